"""Read-only views of the study database for the dashboard and the static report.

Everything here opens the database read-only (SQLite ``mode=ro``) and builds on
``tuner.study.summary``; the only extra queries are Optuna's own (for parameter importance).
The dicts returned are JSON-ready and are what the browser code draws.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from pathlib import Path

import yaml

from tuner.errors import StudyNotFoundError, UserError
from tuner.lifecycle import TrialStatus
from tuner.storage import db, repo
from tuner.storage.snapshot import read_current
from tuner.study.summary import list_summaries, study_summary

log = logging.getLogger(__name__)

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ten times faster on the polled path
DEFAULT_RUNS_DIR = "results/runs"  # the study runner's default workdir: <runs>/<study>/trial-NNNN
MAX_LOG_BYTES = 2 * 1024 * 1024  # logs are served from their tail beyond this size


def studies(storage: str) -> list[dict]:
    """One row per study: backend, trials done, best and baseline capacity."""
    return list_summaries(storage)


def study(storage: str, name: str, runs_dir: str | Path = DEFAULT_RUNS_DIR) -> dict:
    """The study summary plus what the charts need: best-so-far series, the parameters that vary,
    failures grouped by class, the spec's model/hardware/workload and each log's availability."""
    s = study_summary(storage, name)
    run_dir = study_run_dir(runs_dir, name)
    for t in s["trials"]:
        t["log_available"] = _log_inside(t.get("log_path"), run_dir) is not None
        t["duration_s"] = t["wall_time_s"]
    s["spec"] = _spec_facts(storage, name)
    s["best_so_far"] = best_so_far(s["trials"])
    s["varied_params"] = varied_params(s["trials"])
    s["tried"] = tried_values(s["trials"])
    s["failures"] = failure_groups(s["trials"])
    return s


def _spec_facts(storage: str, name: str) -> dict:
    with read_current(storage) as engine:
        row = repo.get_study(engine, name)
    try:
        spec = yaml.load(row.spec_yaml, Loader=_YAML_LOADER) or {}  # written by tuner itself
    except yaml.YAMLError:
        spec = {}
    hw = spec.get("hardware") or {}
    return {
        "description": spec.get("description"), "model": spec.get("model"),
        "workload": spec.get("workload") if isinstance(spec.get("workload"), str) else (spec.get("workload") or {}).get("name"),
        "search_space": spec.get("search_space") if isinstance(spec.get("search_space"), str)
        else (spec.get("search_space") or {}).get("name"),
        "gpu": hw.get("gpu"), "gpus_per_node": hw.get("gpus_per_node"), "nodes": hw.get("nodes"),
        "sampler": spec.get("sampler") if isinstance(spec.get("sampler"), str) else (spec.get("sampler") or {}).get("name"),
    }


def best_so_far(trials: list[dict]) -> list[dict]:
    """Per finished trial in trial order: its capacity and the best capacity up to it."""
    out, best = [], None
    for t in sorted(trials, key=lambda t: t["number"]):
        if t["status"] == TrialStatus.RUNNING:
            continue
        cap = t["capacity_users"] if t["status"] == TrialStatus.COMPLETE else None
        if cap is not None:
            best = cap if best is None else max(best, cap)
        out.append({"number": t["number"], "status": t["status"], "capacity_users": cap, "best_users": best,
                    "is_baseline": t["is_baseline"]})
    return out


def varied_params(trials: list[dict]) -> list[str]:
    """Parameter names whose value differs between trials, in first-seen order."""
    seen: dict[str, set] = {}
    for t in trials:
        for k, v in (t["params"] or {}).items():
            seen.setdefault(k, set()).add(repr(v))
    return [k for k, vals in seen.items() if len(vals) > 1]


def tried_values(trials: list[dict]) -> dict[str, list]:
    """Parameter -> distinct values tried (None = SGLang's default), launched trials only."""
    out: dict[str, list] = {}
    for t in trials:
        if not t["launched"]:
            continue
        for k, v in (t["params"] or {}).items():
            vals = out.setdefault(k, [])
            if v not in vals:
                vals.append(v)
    for k in out:
        out[k].sort(key=lambda v: (v is not None, isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))
    return out


def failure_groups(trials: list[dict]) -> list[dict]:
    """Trials that did not complete, grouped by failure class, largest group first."""
    groups: dict[str, list] = {}
    for t in trials:
        if t["status"] in (TrialStatus.COMPLETE, TrialStatus.RUNNING):
            continue
        groups.setdefault(t["failure_class"] or t["status"], []).append(
            {"number": t["number"], "status": t["status"], "reason": t["failure_reason"], "launched": t["launched"]})
    return sorted(({"failure_class": k, "count": len(v), "trials": v} for k, v in groups.items()),
                  key=lambda g: (-g["count"], g["failure_class"]))


# ----------------------------------------------------------------------------- importance
_importance_cache: dict[tuple, dict] = {}
_importance_lock = threading.Lock()


def param_importances(storage: str, name: str) -> dict:
    """Optuna's importance of each parameter for capacity (its default evaluator, PED-ANOVA, which
    needs no scikit-learn), over Optuna's completed trials: a configuration that could not run
    counts with capacity 0. Cached per number of completed trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostudy = _optuna_study(storage, name)
    done = ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    key = (storage, name, len(done), max((t.number for t in done), default=-1))
    with _importance_lock:
        if key in _importance_cache:
            return _importance_cache[key]
    result = {"trials": len(done), "importances": [], "note": None}
    # Trials whose sampled parameters differ from the baseline's (which Optuna did not sample).
    sampled = [t for t in done if t.params]
    if len(sampled) < 2:
        result["note"] = f"needs at least 2 completed trials with sampled parameters ({len(sampled)} so far)"
    elif len({t.value for t in sampled}) < 2:
        result["note"] = f"all {len(sampled)} completed trials have the same capacity; nothing to attribute yet"
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PED-ANOVA warns on few trials; the note says so
                imp = optuna.importance.get_param_importances(ostudy)  # Optuna's default: PED-ANOVA
            result["importances"] = [{"param": k, "importance": float(v)} for k, v in imp.items()
                                     if v is not None and math.isfinite(v)]
        except (RuntimeError, ValueError, ZeroDivisionError, ImportError) as exc:
            result["note"] = f"importance not available yet: {exc}"
    with _importance_lock:
        _importance_cache[key] = result
    return result


def _optuna_study(storage: str, name: str):
    import optuna

    path = db.sqlite_path(storage)
    url = f"sqlite:///file:{path.resolve()}?mode=ro&uri=true" if path is not None else storage
    try:
        ostorage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        return optuna.load_study(study_name=name, storage=ostorage)
    except KeyError:
        raise StudyNotFoundError(f"no Optuna study {name!r} in {storage}") from None


# ----------------------------------------------------------------------------- logs
def study_run_dir(runs_dir: str | Path, name: str) -> Path:
    return (Path(runs_dir) / name).resolve()


def _log_inside(log_path: str | None, run_dir: Path) -> Path | None:
    """The log file if it exists and lies inside the study's run directory (after resolving
    links), else None: the dashboard serves nothing else from disk."""
    if not log_path:
        return None
    try:
        p = Path(log_path).resolve()
    except (OSError, RuntimeError):
        return None
    if not p.is_relative_to(run_dir) or not p.is_file():
        return None
    return p


def trial_log(storage: str, name: str, number: int, runs_dir: str | Path = DEFAULT_RUNS_DIR) -> tuple[str, bool]:
    """(text, truncated) of trial ``number``'s server log; UserError if there is none to serve."""
    with read_current(storage) as engine:
        row = next((t for t in repo.trials(engine, name) if t.trial_number == number), None)
    if row is None:
        raise StudyNotFoundError(f"no trial {number} in study {name!r}")
    path = _log_inside(row.log_path, study_run_dir(runs_dir, name))
    if path is None:
        raise UserError(f"trial {number} has no log inside {study_run_dir(runs_dir, name)}")
    size = path.stat().st_size
    with path.open("rb") as f:
        if size > MAX_LOG_BYTES:
            f.seek(size - MAX_LOG_BYTES)
        data = f.read(MAX_LOG_BYTES)
    return data.decode("utf-8", errors="replace"), size > MAX_LOG_BYTES
