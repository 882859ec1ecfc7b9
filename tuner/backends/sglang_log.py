"""What an SGLang server's own log says about its start-up: weights, KV pool, CUDA-graph capture.

Read from the log text (never by importing SGLang), line formats as SGLang 0.5.17 and 0.5.23 print
them (``model_runner.py``, ``memory_pool.py``, ``cuda_graph_setup.py``, ``scheduler.py``):

    Load weight end. elapsed=4.10 s, type=Qwen3MoeForCausalLM, avail mem=77.91 GB, mem usage=61.31 GB.
    KV Cache is allocated. #tokens: 651234, K size: 29.81 GB, V size: 29.81 GB
    Capture decode cuda graph end. elapsed=21.37 s, mem usage=1.12 GB, avail mem=11.30 GB.
    max_total_num_tokens=651234, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=..., ...
    The server is fired up and ready to roll!

``startup_report`` turns that into the figures a trial records: weight load time and memory, KV
tokens, graph-capture seconds per phase, and (for a server that died) where in start-up it died.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"
_LOAD_END = re.compile(rf"Load weight end\. elapsed={_FLOAT} s.*?mem usage={_FLOAT} GB")
_KV_ALLOC = re.compile(r"(?:KV Cache|MLA KV Cache|Cache) is allocated\..*?#tokens: (\d+)(?:, K size: "
                       rf"{_FLOAT} GB, V size: {_FLOAT} GB|, KV size: {_FLOAT} GB)?")
# "Capture target decode CUDA graph begin." (0.5.17+) or "Capture cuda graph begin." (older)
_CAPTURE_BEGIN = re.compile(r"Capture (?:(target|draft) )?(\w+ )?(?:\w+ )?(?:cuda|CUDA|CPU|NPU|XPU) graph begin")
_CAPTURE_END = re.compile(r"Capture (?:(target|draft) )?(\w+ )?(?:\w+ )?(?:cuda|CUDA|CPU|NPU|XPU) graph end\. "
                          rf"(?:Time elapsed: |elapsed=){_FLOAT} ?s\.?,? ?mem usage={_FLOAT} GB")
_SCHED = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
                    r"max_running_requests=(\d+), context_len=(\d+)")
_AVAILABLE = re.compile(rf"context_len=\d+, available_gpu_mem={_FLOAT} GB")
_READY = re.compile(r"The server is fired up and ready to roll")
_HOST_POOL = re.compile(rf"Allocating (?:\w+ )?hierarchical KV host pool: (\d+) tokens, {_FLOAT} GB host memory")
_TREE_READY = re.compile(r"Tree cache initialized")
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class StartupReport:
    weight_load_s: float | None = None
    weight_memory_gb: float | None = None
    kv_tokens: int | None = None
    kv_memory_gb: float | None = None
    capture_s: dict[str, float] = field(default_factory=dict)  # phase (decode, prefill) -> seconds
    capture_memory_gb: dict[str, float] = field(default_factory=dict)
    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    # what start-up left for activations (SGLang's "GB" are GiB): a forward needing more dies serving
    available_after_startup_gb: float | None = None
    hicache_host_tokens: int | None = None
    hicache_host_gb: float | None = None
    # seconds from the first time-stamped line to each milestone (the log stamps whole seconds)
    timeline_s: dict[str, float] = field(default_factory=dict)
    ready: bool = False
    died_during: str | None = None  # weight_load | kv_pool | capture_<phase> | serving (None: did not die)

    @property
    def capture_total_s(self) -> float:
        return round(sum(self.capture_s.values()), 3)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capture_total_s"] = self.capture_total_s
        return d


def startup_report(text: str, *, exited: bool = False) -> StartupReport:
    """Parse a server log; ``exited`` says the process is gone (to tell where start-up died)."""
    r = StartupReport()
    open_capture: str | None = None
    loaded = False
    first: datetime | None = None
    host_pool_started: datetime | None = None
    now: datetime | None = None

    def mark(name: str) -> None:
        if now is not None and first is not None:
            r.timeline_s[name] = (now - first).total_seconds()

    for line in text.splitlines():
        stamp = _STAMP.match(line)
        if stamp:
            try:
                now = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
                first = first or now
            except ValueError:
                pass
        if (m := _HOST_POOL.search(line)):
            r.hicache_host_tokens, r.hicache_host_gb = int(m.group(1)), float(m.group(2))
            host_pool_started = now
        elif _TREE_READY.search(line) and host_pool_started is not None:
            mark("host_pool_allocated")
            if now is not None:
                r.timeline_s["host_pool_allocation_s"] = (now - host_pool_started).total_seconds()
        if (m := _LOAD_END.search(line)):
            mark("weights_loaded")
            r.weight_load_s, r.weight_memory_gb = float(m.group(1)), float(m.group(2))
            loaded = True
        elif (m := _KV_ALLOC.search(line)):
            r.kv_tokens = int(m.group(1))
            if m.group(2) is not None:
                r.kv_memory_gb = round(float(m.group(2)) + float(m.group(3)), 3)
            elif m.group(4) is not None:
                r.kv_memory_gb = float(m.group(4))
            mark("kv_pool_allocated")
        elif (m := _CAPTURE_END.search(line)):
            phase = _phase(m.group(1), m.group(2))
            r.capture_s[phase] = round(r.capture_s.get(phase, 0.0) + float(m.group(3)), 3)
            r.capture_memory_gb[phase] = float(m.group(4))
            open_capture = None
            mark(f"{phase}_graphs_captured")
        elif (m := _CAPTURE_BEGIN.search(line)):
            open_capture = _phase(m.group(1), m.group(2))
        elif (m := _SCHED.search(line)):
            (r.max_total_num_tokens, r.chunked_prefill_size, r.max_prefill_tokens, r.max_running_requests,
             r.context_len) = (int(g) for g in m.groups())
            if (a := _AVAILABLE.search(line)):
                r.available_after_startup_gb = float(a.group(1))
        elif _READY.search(line):
            r.ready = True
            mark("ready")
    if exited:
        if r.ready:
            r.died_during = "serving"
        elif open_capture is not None:
            r.died_during = f"capture_{open_capture}"
        elif not loaded:
            r.died_during = "weight_load"
        elif r.kv_tokens is None:
            r.died_during = "kv_pool"
        else:
            r.died_during = "start-up after the KV pool"
    return r


def _phase(role: str | None, name: str | None) -> str:
    phase = (name or "decode").strip().lower()
    return f"draft {phase}" if role == "draft" else phase


def describe_death(report: StartupReport) -> str:
    """A short phrase for a failure reason: where in start-up the server died."""
    where = report.died_during
    if where is None:
        return ""
    if where.startswith("capture_"):
        pool = f" after the KV pool ({report.kv_tokens:,} tokens) was allocated" if report.kv_tokens else ""
        return f"while capturing {where.removeprefix('capture_')} CUDA graphs{pool}"
    return {"weight_load": "while loading weights", "kv_pool": "while allocating the KV pool",
            "serving": "while serving"}.get(where, where)
