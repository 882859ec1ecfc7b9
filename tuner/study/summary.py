"""Summaries of studies (for `study status`, `study list`, reports and the dashboard). They only
read, and never write the database: it is opened read-only, and one of an older schema is read
through an upgraded copy (``tuner.storage.snapshot``)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy.engine import Engine

from tuner import explain
from tuner.errors import StudyNotFoundError
from tuner.lifecycle import TrialStatus, config_key
from tuner.storage import db, leases, repo
from tuner.storage.snapshot import read_current
from tuner.study import trust

MEASUREMENT_FIELDS = ("users", "meets_slo", "valid", "requests", "errors", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s",
                      "p50_tpot_s", "p90_tpot_s", "p99_tpot_s", "p90_itl_s", "throughput_tokens_per_s",
                      "prefix_cache_hit_rate", "kv_capacity_tokens_total", "wall_time_s", "step", "fidelity")


@contextmanager
def _reading(storage: str) -> Iterator[Engine]:
    with read_current(storage) as engine:
        if not db.has_schema(engine):
            raise StudyNotFoundError(f"no tuner studies in {storage}")
        yield engine


def measurement_dict(m) -> dict:
    d = {f: getattr(m, f) for f in MEASUREMENT_FIELDS}
    d[trust.PREDICTION_KEY] = trust.prediction_of(m.extra)
    extra = m.extra or {}
    # how the window was reached (None: recorded before tuner kept it; the study's warmup_s then)
    d["warmup_s"] = extra.get("warmup_s")
    d["duration_s"] = m.duration_s  # its own window (a study resumed with --duration-s changes later ones)
    d["kernel_warmup"] = bool(extra.get("kernel_warmup"))
    d["p90_spread"] = extra.get("p90_spread")  # 90% interval of each P90 (None: not recorded)
    return d


def trial_dict(t, ms: list, diagnosis: explain.TrialDiagnosis | None = None) -> dict:
    at = None
    if t.capacity_users:
        passing = [m for m in ms if m.users == t.capacity_users and m.meets_slo]
        at = measurement_dict(passing[-1]) if passing else None
    measurements = [measurement_dict(m) for m in ms]
    if diagnosis is not None:  # each load point's one-sentence diagnosis beside its figures
        by_users = {d.users: d for d in diagnosis.points}
        for md in measurements:
            d = by_users.get(md["users"])
            md["why"] = d.sentence if d else None
            md["binding"] = d.binding.cause.value if d and d.binding else None
    return {
        "number": t.trial_number, "status": t.status, "is_baseline": t.is_baseline, "backend_kind": t.backend_kind,
        "capacity_users": t.capacity_users, "params": t.params, "flags": t.flags, "knobs": t.knobs,
        "failure_class": t.failure_class, "failure_reason": t.failure_reason, "log_path": t.log_path,
        "predicted_kv_capacity_tokens": t.predicted_kv_capacity_tokens,
        "measured_kv_capacity_tokens": t.measured_kv_capacity_tokens,
        "wall_time_s": t.wall_time_s, "started_at": t.started_at, "finished_at": t.finished_at,
        "launched": t.launched, "screened_by_planner": t.screened_by_planner,
        "sglang_version": ((t.telemetry or {}).get("plan") or {}).get("sglang_version"),
        "pids": t.pids, "gpu_ids": t.gpu_ids,
        "at_capacity": at, "measurements": measurements,
        "bottleneck": diagnosis.to_dict(with_points=False) if diagnosis is not None else None,
    }


def study_summary(storage: str, name: str) -> dict:
    with _reading(storage) as engine:
        row = repo.get_study(engine, name)
        if row is None:
            names = [s.name for s in repo.list_studies(engine)]
            raise StudyNotFoundError(f"no study {name!r} in {storage}; studies there: {', '.join(names) or 'none'}")
        ts = repo.trials(engine, name)
        ms = repo.measurements(engine, name)
        lease = leases.get(engine, name)
    by_trial: dict[int, list] = {}
    for m in ms:
        by_trial.setdefault(m.trial_number, []).append(m)
    ctx = explain.StudyContext.of_study_row(row)
    diagnoses = explain.diagnose_rows(row, ts, ms, ctx)
    trials = [trial_dict(t, by_trial.get(t.trial_number, []), diagnoses.get(t.trial_number)) for t in ts]
    # from the same snapshot as `trials` (a trial may finish meanwhile)
    best = repo.best_of_study(row, ts, ms)
    base = repo.baseline_of(ts)
    best_d = next((t for t in trials if best and t["number"] == best.trial_number), None)
    base_d = next((t for t in trials if base and t["number"] == base.trial_number), None)
    improvement = None
    if best_d and base_d and base_d["capacity_users"]:
        improvement = best_d["capacity_users"] / base_d["capacity_users"]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    return {
        "name": row.name, "backend_kind": row.backend_kind, "status": row.status, "storage": storage,
        "target_users": row.target_users, "slo": {"p90_ttft_s": row.p90_ttft_slo_s, "p90_tpot_s": row.p90_tpot_slo_s},
        "trials_budget": row.trials_budget, "trials_launched": sum(1 for t in trials if t["launched"]),
        "counts": counts, "created_at": row.created_at, "updated_at": row.updated_at,
        "tuner_version": row.tuner_version, "spec_hash": row.spec_hash,
        "best": best_d, "baseline": base_d, "improvement_over_baseline": improvement,
        # trial -> its configuration's least capacity, where a repeat measured less
        "not_reproduced": {str(n): u for n, u in repo.not_reproduced(ts).items()},
        "bottleneck": (best_d or {}).get("bottleneck"),
        "capacity_search": {"start_users": ctx.start_users, "max_users": ctx.max_users,
                            "resolution_users": ctx.resolution_users},
        "meets_target": bool(best_d and best_d["capacity_users"] >= row.target_users),
        "driver": driver_dict(lease),
        "trials": trials,
        **_ledger(trials, {"p90_ttft_s": row.p90_ttft_slo_s, "p90_tpot_s": row.p90_tpot_slo_s}),
    }


def what_if_summary(summary: dict, p90_ttft_s: float, p90_tpot_s: float) -> dict:
    """How many users each trial of ``summary`` serves at other P90 targets, from its stored load
    points only (tuner.explain.whatif): no extrapolation, uncovered answers are marked."""
    resolution = (summary.get("capacity_search") or {}).get("resolution_users") or 1
    rows, results = [], []
    for t in summary["trials"]:
        points = [explain.LoadPoint.of(m) for m in t["measurements"]]
        w = explain.what_if(t["number"], points, p90_ttft_s, p90_tpot_s, resolution)
        results.append(w)
        rows.append({**w.to_dict(), "status": t["status"], "is_baseline": t["is_baseline"],
                     "stored_capacity_users": t["capacity_users"]})
    # as for the study's best: a capacity a repeat of the same configuration did not reach is set aside
    completed = {t["number"]: t for t in summary["trials"] if t["status"] == TrialStatus.COMPLETE}
    refuted = repo.refuted_capacities((w.trial, config_key(completed[w.trial]["params"] or {}), w.capacity_users)
                                      for w in results if w.trial in completed and w.capacity_users is not None)
    best = explain.best_of([w for w in results if w.trial not in refuted])
    return {"slo": {"p90_ttft_s": p90_ttft_s, "p90_tpot_s": p90_tpot_s}, "resolution_users": resolution,
            "trials": rows, "best": best.to_dict() if best else None}


def driver_dict(lease) -> dict | None:
    """Who holds the study's driver lease (None: no driver): it may be running it, or have died
    (a resume takes a dead one over)."""
    if lease is None:
        return None
    return {"command": lease.command, "host": lease.host, "pid": lease.pid, "acquired_at": lease.acquired_at,
            "heartbeat_age_s": round(max(0.0, time.time() - lease.heartbeat_at), 1)}


def _ledger(trials: list[dict], slo: dict) -> dict:
    rows = trust.ledger_rows(trials, slo)
    return {"simulator_ledger": rows, "simulator_fidelity": trust.running_fidelity(rows)}


def list_summaries(storage: str) -> list[dict]:
    with _reading(storage) as engine:
        studies = [(s, repo.trials(engine, s.name), repo.measurements(engine, s.name))
                   for s in repo.list_studies(engine)]
    out = []
    for s, ts, ms in studies:
        best = repo.best_of_study(s, ts, ms)
        base = repo.baseline_of(ts)
        out.append({
            "name": s.name, "backend_kind": s.backend_kind, "status": s.status,
            "trials_budget": s.trials_budget,
            "trials_launched": sum(1 for t in ts if t.launched),
            "counts": _status_counts(t.status for t in ts),
            "best_capacity_users": best.capacity_users if best else None,
            "best_trial": best.trial_number if best else None,
            "baseline_capacity_users": base.capacity_users if base else None,
            "target_users": s.target_users, "created_at": s.created_at,
        })
    return out


def _status_counts(statuses) -> dict[str, int]:
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st] = counts.get(st, 0) + 1
    return counts
