"""Collectives between the GPUs of one machine, timed for the simulator (``tuner profile comm``).

One GPU cannot measure what crosses NVLink, so the step-time model's communication is analytic
(published link bandwidths) until a machine with several GPUs runs this. It times the four
collectives SGLang's multi-GPU layouts need, over message sizes, with one process per GPU on
``torch.distributed`` over NCCL:

- ``all_reduce``: attention-TP (and moe-TP) after each attention and MoE block; bytes = the buffer;
- ``all_gather`` and ``reduce_scatter``: attention-DP ranks gathering every rank's tokens for the
  MoE layer and scattering the results back; bytes = the gathered (whole) buffer;
- ``all_to_all``: DeepEP-style dispatch and combine among the EP group; bytes = one GPU's send buffer.

Each point is the median over ``repeats`` of ``iters`` back-to-back calls timed with CUDA events,
started together after a barrier, and the slowest rank's figure is kept (a collective ends when its
last rank does). The result is a ``tuner-op-profile/1`` file of collectives only, keyed by GPU
count and node count (``tuner.sim.optable.COMM_OPS``), which ``StepTimeModel`` reads wherever a
group of that size communicates. SGLang's own communicator picks its custom all-reduce for small
messages on NVLink, so its small all-reduces may be faster than NCCL's: the table says which
library it timed (``provenance.library``).

torch is imported lazily: the plan and the document are built and checked on a CPU.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.backends.process import free_port
from tuner.errors import BackendUnavailableError, ConfigError
from tuner.sim.optable import COMM_OPS, FORMAT, parse_profile

# 1 KiB to 256 MiB in steps of 4x: a decode step's all-reduce is tens of KiB to a few MiB, a long
# prefill chunk's gather hundreds of MiB
DEFAULT_SIZES_BYTES = tuple(1024 * 4 ** k for k in range(10))
ELEMENT_BYTES = 2  # bf16, as SGLang's activations


@dataclass(frozen=True)
class CommPlan:
    """What ``tuner profile comm`` times: which collectives, over how many GPUs, at which sizes."""

    gpus: int
    ops: tuple[str, ...] = COMM_OPS
    sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES
    warmup: int = 5
    iters: int = 20
    repeats: int = 5
    library: str = "nccl"
    sizes_rounded: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.gpus < 1:
            raise ConfigError(f"--gpus must be at least 1, got {self.gpus}", key="--gpus")
        bad = [op for op in self.ops if op not in COMM_OPS]
        if bad or not self.ops:
            raise ConfigError(f"unknown collective(s) {bad or '(none given)'}; valid: {', '.join(COMM_OPS)}",
                              key="--ops")
        if not self.sizes_bytes or any(s <= 0 for s in self.sizes_bytes):
            raise ConfigError("message sizes must be positive numbers of bytes", key="--sizes")
        # every rank's share of a gathered or scattered buffer is whole elements
        quantum = ELEMENT_BYTES * self.gpus
        rounded = tuple(max(quantum, -(-s // quantum) * quantum) for s in self.sizes_bytes)
        if any(b <= a for a, b in zip(rounded, rounded[1:])):
            raise ConfigError(f"message sizes must be strictly increasing (after rounding to multiples of "
                              f"{quantum} bytes: {list(rounded)})", key="--sizes")
        for given, used in zip(self.sizes_bytes, rounded):
            if given != used:
                self.sizes_rounded[given] = used
        object.__setattr__(self, "sizes_bytes", rounded)
        for name in ("warmup", "iters", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1", key=f"--{name}")

    def points(self) -> int:
        return len(self.ops) * len(self.sizes_bytes)


def comm_document(plan: CommPlan, *, gpu: str, device_name: str, times_us: dict[str, list[float | None]],
                  provenance: dict, nodes: int = 1) -> dict:
    """The profile document of one run (checked by the simulator's own parser before it is returned)."""
    ops = []
    for op in plan.ops:
        us = times_us.get(op)
        if us is None or len(us) != len(plan.sizes_bytes):
            raise ValueError(f"{op}: expected {len(plan.sizes_bytes)} times, got {us!r}")
        ops.append({"op": op, "shape": {"gpus": plan.gpus, "nodes": nodes}, "axes": ["bytes"],
                    "grid": {"bytes": list(plan.sizes_bytes)},
                    "us": [None if v is None else round(float(v), 3) for v in us]})
    doc = {
        "format": FORMAT,
        "gpu": gpu,
        "device_name": device_name,
        "parallel": {"gpus": plan.gpus, "nodes": nodes},
        "provenance": {
            "tool": "tuner profile comm",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "library": plan.library,
            "timer": "cuda_events",
            "statistic": f"median over {plan.repeats} repeats of {plan.iters} back-to-back calls (after "
                         f"{plan.warmup} warm-up calls and a barrier); the slowest rank's",
            "element": "bf16",
            **provenance,
        },
        "ops": ops,
    }
    parse_profile(doc, "<new communication profile>")
    return doc


# ---- on the GPUs (torch, one process per GPU) ------------------------------------------------

def _buffers(op: str, nbytes: int, gpus: int, device):
    import torch

    elems = nbytes // ELEMENT_BYTES
    new = lambda n: torch.empty(n, dtype=torch.bfloat16, device=device)  # noqa: E731
    if op == "all_reduce":
        return new(elems), None
    if op == "all_gather":
        return new(elems // gpus), new(elems)  # in: this rank's share, out: the whole buffer
    if op == "reduce_scatter":
        return new(elems), new(elems // gpus)
    return new(elems), new(elems)  # all_to_all: send and receive buffers


def _call(op: str, a, b) -> Callable[[], None]:
    import torch.distributed as dist

    if op == "all_reduce":
        return lambda: dist.all_reduce(a)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(b, a)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(b, a)
    return lambda: dist.all_to_all_single(b, a)


def _time_point(op: str, nbytes: int, plan: CommPlan, device) -> float:
    import torch
    import torch.distributed as dist

    a, b = _buffers(op, nbytes, plan.gpus, device)
    fn = _call(op, a, b)
    for _ in range(plan.warmup):
        fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(plan.repeats):
        dist.barrier()
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(plan.iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / plan.iters)
    return statistics.median(times)


def _rank_main(rank: int, plan: CommPlan, init_method: str, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=plan.gpus, device_id=device)
    try:
        rows, skipped = [], []
        for op in plan.ops:
            row = []
            for nbytes in plan.sizes_bytes:
                try:
                    row.append(_time_point(op, nbytes, plan, device))
                except (RuntimeError, MemoryError) as exc:  # out of memory at the largest sizes
                    row.append(-1.0)
                    skipped.append({"point": f"{op} bytes={nbytes}", "reason": f"{type(exc).__name__}: {exc}"[:300]})
                if rank == 0:
                    print(f"{op} {nbytes} B: {row[-1]:.2f} us", flush=True)
            rows.append(row)
        slowest = torch.tensor(rows, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # -1 stays only where every rank failed
        if rank == 0:
            out = {op: [None if v < 0 else v for v in slowest[i].tolist()] for i, op in enumerate(plan.ops)}
            Path(result_path).write_text(json.dumps({
                "times_us": out, "skipped_points": skipped,
                "device_name": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "nccl": _version_text(torch.cuda.nccl.version()),
                "cuda": torch.version.cuda}))
    finally:
        dist.destroy_process_group()


def _version_text(v) -> str:
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def run_comm_profile(plan: CommPlan, *, gpu: str, expected_device_name: str, command: str = "") -> dict:
    """Time the plan on this machine's first ``plan.gpus`` GPUs; returns the profile document."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        raise BackendUnavailableError(f"tuner profile comm needs torch with CUDA on a GPU machine ({exc})") from None
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < plan.gpus:
        raise BackendUnavailableError(f"--gpus {plan.gpus}: this machine has {have} CUDA GPU(s)")
    name = torch.cuda.get_device_name(0)
    if expected_device_name and expected_device_name.lower() not in name.lower():
        raise ConfigError(f"--hardware {gpu} is a {expected_device_name}, but this machine's GPU 0 is {name!r}",
                          key="--hardware")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        mp.spawn(_rank_main, args=(plan, f"tcp://127.0.0.1:{free_port()}", str(result)), nprocs=plan.gpus,
                 join=True)
        got = json.loads(result.read_text())
    provenance = {"device_name_measured": got["device_name"], "torch": got["torch"], "nccl": got["nccl"],
                  "cuda": got["cuda"], "skipped_points": got["skipped_points"]}
    if command:
        provenance["command"] = command
    if plan.sizes_rounded:
        provenance["sizes_rounded"] = {str(k): v for k, v in plan.sizes_rounded.items()}
    return comm_document(plan, gpu=gpu, device_name=expected_device_name or got["device_name"],
                         times_us=got["times_us"], provenance=provenance)


__all__ = ["CommPlan", "DEFAULT_SIZES_BYTES", "comm_document", "run_comm_profile"]
