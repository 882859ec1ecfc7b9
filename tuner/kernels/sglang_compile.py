"""Compile SGLang's kernel variants in parallel on the CPU cores, before they are timed.

Each pool process builds the same problem (same E, N, K, dtype, batch size: so the same argument
specialisations and Triton cache keys; weights allocated but not filled) and runs each candidate
once through SGLang's own call: Triton compiles it into the on-disk cache the timing process shares
(``TRITON_CACHE_DIR``, set before the pool starts). SGLang's fused-MoE kernel takes GROUP_SIZE_M as
a compile-time constant and specialises on the token counts, so a task is (batch size, config).
The block-fp8 GEMM takes the token count M only as a plain integer argument (its strides do not
depend on M), which Triton specialises by value 1 and by divisibility by 16 alone: one binary serves
every M of a class, so a config compiled at one M of the class is not compiled again for another
(``specialization_class``). A process holds one shape's weights, so the pool is sized to the GPU
memory free.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

_problem = None  # per pool process


@dataclass
class CompileResult:
    key: tuple
    ok: bool
    seconds: float
    error: str | None = None


def _init(kind: str, shape_dict: dict, routing: str, device_index: int):
    global _problem
    import torch

    torch.cuda.set_device(device_index)
    if kind == "moe":
        from tuner.kernels.shapes import MoEShape
        from tuner.kernels.sglang_kernels import SGLangMoE

        _problem = SGLangMoE(MoEShape.from_dict(shape_dict), routing=routing, rotations=1, empty_weights=True)
    else:
        from tuner.kernels.gemm_shapes import GemmShape
        from tuner.kernels.sglang_kernels import SGLangBlockGemm

        _problem = SGLangBlockGemm(GemmShape.from_dict(shape_dict), rotations=1)


def _compile(task: tuple) -> CompileResult:
    import torch

    M, config = task
    t0 = time.perf_counter()
    try:
        with _problem.using(config):
            _problem.launch(M, config, 0)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure rules this candidate out
        return CompileResult(task, False, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:300])
    return CompileResult(task, True, time.perf_counter() - t0)


def specialization_class(kind: str, M: int):
    """The part of M that selects the Triton binary: the GEMM's (M == 1, M % 16 == 0); the MoE's M
    itself (its launch derives padded sizes from M and the tile, not verified to share binaries)."""
    if kind == "gemm":
        return (M == 1, M % 16 == 0)
    return M


def workers_for(problem_bytes: int, cpu_count: int | None = None, free_bytes: int | None = None) -> int:
    """Compile processes: a core each (one left for the timer), within half the free GPU memory."""
    cores = max(1, (cpu_count or os.cpu_count() or 2) - 1)
    if free_bytes is None:
        import torch

        free_bytes, _ = torch.cuda.mem_get_info()
    by_memory = int(0.5 * free_bytes // max(problem_bytes, 1))
    return max(1, min(cores, by_memory))


class SGLangCompilePool:
    """``ensure(tasks)`` compiles the (batch size, config) pairs not compiled yet, in parallel."""

    def __init__(self, kind: str, shape, *, routing: str = "sglang-tuner", workers: int = 1,
                 device_index: int = 0):
        if kind not in ("moe", "gemm"):
            raise ValueError(f"unknown problem kind {kind!r}")
        self.workers = workers
        self.kind = kind
        self.results: dict[tuple, CompileResult] = {}
        self._by_class: dict[tuple, CompileResult] = {}  # (specialization class, config) -> first result
        self.reused = 0  # tasks answered from another M of the same class
        ctx = mp.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init,
                                         initargs=(kind, shape.to_dict(), str(routing), device_index))
        self.compile_wall_s = 0.0

    def ensure(self, tasks, on_done=None) -> None:
        todo = []
        for t in dict.fromkeys(tasks):
            if t in self.results:
                continue
            known = self._by_class.get(self._class_key(t))
            if known is not None:
                self.results[t] = CompileResult(t, known.ok, 0.0, known.error)
                self.reused += 1
                if on_done:
                    on_done(self.results[t])
            else:
                todo.append(t)
        if not todo:
            return
        t0 = time.perf_counter()
        futures = [self._pool.submit(_compile, t) for t in todo]
        for fut in as_completed(futures):
            res = fut.result()
            self.results[res.key] = res
            self._by_class.setdefault(self._class_key(res.key), res)
            if on_done:
                on_done(res)
        self.compile_wall_s += time.perf_counter() - t0

    def _class_key(self, task: tuple) -> tuple:
        M, config = task
        return specialization_class(self.kind, M), config

    def failed(self, M: int, config) -> str | None:
        res = self.results.get((M, config))
        return None if res is None or res.ok else (res.error or "failed")

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
