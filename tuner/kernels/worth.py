"""Is the ``moe-tile-configs: tuned`` choice worth a trial for a configuration? (pure CPU)

Only where the measurements say it can matter: a tuned file exists for the shape the trial's
SGLang will look up, and its tune report measured a gain over what SGLang would use anyway (its
shipped file, else its default) of at least ``min_gain`` at some batch size of the range the trial
serves. A serving refit in the simulator calibration that found no gain anywhere overrides that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

DEFAULT_MIN_GAIN = 1.03


@dataclass
class Verdict:
    worth: bool
    reason: str
    best_gain: float | None = None
    shape_tag: str | None = None


def _reports(tuned_dir: Path) -> list[dict]:
    out = []
    for path in sorted((tuned_dir / "reports").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        out.extend(r for r in doc.get("reports", [doc]) if isinstance(r, dict) and "rows" in r)
    return out


def tile_configs_worth_trial(model: str, gpu_device_name: str, weight_format: str, *, tp_size: int,
                             ep_size: int = 1, tuned_dir: str | Path, shared_experts_fusion: bool = True,
                             min_gain: float = DEFAULT_MIN_GAIN, batch_range: tuple[int, int] | None = None,
                             serving_speedups: dict[int, float] | None = None) -> Verdict:
    from tuner.kernels.configfile import moe_config_filename
    from tuner.kernels.sglang_layout import device_file_name
    from tuner.kernels.shapes import moe_shape

    if min_gain <= 0:
        raise ConfigError(f"min_gain must be positive, got {min_gain}", key="min_gain")
    formats = {"bf16": ("bf16", None), "fp8_block": ("fp8_w8a8", (128, 128))}
    if weight_format not in formats:
        return Verdict(False, f"{weight_format} weights do not run SGLang's Triton fused-MoE kernel")
    dtype, block = formats[weight_format]
    shape = moe_shape(model, tp_size, ep_size, dtype, block, disable_shared_experts_fusion=not shared_experts_fusion)
    tuned_dir = Path(tuned_dir)
    name = moe_config_filename(shape.num_experts, shape.intermediate, gpu_device_name, shape.config_dtype,
                               shape.block_shape)
    if not any((tuned_dir / "configs").glob(f"triton_*/{name}")):
        return Verdict(False, f"no tuned file {name} under {tuned_dir}/configs", shape_tag=shape.tag)
    if serving_speedups and max(serving_speedups.values()) < min_gain:
        return Verdict(False, f"serving with tuned tiles measured at most {max(serving_speedups.values()):.3f}x",
                       shape_tag=shape.tag)
    rows = [row for rep in _reports(tuned_dir) if rep.get("kind") == "moe" and rep.get("tag") == shape.tag
            and device_file_name(rep.get("device_name") or "") == device_file_name(gpu_device_name)
            for row in rep["rows"]]
    if batch_range:
        lo, hi = batch_range
        rows = [r for r in rows if lo <= int(r["batch_size"]) <= hi]
    gains = [float(r["speedup_vs_baseline"]) for r in rows if r.get("speedup_vs_baseline")]
    if not gains:
        return Verdict(False, f"no tune report measures {shape.tag} on {gpu_device_name}", shape_tag=shape.tag)
    best = max(gains)
    if best < min_gain:
        return Verdict(False, f"tuned tiles gain at most {best:.3f}x over SGLang's own (< {min_gain})", best, shape.tag)
    return Verdict(True, f"tuned tiles gain up to {best:.3f}x over SGLang's own", best, shape.tag)
