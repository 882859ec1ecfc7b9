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

A MoE compile process need not hold all E experts: the kernel's binary depends on E only through the
padded sort length that ``moe_align_block_size`` derives from it, so a stand-in with fewer experts
that keeps that length's specialisation builds the same binary (``compile_stand_in``), and a shape
with 257 experts compiles on many processes instead of two.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

_problem = None  # per pool process
_moe_spec: tuple | None = None  # (shape dict, routing, routed pool) of a MoE pool process; its problem is per stand-in


@dataclass
class CompileResult:
    key: tuple
    ok: bool
    seconds: float
    error: str | None = None


def sort_length(num_tokens_topk: int, num_experts: int, block_m: int) -> int:
    """``sorted_token_ids.shape[0]`` as SGLang 0.5.17's ``moe_align_block_size`` allocates it
    (srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py): the kernel's EM argument."""
    if num_tokens_topk < num_experts + 1:
        return num_tokens_topk * block_m
    return num_tokens_topk + (num_experts + 1) * (block_m - 1)


def stand_in_experts(num_experts: int, topk: int, fused_shared: int, M: int) -> int:
    """The fewest experts E' that give the fused-MoE kernel the binary it gets with E at M tokens.

    Triton specialises an integer argument on == 1 and on divisibility by 16; of the kernel's integer
    arguments only EM (``sort_length``) depends on E. E' = E (mod 16) keeps EM's residue for every
    BLOCK_SIZE_M, and E' on the same side of M*topk as E keeps the branch ``moe_align_block_size``
    takes. E' also holds the top-k and the fused shared slots."""
    n = M * topk
    floor = max(topk, fused_shared + 1)
    if n >= num_experts + 1:  # long branch: E' below n too, the smallest with E's residue
        low = floor
    else:  # short branch (EM = n * BLOCK_SIZE_M): E' must stay at or above n
        low = max(floor, n)
    e = low + ((num_experts - low) % 16)
    return min(e, num_experts)


def compile_stand_in(shape, M: int):
    """A MoEShape with ``stand_in_experts`` experts (the shape itself where that saves nothing, or
    under expert parallelism, whose filtered ids are not modelled here)."""
    from dataclasses import replace

    if shape.ep_size != 1:
        return shape
    e = stand_in_experts(shape.num_experts, shape.topk, shape.fused_shared_experts, M)
    return shape if e == shape.num_experts else replace(shape, num_experts=e)


def moe_stand_in_bytes(shape, batch_sizes) -> int:
    """GPU bytes of the largest stand-in's weights a compile process holds over ``batch_sizes``."""
    per_expert = 3 * shape.intermediate * shape.hidden * (1 if shape.dtype == "fp8_w8a8" else 2)
    return max(compile_stand_in(shape, M).num_experts for M in batch_sizes) * per_expert


def _moe_problem(M: int):
    """This process's problem for M: built for M's stand-in, the previous one dropped first."""
    global _problem
    from tuner.kernels.shapes import MoEShape
    from tuner.kernels.sglang_kernels import SGLangMoE

    shape_dict, routing, routed_pool = _moe_spec
    stand_in = compile_stand_in(MoEShape.from_dict(shape_dict), M)
    if routed_pool is not None:  # the routing's values do not reach the binary: fit the pool to the stand-in
        routed_pool = min(routed_pool, stand_in.routed_experts)
    if _problem is None or _problem.shape != stand_in:
        _problem = None
        _problem = SGLangMoE(stand_in, routing=routing, rotations=1, empty_weights=True, routed_pool=routed_pool)
    return _problem


def _init(kind: str, shape_dict: dict, routing: str, device_index: int, routed_pool: int | None = None):
    global _problem, _moe_spec
    import torch

    torch.cuda.set_device(device_index)
    if kind == "moe":
        _moe_spec = (shape_dict, routing, routed_pool)
    else:
        from tuner.kernels.gemm_shapes import GemmShape
        from tuner.kernels.sglang_kernels import SGLangBlockGemm

        _problem = SGLangBlockGemm(GemmShape.from_dict(shape_dict), rotations=1)


def _compile(task: tuple) -> CompileResult:
    import torch

    M, config = task
    t0 = time.perf_counter()
    try:
        problem = _moe_problem(M) if _moe_spec is not None else _problem
        with problem.using(config):
            problem.launch(M, config, 0)
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
                 device_index: int = 0, routed_pool: int | None = None):
        if kind not in ("moe", "gemm"):
            raise ValueError(f"unknown problem kind {kind!r}")
        self.workers = workers
        self.kind = kind
        self.results: dict[tuple, CompileResult] = {}
        self._by_class: dict[tuple, CompileResult] = {}  # (specialization class, config) -> first result
        self.reused = 0  # tasks answered from another M of the same class
        ctx = mp.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init,
                                         initargs=(kind, shape.to_dict(), str(routing), device_index, routed_pool))
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
