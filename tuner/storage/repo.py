"""The only place tuner's own tables are read and written (with ``leases`` for the driver lease).

Each function is one transaction: a write that fails leaves the database as it was."""

from __future__ import annotations

import math
import time
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from tuner.lifecycle import Outcome, StudyStatus, TrialStatus, config_key
from tuner.storage import leases
from tuner.storage.models import DriverLeaseRow, MeasurementRow, StudyRow, TrialRow
from tuner.workload.metrics import LoadPointMetrics, pooled_meets, pooled_p90s


def _plain(d: dict | None) -> dict:
    """JSON-safe copy (numpy scalars -> Python)."""
    out = {}
    for k, v in (d or {}).items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v
    return out


def create_study(engine: Engine, *, name: str, spec_yaml: str, spec_hash: str, source_path: str | None,
                 backend_kind: str, target_users: int, p90_ttft_slo_s: float, p90_tpot_slo_s: float,
                 trials_budget: int, tuner_version: str, lease: dict | None = None) -> None:
    """The study's row, and (``lease``) its driver's lease in the same transaction: a second start
    of the same name fails on the name (IntegrityError) and writes nothing."""
    now = time.time()
    with Session(engine) as s, s.begin():
        s.add(StudyRow(name=name, spec_yaml=spec_yaml, spec_hash=spec_hash, source_path=source_path,
                       backend_kind=backend_kind, target_users=target_users, p90_ttft_slo_s=p90_ttft_slo_s,
                       p90_tpot_slo_s=p90_tpot_slo_s, trials_budget=trials_budget, created_at=now,
                       updated_at=now, status=StudyStatus.RUNNING.value, tuner_version=tuner_version))
        s.flush()
        if lease is not None:
            leases.insert_in(s, name, lease)


def delete_new_study(engine: Engine, name: str, lease_token: str) -> None:
    """Undo ``create_study`` of a study that got no further (its Optuna side could not be made):
    its row and its lease, only while no trial exists and the lease is still ours."""
    with Session(engine) as s, s.begin():
        if s.scalars(select(TrialRow.id).where(TrialRow.study_name == name).limit(1)).first() is not None:
            return
        gone = s.execute(delete(DriverLeaseRow).where(DriverLeaseRow.study_name == name,
                                                      DriverLeaseRow.token == lease_token))
        if gone.rowcount == 1:
            s.execute(delete(StudyRow).where(StudyRow.name == name))


def set_study_budget(engine: Engine, name: str, trials_budget: int) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(StudyRow).where(StudyRow.name == name).values(trials_budget=trials_budget,
                                                                       updated_at=time.time()))


def get_study(engine: Engine, name: str) -> StudyRow | None:
    with Session(engine, expire_on_commit=False) as s:
        return s.scalars(select(StudyRow).where(StudyRow.name == name)).first()


def list_studies(engine: Engine) -> list[StudyRow]:
    with Session(engine, expire_on_commit=False) as s:
        return list(s.scalars(select(StudyRow).order_by(StudyRow.created_at)))


def set_study_status(engine: Engine, name: str, status: StudyStatus, **fields) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(StudyRow).where(StudyRow.name == name)
                  .values(status=StudyStatus(status).value, updated_at=time.time(), **fields))


def set_study_spec(engine: Engine, name: str, spec_yaml: str) -> None:
    """Replace the stored study (a resume that changes how trials are measured, not what they mean)."""
    with Session(engine) as s, s.begin():
        s.execute(update(StudyRow).where(StudyRow.name == name).values(spec_yaml=spec_yaml, updated_at=time.time()))


def start_trial(engine: Engine, *, study_name: str, trial_number: int, optuna_trial_id: int | None,
                backend_kind: str, params: dict, flags: dict, knobs: dict, is_baseline: bool,
                predicted_kv_capacity_tokens: int | None = None) -> None:
    with Session(engine) as s, s.begin():
        s.add(TrialRow(study_name=study_name, trial_number=trial_number, optuna_trial_id=optuna_trial_id,
                       status=TrialStatus.RUNNING.value, is_baseline=is_baseline, backend_kind=backend_kind,
                       params=_plain(params), flags=_plain(flags), knobs=_plain(knobs),
                       predicted_kv_capacity_tokens=predicted_kv_capacity_tokens,
                       started_at=time.time(), pids=[], gpu_ids=[], telemetry={}))


def update_trial(engine: Engine, study_name: str, trial_number: int, **fields: Any) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(TrialRow).where(TrialRow.study_name == study_name,
                                         TrialRow.trial_number == trial_number).values(**fields))


def finish_trial(engine: Engine, study_name: str, trial_number: int, *, status: TrialStatus,
                 capacity_users: int | None, failure_class: str | None = None,
                 failure_reason: str | None = None, **fields: Any) -> None:
    """Record how the trial ended (``fields``: other columns to set, e.g. launched, telemetry)."""
    now = time.time()
    with Session(engine) as s, s.begin():
        row = s.scalars(select(TrialRow).where(TrialRow.study_name == study_name,
                                               TrialRow.trial_number == trial_number)).one()
        row.status = TrialStatus(status).value
        row.capacity_users = capacity_users
        row.failure_class = None if failure_class is None else str(failure_class)
        row.failure_reason = failure_reason
        row.finished_at = now
        row.wall_time_s = now - row.started_at
        for k, v in fields.items():
            setattr(row, k, v)


def add_measurement(engine: Engine, *, study_name: str, trial_number: int, step: int, backend_kind: str,
                    metrics: LoadPointMetrics, meets_slo: bool, wall_time_s: float, fidelity: float = 1.0) -> None:
    m = metrics
    with Session(engine) as s, s.begin():
        s.add(MeasurementRow(
            study_name=study_name, trial_number=trial_number, step=step, users=m.users,
            backend_kind=backend_kind, fidelity=fidelity, meets_slo=meets_slo, valid=m.valid,
            invalid_reason=m.invalid_reason, requests=m.requests, errors=m.errors, duration_s=m.duration_s,
            p50_ttft_s=m.p50_ttft_s, p90_ttft_s=m.p90_ttft_s, p99_ttft_s=m.p99_ttft_s,
            p50_tpot_s=m.p50_tpot_s, p90_tpot_s=m.p90_tpot_s, p99_tpot_s=m.p99_tpot_s,
            p50_itl_s=m.p50_itl_s, p90_itl_s=m.p90_itl_s, p99_itl_s=m.p99_itl_s, p90_e2e_s=m.p90_e2e_s,
            throughput_tokens_per_s=m.throughput_tokens_per_s,
            input_throughput_tokens_per_s=m.input_throughput_tokens_per_s,
            prefix_cache_hit_rate=m.prefix_cache_hit_rate, kv_capacity_tokens_total=m.kv_capacity_tokens_total,
            wall_time_s=wall_time_s, created_at=time.time(), extra=_plain(m.extra)))


def record_outcome(engine: Engine, study_name: str, trial_number: int, outcome: Outcome, **fields: Any) -> None:
    """``finish_trial`` from an Outcome."""
    if outcome.log_path:
        fields.setdefault("log_path", outcome.log_path)
    finish_trial(engine, study_name, trial_number, status=outcome.status, capacity_users=outcome.capacity_users,
                 failure_class=outcome.failure_class, failure_reason=outcome.reason, launched=outcome.launched,
                 screened_by_planner=outcome.screened_by_planner, **fields)


def trials(engine: Engine, study_name: str) -> list[TrialRow]:
    with Session(engine, expire_on_commit=False) as s:
        return list(s.scalars(select(TrialRow).where(TrialRow.study_name == study_name)
                              .order_by(TrialRow.trial_number)))


def measurements(engine: Engine, study_name: str, trial_number: int | None = None) -> list[MeasurementRow]:
    q = select(MeasurementRow).where(MeasurementRow.study_name == study_name)
    if trial_number is not None:
        q = q.where(MeasurementRow.trial_number == trial_number)
    with Session(engine, expire_on_commit=False) as s:
        return list(s.scalars(q.order_by(MeasurementRow.trial_number, MeasurementRow.step)))


def running_trials(engine: Engine, study_name: str) -> list[TrialRow]:
    with Session(engine, expire_on_commit=False) as s:
        return list(s.scalars(select(TrialRow).where(TrialRow.study_name == study_name,
                                                     TrialRow.status == TrialStatus.RUNNING.value)))


def best_trial(engine: Engine, study_name: str) -> TrialRow | None:
    study = get_study(engine, study_name)
    rows = trials(engine, study_name)
    if study is None:
        return best_of(rows)
    return best_of_study(study, rows, measurements(engine, study_name))


def best_of_study(study: StudyRow, rows: list[TrialRow], ms: list[MeasurementRow]) -> TrialRow | None:
    """``best_of`` with the headroom of each trial to the study's own SLO (one snapshot's rows)."""
    return best_of(rows, slo_headroom(rows, ms, study.p90_ttft_slo_s, study.p90_tpot_slo_s))


def launched_count(rows: list[TrialRow]) -> int:
    """Trials that launched and have ended: what a study's trial budget counts."""
    return sum(1 for t in rows if t.launched and t.status != TrialStatus.RUNNING)


def baseline_trial(engine: Engine, study_name: str) -> TrialRow | None:
    return baseline_of(trials(engine, study_name))


def slo_headroom(rows: list[TrialRow], ms: list[MeasurementRow], p90_ttft_slo_s: float,
                 p90_tpot_slo_s: float) -> dict[int, float]:
    """Per trial with a capacity: the headroom its load points at that capacity left to the SLO,
    ``min(1 - P90 / limit)`` over TTFT and TPOT, the P90s of a count measured twice (a confirmed
    marginal verdict) pooled as the capacity search pooled them (``metrics.pooled_p90s``)."""
    capacity = {t.trial_number: t.capacity_users for t in rows if t.capacity_users}
    at_capacity: dict[int, list[MeasurementRow]] = {}
    for m in ms:
        if capacity.get(m.trial_number) == m.users:
            at_capacity.setdefault(m.trial_number, []).append(m)
    out: dict[int, float] = {}
    for n, windows in at_capacity.items():
        p90s = pooled_p90s(windows)
        if p90s is None or not pooled_meets(windows, p90_ttft_slo_s, p90_tpot_slo_s):
            continue
        room = [1.0 - v / limit for v, limit in zip(p90s, (p90_ttft_slo_s, p90_tpot_slo_s)) if limit]
        if room:
            out[n] = min(room)
    return out


def not_reproduced(rows: list[TrialRow]) -> dict[int, int]:
    """Completed trials whose capacity another completed trial of the same configuration (a
    ``--repeat-trial``, on its own seed) did not reach, each with the least capacity measured for
    its configuration: that is the configuration's claim, and a capacity met on one workload
    sample only is not the study's best."""
    return refuted_capacities((t.trial_number, config_key(t.params or {}), t.capacity_users) for t in rows
                              if t.status == TrialStatus.COMPLETE and t.capacity_users is not None)


def refuted_capacities(entries) -> dict[int, int]:
    """``(trial, configuration key, capacity)`` -> the trials whose capacity exceeds the least of
    their configuration's, each with that least."""
    entries = list(entries)
    least: dict[str, int] = {}
    for _, key, users in entries:
        least[key] = min(least.get(key, users), users)
    return {n: least[key] for n, key, users in entries if users > least[key]}


def best_of(rows: list[TrialRow], headroom: dict[int, float] | None = None) -> TrialRow | None:
    """The best of already-read rows: readers that summarise one snapshot use this, not a second
    query that may see trials finished in between. Among trials serving the same users the one
    with the most ``headroom`` to its SLO (``slo_headroom``) wins, then the earliest: a capacity met
    by 0.1 ms is the weaker claim. A capacity that a repeat of the same configuration did not reach
    (``not_reproduced``) is left out."""
    done = [t for t in rows if t.status == TrialStatus.COMPLETE and t.capacity_users is not None]
    refuted = not_reproduced(done)
    done = [t for t in done if t.trial_number not in refuted]
    if not done:
        return None
    room = headroom or {}
    return max(done, key=lambda t: (t.capacity_users, room.get(t.trial_number, -math.inf), -t.trial_number))


def baseline_of(rows: list[TrialRow]) -> TrialRow | None:
    return next((t for t in rows if t.is_baseline), None)


class StudyRecords:
    """The rows of one study in one database, as the study driver's ledger writes them."""

    def __init__(self, engine: Engine, study_name: str):
        self.engine = engine
        self.study_name = study_name

    def create_study(self, **fields: Any) -> None:
        create_study(self.engine, name=self.study_name, **fields)

    def start_trial(self, **fields: Any) -> None:
        start_trial(self.engine, study_name=self.study_name, **fields)

    def update_trial(self, trial_number: int, **fields: Any) -> None:
        update_trial(self.engine, self.study_name, trial_number, **fields)

    def finish_trial(self, trial_number: int, outcome: Outcome, **fields: Any) -> None:
        record_outcome(self.engine, self.study_name, trial_number, outcome, **fields)

    def add_measurement(self, **fields: Any) -> None:
        add_measurement(self.engine, study_name=self.study_name, **fields)

    def set_status(self, status: StudyStatus) -> None:
        set_study_status(self.engine, self.study_name, status)

    def set_budget(self, trials_budget: int) -> None:
        set_study_budget(self.engine, self.study_name, trials_budget)

    def delete_new_study(self, lease_token: str) -> None:
        delete_new_study(self.engine, self.study_name, lease_token)

    def running_trial_numbers(self) -> list[int]:
        return [t.trial_number for t in running_trials(self.engine, self.study_name)]


def set_measurement_extra(engine: Engine, measurement_id: int, extra: dict) -> None:
    """Replace one measurement's extra JSON (e.g. to add the simulator's prediction of it)."""
    with Session(engine) as s, s.begin():
        s.execute(update(MeasurementRow).where(MeasurementRow.id == measurement_id).values(extra=_plain(extra)))
