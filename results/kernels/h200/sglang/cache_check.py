"""Do the compile pool's binaries serve the timer? For one MoE shape, batch size and config: compile
it in a process the way the pool does (on the stand-in, and on the whole shape), then time it in
this process on the whole shape, and list the Triton cache entries this process still had to
build, each against the pool's entry of the same kernel: the first lines where their IR differs.

    python3 results/kernels/h200/sglang/cache_check.py [--shape dsv3|qwen3-fp8] [--M 32] \
        [--up 16,32,64,32,4,5] [--down 16,32,64,32,4,5,0]

(--up: BLOCK_SIZE_M,N,K,GROUP_SIZE_M,num_warps,num_stages; --down the same and USE_TMA 0/1; without
--down the up tile serves both GEMMs, as in the joint search.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
from pathlib import Path

SHAPES = {
    "dsv3": dict(num_experts=257, intermediate=2048, hidden=7168, topk=9, dtype="fp8_w8a8",
                 block_shape=(128, 128), fused_shared_experts=1),
    "qwen3-fp8": dict(num_experts=128, intermediate=768, hidden=2048, topk=8, dtype="fp8_w8a8",
                      block_shape=(128, 128)),
}


_CONFIG = {"up": "16,128,128,1,4,3", "down": "16,128,128,1,4,3,0"}


def _config():
    from tuner.kernels.space import DownTileConfig, TileConfig

    up = TileConfig(*[int(v) for v in _CONFIG["up"].split(",")])
    if not _CONFIG["down"]:
        return up
    *tile, tma = [int(v) for v in _CONFIG["down"].split(",")]
    return up, DownTileConfig(*tile, USE_TMA=bool(tma))


def _from_env() -> None:
    if "CACHE_CHECK_CONFIG" in os.environ:
        _CONFIG["up"], _CONFIG["down"] = os.environ["CACHE_CHECK_CONFIG"].split("|")


def _compile_in_child(shape_kw: dict, M: int, stand_in: bool, q) -> None:
    import torch

    _from_env()
    from tuner.kernels.sglang_compile import compile_stand_in
    from tuner.kernels.sglang_kernels import SGLangMoE
    from tuner.kernels.shapes import MoEShape

    shape = MoEShape(**shape_kw)
    use = compile_stand_in(shape, M) if stand_in else shape
    p = SGLangMoE(use, rotations=1, empty_weights=True)
    cfg = _config()
    with p.using(cfg):
        p.launch(M, cfg, 0)
    torch.cuda.synchronize()
    q.put(use.num_experts)


def _report(title: str, cache: Path, pool_entries: set[str], mine: set[str]) -> None:
    from tuner.kernels.triton_cache import twin_diff

    print(f"== {title}: this process built {len(mine)} binaries the pool's process had not")
    for name in sorted(mine):
        print("  " + "\n  ".join(twin_diff(cache, name, pool_entries) or [f"{name[:12]}: no pool entry of its kernel"]))


def main() -> None:
    from tuner.kernels.triton_cache import entry_names

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="dsv3")
    ap.add_argument("--M", type=int, default=32)
    ap.add_argument("--up", default=_CONFIG["up"])
    ap.add_argument("--down", default=None, help="empty: the up tile for both GEMMs")
    args = ap.parse_args()
    _CONFIG["up"] = args.up
    _CONFIG["down"] = args.down if args.down is not None else ""
    os.environ["CACHE_CHECK_CONFIG"] = f"{_CONFIG['up']}|{_CONFIG['down']}"  # for the spawned processes
    ctx = mp.get_context("spawn")
    for stand_in in (True, False):
        cache = Path(tempfile.mkdtemp(prefix="triton-check-"))
        os.environ["TRITON_CACHE_DIR"] = str(cache)
        q = ctx.Queue()
        child = ctx.Process(target=_compile_in_child, args=(SHAPES[args.shape], args.M, stand_in, q))
        child.start()
        child.join()
        experts = q.get() if not q.empty() else None
        pool_entries = entry_names(cache)
        # the timing side, in a fresh process too (this one may hold binaries in memory already)
        q2 = ctx.Queue()
        timer = ctx.Process(target=_time_in_child, args=(SHAPES[args.shape], args.M, q2))
        timer.start()
        timer.join()
        compiled_here = q2.get() if not q2.empty() else None
        mine = entry_names(cache) - pool_entries
        _report(f"{args.shape} M={args.M}, pool process on {experts} experts, timer counted {compiled_here}",
                cache, pool_entries, mine)


def _time_in_child(shape_kw: dict, M: int, q) -> None:
    _from_env()
    from tuner.kernels.shapes import MoEShape
    from tuner.kernels.sglang_kernels import SGLangMoE
    from tuner.kernels.timing import GraphTimer

    timer = GraphTimer(SGLangMoE(MoEShape(**shape_kw)))
    timer.measure(M, _config())
    q.put(timer.compiled_here)


if __name__ == "__main__":
    main()
