"""Is the ``moe-tile-configs: tuned`` choice worth a trial for a configuration? (pure CPU)

Only where the measurements say it can matter:

* a tuned file exists for the shape the trial's SGLang will look up;
* that file covers the batch sizes the trial runs. SGLang serves a batch of M tokens with the
  file's entry at the nearest key (``min(keys, key=lambda k: abs(k - M))``), so a file tuned only at
  M = 1..16 serves 64..8192-token prefill chunks with its M = 16 tiles, which may well be slower than
  SGLang's shipped file. The key that serves each M of the trial's range must cover it
  (``key_covers``: M at most 1.5x above it, or 2.5x below), unless the tune report says what SGLang
  ships for the shape: a trial's file is merged over SGLang's shipped file (or another Triton
  version's, its fallback), or over its default config where it ships none
  (``tuner.backends.moe_configs``), so the batch sizes no tuned key covers keep SGLang's own entries;
* its tune report measured a gain over what SGLang would use anyway (its shipped file, else its
  default) of at least ``min_gain`` at some batch size of that range.

A serving refit in the simulator calibration that found no gain anywhere overrides that. And where
the trial's server routes every token to the same few experts (random weights under a biased gate,
``tuner.catalog.routing``), only a tune timed under that routing (``--routing collapsed``) counts: tiles
tuned with tokens routed apart measured 1.7-2.4x slower than SGLang's default there (DeepSeek-V3,
``results/kernels/h200/sglang/compare/``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError
from tuner.kernels.configfile import MAX_KEY_RATIO_ABOVE, MAX_KEY_RATIO_BELOW, key_excess
from tuner.kernels.sglang_env import Found
from tuner.kernels.targets import SGLANG_BATCH_SIZES
from tuner.kernels.tune import shape_reports

DEFAULT_MIN_GAIN = 1.03
_VERSION_DIR = re.compile(r"^triton_(\d+(?:_\d+)*)$")


@dataclass
class Verdict:
    worth: bool
    reason: str
    best_gain: float | None = None
    shape_tag: str | None = None


def trial_batch_range(chunked_prefill_size: int, max_running_requests: int | None = None,
                      cuda_graph_max_bs: int | None = None) -> tuple[int, int]:
    """The token counts M a trial's MoE layers run: decode batches of 1 up to its running-request
    limit (or, when that is unset, its decode CUDA-graph size), prefill chunks up to its
    chunked-prefill size."""
    decode = max_running_requests or cuda_graph_max_bs or 1
    for key, v in (("chunked_prefill_size", chunked_prefill_size), ("max_running_requests", decode)):
        if int(v) < 1:
            raise ConfigError(f"{key} must be >= 1, got {v}", key=key)
    return 1, max(int(chunked_prefill_size), int(decode))


def find_tuned_file(configs_dir: Path, name: str) -> Path | None:
    """``configs_dir/triton_X_Y_Z/name`` for the newest Triton directory holding it, else None.

    An explicit listing, not a glob: SGLang's names hold ``[128, 128]``, which glob patterns read as
    a character class.
    """
    if not configs_dir.is_dir():
        return None
    dirs = [(tuple(int(x) for x in m.group(1).split("_")), d) for d in configs_dir.iterdir()
            if d.is_dir() and (m := _VERSION_DIR.match(d.name))]
    for _, d in sorted(dirs, reverse=True):
        if (d / name).is_file():
            return d / name
    return None


def uncovered_batch_sizes(keys: list[int], batch_range: tuple[int, int], above: float = MAX_KEY_RATIO_ABOVE,
                          below: float = MAX_KEY_RATIO_BELOW) -> tuple[int, int] | None:
    """The worst-served M of ``batch_range`` as (M, key serving it) when its key does not cover it
    (more than ``above`` x above the key, or ``below`` x below it); None when the keys cover the
    whole range. Above SGLang's largest tuning batch size (4096) every file serves M with its entry
    there, SGLang's shipped ones too, so the range is checked up to that size."""
    lo, hi = batch_range[0], min(batch_range[1], max(SGLANG_BATCH_SIZES))
    ks = sorted(set(int(k) for k in keys if int(k) > 0))
    if not ks:
        return lo, 0
    worst: tuple[float, int, int] | None = None
    for i, k in enumerate(ks):
        # key k serves the M nearer to it than to its neighbours (ties go to the smaller key)
        first = lo if i == 0 else max(lo, (ks[i - 1] + k) // 2 + 1)
        last = hi if i == len(ks) - 1 else min(hi, (k + ks[i + 1]) // 2)
        if first > last:
            continue
        for M in (first, last):
            excess = key_excess(k, M, above, below)
            if worst is None or excess > worst[0]:
                worst = (excess, M, k)
    if worst is None or worst[0] <= 1.0:
        return None
    return worst[1], worst[2]


def _moe_reports(tuned_dir: Path, shape_tag: str, gpu_device_name: str) -> list[dict]:
    from tuner.kernels.sglang_layout import device_file_name

    return [rep for rep in shape_reports(tuned_dir) if rep.get("kind") == "moe" and rep.get("tag") == shape_tag
            and device_file_name(rep.get("device_name") or "") == device_file_name(gpu_device_name)]


def _routed_apart(reports: list[dict], file_name: str) -> str | None:
    """Why tiles whose tune reports all routed tokens apart do not suit a collapsed router; None
    where one report tuned under the collapsed routing, or there are no reports to tell."""
    if not reports or any(rep.get("routing") == "collapsed" for rep in reports):
        return None
    tuned_under = sorted({str(rep.get("routing") or "sglang-tuner") for rep in reports})
    return (f"{file_name} was tuned with tokens routed apart ({', '.join(tuned_under)}); this trial's server "
            "sends every token to the same few experts (random weights, biased gate), where such tiles "
            "measured slower than SGLang's own: tune with --routing collapsed")


def collapsed_routing_mismatch(model: str, gpu_device_name: str, weight_format: str, *, tp_size: int,
                               ep_size: int = 1, tuned_dir: str | Path,
                               shared_experts_fusion: bool = True) -> str | None:
    """For a server whose router collapses (``tuner.catalog.routing``): why the folder's tiles for
    this MoE shape were tuned for another routing, or None (tuned under it, no report, or no
    Triton fused MoE for these weights)."""
    from tuner.kernels.configfile import moe_config_filename
    from tuner.kernels.shapes import TRITON_MOE_DTYPES, moe_shape

    if weight_format not in TRITON_MOE_DTYPES:
        return None
    dtype, block = TRITON_MOE_DTYPES[weight_format]
    try:
        shape = moe_shape(model, tp_size, ep_size, dtype, block, disable_shared_experts_fusion=not shared_experts_fusion)
    except ConfigError:
        return None
    name = moe_config_filename(shape.num_experts, shape.intermediate, gpu_device_name, shape.config_dtype,
                               shape.block_shape)
    return _routed_apart(_moe_reports(Path(tuned_dir), shape.tag, gpu_device_name), name)


def tile_configs_worth_trial(model: str, gpu_device_name: str, weight_format: str, *, tp_size: int,
                             ep_size: int = 1, tuned_dir: str | Path, shared_experts_fusion: bool = True,
                             min_gain: float = DEFAULT_MIN_GAIN, batch_range: tuple[int, int] | None = None,
                             serving_speedups: dict[int, float] | None = None,
                             key_ratio_above: float = MAX_KEY_RATIO_ABOVE, collapsed_routing: bool = False) -> Verdict:
    """``batch_range`` is the trial's (1, max M) from ``trial_batch_range``; without it the file's
    coverage is not checked and every measured batch size counts. ``collapsed_routing``: the trial's
    server sends every token to the same few experts."""
    from tuner.kernels.configfile import moe_config_filename, read_configs
    from tuner.kernels.shapes import TRITON_MOE_DTYPES, moe_shape

    if min_gain <= 0:
        raise ConfigError(f"min_gain must be positive, got {min_gain}", key="min_gain")
    if batch_range is not None and not 1 <= batch_range[0] <= batch_range[1]:
        raise ConfigError(f"batch range {batch_range} must be 1 <= low <= high", key="batch_range")
    if weight_format not in TRITON_MOE_DTYPES:
        return Verdict(False, f"{weight_format} weights do not run SGLang's Triton fused-MoE kernel")
    dtype, block = TRITON_MOE_DTYPES[weight_format]
    shape = moe_shape(model, tp_size, ep_size, dtype, block, disable_shared_experts_fusion=not shared_experts_fusion)
    tuned_dir = Path(tuned_dir)
    name = moe_config_filename(shape.num_experts, shape.intermediate, gpu_device_name, shape.config_dtype,
                               shape.block_shape)
    path = find_tuned_file(tuned_dir / "configs", name)
    if path is None:
        return Verdict(False, f"no tuned file {name} under {tuned_dir}/configs", shape_tag=shape.tag)
    if serving_speedups and max(serving_speedups.values()) < min_gain:
        return Verdict(False, f"serving with tuned tiles measured at most {max(serving_speedups.values()):.3f}x",
                       shape_tag=shape.tag)
    reports = _moe_reports(tuned_dir, shape.tag, gpu_device_name)
    if collapsed_routing and (why := _routed_apart(reports, path.name)) is not None:
        return Verdict(False, why, shape_tag=shape.tag)
    if batch_range is not None:
        keys = sorted(read_configs(path))
        gap = uncovered_batch_sizes(keys, batch_range, key_ratio_above)
        # the trial's file is merged over what SGLang runs without it (its shipped file, another Triton
        # version's fallback, or its default config where it ships none: tuner.backends.moe_configs),
        # so batch sizes the tune left uncovered keep SGLang's own tiles; without a report to say what
        # SGLang ships, the file itself must cover the range
        merged_over_sglang = any((rep.get("shipped_up") or {}).get("found") in {f.value for f in Found}
                                 for rep in reports)
        if gap is not None and not merged_over_sglang:
            M, key = gap
            incomplete = [rep for rep in reports if rep.get("complete") is False]
            todo = sorted({int(b) for rep in incomplete for b in rep.get("batch_sizes_requested") or []} - set(keys))
            more = (f"; its tune report is incomplete (batch sizes {todo} not yet tuned: rerun `tuner kernels "
                    f"tune` with the same -o to continue)" if todo else "")
            where = f"{M / key:.3g}x above" if M >= key else f"{key / M:.3g}x below"
            return Verdict(False, f"{path.name} is tuned at M={keys} only: the trial runs M={batch_range[0]}.."
                           f"{batch_range[1]}, and M={M} would use the M={key} tiles (M is {where} them), "
                           f"possibly slower than SGLang's own{more}", shape_tag=shape.tag)
    rows = [row for rep in reports for row in rep["rows"]]
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
