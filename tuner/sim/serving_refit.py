"""Refit the MoE tile speedups from a measured serving difference (default vs tuned tiles).

Two load-point sets of the same workload (same user counts), one served with SGLang's shipped or
default tiles, one with tuned tiles. At each user count:

* the decode batch is the number of requests decoding at once, by Little's law
  ``output tokens/s x TPOT`` (each decoding request yields 1/TPOT tokens per second);
* the step-time ratio is ``r = P50 TPOT default / P50 TPOT tuned``;
* without kernel times the whole step-time change is put on the MoE (``s = r``), the smallest
  speedup that explains the measurement.

The speedups are written into ``moe_tuned_speedup`` of ``calibration/<gpu>.yaml`` (keys: decode
tokens), as ``calibrate.py`` writes kernel speedups; kernel entries near a serving one are replaced.

**With every tuned kernel of the model** (``kernel_terms``: the fused MoE and, for block-fp8 models,
the linear layers' GEMMs, from a tune summary; a trial's ``moe-tile-configs: tuned`` ships both
kinds of file) the step change is shared out by what each kernel saves, not put on the MoE alone:

* per second of serving the server runs ``1 / P50 TPOT`` decode steps of the decode batch and, where
  the load point says so, ``computed prefill tokens/s / tokens per prefill pass`` prefill passes;
* each kernel's time and saving per second follow from its tuned and untuned times at those token
  counts (its layers x calls); their sum ``S`` predicts ``1 - 1/r`` (seconds saved per second);
* the realisation ``a = (1 - 1/r) / S`` says how much of the kernel saving serving showed; the
  refit speedup of each kind at each tuned batch size M is ``base / (base - a x saving)``, written to
  ``moe_tuned_speedup`` and ``gemm_tuned_speedup`` with ``a`` the median over user counts.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuner.catalog import get_model
from tuner.errors import ConfigError
from tuner.kernels.gemm_shapes import linear_layers
from tuner.kernels.shapes import moe_shape
from tuner.kernels.targets import Kernel
from tuner.planner.memory import decode_capture_sizes
from tuner.sim.calibrate import CALIBRATION_DIR, _read, interpolated_speedup, load_calibration
from tuner.sim.decode_ab import percentile_interval

SPEEDUP_BOUNDS = (0.25, 4.0)
# Serving that shows much more (or much less) than the tuned kernels' own saving is not explained by
# them (other differences between the two servers, routing unlike the kernels' benchmark): such a
# realisation is reported, and written only when asked. Two servers of the same tiles differed by
# ~1% in P50 TPOT on the H200, so the band is wide of noise.
REALISATION_PLAUSIBLE = (0.5, 1.5)


def realisation_plausible(a: float | None) -> bool:
    return a is not None and REALISATION_PLAUSIBLE[0] <= a <= REALISATION_PLAUSIBLE[1]


@dataclass
class ServingPair:
    users: int
    decode_tokens: float
    tpot_default_s: float
    tpot_tuned_s: float
    step_ratio: float
    moe_share: float
    moe_speedup: float
    predicted_saved_fraction: float | None = None  # S: kernel seconds saved per second of serving
    realisation: float | None = None  # a = measured (1 - 1/r) / S
    prefill_tokens_per_pass: float | None = None  # None: no prefill rate in the load point


@dataclass(frozen=True)
class KernelTerm:
    """One tuned kernel of a forward pass: ``calls`` per pass, its untuned and tuned times (us) by M."""

    kind: Kernel
    tag: str
    calls: int
    base_us: dict[int, float]
    tuned_us: dict[int, float]

    def base_s(self, tokens: float) -> float:
        return self.calls * interpolated_speedup(self.base_us, tokens) * 1e-6

    def saving_s(self, tokens: float) -> float:
        return self.calls * (interpolated_speedup(self.base_us, tokens) - interpolated_speedup(self.tuned_us, tokens)) * 1e-6


def load_points(path: str | Path) -> list[dict]:
    """Load points from JSON (a list, or under ``load_points`` / ``measurements``) or JSONL."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read ({exc.strerror})", file=str(path)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:
            doc = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"neither JSON nor JSON lines ({exc})", file=str(path)) from None
    if isinstance(doc, dict):
        doc = [doc] if "users" in doc else doc.get("load_points", doc.get("measurements"))
    if not isinstance(doc, list) or not doc:
        raise ConfigError("no load points (a list of {users, p50_tpot_s, throughput_tokens_per_s})", file=str(path))
    for i, p in enumerate(doc):
        missing = [k for k in ("users", "p50_tpot_s", "throughput_tokens_per_s") if not isinstance(p, dict) or k not in p]
        if missing:
            raise ConfigError(f"load point {i} lacks {', '.join(missing)}", file=str(path))
    return doc


def _rows_us(report: dict) -> tuple[dict[int, float], dict[int, float]]:
    """({M: untuned us (shipped, else default)}, {M: chosen us}) of a tune report's rows, or of a
    ``tuner kernels compare`` report's (``files_us``: the very files a server read, timed under the
    routing it names)."""
    base, tuned = {}, {}
    for row in report.get("rows", []):
        b = row.get("shipped_us") or row.get("default_us")
        c = row.get("chosen_us") or row.get("files_us")
        if b and c and math.isfinite(b) and math.isfinite(c):
            base[int(row["batch_size"])] = float(b)
            tuned[int(row["batch_size"])] = float(c)
    return base, tuned


def kernel_terms(report: dict | str | Path, model: str, *, tp_size: int = 1, dtype: str = "bf16",
                 where: str = "kernel_report") -> list[KernelTerm]:
    """The tuned kernels of ``model`` at ``tp_size`` in a tune summary (or one report): its fused MoE
    shape of ``dtype`` and, for fp8_w8a8, the block-fp8 GEMMs of its linear layers."""
    if not isinstance(report, dict):
        try:
            report = json.loads(Path(report).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the tune report ({exc})", file=str(report), key=where) from None
    reps = {r.get("tag"): r for r in report.get("reports", [report]) if isinstance(r, dict)}
    fp8 = dtype == "fp8_w8a8"
    terms = []
    spec = get_model(model)
    if spec.is_moe:
        tag = moe_shape(spec, tp_size, 1, dtype, (128, 128) if fp8 else None).tag
        if tag in reps:
            base, tuned = _rows_us(reps[tag])
            if base:
                terms.append(KernelTerm(Kernel.MOE, tag, spec.num_moe_layers, base, tuned))
    if fp8:
        calls: dict[str, int] = {}
        for layer in linear_layers(model, tp_size):
            calls[layer.shape.tag] = calls.get(layer.shape.tag, 0) + layer.count
        for tag, n in calls.items():
            if tag in reps:
                base, tuned = _rows_us(reps[tag])
                if base:
                    terms.append(KernelTerm(Kernel.GEMM, tag, n, base, tuned))
    if not terms:
        raise ConfigError(f"the tune report has no tuned kernel of {model} at TP {tp_size} ({dtype}); it holds "
                          f"{', '.join(str(t) for t in reps) or 'nothing'}", key=where)
    return terms


def prefill_rate(point: dict) -> tuple[float, float] | None:
    """(prefill passes per second, tokens per pass) of a load point, from the prefill tokens the server
    computed in the window and its own pass counters; None when the point does not carry them."""
    extra = point.get("extra") or {}
    reuse = extra.get("prefix_reuse") or {}
    metrics = extra.get("server_metrics") or {}
    duration = point.get("duration_s")
    computed = reuse.get("computed_tokens")
    tokens = metrics.get("sglang:realtime_tokens_total{mode=prefill_compute}")
    passes = metrics.get("sglang:cuda_graph_passes_total{mode=prefill_none}")
    if not duration or computed is None or not tokens or not passes:
        return None
    per_pass = float(tokens) / float(passes)
    return float(computed) / float(duration) / per_pass, per_pass


def padded_decode_batches(mean: float, users: int, max_bs: int = 256) -> list[tuple[int, float]]:
    """The batch a decode step's kernels run, as (M, probability): each of ``users`` closed-loop users
    decoding with probability ``mean / users`` (a binomial batch of that mean), the batch padded up to
    the next CUDA-graph size (``decode_capture_sizes``); an empty batch runs no step."""
    sizes = decode_capture_sizes(max_bs)
    p = min(1.0, max(0.0, mean / users)) if users > 0 else 0.0
    out: dict[int, float] = {}
    for k in range(1, users + 1):
        w = math.comb(users, k) * p ** k * (1 - p) ** (users - k)
        if w > 0:
            m = next((s for s in sizes if s >= k), k)
            out[m] = out.get(m, 0.0) + w
    total = sum(out.values())
    return [(m, w / total) for m, w in sorted(out.items())] if total > 0 else [(max(1, round(mean)), 1.0)]


def _saved_per_s(terms: list[KernelTerm], tpot_s: float, batches: list[tuple[float, float]],
                 prefill: tuple[float, float] | None, kind: Kernel | None = None) -> tuple[float, float]:
    """(kernel seconds per second of serving, of which saved by the tuned tiles) over ``terms``;
    ``batches``: the decode batches a step runs, with their probabilities."""
    base = saved = 0.0
    for t in terms:
        if kind is not None and t.kind is not kind:
            continue
        for m, w in batches:
            base += w * t.base_s(m) / tpot_s
            saved += w * t.saving_s(m) / tpot_s
        if prefill is not None:
            rate, per_pass = prefill
            base += rate * t.base_s(per_pass)
            saved += rate * t.saving_s(per_pass)
    return base, saved


def serving_pairs(default_points: list[dict], tuned_points: list[dict], *,
                  terms: list[KernelTerm] | None = None, decode_padding: bool = False) -> list[ServingPair]:
    """``decode_padding``: the kernels' decode terms at the batches SGLang's CUDA graphs run
    (``padded_decode_batches``) instead of at the mean decode batch."""
    tuned = {int(p["users"]): p for p in tuned_points if p.get("valid", True)}
    pairs = []
    for d in default_points:
        u = int(d["users"])
        t = tuned.get(u)
        if t is None or not d.get("valid", True):
            continue
        td, tt = d.get("p50_tpot_s"), t.get("p50_tpot_s")
        if not td or not tt or td <= 0 or tt <= 0:
            continue
        decode = float(d["throughput_tokens_per_s"]) * float(td)
        if decode < 0.5:
            continue
        r = td / tt
        if terms:
            batches = padded_decode_batches(decode, u) if decode_padding else [(decode, 1.0)]
            pairs.append(_attributed_pair(u, decode, td, tt, terms, prefill_rate(d), batches))
            continue
        # no kernel times: the whole step change on the MoE (f = 1), the smallest speedup that fits
        pairs.append(ServingPair(u, decode, td, tt, r, 1.0, _speedup(td, tt)))
    if not pairs:
        raise ConfigError("no user count measured validly in both sets (need matching users with p50_tpot_s)",
                          key="load_points")
    return pairs


def _speedup(before_s: float, after_s: float) -> float:
    """before / after within SPEEDUP_BOUNDS (nothing left after: the upper bound)."""
    s = SPEEDUP_BOUNDS[1] if after_s <= 0 else before_s / after_s
    return min(SPEEDUP_BOUNDS[1], max(SPEEDUP_BOUNDS[0], s))


def _attributed_pair(users: int, decode: float, td: float, tt: float, terms: list[KernelTerm],
                     prefill: tuple[float, float] | None, batches: list[tuple[float, float]]) -> ServingPair:
    r = td / tt
    _, saved = _saved_per_s(terms, td, batches, prefill)
    measured = 1.0 - 1.0 / r
    a = measured / saved if saved > 0 else None
    moe_base, moe_saved = _saved_per_s(terms, td, batches, prefill, Kernel.MOE)
    share = min(1.0, moe_base)  # MoE seconds per second of serving
    s = _speedup(moe_base, moe_base - a * moe_saved) if a is not None and moe_base > 0 else 1.0
    return ServingPair(users, decode, td, tt, r, share, s, predicted_saved_fraction=saved, realisation=a,
                       prefill_tokens_per_pass=prefill[1] if prefill else None)


def realisation(pairs: list[ServingPair]) -> float | None:
    """The median realisation over the pairs that have one."""
    values = [p.realisation for p in pairs if p.realisation is not None]
    return statistics.median(values) if values else None


@dataclass
class DecodeStepRow:
    """One batch of one log pair: the kernels' predicted saving of a decode step against the servers'."""

    pair: int  # index of the log pair
    batch: int
    windows: int  # the smaller of the two servers' window counts (the row's weight)
    default_step_ms: float  # the default server's fitted pure-decode step at the pooled context
    predicted_saving: float  # the tuned kernels' saving over that step (fraction)
    measured_saving: float  # 1 - tuned step / default step


@dataclass
class DecodeStepRealisation:
    """How much of the tuned kernels' predicted saving the servers' pure-decode steps showed, pooled
    over every batch of every log pair (``a = sum w x measured / sum w x predicted``), with a 90%
    interval from resampling the windows. A step at equal batch and context carries no window
    traffic, so unlike a whole-TPOT realisation it compares the kernels with the kernels."""

    rows: list[DecodeStepRow]
    realisation: float | None
    interval: tuple[float, float] | None

    @property
    def confirms_kernels(self) -> bool:
        """The interval holds 1: the kernel timings explain the servers' steps; nothing to refit."""
        return self.interval is not None and self.interval[0] <= 1.0 <= self.interval[1]

    def to_dict(self) -> dict:
        return {"realisation": self.realisation, "interval": list(self.interval) if self.interval else None,
                "confirms_kernels": self.confirms_kernels, "rows": [r.__dict__ for r in self.rows]}


def _predicted_step_saving(terms: list[KernelTerm], batch: int, step_s: float) -> float:
    return sum(t.saving_s(batch) for t in terms) / step_s if step_s > 0 else 0.0


def _pooled(parts: list[tuple[list[int], list[int], list[float], list[float]]], terms: list[KernelTerm]) -> float | None:
    """sum w x measured / sum w x predicted over (batches, weights, ratios, default steps) parts."""
    num = den = 0.0
    for batches, weights, ratios, steps in parts:
        for b, w, r, st in zip(batches, weights, ratios, steps):
            num += w * (1.0 - r)
            den += w * _predicted_step_saving(terms, b, st)
    return float(num / den) if den > 1e-12 else None


def decode_step_realisation(pairs: list, terms: list[KernelTerm]) -> DecodeStepRealisation:
    """``pairs``: ``decode_ab.PairedBatches`` of (default server, tuned server) log pairs."""
    pairs = [p for p in pairs if p is not None]
    if not pairs:
        raise ConfigError("no batch size with pure-decode windows in both logs of any pair", key="logs")
    rows = [DecodeStepRow(i, b, w, float(st) * 1e3, float(_predicted_step_saving(terms, b, st)), float(1.0 - r))
            for i, p in enumerate(pairs) for b, w, r, st in zip(p.batches, p.weights, p.ratios, p.a_steps_s)]
    a = _pooled([(p.batches, p.weights, p.ratios, p.a_steps_s) for p in pairs], terms)
    n = min(len(p.draws) for p in pairs)
    draws = [_pooled([(p.batches, p.weights, *p.draws[i]) for p in pairs], terms) for i in range(n)]
    interval = percentile_interval([d for d in draws if d is not None]) if a is not None else None
    return DecodeStepRealisation(rows, a, interval)


def attributed_speedups(terms: list[KernelTerm], a: float) -> dict[str, dict[int, float]]:
    """{calibration key: {M: speedup}} at each tuned batch size: ``base / (base - a x saving)`` per kind."""
    out: dict[str, dict[int, float]] = {}
    for kind, key in ((Kernel.MOE, "moe_tuned_speedup"), (Kernel.GEMM, "gemm_tuned_speedup")):
        mine = [t for t in terms if t.kind is kind]
        if not mine:
            continue
        sizes = sorted({M for t in mine for M in t.base_us})
        table = {}
        for M in sizes:
            base = sum(t.base_s(M) for t in mine)
            table[M] = round(_speedup(base, base - a * sum(t.saving_s(M) for t in mine)), 4)
        out[key] = table
    return out


def refit_from_serving(pairs: list[ServingPair], calibration: dict, terms: list[KernelTerm] | None = None,
                       realised: float | None = None) -> dict:
    """``calibration`` with ``moe_tuned_speedup`` set from the pairs (nearby kernel entries replaced).

    With ``terms``: every tuned batch size's MoE and GEMM speedup from the median realisation of the
    pairs, or from ``realised`` (a decode-step realisation) where given."""
    if terms:
        a = realised if realised is not None else realisation(pairs)
        if a is None:
            raise ConfigError("the tuned kernels save nothing at the measured batch sizes: no realisation to fit",
                              key="kernel_report")
        out = dict(calibration)
        out.update(attributed_speedups(terms, a))
        out["tile_serving_realisation"] = round(a, 4)
        return out
    table = {int(k): float(v) for k, v in (calibration.get("moe_tuned_speedup") or {}).items()}
    serving = {max(1, round(p.decode_tokens)): round(p.moe_speedup, 4) for p in pairs}
    kept = {k: v for k, v in table.items() if all(abs(math.log(k / m)) > math.log(1.25) for m in serving)}
    out = dict(calibration)
    out["moe_tuned_speedup"] = dict(sorted({**kept, **serving}.items()))
    return out


def write_gpu_calibration(gpu: str, pairs: list[ServingPair], source_note: str,
                          calibration_dir: Path = CALIBRATION_DIR, terms: list[KernelTerm] | None = None,
                          realised: float | None = None) -> Path:
    """Rewrite ``calibration/<gpu>.yaml``'s tile speedups, keeping the file's own comments."""
    path = Path(calibration_dir) / f"{gpu}.yaml"
    current = _read(path) if path.exists() else {}
    base = load_calibration(gpu) if calibration_dir == CALIBRATION_DIR else current
    fitted = refit_from_serving(pairs, {**base, "moe_tuned_speedup": current.get("moe_tuned_speedup",
                                                                                 base.get("moe_tuned_speedup"))},
                                terms, realised)
    for key in ("moe_tuned_speedup", "gemm_tuned_speedup", "tile_serving_realisation"):
        if key in fitted:
            current[key] = fitted[key]
    header = []
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if "MoE entries refit from serving" not in line:
                header.append(line)
    header.append(f"# MoE entries refit from serving {source_note}")
    tmp = path.with_suffix(".yaml.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(header) + "\n")
        yaml.safe_dump(current, f, sort_keys=False)
    tmp.replace(path)
    return path
