"""Timing of one operator at one size, behind a narrow interface.

A ``Runnable`` is a list of calls (the same operator on rotating inputs, so repeated calls do not
read warm L2) plus what it is (``meta``). A ``Timer`` returns microseconds per call.
``CudaGraphTimer`` (GPU; imports torch lazily) captures the calls back to back in one CUDA graph,
as SGLang runs decode steps, and times replays with CUDA events; it falls back to eager launches
when an operator cannot be captured and says so. ``FakeTimer`` returns a deterministic figure from
``meta`` so everything around the GPU runs in CPU tests.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Runnable:
    calls: list[Callable[[], None]]
    meta: dict
    keep: list = field(default_factory=list)  # tensors the calls use (freed with the runnable)


class Timer:
    name = "timer"

    def time_us(self, run: Runnable) -> float:
        raise NotImplementedError

    def host_us(self, run: Runnable) -> float:
        """Microseconds the calling thread spends issuing one call (what the scheduler thread
        loses), not the GPU's time."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"timer": self.name}


class CudaGraphTimer(Timer):
    name = "cuda_graph_events"

    def __init__(self, warmup: int = 3, repeats: int = 10):
        self.warmup, self.repeats = warmup, repeats
        self.eager_points = 0
        self.graph_points = 0
        self.host_points = 0  # timed on the host (perf_counter around the call): hicache_write

    def time_us(self, run: Runnable) -> float:
        import torch

        calls = run.calls
        for f in calls:  # compile / autotune outside the timed region
            f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        replay = None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for f in calls:
                    f()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for f in calls:
                    f()
            replay = graph.replay
            self.graph_points += 1
            run.meta["captured"] = True
        except Exception:  # not capturable (host sync inside): time eager launches instead
            torch.cuda.synchronize()

            def replay():
                for f in calls:
                    f()

            self.eager_points += 1
            run.meta["captured"] = False
        for _ in range(self.warmup):
            replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            start.record()
            replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / len(calls))
        return statistics.median(times)

    def host_us(self, run: Runnable) -> float:
        import torch

        for f in run.calls:  # JIT-compile outside the timed region
            f()
        torch.cuda.synchronize()
        times, done = [], []
        for _ in range(self.warmup + self.repeats):
            for f in run.calls:
                t0 = time.perf_counter()
                f()
                times.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()  # each call starts on an idle queue, as after a forward
                done.append((time.perf_counter() - t0) * 1e6)
        self.host_points += 1
        skip = self.warmup * len(run.calls)
        # until the GPU finished what the call queued (the copies), for the record beside the CPU time
        run.meta["done_us"] = statistics.median(done[skip:])
        return statistics.median(times[skip:])

    def describe(self) -> dict:
        return {"timer": self.name, "warmup": self.warmup, "repeats": self.repeats, "host_points": self.host_points,
                "statistic": "median of replays / calls per replay",
                "points_captured": self.graph_points, "points_eager": self.eager_points}


class FakeTimer(Timer):
    """Deterministic stand-in: a few microseconds plus a size-proportional part of ``meta``."""

    name = "fake"

    def __init__(self, fail_when=None):
        self.fail_when = fail_when or (lambda meta: False)
        self.timed: list[dict] = []

    def time_us(self, run: Runnable) -> float:
        m = run.meta
        if self.fail_when(m):
            raise MemoryError(f"fake out of memory at {m}")
        self.timed.append(m)
        size = 1.0
        for k in ("tokens", "batch", "context", "new_tokens", "prefix"):
            if k in m:
                size *= 1 + m[k] / 1024
        return 5.0 + size * (1 + len(m.get("op", "")) / 10)

    def host_us(self, run: Runnable) -> float:
        return self.time_us(run)
