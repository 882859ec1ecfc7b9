"""CUDA-graph timing of one tile config on a kernel problem (imports torch).

A *problem* (our own kernel's ``own_kernel.MoEProblem``, SGLang's ``sglang_kernels.SGLangMoE`` or
``SGLangBlockGemm``) offers ``rotations`` input draws and ``launch(M, config, rotation)``; it may offer
``rotations_for(M)`` (fewer draws where one call already reads more than the L2 holds),
``using(config)`` (a context that makes the library pick ``config``), ``baseline(M, rotation)`` (work
inside each launch that is not the kernel, timed alone and subtracted) and ``is_config_failure(exc)``.

All rotations are captured back to back in one CUDA graph (no launch gaps; each rotation touches other
weights or experts, so small batches are not served from L2). Replays are timed with CUDA events; the
figure is the median replay / rotations, in microseconds per call.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time

import torch

from tuner.kernels.triton_cache import entry_names


class ConfigFailed(Exception):
    """The config does not compile or launch on this GPU (e.g. out of shared memory)."""


def is_resource_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in ("OutOfResources", "CompilationError", "PTXASError") or "out of resource" in str(exc).lower()


COMPILED_HERE_NAMED = 3  # (M, config) pairs a batch size keeps of what the timer compiled itself


def triton_cache_dir() -> str:
    """Where Triton keeps compiled binaries (its own default when TRITON_CACHE_DIR is not set)."""
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


class GraphTimer:
    """Times configs on one problem. ``measure`` returns microseconds per call."""

    def __init__(self, problem, target_ms: float = 25.0, max_replays: int = 12):
        self.problem = problem
        self.target_ms = target_ms
        self.max_replays = max_replays
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()
        self._baseline_us: dict[int, float] = {}
        self.first_failure: str | None = None
        # where measuring spends its wall time (seconds): the eager first launches (loading each
        # compiled kernel, or compiling what the pool did not), the graph capture, the timed replays
        self.wall_s = {"eager": 0.0, "capture": 0.0, "replay": 0.0}
        self.measured = 0
        # binaries the eager launches compiled here, not found in the shared on-disk cache: a compile
        # pool whose processes build other binaries than this one shows up here
        self.compiled_here = 0
        # the first few (M, config, binaries built, their cache entry names) that compiled here
        self.compiled_here_first: list[tuple] = []
        self.cache_dir = triton_cache_dir()

    def wall_snapshot(self) -> dict:
        return {**self.wall_s, "measured": self.measured, "compiled_here": self.compiled_here}

    def _using(self, config):
        using = getattr(self.problem, "using", None)
        return using(config) if using else contextlib.nullcontext()

    def _failure(self, exc: BaseException) -> bool:
        check = getattr(self.problem, "is_config_failure", None)
        return check(exc) if check else is_resource_error(exc)

    def _replay_ms(self, graph, n: int, cutoff_ms: float | None = None) -> list[float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times: list[float] = []
        for i in range(n):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if i == 0 and cutoff_ms is not None and times[0] > cutoff_ms:
                break
        return times

    def _rotations(self, M: int) -> int:
        """Draws timed at M: the problem's ``rotations_for(M)`` where it has one."""
        per_m = getattr(self.problem, "rotations_for", None)
        return per_m(M) if per_m else self.problem.rotations

    def baseline_us(self, M: int) -> float:
        """Time of the problem's non-kernel work per call (0 if it has none)."""
        if M in self._baseline_us:
            return self._baseline_us[M]
        base = getattr(self.problem, "baseline", None)
        if base is None:
            self._baseline_us[M] = 0.0
            return 0.0
        rot = self._rotations(M)
        for r in range(rot):
            base(M, r)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            for r in range(rot):
                base(M, r)
        try:
            graph.replay()
            us = statistics.median(self._replay_ms(graph, 10)) * 1000 / rot
        finally:
            graph.reset()
        self._baseline_us[M] = us
        return us

    def measure(self, M: int, config, cutoff_us: float | None = None, replays: int | None = None) -> float:
        """Median time (us) of one call with ``config`` at M tokens.

        With ``cutoff_us``, a config whose first timed replay is already above it is not timed further.
        Raises ConfigFailed if the config cannot compile or launch.
        """
        p = self.problem
        rot = self._rotations(M)
        self.measured += 1
        t0 = time.perf_counter()
        with self._using(config):
            cached = entry_names(self.cache_dir)
            try:
                for r in range(rot):  # compile / load and allocate outside the capture
                    p.launch(M, config, r)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - Triton raises several types for resource failures
                if self._failure(exc):
                    msg = f"{type(exc).__name__}: {str(exc)[:300]}"
                    self.first_failure = self.first_failure or msg
                    raise ConfigFailed(msg) from None
                raise
            finally:
                self.wall_s["eager"] += time.perf_counter() - t0
                new = entry_names(self.cache_dir) - cached
                self.compiled_here += len(new)
                if new and len(self.compiled_here_first) < COMPILED_HERE_NAMED:
                    self.compiled_here_first.append((M, config, len(new), sorted(new), cached))
            t1 = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                for r in range(rot):
                    p.launch(M, config, r)
            self.wall_s["capture"] += time.perf_counter() - t1
        base = self.baseline_us(M)
        t2 = time.perf_counter()
        try:
            graph.replay()  # warm: instruction cache, TLBs
            cutoff_ms = None if cutoff_us is None else (cutoff_us + base) * rot / 1000
            first = self._replay_ms(graph, 1)
            if cutoff_ms is not None and first[0] > cutoff_ms:
                return first[0] * 1000 / rot - base
            n = replays or max(3, min(self.max_replays, math.ceil(self.target_ms / max(first[0], 1e-3))))
            times = first + self._replay_ms(graph, n - 1)
            return max(statistics.median(times) * 1000 / rot - base, 1e-3)
        finally:
            graph.reset()
            self.wall_s["replay"] += time.perf_counter() - t2


def time_or_inf(timer: GraphTimer, M: int, config, **kw) -> float:
    """A config that fails to compile or launch times as infinity (never the best)."""
    try:
        return timer.measure(M, config, **kw)
    except ConfigFailed:
        return math.inf


def device_facts() -> dict:
    """This process's GPU as SGLang names it in file names, plus the software versions."""
    import triton

    from tuner.kernels.space import SMEM_LIMIT_BYTES_BY_SM

    props = torch.cuda.get_device_properties(0)
    sm = props.major * 10 + props.minor
    smem = int(getattr(props, "shared_memory_per_block_optin", 0)) or SMEM_LIMIT_BYTES_BY_SM.get(sm, 232_448)
    return {"device_name": torch.cuda.get_device_name(0), "triton_version": triton.__version__,
            "torch_version": torch.__version__, "sm_version": sm, "smem_limit_bytes": smem}
