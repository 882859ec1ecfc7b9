"""Compile kernel variants in parallel on the CPU cores, before timing.

Each pool process builds a tiny problem of the same shape (same strides and argument
specialisations as the timed problem, so the same Triton cache keys) and launches each variant
once: Triton compiles it into the shared on-disk cache, where the timing process then finds it.
GROUP_SIZE_M is a run-time argument, so a variant is (BM, BN, BK, warps, stages).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import TileConfig

_problem = None  # per pool process


@dataclass
class CompileResult:
    key: tuple
    ok: bool
    seconds: float
    shared_bytes: int | None = None
    registers: int | None = None
    spills: int | None = None
    error: str | None = None


def _init(shape_dict: dict, device_index: int):
    global _problem
    import torch

    from tuner.kernels.own_kernel import MoEProblem

    torch.cuda.set_device(device_index)
    shape = MoEShape.from_dict(shape_dict)
    _problem = MoEProblem(shape, num_experts=shape.topk)


def _compile(key: tuple) -> CompileResult:
    import torch

    from tuner.kernels.timing import is_resource_error as _is_resource_error

    bm, bn, bk, warps, stages = key
    cfg = TileConfig(bm, bn, bk, 1, num_warps=warps, num_stages=stages)
    t0 = time.perf_counter()
    try:
        kernel = _problem.launch(1, cfg, 0)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        if not _is_resource_error(exc):
            return CompileResult(key, False, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:300])
        return CompileResult(key, False, time.perf_counter() - t0, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    meta = getattr(kernel, "metadata", None)
    return CompileResult(key, True, time.perf_counter() - t0, shared_bytes=getattr(meta, "shared", None),
                         registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None))


class CompilePool:
    """A pool of compile processes for one shape; ``ensure`` compiles what is not compiled yet."""

    def __init__(self, shape: MoEShape, workers: int | None = None, device_index: int = 0):
        self.shape = shape
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.results: dict[tuple, CompileResult] = {}
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                         initializer=_init, initargs=(shape.to_dict(), device_index))
        self.compile_wall_s = 0.0

    def ensure(self, configs, on_done=None) -> dict[tuple, CompileResult]:
        keys = sorted({c.compile_key for c in configs} - set(self.results),
                      key=lambda k: -(k[0] * k[1] * k[2] * k[4]))  # slowest first: better packing
        if keys:
            t0 = time.perf_counter()
            futures = [self._pool.submit(_compile, k) for k in keys]
            for fut in as_completed(futures):
                res = fut.result()
                self.results[res.key] = res
                if on_done:
                    on_done(res)
            self.compile_wall_s += time.perf_counter() - t0
        return {c.compile_key: self.results[c.compile_key] for c in configs}

    def failed(self, config: TileConfig) -> str | None:
        res = self.results.get(config.compile_key)
        return None if res is None or res.ok else (res.error or "failed")

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
