"""Which studies a comparison sets side by side, and what each needs: run it (not in storage),
continue it (stored, unfinished), or reuse it (stored and finished). Everything that can be wrong
with the input is found here, before anything runs: an unknown study, a stored study started from
another spec, different workloads, an unknown cost key (ConfigError, exit 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuner.config.comparison import ComparisonSpec, StudyOverrides
from tuner.config.load import comparison_root, is_comparison_file, load_comparison, load_study, resolve_file, spec_hash
from tuner.config.schema import StudySpec
from tuner.errors import ConfigError, StudyNotFoundError
from tuner.lifecycle import StudyStatus
from tuner.storage import db, repo
from tuner.study.runner import load_existing
from tuner.vocabulary import StrEnum

WORKLOAD_IDENTITY_EXCLUDE = {"name", "description"}


class Action(StrEnum):
    RUN = "run"  # not in storage: created and run to its budget
    RESUME = "resume"  # in storage, unfinished: continued to its budget
    REUSE = "reuse"  # in storage and finished: read as it is


@dataclass
class Entry:
    spec: StudySpec
    given_as: str  # the argument or comparison-file entry it came from
    action: Action
    from_storage_only: bool = False  # no study file: the stored snapshot is the study


@dataclass
class ComparePlan:
    name: str
    description: str
    entries: list[Entry]
    gpu_hour_cost: dict[str, float]
    notes: list[str] = field(default_factory=list)
    cross_seed: bool = False


def _apply(spec: StudySpec, overrides: StudyOverrides, trials: int | None) -> StudySpec:
    update = overrides.study_update()
    if trials is not None:
        update["trials"] = trials
    if not update and not overrides.study_suffix:
        return spec
    data = spec.model_dump(mode="json")
    for k, v in update.items():
        data[k] = {**(data.get(k) or {}), **v} if isinstance(v, dict) else v
    data["name"] = spec.name + overrides.study_suffix
    try:
        return StudySpec.model_validate(data)
    except Exception as exc:  # pydantic's message names the field
        raise ConfigError(f"the comparison's overrides do not fit study {spec.name!r}: {exc}", key="overrides") from None


def _study_spec(name: str, storage: str, near: Path | None) -> tuple[StudySpec, bool]:
    """(spec, from storage only): a study file, else a study of that name already in storage."""
    try:
        path = resolve_file(name, "studies", near=near, what="study")
    except ConfigError as missing:
        engine = db.get_engine(storage, create=False)
        if db.has_schema(engine) and repo.get_study(engine, name) is not None:
            return load_existing(storage, name), True
        raise ConfigError(f"{missing.detail}; and no study {name!r} in {storage}") from None
    return load_study(str(path)), False


def plan_comparison(targets: list[str], storage: str, *, gpu_hour_cost: dict[str, float] | None = None,
                    trials: int | None = None, allow_different_workloads: bool = False,
                    cross_seed: bool | None = None) -> ComparePlan:
    """Expand comparison files, load every study, decide run / resume / reuse, check the input."""
    if not targets:
        raise ConfigError("name at least one study or comparison file", key="STUDY_OR_FILE")
    costs: dict[str, float] = {}
    seeded = False
    items: list[tuple[str, StudyOverrides, Path | None]] = []
    names, descriptions = [], []
    for t in targets:
        comparison: ComparisonSpec | None = None
        try:
            path = resolve_file(t, "studies", what="study or comparison")
        except ConfigError:
            path = None  # a study known only to the storage; resolved below
        if path is not None and is_comparison_file(path):
            comparison = load_comparison(str(path))
        if comparison is None:
            items.append((t, StudyOverrides(), None))
            continue
        names.append(comparison.name)
        descriptions.append(comparison.description)
        costs.update({k.lower(): v for k, v in comparison.gpu_hour_cost.items()})
        allow_different_workloads = allow_different_workloads or comparison.allow_different_workloads
        seeded = seeded or comparison.cross_seed
        items += [(s, comparison.overrides, comparison_root(comparison)) for s in comparison.studies]
    costs.update(gpu_hour_cost or {})

    engine = db.get_engine(storage)
    stored = db.has_schema(engine)
    if stored:
        db.require_current(engine, storage)
    entries: list[Entry] = []
    stopped: list[str] = []
    seen: set[str] = set()
    for given, overrides, near in items:
        spec, storage_only = _study_spec(given, storage, near)
        spec = _apply(spec, overrides, trials) if not storage_only else spec
        if spec.name in seen:
            raise ConfigError(f"study {spec.name!r} is named twice in this comparison", key="STUDY_OR_FILE")
        seen.add(spec.name)
        row = repo.get_study(engine, spec.name) if stored else None
        if row is None:
            action = Action.RUN
        else:
            if not storage_only and row.spec_hash != spec_hash(spec):
                raise ConfigError(
                    f"study {spec.name!r} in {storage} was started from a different spec than {given!r} now "
                    f"describes (spec hash {row.spec_hash} there, {spec_hash(spec)} here); compare it under "
                    "another --storage, or give the comparison a study_suffix", key="STUDY_OR_FILE")
            action = Action.RESUME if row.status == StudyStatus.RUNNING else Action.REUSE
            if row.status == StudyStatus.STOPPED:
                stopped.append(spec.name)
        entries.append(Entry(spec, given, action, storage_only))
    _check_workloads(entries, allow_different_workloads)
    notes = _slo_notes(entries)
    notes += [f"{n} stopped before its trial budget; it is compared as it stands (continue it with "
              f"`tuner study resume {n}`)" for n in stopped]
    used = {e.spec.hardware.gpu.lower() for e in entries}
    notes += [f"cost for {g} given, but no compared study runs on {g}" for g in sorted(set(costs) - used)]
    return ComparePlan(name=" vs ".join(names) if names else "comparison",
                       description=" ".join(d for d in descriptions if d), entries=entries,
                       gpu_hour_cost=costs, notes=notes, cross_seed=seeded if cross_seed is None else cross_seed)


def workload_identity(spec: StudySpec) -> dict:
    return spec.workload_profile().model_dump(mode="json", exclude=WORKLOAD_IDENTITY_EXCLUDE)


def _check_workloads(entries: list[Entry], allowed: bool) -> None:
    if allowed or len(entries) < 2:
        return
    first = entries[0]
    ref = workload_identity(first.spec)
    for e in entries[1:]:
        w = workload_identity(e.spec)
        if w != ref:
            differ = sorted(k for k in set(ref) | set(w) if ref.get(k) != w.get(k))
            raise ConfigError(
                f"studies {first.spec.name!r} and {e.spec.name!r} replay different workloads "
                f"({first.spec.workload_profile().name} and {e.spec.workload_profile().name}; they differ in "
                f"{', '.join(differ)}): capacities are not comparable; give --allow-different-workloads to "
                "compare them anyway", key="STUDY_OR_FILE")


def _slo_notes(entries: list[Entry]) -> list[str]:
    slos = {(e.spec.slo.p90_ttft_s, e.spec.slo.p90_tpot_s) for e in entries}
    if len(slos) <= 1:
        return []
    return ["the studies have different targets: "
            + "; ".join(f"{e.spec.name} P90 TTFT <= {e.spec.slo.p90_ttft_s:g} s, P90 TPOT <= "
                        f"{e.spec.slo.p90_tpot_s * 1000:g} ms" for e in entries)
            + " (the capacity-against-target chart puts them on one scale)"]


def require_completed(storage: str, names: list[str]) -> None:
    """Exit 2 naming every compared study without a completed trial, and how its trials ended."""
    engine = db.get_engine(storage, create=False)
    problems = []
    for name in names:
        rows = repo.trials(engine, name)
        if repo.best_of(rows) is not None:
            continue
        ended: dict[str, int] = {}
        for r in rows:
            key = r.failure_class or r.status
            ended[key] = ended.get(key, 0) + 1
        how = ", ".join(f"{n} {k}" for k, n in sorted(ended.items())) or "no trials"
        problems.append(f"{name} ({how})")
    if problems:
        raise StudyNotFoundError("no completed trial to compare in: " + "; ".join(problems))
