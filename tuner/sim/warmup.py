"""Stalls of a freshly started server: what its first seconds of traffic cost beyond the step times.

Real SGLang servers (0.5.17, Triton attention and MoE, eager prefill, on the H200) stall a few
times in their first tens of seconds of traffic, for most of a second each, and then rarely:
measured from their own step logs by ``tuner calibration fit`` (``tuner.sim.stepfit.warmup_stalls``),
most likely kernels compiled on their first use by a new batch shape (UNVERIFIED: the log does not
say). The calibration key ``fresh_server_stalls`` holds the measured statistics::

    fresh_server_stalls:
      per_start: 4.1     # stalls per server start (expected, all of them)
      stall_s: 0.86      # mean length of one
      decay_s: 14.0      # their rate decays as exp(-t / decay_s) from the first traffic

The simulator places them deterministically (the same load point always simulates the same) at
the quantiles of that decaying rate, and a stall lands on the first prefill step that starts at
or after its time: the whole server waits (running requests do not decode, the prefill's requests
get their first token later, new arrivals queue). Only a deployment's first load point is
simulated on a fresh server; where its warm-up outlasts the stalls they fall before the window and
change nothing that is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.errors import ConfigError

KEY = "fresh_server_stalls"


@dataclass(frozen=True)
class StallModel:
    per_start: float  # expected stalls per server start
    stall_s: float  # mean length of one stall
    decay_s: float  # time constant of the decaying stall rate, from the first traffic

    @classmethod
    def from_calibration(cls, cal: dict) -> "StallModel | None":
        """The calibration's ``fresh_server_stalls`` (None when absent or zero)."""
        doc = cal.get(KEY)
        if not doc:
            return None
        if not isinstance(doc, dict):
            raise ConfigError("must be a mapping {per_start, stall_s, decay_s}", key=KEY)
        try:
            per_start, stall_s, decay_s = (float(doc[k]) for k in ("per_start", "stall_s", "decay_s"))
        except (KeyError, TypeError, ValueError):
            raise ConfigError("needs numbers per_start, stall_s and decay_s", key=KEY) from None
        if per_start < 0 or stall_s < 0 or decay_s <= 0:
            raise ConfigError(f"per_start and stall_s must be >= 0 and decay_s > 0, got {doc}", key=KEY)
        if per_start == 0 or stall_s == 0:
            return None
        return cls(per_start, stall_s, decay_s)

    def expected_after(self, t_s: float) -> float:
        """Expected stalls after ``t_s`` seconds of traffic."""
        return self.per_start * math.exp(-max(0.0, t_s) / self.decay_s)

    def schedule(self) -> list[tuple[float, float]]:
        """(time after the first traffic, length) of each stall: ``round(per_start)`` stalls
        sharing the expected stall time, at the quantiles (i - 1/2) / n of the decaying rate."""
        n = round(self.per_start)
        if n < 1:
            return []
        length = self.per_start * self.stall_s / n
        return [(-self.decay_s * math.log(1.0 - (i + 0.5) / n), length) for i in range(n)]


def stall_schedule(cal: dict, fresh_server: bool) -> list[tuple[float, float]]:
    """The stalls a load point's server goes through: none unless it is fresh."""
    model = StallModel.from_calibration(cal) if fresh_server else None
    return model.schedule() if model else []


def fit_decay_s(times_s: list[float], horizon_s: float) -> float:
    """Maximum-likelihood time constant of an exponentially decaying rate from event times seen
    over ``[0, horizon_s]`` (a truncated exponential); ``horizon_s`` when the times do not decay."""
    times = [t for t in times_s if 0 <= t <= horizon_s]
    if not times:
        return horizon_s
    mean = sum(times) / len(times)
    if mean >= horizon_s / 2:  # no decay seen: uniform or rising
        return horizon_s

    def mean_of(tau: float) -> float:  # mean of the exponential truncated at the horizon
        x = horizon_s / tau
        return tau - horizon_s / math.expm1(x) if x < 700 else tau

    lo, hi = 1e-3 * horizon_s, 1e3 * horizon_s
    for _ in range(200):  # the truncated mean rises with tau: bisect on log tau
        mid = math.sqrt(lo * hi)
        if mean_of(mid) < mean:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


__all__ = ["KEY", "StallModel", "fit_decay_s", "stall_schedule"]
