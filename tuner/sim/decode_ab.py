"""Two SGLang servers' decode steps side by side, at equal batch, from their own logs.

A serving A/B's TPOT mixes what the kernels do with what the traffic did: which prefill chunks
landed between a request's tokens, and at what batch the decode ran. A window of SGLang's log
(``steplog.decode_windows``: 40 decode batches) with no prefill batch in it and the same number of
running requests at both ends is 40 decode steps of that batch and nothing else; its wall time over
40 is one decode step (CUDA graph replay, scheduler and sampling included). Compared batch by
batch, two servers' pure-decode steps say how the decode kernels differ with the traffic taken
out. The context the requests hold (``#token``: the KV a decode step's attention reads) still moves a
step, and two servers' traffic leaves them at different contexts. So the steps are fitted as
``step = c[server, batch] + k x #token`` (one ``k`` for both: the tiles do not touch attention), and
each batch is compared at the two servers' pooled mean context.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .steplog import StepWindow, decode_windows, read_step_lines

INTERVAL_LEVEL = 0.90
RESAMPLES = 500


@dataclass(frozen=True)
class BatchSteps:
    batch: int
    a_step_ms: float  # median pure-decode step of server A at this batch
    b_step_ms: float
    a_windows: int
    b_windows: int
    a_kv_tokens: float  # mean #token over those windows
    b_kv_tokens: float

    @property
    def median_ratio(self) -> float:
        """B's median step over A's, each at its own context (the comparison's ratio is at equal context)."""
        return self.b_step_ms / self.a_step_ms


@dataclass(frozen=True)
class DecodeStepComparison:
    """B's pure-decode step over A's at equal batch and context: the geometric mean over the batches
    both ran, each weighted by the smaller of its two window counts; None where no batch has both."""

    ratio: float | None
    interval: tuple[float, float] | None  # 90%, resampling each batch's windows
    batches: list[BatchSteps] = field(default_factory=list)
    kv_tokens_ratio: float | None = None  # the same mean of B's context over A's

    @property
    def paired_windows(self) -> int:
        return sum(min(b.a_windows, b.b_windows) for b in self.batches)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["paired_windows"] = self.paired_windows
        for row, b in zip(d["batches"], self.batches):
            row["median_ratio"] = b.median_ratio
        return d

    def summary(self) -> str:
        if self.ratio is None:
            return "no batch size with pure-decode windows in both logs"
        lo, hi = self.interval or (float("nan"), float("nan"))
        context = "-" if self.kv_tokens_ratio is None else f"{self.kv_tokens_ratio:.3f}"
        return (f"pure-decode step B/A {self.ratio:.3f} [{lo:.3f}, {hi:.3f}] (90%) over {len(self.batches)} batch "
                f"sizes, {self.paired_windows} paired windows; context B/A {context}")


def pure_decode_steps(windows: list[StepWindow]) -> dict[int, list[tuple[float, int]]]:
    """batch -> [(step seconds, KV tokens)] of the windows that ran only decode batches at one batch
    size on CUDA graphs."""
    out: dict[int, list[tuple[float, int]]] = {}
    for w in windows:
        if w.prefills or not w.cuda_graph or w.running_start != w.running_end or w.running_start < 1:
            continue
        out.setdefault(w.running_start, []).append((w.wall_s / w.interval, (w.kv_tokens_start + w.kv_tokens_end) // 2))
    return out


def _weighted_geomean(ratios: list[float], weights: list[int]) -> float:
    return math.exp(sum(w * math.log(r) for r, w in zip(ratios, weights)) / sum(weights))


def _fit(a, b, common) -> tuple[list[float], list[float], float]:
    """Least squares of step = c[server, batch] + k x tokens over every window of the common batches:
    (A's c per batch, B's c per batch, k)."""
    n = len(common)
    rows, ys = [], []
    for side, data in ((0, a), (1, b)):
        for i, k in enumerate(common):
            for step_s, tokens in data[k]:
                row = [0.0] * (2 * n + 1)
                row[side * n + i] = 1.0
                row[-1] = tokens
                rows.append(row)
                ys.append(step_s)
    x, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    return list(x[:n]), list(x[n:2 * n]), float(x[-1])


def _ratios(a, b, common) -> tuple[list[float], list[float]]:
    """Per common batch, B's fitted step over A's at their pooled mean context, and A's fitted step
    (seconds) there."""
    ca, cb, k = _fit(a, b, common)
    ratios, a_steps = [], []
    for i, batch in enumerate(common):
        tokens = statistics.fmean(t for _, t in a[batch] + b[batch])
        sa, sb = ca[i] + k * tokens, cb[i] + k * tokens
        ratios.append(sb / sa if sa > 0 and sb > 0 else float("nan"))
        a_steps.append(sa)
    return ratios, a_steps


@dataclass(frozen=True)
class PairedBatches:
    """The batches two servers both ran pure-decode windows at: per batch, B's fitted step over A's
    and A's fitted step (seconds), both at the pooled context, weighted by the smaller window count;
    ``draws``: (ratios, A's steps) of each resample of the windows that fitted."""

    batches: list[int]
    weights: list[int]
    ratios: list[float]
    a_steps_s: list[float]
    draws: list[tuple[list[float], list[float]]] = field(default_factory=list)


def _usable(ratios: list[float]) -> bool:
    return all(math.isfinite(r) and r > 0 for r in ratios)


def paired_batches(a: dict[int, list[tuple[float, int]]], b: dict[int, list[tuple[float, int]]], *,
                   seed: int = 0, resamples: int = RESAMPLES) -> PairedBatches | None:
    """None where the two share no batch or the fit gives a non-positive step."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    ratios, a_steps = _ratios(a, b, common)
    if not _usable(ratios):
        return None
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        ra = {k: [a[k][j] for j in rng.integers(0, len(a[k]), len(a[k]))] for k in common}
        rb = {k: [b[k][j] for j in rng.integers(0, len(b[k]), len(b[k]))] for k in common}
        rs, steps = _ratios(ra, rb, common)
        if _usable(rs):
            draws.append((rs, steps))
    return PairedBatches(common, [min(len(a[k]), len(b[k])) for k in common], ratios, a_steps, draws)


def percentile_interval(values: list[float]) -> tuple[float, float] | None:
    """The central ``INTERVAL_LEVEL`` interval of resampled values (None without any)."""
    if not values:
        return None
    tail = (1 - INTERVAL_LEVEL) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def compare_decode_steps(a: dict[int, list[tuple[float, int]]], b: dict[int, list[tuple[float, int]]], *,
                         seed: int = 0) -> DecodeStepComparison:
    common = sorted(set(a) & set(b))
    if not common:
        return DecodeStepComparison(None, None)
    rows = [BatchSteps(k, statistics.median(s for s, _ in a[k]) * 1e3, statistics.median(s for s, _ in b[k]) * 1e3,
                       len(a[k]), len(b[k]), statistics.fmean(t for _, t in a[k]), statistics.fmean(t for _, t in b[k]))
            for k in common]
    paired = paired_batches(a, b, seed=seed)
    if paired is None:
        return DecodeStepComparison(None, None, rows)
    weights = paired.weights
    kv = [r.b_kv_tokens / r.a_kv_tokens for r in rows if r.a_kv_tokens > 0 and r.b_kv_tokens > 0]
    kv_ratio = _weighted_geomean(kv, weights) if len(kv) == len(rows) else None
    interval = percentile_interval([_weighted_geomean(rs, weights) for rs, _ in paired.draws])
    return DecodeStepComparison(_weighted_geomean(paired.ratios, weights), interval, rows, kv_ratio)


def compare_server_logs(a_log: str | Path, b_log: str | Path, *, seed: int = 0) -> DecodeStepComparison:
    """B's pure-decode steps over A's, from two SGLang server logs (plain or gzipped)."""
    return compare_decode_steps(pure_decode_steps(decode_windows(read_step_lines(a_log))),
                                pure_decode_steps(decode_windows(read_step_lines(b_log))), seed=seed)


def paired_server_logs(a_log: str | Path, b_log: str | Path, *, seed: int = 0) -> PairedBatches | None:
    """``paired_batches`` of two SGLang server logs (plain or gzipped)."""
    return paired_batches(pure_decode_steps(decode_windows(read_step_lines(a_log))),
                          pure_decode_steps(decode_windows(read_step_lines(b_log))), seed=seed)
