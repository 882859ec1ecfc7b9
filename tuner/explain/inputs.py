"""What a diagnosis reads: stored load points, the trial's facts and the study's targets and
workload, taken from database rows (or dicts of the same fields) without re-running anything."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from tuner.config.schema import StudySpec
from tuner.lifecycle import TrialStatus
from tuner.workload.metrics import PREDICTION_KEY
from tuner.workload.session import WorkloadProfile

log = logging.getLogger(__name__)

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _get(obj: Any, name: str, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass(frozen=True)
class LoadPoint:
    """One stored measurement (a ``tuner_measurements`` row)."""

    users: int
    valid: bool = True
    invalid_reason: str | None = None
    requests: int = 0
    errors: int = 0
    duration_s: float = 0.0
    p50_ttft_s: float | None = None
    p90_ttft_s: float | None = None
    p50_tpot_s: float | None = None
    p90_tpot_s: float | None = None
    p50_itl_s: float | None = None
    throughput_tokens_per_s: float = 0.0
    prefix_cache_hit_rate: float | None = None
    kv_capacity_tokens_total: int | None = None
    backend_kind: str = ""
    step: int = 0
    wall_time_s: float | None = None  # the whole load point: warm-up, window and drain
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, row: Any) -> "LoadPoint":
        """From a measurement row or a dict with the same field names."""
        kwargs = {f: _get(row, f) for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        kwargs["extra"] = dict(_get(row, "extra") or {})
        return cls(**kwargs)

    def meets(self, p90_ttft_s: float, p90_tpot_s: float) -> bool:
        if not self.valid or self.p90_ttft_s is None or self.p90_tpot_s is None:
            return False
        return self.p90_ttft_s <= p90_ttft_s and self.p90_tpot_s <= p90_tpot_s

    @property
    def simulated(self) -> bool:
        return self.extra.get("backend") == "simulator" or self.backend_kind == "simulator"

    @property
    def server_metrics(self) -> dict:
        return self.extra.get("server_metrics") or {}

    @property
    def prediction(self) -> dict:
        """The simulator's prediction stored beside a real load point (empty when none, or when
        it could not be made)."""
        pred = self.extra.get(PREDICTION_KEY)
        return pred if isinstance(pred, dict) and not pred.get("error") else {}

    @property
    def sim(self) -> dict:
        """The simulator's window report (``extra["explain"]``), empty for real trials."""
        return self.extra.get("explain") or {}


@dataclass(frozen=True)
class TrialFacts:
    """What a diagnosis needs of a trial row."""

    number: int
    status: TrialStatus
    capacity_users: int | None = None
    backend_kind: str = ""
    is_baseline: bool = False
    launched: bool = True
    screened_by_planner: bool = False
    failure_class: str | None = None
    failure_reason: str | None = None
    flags: dict = field(default_factory=dict)
    knobs: dict = field(default_factory=dict)
    measured_kv_capacity_tokens: int | None = None
    predicted_kv_capacity_tokens: int | None = None
    gpu_mean_utilization: float | None = None  # NVML, 0..1, mean over the trial's GPUs and its run
    pools: int | None = None  # KV pools (attention-DP ranks x replicas), when the trial recorded them
    hicache: bool = False

    @classmethod
    def of(cls, row: Any) -> "TrialFacts":
        """From a trial row (or a dict with its fields and ``telemetry``)."""
        tel = _get(row, "telemetry") or {}
        flags = dict(_get(row, "flags") or {})
        return cls(
            number=int(_get(row, "trial_number", _get(row, "number", 0))),
            status=TrialStatus(_get(row, "status", TrialStatus.RUNNING)),
            capacity_users=_get(row, "capacity_users"), backend_kind=str(_get(row, "backend_kind", "") or ""),
            is_baseline=bool(_get(row, "is_baseline", False)), launched=bool(_get(row, "launched", True)),
            screened_by_planner=bool(_get(row, "screened_by_planner", False)),
            failure_class=_get(row, "failure_class"), failure_reason=_get(row, "failure_reason"),
            flags=flags, knobs=dict(_get(row, "knobs") or {}),
            measured_kv_capacity_tokens=_get(row, "measured_kv_capacity_tokens"),
            predicted_kv_capacity_tokens=_get(row, "predicted_kv_capacity_tokens"),
            gpu_mean_utilization=_nvml_utilization(tel), pools=_pools(tel, flags),
            hicache=_truthy(flags.get("enable-hierarchical-cache")),
        )


def _truthy(v) -> bool:
    return v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes"))


def _nvml_utilization(tel: dict) -> float | None:
    """Mean NVML utilisation over the trial's GPUs (the sampler's summary), 0..1."""
    summary = (tel.get("close") or {}).get("gpu_summary") or tel.get("gpu") or {}
    values = [g.get("mean_utilization_pct") for k, g in summary.items()
              if k.startswith("gpu") and isinstance(g, dict) and g.get("mean_utilization_pct") is not None]
    return sum(values) / len(values) / 100.0 if values else None


def _pools(tel: dict, flags: dict) -> int | None:
    """KV pools: attention-DP ranks per replica x replicas (from the launch plan, else the flags)."""
    topo = (tel.get("plan") or {}).get("topology") or {}
    attn_dp = topo.get("attn_dp_size") or flags.get("attn-dp-size") or 1
    dp = topo.get("dp_size") or flags.get("dp-size") or 1
    try:
        return max(1, int(attn_dp)) * max(1, int(dp))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StudyContext:
    """The study's targets, capacity search and workload, as the study was started."""

    p90_ttft_slo_s: float
    p90_tpot_slo_s: float
    resolution_users: int = 1
    max_users: int | None = None
    start_users: int | None = None
    workload: WorkloadProfile | None = None
    gpu: str | None = None
    gpus: int | None = None  # GPUs of the study (per node x nodes)
    nodes: int = 1

    @classmethod
    def of_study_row(cls, row: Any) -> "StudyContext":
        """From a ``tuner_studies`` row: its SLO columns and its stored spec (workload, search)."""
        spec = parse_spec(_get(row, "spec_yaml") or "")
        return cls.of_spec(spec, p90_ttft_slo_s=_get(row, "p90_ttft_slo_s"), p90_tpot_slo_s=_get(row, "p90_tpot_slo_s"))

    @classmethod
    def of_spec(cls, spec: StudySpec | None, *, p90_ttft_slo_s: float | None = None,
                p90_tpot_slo_s: float | None = None) -> "StudyContext":
        if spec is None:
            return cls(p90_ttft_slo_s=float(p90_ttft_slo_s or 0), p90_tpot_slo_s=float(p90_tpot_slo_s or 0))
        workload = spec.workload if isinstance(spec.workload, WorkloadProfile) else None
        return cls(
            p90_ttft_slo_s=float(p90_ttft_slo_s if p90_ttft_slo_s is not None else spec.slo.p90_ttft_s),
            p90_tpot_slo_s=float(p90_tpot_slo_s if p90_tpot_slo_s is not None else spec.slo.p90_tpot_s),
            resolution_users=spec.capacity.resolution_users, max_users=spec.capacity.max_users,
            start_users=spec.capacity.start_users, workload=workload, gpu=spec.hardware.gpu,
            gpus=spec.hardware.total_gpus, nodes=spec.hardware.nodes)

    def with_slo(self, p90_ttft_s: float, p90_tpot_s: float) -> "StudyContext":
        return replace(self, p90_ttft_slo_s=p90_ttft_s, p90_tpot_slo_s=p90_tpot_s)


def parse_spec(spec_yaml: str) -> StudySpec | None:
    """The stored study snapshot, or None when it cannot be read (an older or hand-edited row)."""
    try:
        return StudySpec.model_validate(yaml.load(spec_yaml, Loader=_YAML_LOADER) or {})
    except Exception as exc:  # a diagnosis without the workload is still a diagnosis
        log.debug("stored study spec not readable: %s", exc)
        return None
