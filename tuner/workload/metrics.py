"""Per-request records and their aggregation into one load point's metrics.

Both the real replay client and the simulator produce ``RequestRecord``s and aggregate them here,
so a measurement from either backend has exactly the same shape.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np


# where a real load point's ``extra`` keeps the simulator's prediction of it (the ledger of trust)
PREDICTION_KEY = "simulator_prediction"
# ... and what its server found in its Triton cache (``tuner.evaluation.kernel_ledger``): the kernel set,
# and under "cached" the token counts whose kernels earlier servers of that set had built there
KERNEL_CACHE_KEY = "kernel_cache"


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times are seconds on the client's clock."""

    session_id: int
    turn: int
    start_s: float
    input_tokens: int
    output_tokens: int  # tokens actually received
    ttft_s: float | None  # None when the request failed before its first token
    end_s: float | None
    itl_s: tuple[float, ...] = ()  # gaps between consecutive tokens / chunks
    cached_tokens: int | None = None  # prefix tokens the server reported as cached
    error: str | None = None
    # leading tokens of the prompt this client sent before (the session's previous turn, or the
    # shared system prefix): what an unlimited prefix cache would have served
    reusable_tokens: int | None = None
    # started before the window and still waiting for its first token when the window opened
    # (counted_in_window): in the latencies and errors, not in the throughput
    carried_in: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None and self.end_s is not None

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (n - 1), as SGLang's bench_serving defines it."""
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LoadPointMetrics:
    """What one measurement at a fixed number of closed-loop users found."""

    users: int
    requests: int  # completed + failed, inside the measurement window
    errors: int
    duration_s: float
    p50_ttft_s: float | None
    p90_ttft_s: float | None
    p99_ttft_s: float | None
    p50_tpot_s: float | None
    p90_tpot_s: float | None
    p99_tpot_s: float | None
    p50_itl_s: float | None
    p90_itl_s: float | None
    p99_itl_s: float | None
    p90_e2e_s: float | None
    throughput_tokens_per_s: float  # output tokens per second
    input_throughput_tokens_per_s: float
    prefix_cache_hit_rate: float | None  # cached input tokens / input tokens
    kv_capacity_tokens_total: int | None = None
    valid: bool = True
    invalid_reason: str | None = None
    extra: dict = field(default_factory=dict)  # backend-specific (e.g. evictions, client_bound)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def meets(self, p90_ttft_s: float, p90_tpot_s: float) -> bool:
        if not self.valid or self.p90_ttft_s is None or self.p90_tpot_s is None:
            return False
        return self.p90_ttft_s <= p90_ttft_s and self.p90_tpot_s <= p90_tpot_s

    def to_dict(self) -> dict:
        return asdict(self)


def counted_in_window(start_s: float, waited_until_s: float | None, window: tuple[float, float]) -> bool:
    """Whether a request belongs to the measurement window [lo, hi): it started in it, or it started
    before and was still waiting for its first token when the window opened. ``waited_until_s``:
    its first token, else when it failed, else None (still waiting). Counting starts alone leaves
    out the requests a scheduler starves from the warm-up on (SGLang's ``lpm`` serves the longest
    cached prefixes first), and a window whose slowest requests are missing looks fast."""
    lo, hi = window
    if lo <= start_s < hi:
        return True
    return start_s < lo and (waited_until_s is None or waited_until_s >= lo)


def _pct(values, q: float) -> float | None:
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


SPREAD_KEY = "p90_spread"  # extra: a 90% interval of the window's P90
SPREAD_Z = 1.645  # two-sided 90%


def p90_spread(values) -> tuple[float, float] | None:
    """Sampling spread of a window's P90: the distribution-free 90% interval of a quantile from
    order statistics (the ranks n·0.9 ± 1.645·sqrt(n·0.9·0.1) of the sorted values, the normal
    approximation of the binomial count of requests below it). Requests of one session are
    correlated, so the real spread is at least this wide; with ~100 requests a P90 rests on its
    ~10 slowest, and the interval spans ranks 85 to 95."""
    n = len(values)
    if n < 10:
        return None
    data = np.sort(np.asarray(values, dtype=float))
    centre, half = 0.9 * n, SPREAD_Z * math.sqrt(n * 0.9 * 0.1)
    lo = max(0, math.floor(centre - half) - 1)
    hi = min(n - 1, math.ceil(centre + half))
    return float(data[lo]), float(data[hi])


def verdict_marginal(meets: bool, p90s: tuple[float | None, float | None], spread: dict | None,
                     limits: tuple[float, float], *, valid: bool = True) -> bool | None:
    """Whether a window's SLO verdict is one its own sampling noise could turn: a pass whose P90
    interval (``p90_spread``) reaches past a limit, or a miss whose every P90 over its limit has an
    interval reaching back under it. ``p90s`` and ``limits``: (TTFT, TPOT) in s; ``spread``: the
    window's ``extra["p90_spread"]``. None where no interval was recorded (nothing is known)."""
    spread = spread or {}
    intervals = (spread.get("ttft_s"), spread.get("tpot_s"))
    if not any(intervals):
        return None
    if meets:
        return any(iv and iv[1] > limit for iv, limit in zip(intervals, limits))
    over = [(limit, iv) for value, limit, iv in zip(p90s, limits, intervals) if value is not None and value > limit]
    return bool(valid and over and all(iv and iv[0] <= limit for limit, iv in over))


def pooled_p90s(windows) -> tuple[float, float] | None:
    """(P90 TTFT, P90 TPOT) of several windows measured at one user count: each P90 averaged over
    the windows, weighted by their requests (an estimate of the pooled P90 with less variance than
    any one window's); one window gives its own. None where a window is invalid or lacks a P90.
    ``windows``: objects with ``valid``, ``requests``, ``p90_ttft_s`` and ``p90_tpot_s`` (a
    ``LoadPointMetrics``, a stored point or measurement row)."""
    windows = list(windows)
    if not windows or not all(w.valid and w.p90_ttft_s is not None and w.p90_tpot_s is not None for w in windows):
        return None
    weights = [max(1, w.requests or 0) for w in windows]
    total = sum(weights)
    return (sum(w.p90_ttft_s * k for w, k in zip(windows, weights)) / total,
            sum(w.p90_tpot_s * k for w, k in zip(windows, weights)) / total)


def pooled_meets(windows, p90_ttft_s: float, p90_tpot_s: float) -> bool:
    """Several windows at one user count against the SLO together (``pooled_p90s``); an invalid
    window, or one without a P90, misses."""
    p90s = pooled_p90s(windows)
    return p90s is not None and p90s[0] <= p90_ttft_s and p90s[1] <= p90_tpot_s


def aggregate(
    records: list[RequestRecord],
    *,
    users: int,
    duration_s: float,
    kv_capacity_tokens_total: int | None = None,
    max_error_rate: float = 0.05,
    extra: dict | None = None,
) -> LoadPointMetrics:
    """P50/P90/P99 over the records. Failed requests count as errors, never as zero latency.
    Requests carried into the window count in the latencies and errors; throughput, hit rate and
    prefix reuse are those of the requests that started in it."""
    ok = [r for r in records if r.ok]
    errors = len(records) - len(ok)
    ttft = [r.ttft_s for r in ok]
    tpot = [t for t in (r.tpot_s for r in ok) if t is not None]
    itl = [g for r in ok for g in r.itl_s]
    e2e = [r.e2e_s for r in ok]
    started = [r for r in ok if not r.carried_in]
    out_tokens = sum(r.output_tokens for r in started)
    in_tokens = sum(r.input_tokens for r in started)
    cached_known = [r for r in started if r.cached_tokens is not None]
    hit_rate = None
    if cached_known:
        denom = sum(r.input_tokens for r in cached_known)
        hit_rate = sum(r.cached_tokens for r in cached_known) / denom if denom else 0.0
    extra = dict(extra or {})
    carried = sum(r.carried_in for r in records)
    if carried:
        extra.setdefault("carried_in_requests", carried)
    reuse = prefix_reuse(started)
    if reuse is not None:
        extra.setdefault("prefix_reuse", reuse)
    spread = {k: v for k, v in (("ttft_s", p90_spread(ttft)), ("tpot_s", p90_spread(tpot))) if v is not None}
    if spread:
        extra.setdefault(SPREAD_KEY, spread)
    valid, reason = True, None
    if not records:
        valid, reason = False, "no requests completed in the measurement window"
    elif not ok:
        valid, reason = False, f"all {len(records)} requests failed"
    elif errors / len(records) > max_error_rate:
        valid, reason = False, f"error rate {errors / len(records):.1%} above {max_error_rate:.0%}"
    duration_s = max(duration_s, 1e-9)
    return LoadPointMetrics(
        users=users,
        requests=len(records),
        errors=errors,
        duration_s=duration_s,
        p50_ttft_s=_pct(ttft, 50),
        p90_ttft_s=_pct(ttft, 90),
        p99_ttft_s=_pct(ttft, 99),
        p50_tpot_s=_pct(tpot, 50),
        p90_tpot_s=_pct(tpot, 90),
        p99_tpot_s=_pct(tpot, 99),
        p50_itl_s=_pct(itl, 50),
        p90_itl_s=_pct(itl, 90),
        p99_itl_s=_pct(itl, 99),
        p90_e2e_s=_pct(e2e, 90),
        throughput_tokens_per_s=out_tokens / duration_s,
        input_throughput_tokens_per_s=in_tokens / duration_s,
        prefix_cache_hit_rate=None if hit_rate is None or math.isnan(hit_rate) else hit_rate,
        kv_capacity_tokens_total=kv_capacity_tokens_total,
        valid=valid,
        invalid_reason=reason,
        extra=extra,
    )


def prefix_reuse(records: list[RequestRecord]) -> dict | None:
    """Token sums over completed requests whose cached and reusable prefixes are both known:
    ``recomputed_reusable_tokens`` is what a request sent before but the server computed again
    (evicted, or held by another KV pool)."""
    known = [r for r in records if r.cached_tokens is not None and r.reusable_tokens is not None]
    if not known:
        return None
    return {
        "requests": len(known),
        "input_tokens": sum(r.input_tokens for r in known),
        "cached_tokens": sum(r.cached_tokens for r in known),
        "reusable_tokens": sum(min(r.reusable_tokens, r.input_tokens) for r in known),
        "computed_tokens": sum(max(0, r.input_tokens - r.cached_tokens) for r in known),
        "recomputed_reusable_tokens": sum(max(0, min(r.reusable_tokens, r.input_tokens) - r.cached_tokens)
                                          for r in known),
    }
