"""tuner's own tables, in the same database as Optuna's, linked by study name and trial number."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false, true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tuner.lifecycle import StudyStatus, TrialStatus

# 1: the first release. 2: trials record `launched` and `screened_by_planner` as columns
# (version 1 kept them as telemetry["not_launched"] and a "planner:" prefix of the reason).
# 3: the driver lease table (`tuner_driver_leases`): one driver per study, known for sure.
SCHEMA_VERSION = 3


class Base(DeclarativeBase):
    pass


class SchemaInfo(Base):
    __tablename__ = "tuner_schema"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class StudyRow(Base):
    __tablename__ = "tuner_studies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True, index=True)
    spec_yaml: Mapped[str] = mapped_column(Text)  # the resolved study, as it was started
    spec_hash: Mapped[str] = mapped_column(String(64))
    source_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    backend_kind: Mapped[str] = mapped_column(String(32))
    target_users: Mapped[int] = mapped_column(Integer)
    p90_ttft_slo_s: Mapped[float] = mapped_column(Float)
    p90_tpot_slo_s: Mapped[float] = mapped_column(Float)
    trials_budget: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(32), default=StudyStatus.RUNNING.value)  # a StudyStatus
    tuner_version: Mapped[str] = mapped_column(String(32))


class TrialRow(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("study_name", "trial_number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_name: Mapped[str] = mapped_column(String(255), ForeignKey("tuner_studies.name"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)  # Optuna's trial.number
    optuna_trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(32), default=TrialStatus.RUNNING.value)  # a TrialStatus
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    # False: settled without starting anything (a constraint failed, or the planner screened it out)
    launched: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    screened_by_planner: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    backend_kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict] = mapped_column(JSON)  # knob -> value as sampled (None = default)
    flags: Mapped[dict] = mapped_column(JSON)  # server flags passed
    knobs: Mapped[dict] = mapped_column(JSON)  # tuner-level knobs
    capacity_users: Mapped[int | None] = mapped_column(Integer, nullable=True)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)  # a FailureClass
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    pids: Mapped[list] = mapped_column(JSON, default=list)
    gpu_ids: Mapped[list] = mapped_column(JSON, default=list)
    predicted_kv_capacity_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    measured_kv_capacity_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    telemetry: Mapped[dict] = mapped_column(JSON, default=dict)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    wall_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class MeasurementRow(Base):
    __tablename__ = "tuner_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_name: Mapped[str] = mapped_column(String(255), index=True)
    trial_number: Mapped[int] = mapped_column(Integer, index=True)
    step: Mapped[int] = mapped_column(Integer)  # order within the trial's capacity search
    users: Mapped[int] = mapped_column(Integer)
    backend_kind: Mapped[str] = mapped_column(String(32))
    fidelity: Mapped[float] = mapped_column(Float, default=1.0)
    meets_slo: Mapped[bool] = mapped_column(Boolean)
    valid: Mapped[bool] = mapped_column(Boolean)
    invalid_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    requests: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    p50_ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p90_ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p50_tpot_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p90_tpot_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_tpot_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p50_itl_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p90_itl_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_itl_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p90_e2e_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    throughput_tokens_per_s: Mapped[float] = mapped_column(Float)
    input_throughput_tokens_per_s: Mapped[float] = mapped_column(Float)
    prefix_cache_hit_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    kv_capacity_tokens_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    wall_time_s: Mapped[float] = mapped_column(Float)  # how long the measurement took to run
    created_at: Mapped[float] = mapped_column(Float)
    extra: Mapped[dict] = mapped_column(JSON, default=dict)


class DriverLeaseRow(Base):
    """The one process driving a study (tuner.study.lease): taken atomically (the primary key is the
    study's name), renewed by its heartbeat, deleted when the driver ends. A row left behind names
    a dead driver: where it ran, which process it was, and the processes it started."""

    __tablename__ = "tuner_driver_leases"
    study_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))  # this holding; a take-over replaces it
    command: Mapped[str] = mapped_column(String(32))  # start | resume
    host: Mapped[str] = mapped_column(String(255))  # the node name
    boot_id: Mapped[str] = mapped_column(String(64))  # the host's boot (a reboot ends every process)
    pid_namespace: Mapped[str] = mapped_column(String(64))  # PIDs compare only inside one namespace
    pid: Mapped[int] = mapped_column(Integer)
    pid_start_ticks: Mapped[int] = mapped_column(BigInteger)  # clock ticks after boot (/proc/PID/stat)
    cmdline: Mapped[str] = mapped_column(Text)
    tuner_version: Mapped[str] = mapped_column(String(32))
    acquired_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)  # the holder's clock
    heartbeat_count: Mapped[int] = mapped_column(Integer, default=0)  # changes every beat: no clocks needed
    processes: Mapped[list] = mapped_column(JSON, default=list)  # identities of what the driver started
