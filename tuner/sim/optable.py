"""Measured operator times: the profile table format, loading, and interpolation.

Profiles are JSON files under ``tuner/sim/profiles/<gpu>/`` (and the folders of
``$TUNER_PROFILE_DIRS``) written by ``tuner profile`` on a GPU
(format ``tuner-op-profile/1``, documented in docs/calibration.md, "Profile tables"). A file holds
the operators one GPU ran for one configuration (model, parallelism, dtypes) under one SGLang
version and attention / MoE backend, with its provenance. Each operator is indexed by its own
shape key (``tuner.sim.opshapes``), so a GEMM or attention table measured for one model serves
every configuration whose GPUs see the same shape.

Values are microseconds per call (one layer for per-layer operators). Lookups interpolate
piecewise-linearly between grid points in the work the operator does (active experts for fused
MoE, query-key pairs for extend attention, the axis itself otherwise); above the grid the
compute-bound token operators go on linearly, elsewhere outside it they return ``None`` and the
step-time model falls back to its roofline for that operator. Collectives (``COMM_OPS``, written by
``tuner profile comm``) are keyed by GPU count and message size instead, and below their grid take
the smallest message's time.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from tuner.errors import ConfigError
from .scheduler import version_tuple

FORMAT = "tuner-op-profile/1"
PROFILE_DIR = Path(__file__).parent / "profiles"
# collectives between the GPUs of one group (``tuner profile comm``): microseconds per call at a
# message size, shape {"gpus": n, "nodes": k}; they depend on the machine, not on SGLang's version
COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# hicache_write: the scheduler thread's CPU microseconds to issue one HiCache write-through backup
# of that many tokens (not GPU time)
OPS = ("gemm", "decode_attention", "extend_attention", "moe", "layer_misc", "sampling", "step_overhead",
       "hicache_write", *COMM_OPS)
AXES = {
    **{op: ("bytes",) for op in COMM_OPS},
    "gemm": ("tokens",),
    "decode_attention": ("batch", "context"),
    "extend_attention": ("new_tokens", "prefix"),
    "moe": ("tokens",),
    "layer_misc": ("tokens",),
    "sampling": ("batch",),
    "step_overhead": ("batch",),
    "hicache_write": ("tokens",),
}


def _interp(xs: list[float], ys: list, x: float, work: Callable[[float], float] | None = None) -> float | None:
    """Piecewise-linear in ``work(x)`` (x itself by default) between the grid points around x; None
    outside the grid or next to a point that was not measured."""
    if x < xs[0] or x > xs[-1]:
        return None
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return ys[i]
    y0, y1 = ys[i - 1], ys[i]
    if y0 is None or y1 is None:
        return None
    x0, x1 = xs[i - 1], xs[i]
    if work is not None:
        w0, w1 = work(x0), work(x1)
        if w1 - w0 > 1e-9 * max(abs(w1), 1.0):
            return y0 + (y1 - y0) * (work(x) - w0) / (w1 - w0)
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# Between grid points an operator's time follows the work it does, not its size: a coarse grid
# interpolated linearly in tokens misses the shape of both curves below by 30-300% at mid-points.
# token-axis operators whose time above the largest measured size is extrapolated linearly
EXTRAPOLATED_UP = frozenset({"gemm", "moe", "layer_misc", "hicache_write", *COMM_OPS})
SATURATED = 0.99  # share of experts active above which fused-MoE time grows with tokens, not experts


def active_experts(tokens: float, experts: int, topk: int) -> float:
    """Expected distinct experts that ``tokens`` tokens route to (each picks ``topk`` of ``experts``
    uniformly): fused MoE reads each active expert's weights once, so at small token counts its
    time follows this, concave in tokens."""
    if experts <= 0 or topk <= 0:
        return float(tokens)
    return experts * -math.expm1(tokens * math.log1p(-min(topk, experts - 1e-9) / experts))


def causal_work(new_tokens: float, prefix: float) -> float:
    """Query-key pairs of one extend: each new token attends the cached prefix and, causally, the
    new tokens before it (quadratic in new tokens without a prefix, linear with a long one)."""
    return new_tokens * (prefix + new_tokens / 2.0)


@dataclass(frozen=True)
class OpTable:
    """One operator's measured times over its grid."""

    op: str
    shape: dict
    axes: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]
    us: tuple  # nested lists, one level per axis
    mode: str | None = None  # extend_attention: mha | absorbed
    variant: str | None = None  # moe: default | tuned
    name: str | None = None  # gemm: which linear layer it was measured as
    # hicache_write: when the backup's copies had finished (the copy engine's time), beside ``us``
    done_us: tuple | None = None
    source: "ProfileFile | None" = field(default=None, compare=False, repr=False)

    def lookup_us(self, *x: float) -> float | None:
        if len(self.axes) == 1:
            xs, ys = self.grid[0], self.us
            if x[0] < xs[0] and self.op in COMM_OPS and ys[0] is not None:
                return ys[0]  # below the grid a collective is latency-bound: its smallest message's time
            if x[0] > xs[-1] and self.op in EXTRAPOLATED_UP and len(xs) >= 2 and None not in ys[-2:] \
                    and ys[-1] > ys[-2]:
                # above the grid these operators are compute-bound: time grows linearly in tokens,
                # as between the two largest measured sizes (closer than a roofline's peak x share)
                slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
                return ys[-1] + slope * (x[0] - xs[-1])
            return _interp(list(xs), list(ys), x[0], self._work_1d(x[0]))
        xs, ys = list(self.grid[0]), list(self.grid[1])
        a, b = x
        if a < xs[0] or a > xs[-1] or b < ys[0] or b > ys[-1]:
            return None
        if self.op == "extend_attention":
            # along new tokens at each measured prefix, in query-key pairs; then linear in the prefix
            # (the work is linear in it)
            j = bisect.bisect_left(ys, b)
            cols = [j] if ys[j] == b else [j - 1, j]
            vals = [_interp(xs, [row[c] for row in self.us], a, lambda n, p=ys[c]: causal_work(n, p)) for c in cols]
            if any(v is None for v in vals):
                return None
            if len(vals) == 1:
                return vals[0]
            y0, y1 = ys[cols[0]], ys[cols[1]]
            return vals[0] + (vals[1] - vals[0]) * (b - y0) / (y1 - y0)
        i = bisect.bisect_left(xs, a)
        if xs[i] == a:  # on a grid row: only that row
            return _interp(ys, list(self.us[i]), b)
        rows = [i - 1, i]
        vals = [_interp(ys, list(self.us[r]), b) for r in rows]
        if vals[0] is None or vals[1] is None:
            return None
        x0, x1 = xs[rows[0]], xs[rows[1]]
        return vals[0] + (vals[1] - vals[0]) * (a - x0) / (x1 - x0)

    def _work_1d(self, tokens: float) -> Callable[[float], float] | None:
        """Fused MoE: interpolate in active experts while the tokens leave experts idle (its time
        follows the expert weights read), in tokens once nearly every expert is active."""
        if self.op != "moe":
            return None
        # a table timed under a collapsed router spreads its tokens over its pool only
        e = int(self.shape.get("routed_pool") or self.shape.get("experts") or 0)
        k = int(self.shape.get("topk") or 0)
        if e <= 0 or k <= 0:
            return None
        xs = self.grid[0]
        i = min(max(bisect.bisect_left(xs, tokens), 1), len(xs) - 1)
        if active_experts(xs[i], e, k) >= SATURATED * e:
            return None
        return lambda t: active_experts(t, e, k)

    def lookup_s(self, *x: float) -> float | None:
        v = self.lookup_us(*x)
        return None if v is None else v * 1e-6

    def done_table(self) -> "OpTable | None":
        """The same grid over ``done_us`` (hicache_write), looked up like ``us``; None without it."""
        return None if self.done_us is None else replace(self, us=self.done_us, done_us=None)


@dataclass(frozen=True)
class ProfileFile:
    path: str
    gpu: str
    device_name: str
    sglang_version: str
    attention_backend: str
    moe_runner_backend: str
    model: str | None
    parallel: dict
    provenance: dict
    tables: tuple[OpTable, ...]
    whole_steps: tuple[dict, ...]


def _err(path, key, detail) -> ConfigError:
    return ConfigError(detail, file=str(path), key=key)


def _check_grid(path, where, axes, grid, us, key="us"):
    if not isinstance(grid, dict):
        raise _err(path, f"{where}.grid", f"must map each axis ({', '.join(axes)}) to a list of values")
    out = []
    for ax in axes:
        vals = grid.get(ax)
        if not isinstance(vals, list) or not vals or not all(isinstance(v, (int, float)) for v in vals):
            raise _err(path, f"{where}.grid.{ax}", "must be a non-empty list of numbers")
        if any(b <= a for a, b in zip(vals, vals[1:])):
            raise _err(path, f"{where}.grid.{ax}", "values must be strictly increasing")
        out.append(tuple(float(v) for v in vals))
    def ok(v):  # null: a point that could not be measured (e.g. out of memory)
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)

    if len(axes) == 1:
        if not isinstance(us, list) or len(us) != len(out[0]) or not all(ok(v) for v in us):
            raise _err(path, f"{where}.{key}", f"must be {len(out[0])} positive numbers or null (one per {axes[0]})")
        return tuple(out), tuple(None if v is None else float(v) for v in us)
    if not isinstance(us, list) or len(us) != len(out[0]):
        raise _err(path, f"{where}.{key}", f"must be {len(out[0])} rows (one per {axes[0]})")
    rows = []
    for r, row in enumerate(us):
        if not isinstance(row, list) or len(row) != len(out[1]) or not all(ok(v) for v in row):
            raise _err(path, f"{where}.{key}[{r}]",
                       f"must be {len(out[1])} positive numbers or null (one per {axes[1]})")
        rows.append(tuple(None if v is None else float(v) for v in row))
    return tuple(out), tuple(rows)


def parse_profile(doc: Any, path: str | Path) -> ProfileFile:
    """Validate one profile document; ConfigError names the file and the key."""
    if not isinstance(doc, dict):
        raise _err(path, None, "a profile must be a JSON object")
    if doc.get("format") != FORMAT:
        raise _err(path, "format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
    ops = doc.get("ops")
    if not isinstance(ops, list):
        raise _err(path, "ops", "must be a list of operator tables")
    # a file of collectives only is the machine's, whatever SGLang runs on it
    comm_only = bool(ops) and all(isinstance(e, dict) and e.get("op") in COMM_OPS for e in ops)
    for key in ("gpu",) if comm_only else ("gpu", "sglang_version", "attention_backend"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            raise _err(path, key, "required string")
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or not prov:
        raise _err(path, "provenance", "required: where and how the times were measured")
    holder: list[OpTable] = []
    pf = ProfileFile(path=str(path), gpu=doc["gpu"].lower(), device_name=str(doc.get("device_name", "")),
                     sglang_version=str(doc.get("sglang_version") or ""),
                     attention_backend=str(doc.get("attention_backend") or ""),
                     moe_runner_backend=str(doc.get("moe_runner_backend", "triton")), model=doc.get("model"),
                     parallel=dict(doc.get("parallel") or {}), provenance=prov, tables=(),
                     whole_steps=tuple(doc.get("whole_steps") or ()))
    for i, entry in enumerate(ops):
        where = f"ops[{i}]"
        if not isinstance(entry, dict):
            raise _err(path, where, "must be an object")
        op = entry.get("op")
        if op not in OPS:
            raise _err(path, f"{where}.op", f"unknown operator {op!r}; valid: {', '.join(OPS)}")
        axes = AXES[op]
        if tuple(entry.get("axes") or ()) != axes:
            raise _err(path, f"{where}.axes", f"{op} tables have axes {list(axes)}")
        shape = entry.get("shape")
        if not isinstance(shape, dict):
            raise _err(path, f"{where}.shape", "must be an object")
        grid, us = _check_grid(path, where, axes, entry.get("grid"), entry.get("us"))
        if op in COMM_OPS and not all(isinstance(shape.get(k), int) and not isinstance(shape.get(k), bool)
                                      and shape[k] >= 1 for k in ("gpus", "nodes")):
            raise _err(path, f"{where}.shape", f"{op} tables need whole numbers gpus and nodes (>= 1)")
        mode = entry.get("mode")
        if op == "extend_attention" and mode not in ("mha", "absorbed"):
            raise _err(path, f"{where}.mode", "extend_attention needs mode mha or absorbed")
        variant = entry.get("variant")
        if op == "moe" and variant not in ("default", "tuned"):
            raise _err(path, f"{where}.variant", "moe needs variant default or tuned")
        done_us = None
        if op == "hicache_write" and entry.get("done_us") is not None:
            _, done_us = _check_grid(path, where, axes, entry.get("grid"), entry.get("done_us"), "done_us")
        holder.append(OpTable(op=op, shape=dict(shape), axes=axes, grid=grid, us=us, mode=mode, variant=variant,
                              name=entry.get("name"), done_us=done_us, source=None))
    tables = tuple(OpTable(**{**t.__dict__, "source": pf}) for t in holder)
    object.__setattr__(pf, "tables", tables)
    return pf


def load_profile(path: str | Path) -> ProfileFile:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read profile: {exc}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}", file=str(path)) from None
    return parse_profile(doc, path)


def _shape_matches(have: dict, want: dict) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def _version_distance(a: str, b: str) -> tuple:

    va, vb = version_tuple(a), version_tuple(b)
    return (va[:2] != vb[:2], abs(va[2] - vb[2]))


class OpTables:
    """Every profile of one GPU, indexed for lookups by operator and shape."""

    def __init__(self, files: list[ProfileFile]):
        self.files = files
        self.by_op: dict[str, list[OpTable]] = {}
        for f in files:
            for t in f.tables:
                self.by_op.setdefault(t.op, []).append(t)

    @classmethod
    def empty(cls) -> "OpTables":
        return cls([])

    def find(self, op: str, shape: dict, *, sglang_version: str, attention_backend: str | None = None,
             moe_runner_backend: str | None = None, mode: str | None = None,
             variant: str | None = None) -> OpTable | None:
        """The best table for this operator and shape: same SGLang version if one exists, else the
        nearest version; attention tables also need the same attention backend, MoE tables the
        same MoE runner backend."""
        best, best_d = None, None
        for t in self.by_op.get(op, ()):
            if mode is not None and t.mode != mode:
                continue
            if variant is not None and t.variant != variant:
                continue
            if attention_backend is not None and op.endswith("attention") and \
                    t.source.attention_backend != attention_backend:
                continue
            if moe_runner_backend is not None and op == "moe" and t.source.moe_runner_backend != moe_runner_backend:
                continue
            if not _shape_matches(t.shape, shape):
                continue
            # collectives: the machine's, not SGLang's; any version's table serves
            d = (False, 0) if op in COMM_OPS else _version_distance(t.source.sglang_version, sglang_version)
            if best_d is None or d < best_d:
                best, best_d = t, d
        return best


@lru_cache(maxsize=16)
def _load_dir(directory: str) -> tuple[ProfileFile, ...]:
    d = Path(directory)
    if not d.is_dir():
        return ()
    return tuple(load_profile(p) for p in sorted(d.glob("*.json")))


PROFILE_DIRS_ENV = "TUNER_PROFILE_DIRS"  # more profile folders, ':'-separated (``bench fidelity --profiles``)


def profile_dirs(gpu: str, extra_dirs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Where a GPU's profiles are read from: the committed folder, the environment's, ``extra_dirs``."""
    env = tuple(d for d in os.environ.get(PROFILE_DIRS_ENV, "").split(os.pathsep) if d)
    return (str(PROFILE_DIR / gpu.lower()), *env, *extra_dirs)


def tables_for_gpu(gpu: str, extra_dirs: tuple[str, ...] = ()) -> OpTables:
    """Profiles committed under ``tuner/sim/profiles/<gpu>/`` plus any in ``$TUNER_PROFILE_DIRS``
    and ``extra_dirs``."""
    files: list[ProfileFile] = []
    for d in profile_dirs(gpu, extra_dirs):
        files.extend(f for f in _load_dir(str(d)) if f.gpu == gpu.lower())
    return OpTables(files)


def profiles_fingerprint(gpu: str) -> tuple:
    """What the profiles of a GPU are right now (paths and modification times): part of the key
    under which step-time models are reused."""
    out = []
    for d in map(Path, profile_dirs(gpu)):
        if d.is_dir():
            out.extend((str(p), p.stat().st_mtime_ns) for p in sorted(d.glob("*.json")))
    return tuple(out)


def clear_cache() -> None:
    _load_dir.cache_clear()
