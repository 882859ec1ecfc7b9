"""Study and search-space specifications (the YAML users edit), validated with pydantic v2.

Every model forbids unknown keys; ``tuner.config.load`` turns pydantic's errors into messages that
name the file and the key path, with a did-you-mean for misspelt keys.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from tuner import limits as L
from tuner.catalog.hf import ModelRef
from tuner.config import expr
from tuner.vocabulary import AUTO_BACKEND, BackendKind, Bisection, CapacityStart, Engine, Sampler, literal
from tuner.workload.session import WorkloadProfile

ModelName = Annotated[str, BeforeValidator(L.text_check(L.MAX_TEXT_CHARS)), Field(min_length=1)]
KnobNumber = L.number(float, -L.MAX_KNOB_NUMBER, L.MAX_KNOB_NUMBER)
GpusPerNode = L.number(int, 0, L.MAX_GPUS_PER_NODE)
Nodes = L.number(int, 1, L.MAX_NODES)
HostMemoryGB = L.number(float, 0, L.MAX_HOST_MEMORY_GB, lo_open=True, unit="GB")
TtftSeconds = L.number(float, 0, L.MAX_SLO_TTFT_S, lo_open=True, unit="s", description="P90 time to first token")
TpotSeconds = L.number(float, 0, L.MAX_SLO_TPOT_S, lo_open=True, unit="s", description="P90 time per output token")
ResolutionUsers = L.number(int, 1, L.MAX_USERS, unit="users",
                           description="bisection stops when the bracket is this narrow")
GrowthFactor = L.number(float, L.MIN_GROWTH_FACTOR, L.MAX_GROWTH_FACTOR)
WarmupSeconds = L.number(float, 0, L.MAX_WINDOW_S, unit="s")
Fraction = L.number(float, 0, 1)
TimeScale = L.number(float, L.MIN_TIME_SCALE, L.MAX_TIME_SCALE,
                     description="multiplies think times (tests and dry runs)")
Trials = L.number(int, 1, L.MAX_TRIALS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


KNOB_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"  # a flag name: becomes --NAME and a variable NAME_WITH_UNDERSCORES
_KNOB_NAME_RE = re.compile(KNOB_NAME_PATTERN)
_PRIMITIVES = (type(None), bool, int, float, str)


def knob_name_problem(name) -> str | None:
    if not isinstance(name, str) or not name:
        return "a knob name must be a non-empty string"
    if len(name) > L.MAX_NAME_CHARS:
        return f"a knob name has at most {L.MAX_NAME_CHARS} characters (this one has {len(name)})"
    if not _KNOB_NAME_RE.match(name):
        return "a knob name has letters, digits, '-' and '_', starting with a letter"
    return None


def value_problem(v) -> str | None:
    """Why ``v`` cannot be a knob value (Optuna stores None, bools, numbers and short strings)."""
    if not isinstance(v, _PRIMITIVES):
        return f"a value must be null, true/false, a number or a string, not {type(v).__name__}"
    if isinstance(v, str):
        return L.text_problem(v, L.MAX_SHORT_TEXT_CHARS)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return L.check_number(v, -L.MAX_KNOB_NUMBER, L.MAX_KNOB_NUMBER)
    return None


def _knob_value(v):
    problem = value_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _expression(v):
    try:
        expr.parse(v)
    except expr.ExpressionError as exc:
        raise ValueError(str(exc)) from None
    return v


#: one entry of ``values``: null, a bool, a bounded number or a short string
KnobValue = Annotated[Any, BeforeValidator(_knob_value)]
#: a condition or constraint (tuner.config.expr), parsed with its length, depth and cost limits
Expression = Annotated[str, AfterValidator(_expression), Field(json_schema_extra={"maxLength": expr.MAX_CHARS})]


class ParamSpec(_Strict):
    """One knob: a list of ``values`` (None = leave SGLang's default) or a numeric range."""

    values: list[KnobValue] | None = Field(default=None, max_length=L.MAX_VALUES_PER_PARAM)
    low: KnobNumber | None = None
    high: KnobNumber | None = None
    step: KnobNumber | None = None
    log: bool = False
    condition: Expression | None = Field(default=None, description="only sampled when this holds")
    help: L.Text = ""

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
            if self.low > self.high:
                raise ValueError(f"empty range: low ({self.low}) > high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log range needs low > 0")
            if self.step is not None:
                if self.step <= 0:
                    raise ValueError("step must be > 0")
                points = (self.high - self.low) / self.step + 1
                if points > L.MAX_GRID_POINTS_PER_PARAM:
                    raise ValueError(f"step {self.step:g} divides [{self.low:g}, {self.high:g}] into {points:,.0f} "
                                     f"values; at most {L.MAX_GRID_POINTS_PER_PARAM:,} (use a larger step)")
        return self

    @property
    def is_int_range(self) -> bool:
        return (self.values is None and float(self.low).is_integer() and float(self.high).is_integer()
                and (self.step is None or float(self.step).is_integer()))

    def grid(self, max_points: int = 16) -> list[Any]:
        """Finite list of the values this parameter can take (ranges discretised by step)."""
        if self.values is not None:
            return list(self.values)
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
    name: str = Field(default="", max_length=L.MAX_NAME_CHARS, pattern=L.NAME_PATTERN)
    description: L.Text = ""
    engine: literal(Engine) = Engine.SGLANG.value
    params: dict[str, ParamSpec] = Field(max_length=L.MAX_PARAMS)
    constraints: list[Expression] = Field(default_factory=list, max_length=L.MAX_CONSTRAINTS,
                                          description="must all hold for a configuration to run")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v):
        return L.check_name(v)

    @field_validator("params", mode="before")
    @classmethod
    def _knob_names(cls, v):
        if isinstance(v, dict):
            seen: dict[str, str] = {}
            for name in v:
                problem = knob_name_problem(name)
                if problem:
                    raise ValueError(f"{name!r:.80}: {problem}")
                var = expr.var_name(name)
                if var in seen:
                    raise ValueError(f"{seen[var]!r} and {name!r} are the same name in expressions ({var})")
                seen[var] = name
        return v

    @field_validator("params")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("no parameters: name at least one knob")
        return v


class HardwareSpec(_Strict):
    gpu: L.Name = Field(description="catalog GPU name: h100, h200, b200, rtx-pro-6000 (or 'cpu' for CPU engines)")
    gpus_per_node: GpusPerNode = 8
    nodes: Nodes = 1
    host_memory_gb: HostMemoryGB = 2048

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


class SLOSpec(_Strict):
    p90_ttft_s: TtftSeconds
    p90_tpot_s: TpotSeconds


class CapacitySpec(_Strict):
    """How the largest user count within the SLO is searched: gallop up, then bisect.

    ``start: simulator`` starts each trial at the simulator's predicted capacity of that
    configuration and steps out from it by ``resolution_users`` (the step growing by
    ``growth_factor``): a good prediction finishes the search in two load points. Where the
    simulator cannot predict, the trial starts at ``start_users``."""

    start_users: L.Users = 8
    max_users: L.Users = 512
    resolution_users: ResolutionUsers = 2
    growth_factor: GrowthFactor = 2.0
    start: literal(CapacityStart) = CapacityStart.START_USERS.value
    # a verdict whose P90 interval (order statistics of the window's requests) holds a limit, pass
    # or miss, is measured once more at the same user count and decided by both windows together
    confirm_marginal: bool = False
    # inside a bracket: the midpoint, or where the bracket ends' P90s put the SLO's crossing
    bisect: literal(Bisection) = Bisection.INTERPOLATE.value

    @model_validator(mode="after")
    def _order(self):
        if self.start_users > self.max_users:
            raise ValueError(f"start_users ({self.start_users}) > max_users ({self.max_users})")
        return self


class MeasurementSpec(_Strict):
    warmup_s: WarmupSeconds = 120
    # a fresh server's first load point warms up this long instead (None: warmup_s). Real SGLang
    # stalls in its first ~35 s of traffic while it compiles and tunes kernels for new shapes.
    first_warmup_s: WarmupSeconds | None = None
    # before a fresh server's first load point, one prompt per fused-MoE tile-config variant
    # (tuner/workload/kernel_warmup.py): the kernels SGLang compiles on first use are built before
    # the warm-up and window, so the first load point measures a server like the later ones
    kernel_warmup: bool = False
    duration_s: L.WindowSeconds = 600
    max_error_rate: Fraction = 0.05
    time_scale: TimeScale = 1.0
    request_timeout_s: L.WindowSeconds = 600

    def warmup_for(self, load_point_index: int) -> float:
        """The warm-up of a deployment's ``load_point_index``-th load point (0: its first)."""
        if load_point_index == 0 and self.first_warmup_s is not None:
            return max(float(self.warmup_s), float(self.first_warmup_s))
        return float(self.warmup_s)

    def fresh_kernels(self, load_point_index: int) -> bool:
        """Whether this load point meets kernels its server has not run yet (its first one, without
        the kernel warm-up): where the simulator applies the fresh-server stalls."""
        return load_point_index == 0 and not self.kernel_warmup


def _check_flag_mapping(v, what: str):
    """``baseline`` flags: knob names and primitive values (types per knob are checked by the loader)."""
    if isinstance(v, dict):
        if len(v) > L.MAX_PARAMS:
            raise ValueError(f"{len(v)} {what}; at most {L.MAX_PARAMS}")
        for name, value in v.items():
            problem = knob_name_problem(name) or value_problem(value)
            if problem:
                raise ValueError(f"{name!r:.80}: {problem}")
    return v


class StudySpec(_Strict):
    name: L.Name
    description: L.Text = ""
    model: ModelName | ModelRef = Field(description="catalog model name, a directory holding a config.json, or "
                                                    "{name: <either>, overrides: {config.json key: value}}; for "
                                                    "the transformers engine a local model dir")
    hardware: HardwareSpec
    workload: str | WorkloadProfile = Field(description="profile name (workloads/NAME.yaml, built-in) or inline")
    search_space: str | SearchSpaceSpec = Field(description="search_spaces/NAME.yaml, a path, or inline")
    slo: SLOSpec
    target_users: L.Users = 50
    capacity: CapacitySpec = CapacitySpec()
    measurement: MeasurementSpec = MeasurementSpec()
    baseline: dict[str, Any] = Field(default_factory=dict, description="flags of trial 0 (SGLang defaults + these)")
    trials: Trials = 30
    sampler: literal(Sampler) = Sampler.DEFAULT.value
    backend: literal(BackendKind, AUTO_BACKEND) = AUTO_BACKEND
    backend_options: dict[str, Any] = Field(default_factory=dict)
    seed: L.Seed = 0
    # filled in by the loader: the resolved profile and search space, and where they came from
    source_path: str | None = None

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline(cls, v):
        return _check_flag_mapping(v, "baseline flags")

    def workload_profile(self) -> WorkloadProfile:
        if not isinstance(self.workload, WorkloadProfile):
            raise RuntimeError("study workload was not resolved; load it with tuner.config.load.load_study")
        return self.workload

    def space(self) -> SearchSpaceSpec:
        if not isinstance(self.search_space, SearchSpaceSpec):
            raise RuntimeError("study search space was not resolved; load it with tuner.config.load.load_study")
        return self.search_space
