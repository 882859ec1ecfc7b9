"""Capacity search: the largest number of closed-loop users that meets both P90 targets.

Gallop up from the study's start value (multiplying by the growth factor) until a load point
misses the SLO or the maximum is reached, then bisect between the last pass and the first miss to
the study's resolution. A search started from a prediction (``guided``) steps out from it by the
resolution instead, the step growing by the growth factor, so that a right guess is bracketed by
two load points. The search is a small state machine so that the driver can run each step
on a remote worker, record it, report it to Optuna and prune between steps.

With ``confirm_marginal`` a verdict that the window's own sampling noise could turn
(``marginal``: a limit inside the 90% interval of a P90) is measured again at the same user
count, on a later window with other sessions, and the two windows decide together: their P90s
averaged, weighted by their requests (an estimate of the pooled P90 with about half the
variance of one window's). A marginal pass and a marginal miss are treated alike, so the
confirmation does not bias the capacity down (a pass needing two passing windows would).

With ``bisect=interpolate`` the bisection reads how far each end of the bracket is from the SLO
(its binding P90 over its limit, as a log ratio: ``slo_margin``) and probes where a straight line
between the two ends crosses the limit, kept at least the resolution away from both ends so that
a right estimate is bracketed by the next load point. A bracket of at most twice the resolution,
an end without P90s (an invalid window, or steps recorded without metrics), and a probe after three
in a row that moved the same end (the line is bent: regula falsi's slow side) take the midpoint.
Every step inside a bracket shrinks it by at least the resolution, and a search replayed from
verdicts alone is the midpoint search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.vocabulary import Bisection
from tuner.workload.metrics import SPREAD_KEY, LoadPointMetrics, pooled_meets, pooled_p90s, verdict_marginal


def slo_margin(p90s: tuple[float | None, float | None] | None, p90_ttft_s: float, p90_tpot_s: float) -> float | None:
    """How far a load point is from the SLO: the larger of log(P90 / limit) over TTFT and TPOT
    (<= 0 meets, > 0 misses); None without both P90s."""
    if p90s is None or p90s[0] is None or p90s[1] is None or p90s[0] <= 0 or p90s[1] <= 0:
        return None
    return max(math.log(p90s[0] / p90_ttft_s), math.log(p90s[1] / p90_tpot_s))


@dataclass
class CapacitySearch:
    start_users: int
    max_users: int
    resolution_users: int = 2
    growth_factor: float = 2.0
    p90_ttft_s: float = 30.0
    p90_tpot_s: float = 0.05
    min_users: int = 1
    guided: bool = False  # start_users is a prediction: step out from it by resolution_users
    confirm_marginal: bool = False  # decide a marginal verdict with a second window
    bisect: Bisection = Bisection.INTERPOLATE  # how a point inside a bracket is picked (midpoint without P90s)

    best_pass: int = 0  # largest user count seen meeting the SLO
    lowest_fail: int | None = None  # smallest user count seen missing it
    steps: list[tuple[int, bool]] = field(default_factory=list)
    _next: int | None = None
    _confirming: tuple[int, LoadPointMetrics | None] | None = None  # a marginal verdict awaiting its second window
    _margins: dict[int, float] = field(default_factory=dict)  # slo_margin of each decided user count
    _bisect_moves: list[bool] = field(default_factory=list)  # inside a bracket: did each step move its lower end?

    def __post_init__(self):
        self._next = max(self.min_users, min(self.start_users, self.max_users))

    @classmethod
    def for_study(cls, study, predicted_users: int | None = None, bisect: Bisection | None = None) -> "CapacitySearch":
        """The study's search; ``predicted_users`` (a predicted capacity) makes it a guided search from
        there; ``bisect`` overrides the study's bisection."""
        c = study.capacity
        guided = predicted_users is not None
        start = max(1, min(int(predicted_users), c.max_users)) if guided else c.start_users
        return cls(start_users=start, max_users=c.max_users, resolution_users=c.resolution_users,
                   growth_factor=c.growth_factor, p90_ttft_s=study.slo.p90_ttft_s, p90_tpot_s=study.slo.p90_tpot_s,
                   guided=guided, confirm_marginal=c.confirm_marginal, bisect=bisect or Bisection(c.bisect))

    @property
    def done(self) -> bool:
        return self._next is None

    def next_users(self) -> int | None:
        return self._next

    def meets(self, m: LoadPointMetrics) -> bool:
        return m.meets(self.p90_ttft_s, self.p90_tpot_s)

    def marginal(self, m: LoadPointMetrics) -> bool:
        """A verdict its window's own noise could turn (``extra["p90_spread"]``, a 90% interval of
        each P90): a pass whose interval reaches past a limit, or a miss whose every P90 over its
        limit has an interval reaching back under it. False where no spread was recorded."""
        return bool(verdict_marginal(self.meets(m), (m.p90_ttft_s, m.p90_tpot_s), (m.extra or {}).get(SPREAD_KEY),
                                     (self.p90_ttft_s, self.p90_tpot_s), valid=m.valid))

    def pooled_meets(self, a: LoadPointMetrics, b: LoadPointMetrics) -> bool:
        """Both windows of one user count against the SLO (``metrics.pooled_meets``)."""
        return pooled_meets((a, b), self.p90_ttft_s, self.p90_tpot_s)

    def record(self, users: int, passed: bool, *, marginal: bool = False,
               point: LoadPointMetrics | None = None) -> None:
        """One window's verdict. ``point`` (its metrics) lets a confirmation pool the two windows;
        without it the second window decides."""
        self.steps.append((users, passed))
        confirming, self._confirming = self._confirming, None
        windows = (point,) if point is not None else ()
        if confirming is not None and confirming[0] == users:  # the second window of a marginal verdict
            first = confirming[1]
            if first is not None and point is not None:
                passed = self.pooled_meets(first, point)
                windows = (first, point)
            else:
                windows = ()
        elif self.confirm_marginal and marginal:
            self._confirming = (users, point)  # decided with a second window
            self._next = users
            return
        in_bracket = self.best_pass > 0 and self.lowest_fail is not None and self.best_pass < users < self.lowest_fail
        if in_bracket:
            self._bisect_moves.append(passed)
        self._margins.pop(users, None)
        margin = slo_margin(pooled_p90s(windows), self.p90_ttft_s, self.p90_tpot_s) if windows else None
        if margin is not None and (margin <= 0) == passed:  # a verdict its P90s explain (not an invalid window)
            self._margins[users] = margin
        if passed:
            self.best_pass = max(self.best_pass, users)
        else:
            self.lowest_fail = users if self.lowest_fail is None else min(self.lowest_fail, users)
            if self.best_pass >= users:  # passed once, missed now: the lower count is what holds
                self.best_pass = max([u for u, p in self.steps if p and u < users], default=0)
        self._next = self._choose_next()

    def _stride(self, passed: bool) -> int:
        """A guided search's next step: the resolution, grown by the growth factor per step in the same direction."""
        k = len({u for u, p in self.steps if p == passed})  # a confirmed count is one step
        return max(1, int(round(self.resolution_users * self.growth_factor ** (k - 1))))

    def _choose_next(self) -> int | None:
        lo, hi = self.best_pass, self.lowest_fail
        if self.guided and (hi is None or lo == 0):
            return self._step_out(lo, hi)
        if hi is None:  # still galloping up
            if lo >= self.max_users:
                return None
            return min(self.max_users, max(lo + 1, int(round(lo * self.growth_factor))))
        if hi <= self.min_users:
            return None  # even the smallest load misses
        if lo == 0:  # the first step failed: gallop down
            if hi <= self.min_users:
                return None
            nxt = max(self.min_users, int(hi // self.growth_factor))
            if nxt >= hi:
                return None
            if nxt == self.min_users and (self.min_users, False) in self.steps:
                return None
            return nxt
        if hi - lo <= self.resolution_users:
            return None
        return self._inside(lo, hi)

    def _inside(self, lo: int, hi: int) -> int:
        """The next load point inside the bracket (lo passed, hi missed)."""
        mid = (lo + hi) // 2
        res = self.resolution_users
        if self.bisect is not Bisection.INTERPOLATE or hi - lo <= 2 * res:
            return mid
        if len(self._bisect_moves) >= 3 and len(set(self._bisect_moves[-3:])) == 1:
            return mid  # the line keeps landing on one side: halve the bracket instead
        g_lo, g_hi = self._margins.get(lo), self._margins.get(hi)
        if g_lo is None or g_hi is None or not g_lo <= 0 < g_hi:
            return mid
        crossing = lo + (hi - lo) * (-g_lo) / (g_hi - g_lo)
        return min(hi - res, max(lo + res, int(round(crossing))))

    def _step_out(self, lo: int, hi: int | None) -> int | None:
        if hi is None:  # every point so far passed: step up
            if lo >= self.max_users:
                return None
            return min(self.max_users, lo + self._stride(True))
        if hi <= self.min_users:  # every point so far failed, down to the smallest load
            return None
        return max(self.min_users, hi - self._stride(False))

    @property
    def capacity_users(self) -> int:
        return self.best_pass

    def upper_bound(self) -> int:
        """The most this search can still conclude (used for pruning)."""
        return self.max_users if self.lowest_fail is None else self.lowest_fail - 1
