"""Comparison files: the studies ``tuner compare`` sets side by side (``studies/compare-*.yaml``).

    name: compare-glm-5.1
    description: GLM-5.1 on one 8-GPU node: H200 against B200, FP8 against NVFP4.
    studies: [glm-5.1-h200-fp8, glm-5.1-h200-nvfp4, glm-5.1-b200-fp8, glm-5.1-b200-nvfp4]
    gpu_hour_cost: {h200: 3.5, b200: 6.0}    # optional, per GPU-hour (any currency)
    cross_seed: true                         # optional: each study also runs the others' best
    overrides:                               # optional, applied to every study (a quick variant)
      study_suffix: -quick                   # ... stored under NAME-quick, not beside the full study
      trials: 6
      measurement: {warmup_s: 60, duration_s: 240}

A file is a comparison when its top level has ``studies`` (a list) and no ``slo``. Studies are
names (``studies/NAME.yaml``) or paths, found from the file's repository root like a study's search
space (``tuner.config.load.load_comparison``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuner import catalog
from tuner import limits as L
from tuner.errors import ConfigError

MAX_COMPARED_STUDIES = 32
MAX_GPU_HOUR_COST = 1e6
OVERRIDABLE = ("trials", "measurement", "capacity", "backend", "seed")

Cost = L.number(float, 0, MAX_GPU_HOUR_COST, lo_open=True, unit="per GPU-hour")
Suffix = Field(default="", max_length=16, pattern=r"^[A-Za-z0-9._-]*$")


class StudyOverrides(BaseModel):
    """What a comparison may change in every study it runs (window, budget, search, backend)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    study_suffix: str = Suffix
    trials: L.number(int, 1, L.MAX_TRIALS) | None = None
    measurement: dict | None = None
    capacity: dict | None = None
    backend: str | None = None
    seed: L.Seed | None = None

    def study_update(self) -> dict:
        return {k: getattr(self, k) for k in OVERRIDABLE if getattr(self, k) is not None}


class ComparisonSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: L.Name
    description: L.Text = ""
    studies: list[str] = Field(min_length=1, max_length=MAX_COMPARED_STUDIES)
    gpu_hour_cost: dict[str, Cost] = Field(default_factory=dict)
    allow_different_workloads: bool = False
    # also run each study's best configuration on the others (as far as their spaces express it)
    cross_seed: bool = False
    overrides: StudyOverrides = StudyOverrides()
    source_path: str | None = None

    @field_validator("studies")
    @classmethod
    def _names(cls, v):
        for s in v:
            problem = L.text_problem(s, L.MAX_TEXT_CHARS) if isinstance(s, str) else "must be a string"
            if problem or not s:
                raise ValueError(f"{s!r:.80}: {problem or 'must not be empty'}")
        if len(set(v)) != len(v):
            raise ValueError(f"a study is listed twice: {v}")
        return v


def looks_like_comparison(data: dict) -> bool:
    return isinstance(data.get("studies"), list) and "slo" not in data


def check_costs(costs: dict[str, float], *, file: str | None = None, key: str = "--gpu-hour-cost") -> None:
    known = catalog.gpus()
    for gpu in costs:
        if gpu.lower() not in known:
            raise ConfigError(f"unknown GPU {gpu!r} in the costs; valid: {', '.join(sorted(known))}",
                              file=file, key=key)


def parse_costs(text: str | None) -> dict[str, float]:
    """``h200=3.5,b200=6.0`` -> {gpu: cost per GPU-hour}; ConfigError (exit 2) names what is wrong."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        gpu, eq, raw = part.partition("=")
        gpu = gpu.strip().lower()
        if not eq or not gpu:
            raise ConfigError(f"{part!r}: give costs as GPU=COST per GPU-hour, e.g. h200=3.5,b200=6.0",
                              key="--gpu-hour-cost")
        try:
            cost = float(raw)
        except ValueError:
            raise ConfigError(f"{gpu}={raw.strip()!r} is not a number", key="--gpu-hour-cost") from None
        problem = L.check_number(cost, 0, MAX_GPU_HOUR_COST)
        if problem or cost <= 0:
            raise ConfigError(f"{gpu}: a cost per GPU-hour must be more than 0 and at most {MAX_GPU_HOUR_COST:g}, "
                              f"got {raw.strip()}", key="--gpu-hour-cost")
        if gpu in out:
            raise ConfigError(f"{gpu} is given twice", key="--gpu-hour-cost")
        out[gpu] = cost
    check_costs(out)
    return out
