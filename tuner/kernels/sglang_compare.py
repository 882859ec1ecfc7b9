"""Time SGLang's fused-MoE call with the config files of a directory against SGLang's own choice
(GPU; imports sglang).

``tuner kernels tune`` picks each batch size's tiles under one routing of the tokens to experts. A
server may route otherwise: with random weights (``--load-format dummy``) a biased gate sends every
token to the same few experts, so each hot expert gets most of the batch. This module answers
whether a tuned directory still beats SGLang's default (and its shipped file, where it has one) at
given batch sizes under a given routing: per batch size it takes the entries SGLang would read
(nearest batch size of the up file and of its ``_down`` twin) and times them in interleaved rounds
with SGLang's ``get_default_config`` answer, so drift between rounds hits every candidate alike.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Callable

from tuner.kernels.configfile import moe_config_filename
from tuner.kernels.sglang_env import Found, Lookup, shipped_down_configs, shipped_moe_configs
from tuner.kernels.shapes import MoEShape
from tuner.kernels.sglang_tune import describe_config, pair_at
from tuner.kernels.space import DownTileConfig, TileConfig, default_config

Log = Callable[[str], None]


def _both(pair: tuple[TileConfig, DownTileConfig | None]) -> tuple[TileConfig, DownTileConfig]:
    """A pair with its down tile always named: without a ``_down`` file the up tile serves both GEMMs."""
    up, down = pair
    return up, down if down is not None else DownTileConfig.from_tile(up)


def files_in(config_dir: Path, shape: MoEShape, device_name: str, triton_version_dir: str) -> tuple[Lookup, Lookup]:
    """The up and down files of ``shape`` in a directory laid out as SGLANG_MOE_CONFIG_DIR
    (``DIR/configs/triton_X_Y_Z/``), found the way SGLang finds them."""
    up_name = moe_config_filename(shape.num_experts, shape.intermediate, device_name, shape.config_dtype,
                                  shape.block_shape)
    down_name = moe_config_filename(shape.num_experts, shape.intermediate, device_name, shape.config_dtype,
                                    shape.block_shape, down=True)
    return (shipped_moe_configs(config_dir, up_name, triton_version_dir),
            shipped_down_configs(config_dir, up_name, down_name, triton_version_dir))


def compare_moe(shape: MoEShape, batch_sizes: list[int], config_dir: Path, *, routing: str,
                routed_pool: int | None = None, rounds: int = 5, seed: int = 0,
                log: Log = lambda msg: None) -> dict:
    """Per batch size: median us of SGLang's default, its shipped file (if any) and ``config_dir``'s
    files, timed in ``rounds`` interleaved rounds; and the per-round ratio files/default."""
    import triton

    from tuner.errors import ConfigError
    from tuner.kernels.sglang_kernels import SGLangMoE, runtime
    from tuner.kernels.timing import GraphTimer, device_facts, time_or_inf

    t0 = time.monotonic()
    rt = runtime()
    facts = device_facts()
    vdir = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    files_up, files_down = files_in(config_dir, shape, facts["device_name"], vdir)
    if files_up.found is Found.NONE:
        raise ConfigError(f"no {files_up.path or 'config file'} for {shape.tag} on {facts['device_name']} under "
                          f"{config_dir}/configs/{vdir}/ (or another triton_* folder)", file=str(config_dir))
    shipped_up, shipped_down = files_in(rt.installed.moe_config_root, shape, facts["device_name"], vdir)
    problem = SGLangMoE(shape, routing=routing, seed=seed, routed_pool=routed_pool)
    timer = GraphTimer(problem)
    log(f"{shape.tag}: SGLang {rt.version}, routing {routing}"
        f"{f' over {routed_pool} routed experts' if routed_pool else ''}; files {files_up.path} "
        f"(down: {files_down.found.value}); shipped {shipped_up.found.value}")
    rows = []
    for M in sorted(set(batch_sizes)):
        tm = time.monotonic()
        cands = {"default": default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                           shape.config_dtype, shape.block_shape),
                 "files": _both(pair_at(files_up, files_down, M))}
        shipped = pair_at(shipped_up, shipped_down, M)
        if shipped is not None:
            cands["shipped"] = _both(shipped)
        samples: dict[str, list[float]] = {k: [] for k in cands}
        for _ in range(rounds):
            for k, c in cands.items():
                samples[k].append(time_or_inf(timer, M, c, replays=10))
        med = {k: statistics.median(v) for k, v in samples.items()}
        ratios = [f / d for f, d in zip(samples["files"], samples["default"]) if math.isfinite(f / d)]
        row = {"batch_size": M, **{f"{k}_us": round(v, 3) if math.isfinite(v) else None for k, v in med.items()},
               "files_vs_default": round(statistics.median(ratios), 4) if ratios else None,
               "files_vs_default_range": [round(min(ratios), 4), round(max(ratios), 4)] if ratios else None,
               "configs": {k: describe_config(c) for k, c in cands.items()},
               "wall_s": round(time.monotonic() - tm, 1)}
        if "shipped" in med and math.isfinite(med["shipped"]) and med["shipped"] > 0:
            row["files_vs_shipped"] = round(med["files"] / med["shipped"], 4)
        rows.append(row)
        problem.drop_batch(M)
        log(f"M={M}: default {med['default']:.1f} us, files {med['files']:.1f} us "
            f"(x{row['files_vs_default']} of default, rounds {row['files_vs_default_range']})"
            f"{', shipped %.1f us' % med['shipped'] if 'shipped' in med else ''} ({row['wall_s']} s)")
    return {"kind": "moe-compare", "shape": shape.to_dict(), "tag": shape.tag, "sglang_version": rt.version,
            **facts, "routing": str(routing), "routed_pool": routed_pool, "rounds": rounds,
            "config_dir": str(config_dir), "files": {"up": str(files_up.path), "down": files_down.found.value,
                                                     "down_path": str(files_down.path) if files_down.path else None},
            "shipped": shipped_up.found.value, "rows": rows, "wall_s": round(time.monotonic() - t0, 1)}


def compare_table(doc: dict) -> list[str]:
    """The printed form of one ``compare_moe`` result."""
    pool = f" over {doc['routed_pool']} routed experts" if doc.get("routed_pool") else ""
    lines = [f"{doc['tag']} on {doc['device_name']}, SGLang {doc['sglang_version']}, routing {doc['routing']}{pool}, "
             f"{doc['rounds']} interleaved rounds",
             f"{'M':>6} {'default_us':>11} {'shipped_us':>11} {'files_us':>9} {'files/default':>14} "
             f"{'rounds':>15}  default BLOCK_SIZE_M / files'"]
    for r in doc["rows"]:
        rng = r.get("files_vs_default_range") or [None, None]
        cfg = r["configs"]
        files_bm = cfg["files"]["up"]["BLOCK_SIZE_M"] if cfg.get("files") else "-"
        lines.append(f"{r['batch_size']:>6} {_f(r.get('default_us')):>11} {_f(r.get('shipped_us')):>11} "
                     f"{_f(r.get('files_us')):>9} {_f(r.get('files_vs_default'), 3):>14} "
                     f"{_f(rng[0], 3) + '-' + _f(rng[1], 3):>15}  {cfg['default']['BLOCK_SIZE_M']} / {files_bm}")
    return lines


def _f(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"
