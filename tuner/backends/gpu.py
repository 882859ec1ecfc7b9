"""GPU telemetry through NVML (the only module that imports ``pynvml``, from nvidia-ml-py).

On a machine without an NVIDIA driver every function degrades to "no GPUs" instead of raising,
so the simulator path and CPU-only CI never need a GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Sequence

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state = {"initialised": False, "error": None}


def _nvml():
    """The initialised pynvml module, or None (reason in ``nvml_error()``)."""
    with _lock:
        if _state["initialised"]:
            import pynvml

            return pynvml
        if _state["error"] is not None:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _state["error"] = f"{type(exc).__name__}: {exc}"
            return None
        _state["initialised"] = True
        return pynvml


def nvml_available() -> bool:
    return _nvml() is not None


def nvml_error() -> str | None:
    _nvml()
    return _state["error"]


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _index(i) -> int:
    """NVML wants an int index; Ray and CUDA_VISIBLE_DEVICES give GPU ids as strings ("0")."""
    return int(i)


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str  # as NVML reports it, e.g. "NVIDIA H200"
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int | None
    processes: tuple[tuple[int, int], ...] = ()  # (pid, used MiB)

    def to_dict(self) -> dict:
        return asdict(self)


def detect_gpus(with_processes: bool = False) -> list[GPUInfo]:
    """Every GPU NVML sees (all of them, regardless of CUDA_VISIBLE_DEVICES); [] without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        count = nv.nvmlDeviceGetCount()
    except Exception as exc:
        log.warning("NVML device count failed: %s", exc)
        return []
    for i in range(count):
        try:
            out.append(_info(nv, i, with_processes))
        except Exception as exc:
            log.warning("NVML query of GPU %d failed: %s", i, exc)
    return out


def _info(nv, index: int, with_processes: bool) -> GPUInfo:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    try:
        util = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
    except Exception:
        util = None
    procs: tuple[tuple[int, int], ...] = ()
    if with_processes:
        procs = tuple(gpu_processes_of_handle(nv, h))
    return GPUInfo(index=index, name=_str(nv.nvmlDeviceGetName(h)), uuid=_str(nv.nvmlDeviceGetUUID(h)),
                   memory_total_mib=int(mem.total // 2**20), memory_used_mib=int(mem.used // 2**20),
                   utilization_pct=util, processes=procs)


def gpu_processes_of_handle(nv, handle) -> list[tuple[int, int]]:
    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            for p in getattr(nv, getter)(handle):
                used = getattr(p, "usedGpuMemory", None)
                procs.append((int(p.pid), int(used // 2**20) if isinstance(used, int) else 0))
        except Exception:
            pass
    return procs


def gpu_processes(indices: Sequence[int] | None = None) -> dict[int, list[tuple[int, int]]]:
    """{gpu index: [(pid, used MiB)]}; {} without NVML."""
    nv = _nvml()
    if nv is None:
        return {}
    out = {}
    for i in indices if indices is not None else range(nv.nvmlDeviceGetCount()):
        try:
            out[i] = gpu_processes_of_handle(nv, nv.nvmlDeviceGetHandleByIndex(_index(i)))
        except Exception as exc:
            log.warning("NVML process query of GPU %d failed: %s", i, exc)
    return out


def memory_used_mib(indices: Sequence[int]) -> dict[int, int]:
    nv = _nvml()
    if nv is None:
        return {}
    out = {}
    for i in indices:
        try:
            out[i] = int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(_index(i))).used // 2**20)
        except Exception:
            pass
    return out


def wait_memory_released(indices: Sequence[int], pids: Sequence[int], *, timeout_s: float = 60.0,
                         baseline_mib: dict[int, int] | None = None, slack_mib: int = 1024) -> dict:
    """Wait until none of ``pids`` holds memory on ``indices`` (and used memory is back near
    ``baseline_mib``). Returns {"released": bool, "waited_s", "holders", "used_mib"}; without NVML
    {"released": None}."""
    if not nvml_available() or not indices:
        return {"released": None, "reason": nvml_error() or "no GPUs assigned"}
    ours = set(pids)
    start = time.monotonic()
    while True:
        procs = gpu_processes(indices)
        holders = {i: [p for p, _ in plist if p in ours] for i, plist in procs.items()}
        holders = {i: h for i, h in holders.items() if h}
        used = memory_used_mib(indices)
        over = {i: used[i] for i in used if baseline_mib and i in baseline_mib
                and used[i] > baseline_mib[i] + slack_mib}
        if not holders and not over:
            return {"released": True, "waited_s": round(time.monotonic() - start, 2), "holders": {},
                    "used_mib": used}
        if time.monotonic() - start >= timeout_s:
            return {"released": False, "waited_s": round(time.monotonic() - start, 2), "holders": holders,
                    "used_mib": used, "over_baseline_mib": over}
        time.sleep(0.5)


# NVML's clock event reasons (``nvmlClocksEventReason*``, formerly ``...ThrottleReason*``) that
# slow a busy GPU below its boost clock; idle, application-clock and sync-boost settings are not
# slowdowns and are left out
GPU_IDLE_BIT = 0x1  # nvmlClocksEventReasonGpuIdle: an idle card clocks down, which is no slowdown
CLOCK_LIMIT_BITS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


def clock_limits(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clock-event bitmask (names of ``CLOCK_LIMIT_BITS``)."""
    return [name for name, bit in CLOCK_LIMIT_BITS.items() if mask & bit]


def _clock_sample(nv, handle, i) -> dict:
    """One GPU's SM clock and its ceiling (MHz), board power (W), temperature (C) and clock-event
    bitmask; each left out where NVML cannot read it (e.g. power on some virtualised GPUs)."""
    row = {}
    reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))  # older nvidia-ml-py
    reads = (
        (f"sm_clock_mhz_{i}", lambda: int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))),
        (f"max_sm_clock_mhz_{i}", lambda: int(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM))),
        (f"power_w_{i}", lambda: round(nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1)),
        (f"temp_c_{i}", lambda: int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))),
        (f"clock_events_{i}", lambda: int(reasons(handle))),
    )
    for key, read in reads:
        try:
            row[key] = read()
        except Exception:
            pass
    return row


def _series(rows: list[dict], key: str) -> list:
    """The values of ``key`` in the samples that read it."""
    return [r[key] for r in rows if key in r]


@dataclass
class GPUSampler:
    """Background thread sampling memory used and utilization of some GPUs every ``interval_s``.

    ``summary()`` gives per-GPU peak/mean memory and mean/max utilization; a no-op without NVML.
    """

    indices: Sequence[int]
    interval_s: float = 1.0
    max_samples: int = 100_000
    samples: list[dict] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "GPUSampler":
        if not nvml_available() or not self.indices or self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nv = _nvml()
        handles = {}
        for i in self.indices:
            try:
                handles[i] = nv.nvmlDeviceGetHandleByIndex(_index(i))
            except Exception as exc:
                log.warning("GPU sampler: no handle for GPU %d: %s", i, exc)
        t0 = time.monotonic()
        while not self._stop.is_set():
            row = {"t_s": round(time.monotonic() - t0, 3)}
            for i, h in handles.items():
                try:
                    row[f"mem_mib_{i}"] = int(nv.nvmlDeviceGetMemoryInfo(h).used // 2**20)
                    row[f"util_pct_{i}"] = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                except Exception:
                    pass
                row.update(_clock_sample(nv, h, i))
            if len(self.samples) < self.max_samples:
                self.samples.append(row)
            self._stop.wait(self.interval_s)

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.summary()

    def mark(self) -> int:
        """Where the samples taken from now on start (for :meth:`utilization_since`)."""
        return len(self.samples)

    def utilization_since(self, mark: int) -> dict | None:
        """Mean utilisation of each GPU over the samples taken since ``mark`` (one load point), and
        the mean over the GPUs; None when no sample has a utilisation (no NVML, too short)."""
        rows = self.samples[mark:]
        per_gpu = {}
        for i in self.indices:
            util = _series(rows, f"util_pct_{i}")
            if util:
                per_gpu[str(i)] = round(sum(util) / len(util), 1)
        if not per_gpu:
            return None
        return {"samples": len(rows), "interval_s": self.interval_s,
                "mean_utilization_pct": round(sum(per_gpu.values()) / len(per_gpu), 1),
                "per_gpu_mean_utilization_pct": per_gpu}

    def clocks_since(self, mark: int) -> dict | None:
        """Each GPU's mean SM clock and board power, its peak temperature and the share of samples
        with each clock slowdown reason (``CLOCK_LIMIT_BITS``) since ``mark``: two servers of one
        configuration that differ in speed can be told apart from a throttled card. None when no
        sample read a clock (no NVML, too short)."""
        rows = self.samples[mark:]
        per_gpu = {}
        for i in self.indices:
            clocks = _series(rows, f"sm_clock_mhz_{i}")
            if not clocks:
                continue
            power, temps = _series(rows, f"power_w_{i}"), _series(rows, f"temp_c_{i}")
            masks, ceilings = _series(rows, f"clock_events_{i}"), _series(rows, f"max_sm_clock_mhz_{i}")
            # the clock while busy: samples without the idle reason (all, where NVML gave no reasons)
            busy = [r[f"sm_clock_mhz_{i}"] for r in rows
                    if f"sm_clock_mhz_{i}" in r and not r.get(f"clock_events_{i}", 0) & GPU_IDLE_BIT]
            seen = Counter(name for m in masks for name in clock_limits(m))
            limits = {name: round(seen[name] / len(masks), 3) for name in CLOCK_LIMIT_BITS if seen[name]}
            per_gpu[str(i)] = {
                "mean_sm_clock_mhz": round(sum(clocks) / len(clocks), 1),
                "mean_busy_sm_clock_mhz": round(sum(busy) / len(busy), 1) if busy else None,
                "min_sm_clock_mhz": min(clocks),
                "max_sm_clock_mhz": max(ceilings) if ceilings else None,  # the card's own ceiling
                "mean_power_w": round(sum(power) / len(power), 1) if power else None,
                "max_temperature_c": max(temps) if temps else None,
                "clock_limit_share": limits,  # reason -> share of samples it was set
            }
        if not per_gpu:
            return None
        return {"samples": len(rows), "interval_s": self.interval_s, "per_gpu": per_gpu}

    def summary(self) -> dict:
        out: dict = {"samples": len(self.samples), "interval_s": self.interval_s}
        for i in self.indices:
            mem, util = _series(self.samples, f"mem_mib_{i}"), _series(self.samples, f"util_pct_{i}")
            if mem:
                out[f"gpu{i}"] = {
                    "peak_memory_used_mib": max(mem),
                    "mean_memory_used_mib": round(sum(mem) / len(mem), 1),
                    "mean_utilization_pct": round(sum(util) / len(util), 1) if util else None,
                    "max_utilization_pct": max(util) if util else None,
                }
                clocks = _series(self.samples, f"sm_clock_mhz_{i}")
                if clocks:
                    out[f"gpu{i}"]["mean_sm_clock_mhz"] = round(sum(clocks) / len(clocks), 1)
        return out
