"""Two measurement windows of one workload compared: is B faster than A beyond the windows' noise?

A serving A/B (tile configs, a flag) measures each variant once, in a window of a few hundred
requests. Its P90 rests on the ~10% slowest of them, so two windows of the *same* server differ by
tens of percent on P90 TTFT at 40 s (``docs/calibration.md``). Each ratio B/A therefore comes with
a 90% interval from a bootstrap over **sessions** (a session's turns share its context and its
queueing, so requests are not independent; resampling whole sessions keeps that), and a verdict:
faster where the whole interval is below 1, slower where it is above, otherwise within the noise.

Where both windows replayed the same seeds, the requests present in both (same session and turn)
are also compared pairwise: the median of the per-request TPOT ratios, with its own session
bootstrap. Pairing removes the difference in which requests each window caught, so it tells
smaller changes apart than the P50 of each window can.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from statistics import NormalDist
from typing import Iterable, Mapping, Sequence

import numpy as np

from tuner.errors import ConfigError

from .metrics import RequestRecord

RESAMPLES = 2000
LEVEL = 0.90  # two-sided interval of every ratio
Z = NormalDist().inv_cdf(0.5 + LEVEL / 2)


class Verdict(str, Enum):
    FASTER = "faster"  # B below A beyond the noise (the whole interval of B/A under 1)
    SLOWER = "slower"
    WITHIN_NOISE = "within noise"


@dataclass(frozen=True)
class RatioInterval:
    """B/A of one statistic, with its ``LEVEL`` interval and what it says."""

    metric: str  # e.g. p90_tpot_s
    ratio: float
    low: float
    high: float
    samples: tuple[int, int]  # requests behind each side (pairs: both the same)
    server_sd: float = 0.0  # the between-servers spread folded in (``widened``)

    @property
    def verdict(self) -> Verdict:
        if self.high < 1:
            return Verdict.FASTER
        if self.low > 1:
            return Verdict.SLOWER
        return Verdict.WITHIN_NOISE

    def to_dict(self) -> dict:
        return {"metric": self.metric, "ratio": self.ratio, "low": self.low, "high": self.high,
                "requests": list(self.samples), "server_sd": self.server_sd, "verdict": self.verdict.value}

    def widened(self, server_sd: float) -> "RatioInterval":
        """With two servers' own difference added. Each server's statistic sits off its
        configuration's by a factor e^u, u ~ N(0, server_sd^2) (another process, another machine);
        B/A then carries e^(u_b - u_a), and in log space its sd, sqrt(2) server_sd, adds in
        quadrature to each side of the window's own interval."""
        if server_sd <= 0:
            return self
        centre, between = math.log(self.ratio), 2 * server_sd ** 2
        low = centre - Z * math.hypot((centre - math.log(self.low)) / Z, math.sqrt(between))
        high = centre + Z * math.hypot((math.log(self.high) - centre) / Z, math.sqrt(between))
        return replace(self, low=math.exp(low), high=math.exp(high), server_sd=server_sd)


@dataclass(frozen=True)
class WindowComparison:
    """Every ratio of one user count, B over A."""

    ratios: tuple[RatioInterval, ...]
    paired_tpot: RatioInterval | None  # median per-request TPOT ratio over requests in both windows

    @property
    def intervals(self) -> tuple[RatioInterval, ...]:
        return self.ratios + ((self.paired_tpot,) if self.paired_tpot else ())

    def widened(self, server_sd: Mapping[str, float]) -> "WindowComparison":
        """Every interval with its metric's between-servers spread (``server_spread``) folded in."""
        grow = lambda r: r.widened(server_sd.get(r.metric, 0.0))
        return WindowComparison(tuple(grow(r) for r in self.ratios),
                                None if self.paired_tpot is None else grow(self.paired_tpot))

    def to_dict(self) -> dict:
        return {"ratios": [r.to_dict() for r in self.ratios],
                "paired_tpot": None if self.paired_tpot is None else self.paired_tpot.to_dict()}


# statistic name -> (per-request value, percentile)
STATISTICS: dict[str, tuple[str, float]] = {
    "p50_tpot_s": ("tpot_s", 50.0),
    "p90_tpot_s": ("tpot_s", 90.0),
    "p50_ttft_s": ("ttft_s", 50.0),
    "p90_ttft_s": ("ttft_s", 90.0),
}
MIN_REQUESTS = 10  # fewer than this on a side: no interval


def read_requests(path: str | Path) -> list[RequestRecord]:
    """A load point's requests as the live evaluator saved them (``loadpoint-NN-Uu.requests.jsonl.gz``,
    one JSON object a line, gzipped or not)."""
    fields = set(RequestRecord.__dataclass_fields__)
    required = {"session_id", "turn", "start_s", "input_tokens", "output_tokens", "ttft_s", "end_s"}
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    try:
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                d = json.loads(line)
                missing = required - set(d) if isinstance(d, dict) else required
                if missing:
                    raise ConfigError(f"line {n} is not a request record: missing {sorted(missing)}",
                                      file=str(path), key="requests")
                out.append(RequestRecord(**{k: v for k, v in d.items() if k in fields}))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as exc:
        raise ConfigError(f"cannot read requests: {exc} (expected a loadpoint-NN-Uu.requests.jsonl.gz "
                          "that a real load point wrote)", file=str(path), key="requests") from None
    if not out:
        raise ConfigError("no requests in this file", file=str(path), key="requests")
    return out


class _Grouped:
    """Values grouped by session, stored flat, so that a resample of whole sessions is an index
    array rather than a concatenation (2,000 resamples of a window in a few hundred ms)."""

    def __init__(self, groups: Sequence[np.ndarray]):
        self.lengths = np.array([len(g) for g in groups], dtype=np.int64)
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.flat = np.concatenate(groups) if len(groups) else np.empty(0)

    @property
    def sessions(self) -> int:
        return len(self.lengths)

    def percentiles(self, qs: Sequence[float], picks: np.ndarray | None = None) -> np.ndarray | None:
        """The ``qs`` percentiles over the sessions picked (all of them once where ``picks`` is None)."""
        if picks is None:
            data = self.flat
        else:
            lens = self.lengths[picks]
            ends = np.cumsum(lens)
            # each picked session's values: its start, plus the position within its run of the output
            offsets = np.repeat(self.starts[picks] - (ends - lens), lens)
            data = self.flat[np.arange(ends[-1] if len(ends) else 0) + offsets]
        return _percentiles(data, qs) if data.size else None


def _percentiles(data: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """``np.percentile(data, qs)`` (its default, linear method) without its per-call overhead, which
    is most of a bootstrap's time on a few hundred values."""
    d = np.sort(data)
    h = (len(d) - 1) * np.asarray(qs, dtype=float) / 100
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, len(d) - 1)
    return d[lo] + (h - lo) * (d[hi] - d[lo])


class _Window:
    """One window's requests grouped by session, for each per-request value of ``STATISTICS``."""

    def __init__(self, records: Iterable[RequestRecord]):
        sessions: dict[int, dict[str, list[float]]] = {}
        for r in records:
            if r.ok:
                per = sessions.setdefault(r.session_id, {"tpot_s": [], "ttft_s": []})
                for value in per:
                    v = getattr(r, value)
                    if v is not None:
                        per[value].append(v)
        # one session order for both values: a resample picks the same sessions for each
        self.values = {value: _Grouped([np.asarray(s[value], dtype=float) for s in sessions.values()])
                       for value in ("tpot_s", "ttft_s")}
        self.count = {value: int(g.lengths.sum()) for value, g in self.values.items()}

    def statistics(self, picks: np.ndarray | None = None) -> dict[str, float]:
        """Every statistic over the sessions picked (all of them once where ``picks`` is None)."""
        out = {}
        for value, grouped in self.values.items():
            qs = [q for v, q in STATISTICS.values() if v == value]
            got = grouped.percentiles(qs, picks)
            if got is not None:
                out.update({f"p{int(q)}_{value}": float(x) for q, x in zip(qs, got)})
        return out

    def bootstrap(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """Every statistic over ``n`` resamples of whole sessions."""
        k = self.values["ttft_s"].sessions
        rows = [self.statistics(row) for row in rng.integers(0, k, size=(n, k))]
        return {m: np.array([r.get(m, np.nan) for r in rows]) for m in STATISTICS}


def _interval(metric: str, ratio: float, boot: np.ndarray, samples: tuple[int, int]) -> RatioInterval:
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.nanpercentile(boot, [tail, 100 - tail])
    return RatioInterval(metric, float(ratio), float(low), float(high), samples)


def compare_windows(a: Sequence[RequestRecord], b: Sequence[RequestRecord], *, seed: int = 0,
                    resamples: int = RESAMPLES, server_sd: Mapping[str, float] | None = None) -> WindowComparison:
    """B over A for each of ``STATISTICS`` (a session bootstrap of each window, independently) and
    the paired per-request TPOT ratio where both windows hold the same (session, turn). The
    intervals hold the windows' own noise; ``server_sd`` (per metric, ``server_spread``) adds the
    difference between two servers of one configuration, which no single window shows."""
    rng = np.random.default_rng(seed)
    wa, wb = _Window(a), _Window(b)
    pa, pb = wa.statistics(), wb.statistics()
    ba, bb = wa.bootstrap(rng, resamples), wb.bootstrap(rng, resamples)
    ratios = []
    for metric, (value, _) in STATISTICS.items():
        na, nb = wa.count[value], wb.count[value]
        if na < MIN_REQUESTS or nb < MIN_REQUESTS or not pa.get(metric):
            continue
        ratios.append(_interval(metric, pb[metric] / pa[metric], bb[metric] / ba[metric], (na, nb)))
    out = WindowComparison(tuple(ratios), _paired_tpot(a, b, rng, resamples))
    return out.widened(server_sd) if server_sd else out


def server_spread(same: Iterable[WindowComparison]) -> dict[str, float]:
    """Between-servers spread per metric from A/A comparisons (two servers of one configuration,
    the same workload and seeds): a log ratio d of such a pair has E[d^2] = 2 sd^2 + the window
    noise (its interval's half-width over Z, squared), so sd^2 = mean(d^2 - noise) / 2, at least 0."""
    excess: dict[str, list[float]] = {}
    for comparison in same:
        for r in comparison.intervals:
            noise = ((math.log(r.high) - math.log(r.low)) / (2 * Z)) ** 2
            excess.setdefault(r.metric, []).append(math.log(r.ratio) ** 2 - noise)
    return {m: math.sqrt(max(0.0, sum(v) / len(v) / 2)) for m, v in excess.items()}


def _paired_tpot(a, b, rng, resamples) -> RatioInterval | None:
    tpot_a = {(r.session_id, r.turn): r.tpot_s for r in a if r.tpot_s}
    groups: dict[int, list[float]] = {}
    for r in b:
        key = (r.session_id, r.turn)
        if r.tpot_s and key in tpot_a:
            groups.setdefault(r.session_id, []).append(r.tpot_s / tpot_a[key])
    pairs = sum(len(v) for v in groups.values())
    if pairs < MIN_REQUESTS:
        return None
    grouped = _Grouped([np.asarray(v) for v in groups.values()])
    point = float(np.median(grouped.flat))
    boot = np.array([grouped.percentiles([50.0], row)[0]
                     for row in rng.integers(0, grouped.sessions, size=(resamples, grouped.sessions))])
    return _interval("paired_tpot", point, boot, (pairs, pairs))


__all__ = ["LEVEL", "RESAMPLES", "RatioInterval", "STATISTICS", "Verdict", "WindowComparison",
           "compare_windows", "read_requests", "server_spread"]
