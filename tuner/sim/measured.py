"""Real measurements the simulator is checked and calibrated against.

Sources (found under the given results directories):

* study databases (``*.db``, the project's SQLite schema, any schema version: an older one is read
  through an upgraded temporary copy): every valid load point measured by a real backend
  (``tuner_measurements.backend_kind``, default ``sglang``), with the trial's flags and knobs
  (``tuner_trials``), the study as it was started (``tuner_studies.spec_yaml``) and SGLang's own
  ``/metrics`` over the load point (``extra.server_metrics``);
* probe files (``*.probe.json`` or ``probes/*.json``, format ``tuner-probe/1``, below): load points
  measured outside a study, e.g. with a forced-small KV pool or HiCache.

Probe format (``tuner-probe/1``)::

    {"format": "tuner-probe/1", "name": "...", "model": "qwen3-30b-a3b" | {"name": ..., "overrides": {...}}, "gpu": "h200",
     "gpus": 1, "nodes": 1, "host_memory_gb": 2048, "sglang_version": "0.5.17",
     "flags": {"tp-size": 1, "attention-backend": "triton", ...}, "knobs": {},
     "workload": "coding-agent" | {inline workload profile},
     "slo": {"p90_ttft_s": 5.0, "p90_tpot_s": 0.05},
     "points": [{"users": 16, "warmup_s": 60, "duration_s": 300, "seed": 0, "fresh_server": true,
                 "cached_kernels": {"prefill_tokens": [3, 2048], "graph_tokens": [1, 2, 4]},  # optional
                 "p90_spread": {"ttft_s": [0.21, 0.26], "tpot_s": [0.022, 0.024]},  # optional: 90% intervals
                 "measured": {"p50_ttft_s": ..., "p90_ttft_s": ..., "p90_tpot_s": ...,
                              "throughput_tokens_per_s": ..., "prefix_cache_hit_rate": ...}}],
     "provenance": {"date": "...", "command": "...", "server_info": {...}}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple


from tuner.catalog.hf import ModelRef
from tuner.config.load import results_study
from tuner.errors import ConfigError, UserError
from tuner.storage import repo
from tuner.storage.snapshot import read_snapshot
from tuner.workload.profiles import load_profile
from tuner.workload.metrics import KERNEL_CACHE_KEY, SPREAD_KEY
from tuner.workload.session import WorkloadProfile

from tuner.catalog.routing import random_weight_flags

from .warmup import CachedKernels

PROBE_FORMAT = "tuner-probe/1"
METRICS = ("p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s", "prefix_cache_hit_rate")


def format_metric(value: float | None, metric: str, missing: str = "-") -> str:
    """``value`` of one of ``METRICS`` as reports show it: TTFT in s, TPOT in ms, tokens/s whole."""
    if value is None:
        return missing
    if metric == "p90_tpot_s":
        return f"{value * 1000:.1f}"
    if metric == "throughput_tokens_per_s":
        return f"{value:,.0f}"
    return f"{value:.2f}"
REAL_BACKENDS = ("sglang",)


@dataclass
class LoadPoint:
    """One measured load point and everything needed to re-simulate it."""

    source: str
    label: str
    model: str
    gpu: str
    gpus: int
    nodes: int
    host_memory_gb: float | None
    flags: dict
    knobs: dict
    workload: Any  # WorkloadProfile
    users: int
    warmup_s: float
    duration_s: float
    seed: int
    p90_ttft_slo_s: float
    p90_tpot_slo_s: float
    sglang_version: str | None
    measured: dict
    study: str | None = None
    trial: int | None = None
    step: int = 0  # order within the trial's capacity search
    fresh_server: bool = False  # the first load point its server measured (kernels not used before)
    # per-M kernels that fresh server found built in its Triton cache (tuner.evaluation.kernel_ledger)
    cached_kernels: CachedKernels | None = None
    server_metrics: dict = field(default_factory=dict)  # SGLang's /metrics over the load point
    # 90% intervals of the window's own P90s (``metrics.p90_spread``: {"ttft_s": (lo, hi), ...});
    # None where the measurement did not record them
    p90_spread: dict | None = None

    def server_stage_means(self) -> dict | None:
        """SGLang's own per-request means over the load point: queue time (waiting queue to a
        batch), prefill forward (``per_stage_req_latency``: batch to prefill done, plus, for a
        chunked request, its chunks before the last once more as ``chunked_prefill``; the third
        observed stage, request_process, is sub-millisecond), TTFT (tokenizer manager)."""
        sm = self.server_metrics or {}
        n = sm.get("sglang:time_to_first_token_seconds_count")
        if not n:
            return None
        q_n = sm.get("sglang:queue_time_seconds_count") or n
        return {"requests": int(n), "queue_s": sm.get("sglang:queue_time_seconds_sum", 0.0) / q_n,
                "prefill_forward_s": sm.get("sglang:per_stage_req_latency_seconds_sum", 0.0) / n,
                "ttft_s": sm.get("sglang:time_to_first_token_seconds_sum", 0.0) / n}


# ---- which trials ----------------------------------------------------------------------------

def trial_label(study: str | None, trial: int | None) -> str:
    """``study#trial``, as load points and fitted trials are named (``h200-sglang-qwen3#3``)."""
    return f"{study}#{trial}"


@dataclass(frozen=True)
class TrialSelection:
    """Which real trials to use: ``only`` (none given: all) minus ``exclude``. Each name is a
    trial (``study#N``) or a whole study (``study``)."""

    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, only=(), exclude=()) -> "TrialSelection":
        split = lambda values: tuple(x.strip() for v in (values or ()) for x in str(v).split(",") if x.strip())
        return cls(split(only), split(exclude))

    @property
    def everything(self) -> bool:
        return not self.only and not self.exclude

    @staticmethod
    def _hit(name: str, study: str | None, trial: int | None) -> bool:
        return name == study or (trial is not None and name == trial_label(study, trial))

    def keeps(self, study: str | None, trial: int | None) -> bool:
        if self.only and not any(self._hit(n, study, trial) for n in self.only):
            return False
        return not any(self._hit(n, study, trial) for n in self.exclude)

    def keeps_point(self, p: "LoadPoint") -> bool:
        if p.study is None:  # a probe file's point: named by the probe
            name = p.label.rsplit("@", 1)[0]
            return self.keeps(name, None) if self.only or self.exclude else True
        return self.keeps(p.study, p.trial)

    def check(self, known: Iterable[tuple[str | None, int | None]], option: str = "--only-trials") -> None:
        """A name that matches no trial of the data is a mistake: say which names exist."""
        known = list(known)
        for names, key in ((self.only, option), (self.exclude, "--exclude-trials")):
            for n in names:
                if not any(self._hit(n, s, t) for s, t in known):
                    valid = ", ".join(sorted({trial_label(s, t) for s, t in known if t is not None}
                                             | {str(s) for s, _ in known}))
                    raise ConfigError(f"no trial {n!r} in the data; valid: {valid}", key=key)
        if not any(self.keeps(s, t) for s, t in known):
            raise ConfigError("the selection leaves no trial", key=option)


# ---- sources -------------------------------------------------------------------------------

def find_sources(dirs: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(study databases, probe files) under ``dirs`` (a file is taken as it is)."""
    dbs, probes = [], []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            (dbs if d.suffix in (".db", ".sqlite") else probes).append(d)
            continue
        if not d.is_dir():
            raise ConfigError(f"no such results directory: {d}", key="--results")
        dbs += sorted(p for p in d.rglob("*.db") if p.is_file())
        probes += sorted({*d.rglob("*.probe.json"), *d.rglob("probes/*.json")})
    return dbs, probes


class LoadedPoints(NamedTuple):
    points: list["LoadPoint"]
    skipped: list[dict]  # databases that could not be read, each with the reason
    sources: list[Path]  # every database and probe file found


def load_points(dirs: Iterable[str | Path], backends: tuple[str, ...] = REAL_BACKENDS) -> LoadedPoints:
    """Every real load point under ``dirs`` (study databases, then probe files)."""
    dbs, probes = find_sources(dirs)
    points: list[LoadPoint] = []
    skipped = []
    for path in dbs:
        try:
            points += points_from_database(path, backends)
        except UserError as exc:
            skipped.append({"source": str(path), "reason": str(exc)})
    for path in probes:
        points += points_from_probe(path)
    return LoadedPoints(points, skipped, dbs + probes)


def extra_args_to_flags(args: Iterable[str]) -> dict[str, Any]:
    """``["--attention-backend", "triton", "--disable-radix-cache"]`` -> flags."""
    out: dict[str, Any] = {}
    args = list(args or [])
    i = 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def _version_from_trial(trial, spec_options: dict) -> str | None:
    tele = trial.telemetry or {}
    info = tele.get("server_info") or {}
    if isinstance(info, list):  # one snapshot per server process
        info = next((i for i in info if isinstance(i, dict)), {})
    for v in ((tele.get("plan") or {}).get("sglang_version"), info.get("version"),
              (tele.get("server") or {}).get("sglang_version"), tele.get("sglang_version"),
              spec_options.get("sglang_version")):
        if v:
            return str(v).split("-")[0]
    return None


def points_from_database(path: Path, backends: tuple[str, ...] = REAL_BACKENDS) -> list[LoadPoint]:
    """Every valid real load point of the database (read without writing: an older schema is
    read through an upgraded temporary copy)."""
    with read_snapshot(path) as engine:
        return [] if engine is None else _points(engine, path, backends)


def _points(engine, path: Path, backends: tuple[str, ...]) -> list[LoadPoint]:
    out: list[LoadPoint] = []
    for study_row in repo.list_studies(engine):
        spec = results_study(study_row.spec_yaml, study_row.name, str(path))
        profile = spec.workload_profile()
        trials = {t.trial_number: t for t in repo.trials(engine, study_row.name)}
        extra_flags = {**extra_args_to_flags((spec.backend_options or {}).get("extra_server_args") or []),
                       **random_weight_flags(spec.backend_options)}
        rows = repo.measurements(engine, study_row.name)
        first_step = {}
        for m in rows:  # one server per trial: its first load point ran on a fresh server
            first_step[m.trial_number] = min(m.step, first_step.get(m.trial_number, m.step))
        for m in rows:
            if m.backend_kind not in backends or not m.valid:
                continue
            trial = trials.get(m.trial_number)
            if trial is None:
                continue
            fid = max(0.05, min(1.0, m.fidelity or 1.0))
            measured = {k: getattr(m, k) for k in METRICS}
            out.append(LoadPoint(
                source=str(path), label=f"{study_row.name}#{m.trial_number}@{m.users}",
                model=spec.model, gpu=spec.hardware.gpu, gpus=spec.hardware.gpus_per_node,
                nodes=spec.hardware.nodes, host_memory_gb=spec.hardware.host_memory_gb,
                flags={**extra_flags, **(trial.flags or {})}, knobs=dict(trial.knobs or {}), workload=profile,
                users=m.users, warmup_s=warmup_of(m, spec, fid), duration_s=m.duration_s,
                seed=spec.seed + m.trial_number + 1009 * m.step,
                p90_ttft_slo_s=spec.slo.p90_ttft_s, p90_tpot_slo_s=spec.slo.p90_tpot_s,
                sglang_version=_version_from_trial(trial, spec.backend_options or {}),
                measured=measured, study=study_row.name, trial=m.trial_number, step=m.step,
                fresh_server=ran_on_fresh_server(m, first_step),
                cached_kernels=stored_cached_kernels(m.extra, f"{study_row.name}#{m.trial_number}@{m.users}"),
                server_metrics=dict((m.extra or {}).get("server_metrics") or {}),
                p90_spread=(m.extra or {}).get(SPREAD_KEY) or None))
    return out


def ran_on_fresh_server(m, first_step: dict[int, int]) -> bool:
    """Whether stored load point ``m`` was its server's first traffic (``first_step``: each trial's
    first step), unless the kernel warm-up ran before it."""
    return m.step == first_step[m.trial_number] and not (m.extra or {}).get("kernel_warmup")


def stored_cached_kernels(extra: dict | None, where: str) -> CachedKernels | None:
    """What a stored load point's server found in its Triton cache (``extra.kernel_cache.cached``);
    None where nothing was recorded (a server before the ledger, or an unpinned cache)."""
    doc = ((extra or {}).get(KERNEL_CACHE_KEY) or {}).get("cached")
    if doc is None:
        return None
    try:
        return CachedKernels.from_dict(doc)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.detail}", key=f"extra.{KERNEL_CACHE_KEY}.{exc.key}") from None


def warmup_of(m, spec, fidelity: float) -> float:
    """The warm-up a stored load point ran with: its own record, else the study's (scaled by fidelity)."""
    recorded = (m.extra or {}).get("warmup_s")
    return float(recorded) if isinstance(recorded, (int, float)) else spec.measurement.warmup_s * fidelity


def _req(doc: dict, key: str, kind, path: Path, where: str = ""):
    value = doc.get(key)
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ConfigError(f"required {name}", file=str(path), key=f"{where}{key}")
    return value


def _probe_cached_kernels(p: dict, path: Path, where: str) -> CachedKernels | None:
    if p.get("cached_kernels") is None:
        return None
    try:
        return CachedKernels.from_dict(p["cached_kernels"])
    except ConfigError as exc:
        raise ConfigError(exc.detail, file=str(path), key=f"{where}{exc.key}") from None


def _probe_spread(p: dict, path: Path, where: str) -> dict | None:
    """A probe point's optional ``p90_spread``: for ``ttft_s`` and/or ``tpot_s``, [low, high] in s."""
    doc = p.get(SPREAD_KEY)
    if doc is None:
        return None
    if not isinstance(doc, dict) or not doc or set(doc) - {"ttft_s", "tpot_s"}:
        raise ConfigError("must map ttft_s and/or tpot_s to [low, high] in s", file=str(path), key=f"{where}{SPREAD_KEY}")
    for k, v in doc.items():
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) and not
                                                                   isinstance(x, bool) for x in v) and 0 <= v[0] <= v[1]):
            raise ConfigError(f"must be [low, high] in s with 0 <= low <= high, got {v!r:.80}", file=str(path),
                              key=f"{where}{SPREAD_KEY}.{k}")
    return {k: (float(v[0]), float(v[1])) for k, v in doc.items()}


def points_from_probe(path: Path) -> list[LoadPoint]:

    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read probe: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("format") != PROBE_FORMAT:
        raise ConfigError(f"not a probe file: expected format {PROBE_FORMAT!r}", file=str(path), key="format")
    model = _req(doc, "model", (str, dict), path)
    if isinstance(model, dict):  # as a study names it: {name, overrides[, hf_config]}
        try:
            model = ModelRef.model_validate(model)
        except ValueError as exc:
            raise ConfigError(f"invalid model: {exc}", file=str(path), key="model") from None
    gpu = _req(doc, "gpu", str, path)
    flags = _req(doc, "flags", dict, path)
    slo = _req(doc, "slo", dict, path)
    workload = doc.get("workload")
    try:
        if isinstance(workload, str):
            profile = load_profile(workload)
        elif isinstance(workload, dict):
            profile = WorkloadProfile.model_validate(workload)
        else:
            raise ConfigError("required: a workload profile name or an inline profile", file=str(path),
                              key="workload")
    except ConfigError as exc:
        raise ConfigError(exc.detail, file=str(path), key=exc.key or "workload") from None
    except Exception as exc:
        raise ConfigError(f"invalid workload: {exc}", file=str(path), key="workload") from None
    points = _req(doc, "points", list, path)
    if not points:
        raise ConfigError("needs at least one load point", file=str(path), key="points")
    out = []
    for i, p in enumerate(points):
        where = f"points[{i}]."
        if not isinstance(p, dict):
            raise ConfigError("must be an object", file=str(path), key=f"points[{i}]")
        users = _req(p, "users", int, path, where)
        measured = _req(p, "measured", dict, path, where)
        for k in ("p90_ttft_s", "p90_tpot_s"):
            if not isinstance(measured.get(k), (int, float)):
                raise ConfigError("required number", file=str(path), key=f"{where}measured.{k}")
        out.append(LoadPoint(
            source=str(path), label=f"{doc.get('name', path.stem)}@{users}", model=model, gpu=gpu,
            gpus=int(doc.get("gpus", 8)), nodes=int(doc.get("nodes", 1)), host_memory_gb=doc.get("host_memory_gb"),
            flags=dict(flags), knobs=dict(doc.get("knobs") or {}), workload=profile, users=users,
            warmup_s=float(p.get("warmup_s", 120)), duration_s=float(_req(p, "duration_s", (int, float), path, where)),
            seed=int(p.get("seed", 0)), p90_ttft_slo_s=float(_req(slo, "p90_ttft_s", (int, float), path, "slo.")),
            p90_tpot_slo_s=float(_req(slo, "p90_tpot_s", (int, float), path, "slo.")),
            sglang_version=doc.get("sglang_version"), measured={k: measured.get(k) for k in METRICS},
            step=i, fresh_server=bool(p.get("fresh_server", False)),
            cached_kernels=_probe_cached_kernels(p, path, where),
            server_metrics=dict(p.get("server_metrics") or {}),
            p90_spread=_probe_spread(p, path, where)))
    return out


