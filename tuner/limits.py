"""The bounds of everything a user writes: numbers, names, free text. No tuner imports here.

Every number in a study, search space or workload has a finite range that is stated once, here,
and appears both in the pydantic schema (JSON schema ``minimum``/``maximum``) and in the error
message a value outside it gets ("must be between 1 and 100000 (got 1000000000000)"). The ranges
are wide enough for any real deployment and narrow enough that no value can hang a study, run it
out of memory or overflow a type.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

# ---- ranges (units in the names) ------------------------------------------------------------
MAX_USERS = 100_000  # closed-loop users of one load point: each is a task with its own session
MAX_TRIALS = 100_000
MAX_SEED = 2**32 - 1  # numpy and Optuna seed range
MAX_WINDOW_S = 86_400.0  # warm-up, measurement window, request timeout: one day
MAX_SLO_TTFT_S = 3_600.0
MAX_SLO_TPOT_S = 60.0
MIN_GROWTH_FACTOR = 1.1  # capacity search gallops by at least this factor per step (few load points) ...
MAX_GROWTH_FACTOR = 16.0  # ... and at most this one
MAX_TIME_SCALE = 1_000.0
MIN_TIME_SCALE = 1e-6
MAX_GPUS_PER_NODE = 64
MAX_NODES = 1_024
MAX_HOST_MEMORY_GB = 1_048_576.0  # 1 PiB
MAX_TOKENS = 16_777_216  # 2**24: the longest context any catalog model has is far below this
MAX_LOGNORMAL_MU = 25.0  # exp(25) ~ 7e10: beyond any token count or think time
MAX_LOGNORMAL_SIGMA = 10.0
MAX_LOGNORMAL_BOUND = 1e12
MAX_WORKLOAD_SCALE = 1_000.0
MAX_KNOB_NUMBER = 2**31 - 1  # numbers in a search space: SGLang's integer flags are C ints
MAX_GRID_POINTS_PER_PARAM = 10_000  # a stepped range may not expand to more values than this
MAX_VALUES_PER_PARAM = 1_000
MAX_PARAMS = 64
MAX_CONSTRAINTS = 64

# ---- names and text -------------------------------------------------------------------------
MAX_NAME_CHARS = 64
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_NAME_RE = re.compile(NAME_PATTERN)
MAX_TEXT_CHARS = 4_096  # descriptions, help texts, model paths
MAX_SHORT_TEXT_CHARS = 256  # string values of knobs
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # everything but \t and \n

NAME_RULE = (f"letters, digits, '-', '_' and '.', starting with a letter or digit, at most {MAX_NAME_CHARS} "
             "characters, no '..'")


def name_problem(value: Any) -> str | None:
    """Why ``value`` is not a valid name (study, search space, workload, knob), or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_NAME_CHARS:
        return f"is {len(value)} characters long; at most {MAX_NAME_CHARS}"
    if _CONTROL_RE.search(value):
        return "contains control characters"
    if "/" in value or "\\" in value:
        return "contains a path separator"
    if ".." in value:
        return "contains '..'"
    if not _NAME_RE.fullmatch(value):  # match() would let a trailing newline through ($)
        bad = sorted({c for c in value if not (c.isascii() and (c.isalnum() or c in "._-"))})
        if bad:
            return f"contains {', '.join(repr(c) for c in bad)}"
        return "must start with a letter or a digit"
    return None


def check_name(value):
    problem = name_problem(value)
    if problem:
        raise ValueError(f"invalid name: {problem}; a name has {NAME_RULE}")
    return value


def text_check(limit: int):
    def check(value):
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        if len(value) > limit:
            raise ValueError(f"is {len(value)} characters long; at most {limit}")
        if _CONTROL_RE.search(value):
            raise ValueError("contains control characters (only tab and newline are allowed)")
        return value

    return check


#: A name: study, search space, workload profile. Used in file and directory names.
Name = Annotated[str, BeforeValidator(check_name),
                 Field(max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN)]
#: Free text shown to people (descriptions, help).
Text = Annotated[str, BeforeValidator(text_check(MAX_TEXT_CHARS)), Field(max_length=MAX_TEXT_CHARS)]


def text_problem(value: Any, limit: int = MAX_SHORT_TEXT_CHARS) -> str | None:
    try:
        text_check(limit)(value)
    except ValueError as exc:
        return str(exc)
    return None


def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    return f"{x:,}".replace(",", "") if isinstance(x, int) else f"{x:g}"


def range_text(lo: float, hi: float, *, lo_open: bool = False, unit: str = "") -> str:
    u = f" {unit}" if unit else ""
    if lo_open:
        return f"greater than {_fmt(lo)} and at most {_fmt(hi)}{u}"
    return f"between {_fmt(lo)} and {_fmt(hi)}{u}"


def _number_check(kind: type, lo: float, hi: float, lo_open: bool, unit: str):
    what = "an integer" if kind is int else "a finite number"
    rng = range_text(lo, hi, lo_open=lo_open, unit=unit)

    def before(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be {what} {rng}, not {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be {what} {rng}")
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"must be {what} {rng}")
        return value

    def after(value):
        if (value <= lo if lo_open else value < lo) or value > hi:
            raise ValueError(f"must be {rng}")
        return value

    return before, after


def number(kind: type, lo: float, hi: float, *, lo_open: bool = False, unit: str = "", description: str = ""):
    """An int or float field limited to [lo, hi] (or (lo, hi]); bools, strings, NaN and infinities
    are refused, with the whole range in the message."""
    before, after = _number_check(kind, lo, hi, lo_open, unit)
    bounds = {"exclusiveMinimum" if lo_open else "minimum": lo, "maximum": hi}
    return Annotated[kind, BeforeValidator(before), AfterValidator(after),
                     Field(json_schema_extra=bounds, description=description or None)]


def check_number(value: Any, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False,
                 unit: str = "") -> str | None:
    """Why ``value`` is outside [lo, hi] (for values checked outside a pydantic field), or None."""
    before, after = _number_check(int if integer else float, lo, hi, lo_open, unit)
    try:
        after(before(value))
    except ValueError as exc:
        return str(exc)
    return None


Users = number(int, 1, MAX_USERS, unit="users")
Seed = number(int, 0, MAX_SEED)
WindowSeconds = number(float, 0, MAX_WINDOW_S, lo_open=True, unit="s")
