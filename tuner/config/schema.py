"""Study and search-space specifications (the YAML users edit), validated with pydantic v2.

Every model forbids unknown keys; ``tuner.config.load`` turns pydantic's errors into messages that
name the file and the key path, with a did-you-mean for misspelt keys.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.config import expr
from tuner.vocabulary import AUTO_BACKEND, BackendKind, Engine, Sampler, literal
from tuner.workload.session import WorkloadProfile


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamSpec(_Strict):
    """One knob: a list of ``values`` (None = leave SGLang's default) or a numeric range."""

    values: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    condition: str | None = Field(default=None, description="only sampled when this holds")
    help: str = ""

    @model_validator(mode="after")
    def _shape(self):
        if self.values is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either 'values' or 'low'/'high', not both")
            if len(self.values) == 0:
                raise ValueError("'values' is empty: list at least one value")
            if len(set(map(repr, self.values))) != len(self.values):
                raise ValueError(f"'values' has duplicates: {self.values}")
        else:
            if self.low is None or self.high is None:
                raise ValueError("give 'values' (a list) or both 'low' and 'high'")
            if not (math.isfinite(self.low) and math.isfinite(self.high)):
                raise ValueError(f"low and high must be finite numbers, got {self.low} and {self.high}")
            if self.low > self.high:
                raise ValueError(f"empty range: low ({self.low}) > high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log range needs low > 0")
            if self.step is not None and self.step <= 0:
                raise ValueError("step must be > 0")
        if self.condition is not None:
            try:
                expr.parse(self.condition)
            except expr.ExpressionError as exc:
                raise ValueError(str(exc)) from None
        return self

    @property
    def is_int_range(self) -> bool:
        return (self.values is None and float(self.low).is_integer() and float(self.high).is_integer()
                and (self.step is None or float(self.step).is_integer()))

    def grid(self, max_points: int = 16) -> list[Any]:
        """Finite list of the values this parameter can take (ranges discretised by step)."""
        if self.values is not None:
            return list(self.values)
        import numpy as np

        if self.step:
            pts = list(np.arange(self.low, self.high + self.step / 2, self.step))
        elif self.log:
            pts = list(np.geomspace(self.low, self.high, max_points))
        else:
            pts = list(np.linspace(self.low, self.high, max_points))
        if self.is_int_range:
            return sorted({int(round(p)) for p in pts})
        return [round(float(p), 6) for p in pts]


class SearchSpaceSpec(_Strict):
    name: str = ""
    description: str = ""
    engine: literal(Engine) = Engine.SGLANG.value
    params: dict[str, ParamSpec]
    constraints: list[str] = Field(default_factory=list, description="must all hold for a configuration to run")

    @field_validator("params")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("no parameters: name at least one knob")
        return v

    @field_validator("constraints")
    @classmethod
    def _parse_constraints(cls, v):
        for c in v:
            try:
                expr.parse(c)
            except expr.ExpressionError as exc:
                raise ValueError(str(exc)) from None
        return v


class HardwareSpec(_Strict):
    gpu: str = Field(description="catalog GPU name: h100, h200, b200, rtx-pro-6000 (or 'cpu' for CPU engines)")
    gpus_per_node: int = Field(default=8, ge=0, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)
    host_memory_gb: float = Field(default=2048, gt=0)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


class SLOSpec(_Strict):
    p90_ttft_s: float = Field(gt=0, description="P90 time to first token, seconds")
    p90_tpot_s: float = Field(gt=0, description="P90 time per output token, seconds")


class CapacitySpec(_Strict):
    """How the largest user count within the SLO is searched: gallop up, then bisect."""

    start_users: int = Field(default=8, ge=1)
    max_users: int = Field(default=512, ge=1)
    resolution_users: int = Field(default=2, ge=1, description="bisection stops when the bracket is this narrow")
    growth_factor: float = Field(default=2.0, gt=1.0)

    @model_validator(mode="after")
    def _order(self):
        if self.start_users > self.max_users:
            raise ValueError(f"start_users ({self.start_users}) > max_users ({self.max_users})")
        return self


class MeasurementSpec(_Strict):
    warmup_s: float = Field(default=120, ge=0)
    duration_s: float = Field(default=600, gt=0)
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    time_scale: float = Field(default=1.0, gt=0, description="multiplies think times (tests and dry runs)")
    request_timeout_s: float = Field(default=600, gt=0)


class StudySpec(_Strict):
    name: str
    description: str = ""
    model: str = Field(description="catalog model name, or for the transformers engine a local model dir")
    hardware: HardwareSpec
    workload: str | WorkloadProfile = Field(description="profile name (workloads/NAME.yaml, built-in) or inline")
    search_space: str | SearchSpaceSpec = Field(description="search_spaces/NAME.yaml, a path, or inline")
    slo: SLOSpec
    target_users: int = Field(default=50, ge=1)
    capacity: CapacitySpec = CapacitySpec()
    measurement: MeasurementSpec = MeasurementSpec()
    baseline: dict[str, Any] = Field(default_factory=dict, description="flags of trial 0 (SGLang defaults + these)")
    trials: int = Field(default=30, ge=1)
    sampler: literal(Sampler) = Sampler.DEFAULT.value
    backend: literal(BackendKind, AUTO_BACKEND) = AUTO_BACKEND
    backend_options: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    # filled in by the loader: the resolved profile and search space, and where they came from
    source_path: str | None = None

    def workload_profile(self) -> WorkloadProfile:
        if not isinstance(self.workload, WorkloadProfile):
            raise RuntimeError("study workload was not resolved; load it with tuner.config.load.load_study")
        return self.workload

    def space(self) -> SearchSpaceSpec:
        if not isinstance(self.search_space, SearchSpaceSpec):
            raise RuntimeError("study search space was not resolved; load it with tuner.config.load.load_study")
        return self.search_space
