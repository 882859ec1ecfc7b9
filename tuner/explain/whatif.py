"""What-if without new trials: how many users each trial serves at other targets, read from the
load points it stored.

A trial's stored points are (users, P90 TTFT, P90 TPOT, valid). At targets (X, Y) its capacity
is taken, as the capacity search takes it, to be the largest stored user count that meets both
with every smaller stored point meeting them too; the smallest stored point above that which
misses bounds the answer from above. Nothing is extrapolated: where no stored point above meets
or misses, the answer is "at least"; where the smallest stored point already misses, "fewer than".
A user count measured more than once is decided by its windows together, as the capacity search
decides a confirmed one (``tuner.workload.metrics.pooled_meets``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner import limits as L
from tuner.errors import ConfigError
from tuner.explain.inputs import LoadPoint
from tuner.vocabulary import StrEnum
from tuner.workload.metrics import pooled_meets


class Coverage(StrEnum):
    """How far the stored points answer the question."""

    EXACT = "exact"  # bracketed within the study's resolution (as the capacity search would answer)
    BRACKETED = "bracketed"  # between two stored points further apart than the resolution
    AT_LEAST = "at_least"  # every stored point meets the targets; none above was measured
    FEWER_THAN = "fewer_than"  # the smallest stored point already misses
    NO_POINTS = "no_points"  # the trial stored no load point


@dataclass(frozen=True)
class WhatIf:
    trial: int
    capacity_users: int | None  # the largest stored user count that serves (a lower bound); None: none does
    upper_bound_users: int | None  # the smallest stored user count above it that misses (exclusive bound)
    coverage: Coverage
    text: str
    non_monotone: bool = False  # a stored point above a miss meets the targets again

    @property
    def short(self) -> str:
        """The answer in a few characters: 32, >= 64, 80-95, < 16."""
        c, lo, hi = self.coverage, self.capacity_users, self.upper_bound_users
        if c is Coverage.NO_POINTS:
            return "-"
        if c is Coverage.EXACT:
            return str(lo)
        if c is Coverage.AT_LEAST:
            return f">= {lo}"
        if c is Coverage.FEWER_THAN:
            return f"< {hi}"
        return f"{lo}-{hi - 1}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["coverage"] = self.coverage.value
        d["short"] = self.short
        return d


def what_if(trial: int, points: list[LoadPoint], p90_ttft_s: float, p90_tpot_s: float,
            resolution_users: int = 1) -> WhatIf:
    # one verdict per user count: a repeated count (a marginal verdict measured again) is decided
    # by its windows together, as the capacity search decides it
    windows: dict[int, list[LoadPoint]] = {}
    for p in points:
        windows.setdefault(p.users, []).append(p)
    verdict = {u: pooled_meets(ws, p90_ttft_s, p90_tpot_s) for u, ws in windows.items()}  # one window: its own verdict
    if not verdict:
        return WhatIf(trial, None, None, Coverage.NO_POINTS, "no stored load points")
    users = sorted(verdict)
    lower, upper = None, None
    for u in users:
        if verdict[u]:
            lower = u
        else:
            upper = u
            break
    non_monotone = upper is not None and any(verdict[u] for u in users if u > upper)
    suffix = " (a larger stored point meets them again; the first miss is taken)" if non_monotone else ""
    if lower is None:
        if upper == 1:
            return WhatIf(trial, 0, 1, Coverage.EXACT, "0 users (1 user already misses)" + suffix, non_monotone)
        return WhatIf(trial, None, upper, Coverage.FEWER_THAN,
                      f"fewer than {upper} users (the smallest stored load point misses; nothing below it was measured)"
                      + suffix, non_monotone)
    if upper is None:
        return WhatIf(trial, lower, None, Coverage.AT_LEAST,
                      f"at least {lower} users (every stored load point meets the targets; none above {lower} "
                      "was measured)", non_monotone)
    if upper - lower <= resolution_users:
        return WhatIf(trial, lower, upper, Coverage.EXACT, f"{lower} users ({upper} misses)" + suffix, non_monotone)
    return WhatIf(trial, lower, upper, Coverage.BRACKETED,
                  f"between {lower} and {upper - 1} users (stored points {lower} and {upper}; not measured between)"
                  + suffix, non_monotone)


def best_of(results: list[WhatIf]) -> WhatIf | None:
    """The trial that serves the most at the new targets (by its lower bound)."""
    served = [r for r in results if r.capacity_users is not None]
    if not served:
        return None
    return max(served, key=lambda r: (r.capacity_users, -(r.upper_bound_users or 10**9), -r.trial))


def parse_slo(text: str, default_ttft_s: float, default_tpot_s: float) -> tuple[float, float]:
    """``ttft=10,tpot=0.06`` (seconds; ``ms`` and ``s`` suffixes accepted) -> (P90 TTFT, P90 TPOT).
    A target left out keeps the study's. ConfigError names the key and what is valid."""
    values = {"ttft": default_ttft_s, "tpot": default_tpot_s}
    bounds = {"ttft": L.MAX_SLO_TTFT_S, "tpot": L.MAX_SLO_TPOT_S}
    seen = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, raw = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in values:
            raise ConfigError(f"{part!r}: give targets as ttft=SECONDS,tpot=SECONDS (e.g. ttft=10,tpot=0.06); "
                              "valid keys: ttft, tpot", key="--slo")
        if key in seen:
            raise ConfigError(f"{key} is given twice", key="--slo")
        seen.add(key)
        raw = raw.strip().lower()
        scale = 1.0
        if raw.endswith("ms"):
            raw, scale = raw[:-2], 1e-3
        elif raw.endswith("s"):
            raw = raw[:-1]
        try:
            v = float(raw) * scale
        except ValueError:
            raise ConfigError(f"{key}={raw!r} is not a number of seconds", key="--slo") from None
        if not (0 < v <= bounds[key]):
            raise ConfigError(f"{key} must be more than 0 and at most {bounds[key]:g} s, got {v:g}", key="--slo")
        values[key] = v
    if not seen:
        raise ConfigError("no targets given; e.g. --slo ttft=10,tpot=0.06", key="--slo")
    return values["ttft"], values["tpot"]
