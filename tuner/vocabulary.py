"""The names tuner's files and commands accept, each vocabulary listed once.

The study schema's ``Literal`` fields and the CLI's ``click.Choice`` options are built from these
enums (``literal`` and ``names``), and the registries that map a name to code
(``tuner.evaluation.registry`` for backend kinds, ``tuner.study.samplers`` for samplers) are keyed
by them; tests check that every name has its code and no code has a name missing here.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

try:
    from enum import StrEnum
except ImportError:  # Python 3.10
    class StrEnum(str, enum.Enum):
        """A string-valued enum: compares, formats and serialises as its value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class BackendKind(StrEnum):
    """Where a trial runs."""

    SIMULATOR = "simulator"  # the serving simulator, in-process, no GPU
    SGLANG = "sglang"  # real SGLang servers on the GPUs Ray assigns
    TRANSFORMERS = "transformers"  # `transformers serve` (small models, CPU or GPU)
    SERVE_SIM = "serve-sim"  # `tuner serve-sim` servers: the live path, timed by the simulator


AUTO_BACKEND = "auto"  # not a kind: resolved to one by tuner.evaluation.registry.resolve_auto


class Sampler(StrEnum):
    """How the next configuration is chosen (tuner.study.samplers)."""

    DEFAULT = "default"  # planner-ranked first trials, then multivariate TPE with constraints
    TPE = "tpe"
    RANDOM = "random"
    GP = "gp"
    GRID = "grid"  # every configuration of the space, in order


class CapacityStart(StrEnum):
    """Where a trial's capacity search takes its first load point (tuner.evaluation.capacity)."""

    START_USERS = "start_users"  # the study's capacity.start_users, galloping by growth_factor
    SIMULATOR = "simulator"  # the simulator's predicted capacity of that configuration, stepping out by resolution


class Bisection(StrEnum):
    """How a capacity search picks the next load point inside a bracket (tuner.evaluation.capacity)."""

    MIDPOINT = "midpoint"  # halfway between the last pass and the first miss
    INTERPOLATE = "interpolate"  # where the P90s of the bracket's ends say the SLO is crossed


class RouterPolicy(StrEnum):
    """sglang_router policies tuner can put in front of data-parallel ranks or replicas."""

    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"


class Engine(StrEnum):
    """The server a search space's knobs belong to."""

    SGLANG = "sglang"
    TRANSFORMERS = "transformers"


class LoadFormat(StrEnum):
    """How an SGLang server gets its weights (``backend_options.load_format``)."""

    AUTO = "auto"  # the checkpoint's own weights
    DUMMY = "dummy"  # random values of the model's shapes, from its config.json (nothing downloaded)


def names(vocabulary: type[enum.Enum], *extra: str) -> tuple[str, ...]:
    """The accepted spellings, in declaration order (``extra`` first, e.g. "auto")."""
    return (*extra, *(m.value for m in vocabulary))


def literal(vocabulary: type[enum.Enum], *extra: str) -> Any:
    """``Literal[...]`` of the accepted spellings, for pydantic fields."""
    return Literal[names(vocabulary, *extra)]  # type: ignore[valid-type]


__all__ = ["AUTO_BACKEND", "BackendKind", "CapacityStart", "Engine", "RouterPolicy", "Sampler", "StrEnum", "literal", "names"]
