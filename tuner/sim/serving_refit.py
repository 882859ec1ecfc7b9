"""Refit the MoE tile speedups from a measured serving difference (default vs tuned tiles).

Two load-point sets of the same workload (same user counts), one served with SGLang's shipped or
default tiles, one with tuned tiles. At each user count:

* the decode batch is the number of requests decoding at once, by Little's law
  ``output tokens/s x TPOT`` (each decoding request yields 1/TPOT tokens per second);
* the step-time ratio is ``r = P50 TPOT default / P50 TPOT tuned``;
* only the MoE part of a step changes with the tiles. With its share ``f`` of the default step
  (``moe_layers x`` the measured default MoE layer time at that batch / P50 TPOT default, from the
  kernel tune report), ``1/r = (1 - f) + f / s`` gives the MoE speedup ``s = f / (1/r - (1 - f))``.
  Without a kernel report ``f = 1``: the whole step-time change is put on the MoE, which is the
  smallest speedup that explains the measurement.

The speedups are written into ``moe_tuned_speedup`` of ``calibration/<gpu>.yaml`` (keys: decode
tokens), as ``calibrate.py`` writes kernel speedups; kernel entries near a serving one are replaced.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuner.errors import ConfigError
from tuner.sim.calibrate import CALIBRATION_DIR, _read, load_calibration

SPEEDUP_BOUNDS = (0.25, 4.0)


@dataclass
class ServingPair:
    users: int
    decode_tokens: float
    tpot_default_s: float
    tpot_tuned_s: float
    step_ratio: float
    moe_share: float
    moe_speedup: float


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


def _interp_log(table: dict[int, float], x: float) -> float:
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    if x >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= x <= hi:
            w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return table[lo] + w * (table[hi] - table[lo])
    return table[keys[-1]]


def default_moe_us_from_report(report: dict | str | Path) -> dict[int, float]:
    """{batch size: the baseline (shipped, else default) MoE layer time, us} from a tune report."""
    if not isinstance(report, dict):
        report = json.loads(Path(report).read_text())
    reps = report.get("reports", [report])
    moes = [r for r in reps if r.get("kind") == "moe"]
    if not moes:
        raise ConfigError("the tune report has no fused-MoE shape", key="kernel_report")
    if len(moes) > 1:
        raise ConfigError(f"the tune summary holds {len(moes)} fused-MoE shapes "
                          f"({', '.join(str(r.get('tag')) for r in moes)}); pass that shape's reports/<shape>.json",
                          key="kernel_report")
    moe = moes[0]
    out = {}
    for row in moe["rows"]:
        us = row.get("shipped_us") or row.get("default_us")
        if us:
            out[int(row["batch_size"])] = float(us)
    if not out:
        raise ConfigError("the tune report has no timed batch size", key="kernel_report")
    return out


def serving_pairs(default_points: list[dict], tuned_points: list[dict], *, moe_layers: int | None = None,
                  moe_us: dict[int, float] | None = None) -> list[ServingPair]:
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
        f = 1.0
        if moe_us and moe_layers:
            f = min(0.95, max(0.01, moe_layers * _interp_log(moe_us, decode) * 1e-6 / td))
        denom = 1.0 / r - (1.0 - f)
        s = SPEEDUP_BOUNDS[1] if denom <= 0 else f / denom
        s = min(SPEEDUP_BOUNDS[1], max(SPEEDUP_BOUNDS[0], s))
        pairs.append(ServingPair(u, decode, td, tt, r, f, s))
    if not pairs:
        raise ConfigError("no user count measured validly in both sets (need matching users with p50_tpot_s)",
                          key="load_points")
    return pairs


def refit_from_serving(pairs: list[ServingPair], calibration: dict) -> dict:
    """``calibration`` with ``moe_tuned_speedup`` set from the pairs (nearby kernel entries replaced)."""
    table = {int(k): float(v) for k, v in (calibration.get("moe_tuned_speedup") or {}).items()}
    serving = {max(1, round(p.decode_tokens)): round(p.moe_speedup, 4) for p in pairs}
    kept = {k: v for k, v in table.items() if all(abs(math.log(k / m)) > math.log(1.25) for m in serving)}
    out = dict(calibration)
    out["moe_tuned_speedup"] = dict(sorted({**kept, **serving}.items()))
    return out


def write_gpu_calibration(gpu: str, pairs: list[ServingPair], source_note: str,
                          calibration_dir: Path = CALIBRATION_DIR) -> Path:
    """Rewrite ``calibration/<gpu>.yaml``'s MoE speedups, keeping the file's own comments."""
    path = Path(calibration_dir) / f"{gpu}.yaml"
    current = _read(path) if path.exists() else {}
    base = load_calibration(gpu) if calibration_dir == CALIBRATION_DIR else current
    fitted = refit_from_serving(pairs, {**base, "moe_tuned_speedup": current.get("moe_tuned_speedup",
                                                                                 base.get("moe_tuned_speedup"))})
    current["moe_tuned_speedup"] = fitted["moe_tuned_speedup"]
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
