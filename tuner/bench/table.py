"""Tabular benchmark of a study's search space: every configuration's simulated capacity, computed
once and kept in a JSON file so that search strategies can be compared in seconds.

The simulator is deterministic given the workload seed, so a configuration's capacity search
(the same ``CapacitySearch`` the runner drives, one load point per step, bisecting at the midpoint:
the table keeps verdicts, not P90s, and a replay must take the same steps) is a pure function of
(study, configuration). The table stores each configuration's steps, so a replay can also stop
a search early (pruning) and count what that saves. It is keyed by a hash of everything that
changes a measurement, so an edited study or calibration never reads stale entries.
"""

from __future__ import annotations

import hashlib
import gzip
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

import yaml

from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.capacity import CapacitySearch
from tuner.evaluation.sim import SimEvaluator
from tuner.lifecycle import FailureClass, TrialStatus
from tuner.vocabulary import Bisection
from tuner.sim.calibrate import load_calibration
from tuner.config.schema import StudySpec
from tuner.study import space as space_mod
from tuner.study.proposer import config_key, planner_verdict

# 2: a load point counts the warm-up's requests still waiting for their first token when the
# window opens (tuner.workload.metrics.counted_in_window)
TABLE_VERSION = 2


def table_hash(study: StudySpec) -> str:
    """Hash of what a measurement depends on (not the trial budget, sampler or names)."""
    dump = study.model_dump(mode="json", exclude={"trials": True, "source_path": True, "description": True,
                                                  "backend": True, "sampler": True, "name": True,
                                                  "capacity": {"bisect": True}})
    dump["table_version"] = TABLE_VERSION
    # the simulator's calibration files change measurements too (e.g. a refit from kernel timings)
    dump["calibration_resolved"] = load_calibration(study.hardware.gpu, (study.backend_options or {}).get("calibration"))
    return hashlib.sha256(yaml.safe_dump(dump, sort_keys=True).encode()).hexdigest()[:16]


def measure_config(study: StudySpec, values: dict) -> dict:
    """One configuration as the runner would settle it: planner pre-screen, deploy, capacity search."""
    flags, knobs = space_mod.split(values, study.space().engine, space_mod.pinned_flags(study))
    fits, reason, kv = planner_verdict(study, flags)
    if not fits:
        return {"status": TrialStatus.INFEASIBLE.value, "prescreened": True, "capacity_users": 0, "steps": [], "reason": reason,
                "kv_capacity_tokens": kv}
    request = TrialRequest(study=study, trial_number=0, flags=flags, knobs=knobs, seed=study.seed)
    # the midpoint: what replay_pruned reproduces from verdicts alone
    search = CapacitySearch.for_study(study, bisect=Bisection.MIDPOINT)
    try:
        deployment = SimEvaluator().deploy(request)
        while (users := search.next_users()) is not None:
            metrics = deployment.measure(users)
            search.record(users, search.meets(metrics))
    except TrialError as exc:
        status = (TrialStatus.INFEASIBLE if exc.failure_class in (FailureClass.INFEASIBLE, FailureClass.OOM)
                  else TrialStatus.FAILED).value
        return {"status": status, "prescreened": False, "capacity_users": 0, "steps": [list(s) for s in search.steps],
                "reason": f"{exc.failure_class}: {exc.reason}", "kv_capacity_tokens": kv}
    return {"status": TrialStatus.COMPLETE.value, "prescreened": False, "capacity_users": search.capacity_users,
            "steps": [[u, bool(p)] for u, p in search.steps], "reason": None, "kv_capacity_tokens": kv}


def _worker(args):
    study_json, values = args
    study = _study_cache(study_json)
    return config_key(values), values, measure_config(study, values)


_STUDY: dict[str, StudySpec] = {}


def _study_cache(study_json: str) -> StudySpec:
    s = _STUDY.get(study_json)
    if s is None:
        s = _STUDY[study_json] = StudySpec.model_validate_json(study_json)
    return s


class Table:
    """Capacities of configurations of one study, persisted as JSON."""

    def __init__(self, study: StudySpec, path: str | Path):
        self.study = study
        self.path = Path(path)
        self.hash = table_hash(study)
        self.entries: dict[str, dict] = {}
        self.workers: int | None = None
        self.compute_s = 0.0  # wall time spent measuring the entries, over every fill
        if self.path.exists():
            doc = json.loads(_read_text(self.path))
            if doc.get("table_hash") == self.hash:
                self.entries = doc.get("entries", {})
                self.compute_s = float(doc.get("compute_s") or 0.0)

    def get(self, values: dict) -> dict | None:
        return self.entries.get(config_key(values))

    def missing(self, configs: list[dict]) -> list[dict]:
        seen, out = set(), []
        for v in configs:
            k = config_key(v)
            if k not in self.entries and k not in seen:
                seen.add(k)
                out.append(v)
        return out

    def fill(self, configs: list[dict], *, workers: int | None = None,
             progress: Callable[[int, int, float], None] | None = None, save_every: int = 50) -> int:
        """Measure every configuration not yet in the table (in worker processes); returns how many."""
        todo = self.missing(configs)
        if not todo:
            return 0
        t0 = time.time()
        workers = workers or max(1, min(os.cpu_count() or 1, len(todo)))
        self.workers = workers
        study_json = self.study.model_dump_json()
        done = 0
        if workers == 1:
            results = (_worker((study_json, v)) for v in todo)
            for key, values, entry in results:
                done = self._add(key, values, entry, done, len(todo), t0, progress, save_every)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(_worker, (study_json, v)) for v in todo]
                for fut in as_completed(futures):
                    key, values, entry = fut.result()
                    done = self._add(key, values, entry, done, len(todo), t0, progress, save_every)
        self.compute_s += time.time() - t0
        self.save()
        return done

    def _add(self, key, values, entry, done, total, t0, progress, save_every) -> int:
        entry = dict(entry, values=values)
        self.entries[key] = entry
        done += 1
        if progress:
            progress(done, total, time.time() - t0)
        if done % save_every == 0:
            self.save()
        return done

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"table_version": TABLE_VERSION, "table_hash": self.hash, "study": self.study.name,
               "model": self.study.model, "gpu": self.study.hardware.gpu, "space": self.study.space().name,
               "calibration": (self.study.backend_options or {}).get("calibration"),
               "compute_s": round(self.compute_s, 1), "workers": self.workers, "entries": self.entries}
        tmp = self.path.with_name(self.path.name + ".tmp")
        text = json.dumps(doc, indent=0, sort_keys=True)
        if self.path.suffix == ".gz":  # committed tables are compressed (~8x smaller)
            with gzip.open(tmp, "wt", compresslevel=9) as f:
                f.write(text)
        else:
            tmp.write_text(text)
        tmp.replace(self.path)


def _read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


def stderr_progress(label: str) -> Callable[[int, int, float], None]:
    def show(done: int, total: int, elapsed_s: float) -> None:
        if done == total or done % 10 == 0:
            eta = elapsed_s / done * (total - done)
            print(f"\r{label}: {done}/{total} configurations, {elapsed_s:.0f} s elapsed, ~{eta:.0f} s left   ",
                  end="" if done < total else "\n", file=sys.stderr, flush=True)
    return show


def require_entry(table: Table, values: dict) -> dict:
    entry = table.get(values)
    if entry is None:
        raise ConfigError(f"configuration {config_key(values)} is not in the benchmark table {table.path}; "
                          f"fill it first")
    return entry
