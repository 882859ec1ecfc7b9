"""How fast each tile search converged, from the timings a tuning run recorded (CPU only).

``tuner kernels tune`` appends every timed config to ``reports/<shape>.timings.jsonl.gz`` in the order
it was evaluated: the joint search's configs (one tile config for both GEMMs), then, where the
version reads ``_down`` files, the down search's (rows with an ``up`` key), and with ``--grid`` the
exhaustive pass (``"pass": "grid"``). Replaying that order says how many evaluations each search
needed to come within a tolerance of its own final best (and of the grid's best where a grid ran):
the evidence for a smaller budget, which is most of a shape's device time.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuner.errors import ConfigError

TOLERANCES = (0.02, 0.01, 0.0)
BUDGET_SHARES = (0.25, 0.5, 0.75)


@dataclass
class SearchTrace:
    shape: str
    batch_size: int
    search: str  # joint | down
    evaluations: int
    best_us: float
    evals_to_within: dict[str, int | None]  # "2%" -> first evaluation within 2% of best_us
    best_so_far_at_share: dict[str, float]  # "50%" -> best of the first half / best_us
    grid_best_us: float | None = None
    fraction_of_grid_best: float | None = None  # grid best / search best (1.0: the search found it)
    evals_to_within_grid: dict[str, int | None] = field(default_factory=dict)


def _us(row) -> float:
    v = row.get("us")
    return math.inf if v is None else float(v)


def _first_within(times: list[float], target: float, tol: float) -> int | None:
    for i, t in enumerate(times):
        if t <= target * (1 + tol):
            return i + 1
    return None


def _trace(shape: str, M: int, kind: str, rows: list[dict], grid_best: float | None) -> SearchTrace | None:
    times = [_us(r) for r in rows]
    finite = [t for t in times if math.isfinite(t)]
    if not finite:
        return None
    best = min(finite)
    n = len(times)
    at_share = {}
    for share in BUDGET_SHARES:
        k = max(1, math.ceil(share * n))
        head = [t for t in times[:k] if math.isfinite(t)]
        at_share[f"{share:.0%}"] = round(min(head) / best, 4) if head else math.inf
    tr = SearchTrace(shape=shape, batch_size=M, search=kind, evaluations=n, best_us=best,
                     evals_to_within={f"{tol:.0%}": _first_within(times, best, tol) for tol in TOLERANCES},
                     best_so_far_at_share=at_share)
    if grid_best is not None and kind == "joint":
        tr.grid_best_us = grid_best
        tr.fraction_of_grid_best = round(grid_best / best, 4)
        tr.evals_to_within_grid = {f"{tol:.0%}": _first_within(times, grid_best, tol) for tol in TOLERANCES}
    return tr


TIMINGS_SUFFIX = ".timings.jsonl.gz"
LEGACY_TIMINGS_SUFFIX = ".timings.jsonl"  # written before the rows were gzipped


def timings_path(reports: Path, tag: str) -> Path:
    """``reports/<tag>.timings.jsonl.gz``, the shape's timing rows; a plain ``.timings.jsonl`` left by an
    earlier version is folded into it first, so that one file holds every row of the shape."""
    path = reports / f"{tag}{TIMINGS_SUFFIX}"
    legacy = reports / f"{tag}{LEGACY_TIMINGS_SUFFIX}"
    if legacy.exists():
        with gzip.open(path, "at") as f:
            f.write(legacy.read_text())
        legacy.unlink()
    return path


def timings_files(directory: Path) -> list[Path]:
    return sorted([*directory.glob(f"*{TIMINGS_SUFFIX}"), *directory.glob(f"*{LEGACY_TIMINGS_SUFFIX}")])


def _read_groups(path: Path) -> dict[int, dict[str, list[dict]]]:
    """A timings file's rows, {M: {"joint" | "down" | "grid": rows in evaluation order}}."""
    by_m: dict[int, dict[str, list[dict]]] = {}
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt") as f:
                lines = f.read().splitlines()
        else:
            lines = path.read_text().splitlines()
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            M = int(r["batch_size"])
            cfg = r["config"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ConfigError(f"line {n}: not a timing row (batch_size, config, us)", file=str(path)) from None
        kind = "grid" if r.get("pass") == "grid" else ("down" if isinstance(cfg, dict) and "up" in cfg else "joint")
        by_m.setdefault(M, {}).setdefault(kind, []).append(r)
    return by_m


def _shape_of(path: Path) -> str:
    return path.name.removesuffix(TIMINGS_SUFFIX).removesuffix(LEGACY_TIMINGS_SUFFIX)


def read_traces(path: str | Path) -> list[SearchTrace]:
    """The searches of one ``<shape>.timings.jsonl.gz`` (or plain ``.jsonl``) file, per batch size and
    search."""
    path = Path(path)
    shape = _shape_of(path)
    by_m = _read_groups(path)
    out = []
    for M in sorted(by_m):
        groups = by_m[M]
        grid = [t for t in map(_us, groups.get("grid", [])) if math.isfinite(t)]
        grid_best = min(grid) if grid else None
        for kind in ("joint", "down"):
            if groups.get(kind):
                tr = _trace(shape, M, kind, groups[kind], grid_best)
                if tr is not None:
                    out.append(tr)
    return out


def convergence(directory: str | Path) -> dict:
    """Every shape's search traces under ``directory`` (a tuned folder or its ``reports/``)."""
    d = Path(directory)
    files = timings_files(d / "reports") or timings_files(d)
    if not files:
        raise ConfigError("no *.timings.jsonl.gz here or under reports/ (written by `tuner kernels tune`)",
                          file=str(d))
    traces = [t for f in files for t in read_traces(f)]
    joint = [t for t in traces if t.search == "joint"]
    worst = {}
    for share in BUDGET_SHARES:
        key = f"{share:.0%}"
        vals = [t.best_so_far_at_share[key] for t in joint]
        worst[key] = max(vals) if vals else None
    needed = [t.evals_to_within["2%"] / t.evaluations for t in joint if t.evals_to_within["2%"]]
    return {"directory": str(d), "searches": [asdict(t) for t in traces],
            "joint_worst_best_so_far_at_share": worst,
            "joint_max_share_of_budget_to_within_2pct": round(max(needed), 3) if needed else None}


# the first round of a search (its warm start) runs whatever the time: ``search_batch_size``'s batch
FIRST_ROUND = 8


@dataclass
class BudgetReplayRow:
    shape: str
    batch_size: int
    full_wall_s: float  # what the batch size took with its whole evaluation budget
    share_s: float  # its part of the time budget (what earlier batch sizes left, shared evenly)
    evaluations_full: dict[str, int]  # search -> evaluations made
    evaluations_at_budget: dict[str, int]  # search -> evaluations the share pays for, at the same rate
    best_at_budget: dict[str, float | None]  # search -> best of those / the whole search's best


def _best_of_first(rows: list[dict], k: int) -> float | None:
    times = [_us(r) for r in rows]
    finite = [t for t in times if math.isfinite(t)]
    head = [t for t in times[:k] if math.isfinite(t)]
    return round(min(head) / min(finite), 4) if head and finite else None


def time_budget_replay(directory: str | Path, shape_time_s: float) -> dict:
    """What a ``shape_time_s`` budget would have kept of each recorded search (CPU estimate).

    Per shape, the batch sizes in ascending order get what is left shared evenly (``time_share``); a
    batch size whose whole search took less passes the rest on. A cut search makes evaluations at
    the rate its batch size ran them (compiles, timings and re-timing included), its joint and down
    parts at ``JOINT_TIME_FRACTION`` / ``DOWN_TIME_FRACTION`` of the share, never fewer than its first
    round; the best of its first k recorded evaluations against its full best is what it would have
    reached, were the order the same (a shorter TPE phase moves refinement earlier: an estimate)."""
    from tuner.kernels.time_budget import DOWN_TIME_FRACTION, JOINT_TIME_FRACTION

    d = Path(directory)
    reports = d / "reports" if (d / "reports").is_dir() else d
    files = timings_files(reports)
    if not files:
        raise ConfigError("no *.timings.jsonl.gz here or under reports/ (written by `tuner kernels tune`)",
                          file=str(d))
    out: list[BudgetReplayRow] = []
    shapes = {}
    for f in files:
        shape = _shape_of(f)
        try:
            rep = json.loads((reports / f"{shape}.json").read_text())
        except (OSError, ValueError):
            continue  # timings without their report: no wall times to replay
        groups = _read_groups(f)
        rows = [r for r in sorted(rep.get("rows", []), key=lambda r: r["batch_size"]) if r.get("wall_s")]
        left, total_full = float(shape_time_s), 0.0
        for i, r in enumerate(rows):
            M, wall = int(r["batch_size"]), float(r["wall_s"])
            total_full += wall
            share = max(0.0, left) / (len(rows) - i)
            searches = groups.get(M, {})
            full = {k: len(searches.get(k, [])) for k in ("joint", "down") if searches.get(k)}
            made = {"joint": int(r.get("evaluations_joint", r.get("evaluations", 0)) or 0),
                    "down": int(r.get("evaluations_down", 0) or 0)}
            rate = sum(made.values()) / wall if wall > 0 else 0.0
            fits = wall <= share
            at_budget, reach = {}, {}
            for kind, n in full.items():
                frac = (JOINT_TIME_FRACTION if kind == "joint" else DOWN_TIME_FRACTION) + (
                    DOWN_TIME_FRACTION if kind == "joint" and "down" not in full else 0.0)
                k = n if fits else min(n, max(FIRST_ROUND, math.floor(frac * share * rate)))
                at_budget[kind] = k
                reach[kind] = _best_of_first(searches[kind], k)
            left -= min(wall, share) if fits else share
            if full:
                out.append(BudgetReplayRow(shape, M, wall, round(share, 1), full, at_budget, reach))
        shapes[shape] = {"full_wall_s": round(total_full, 1), "batch_sizes": len(rows)}
    joint = [r.best_at_budget.get("joint") for r in out if r.best_at_budget.get("joint") is not None]
    return {"directory": str(d), "shape_time_s": shape_time_s, "shapes": shapes, "rows": [asdict(r) for r in out],
            "joint_worst_best_at_budget": max(joint) if joint else None}
