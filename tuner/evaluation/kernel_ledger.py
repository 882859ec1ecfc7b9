"""Which per-M kernels a pinned Triton cache holds, kept in a ledger beside them.

SGLang builds its Triton kernels (fused MoE, block-fp8 linears) the first time a batch size needs
each variant, and Triton keeps every build in its on-disk cache. tuner pins that cache to one
directory per machine (``tuner.backends.sglang.pinned_triton_cache``), so a later server of the
same kernel set finds those builds and skips their first-use stalls: a second server on a cache
the first had filled stalled on none of the 35 prompts the first stalled on 20 of
(results/h100-sglang/README.md, "The pinned cache, measured").

The simulator stalls a fresh server once per new variant (``tuner.sim.warmup``), so it must know
which variants a new server will find built. Triton's cache does not say which batch size a build
was for, so tuner keeps its own record in the cache directory (``LEDGER_FILE``): per kernel set,
the prefill batch sizes and CUDA-graph capture sizes its servers ran there, read from their own
logs after each load point (``served_token_counts``). The record lives inside the cache, so it is
wiped, copied or carried with it. A kernel set (``kernel_set_key``) is whatever decides the
builds' binaries, as the backend states it (``ProcessBackend.kernel_set``): GPU, SGLang and Triton
versions, model shapes, weight and KV formats, parallel layout, tile configs, and the flags that
change kernels. Servers of different sets share no record, even where they might share a kernel.

A ledger that cannot be read (damaged, another format) is set aside and started anew: a wrong
record would make the simulator call a cold cache warm, a lost one only makes it call a warm
cache cold. Writers on one machine (parallel trials) take a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from tuner.errors import ConfigError
from tuner.sim.steplog import PrefillLine, parse_step_lines
from tuner.sim.warmup import CachedKernels

log = logging.getLogger(__name__)

LEDGER_FILE = "tuner-kernel-ledger.json"
LEDGER_FORMAT = "tuner-kernel-ledger/1"
# a server may run any M up to its chunk: tens of thousands of sizes at most, bounded anyway
MAX_TOKEN_COUNTS = 1 << 17

# SGLang's start-up lines naming the batch sizes its CUDA graphs capture (0.5.17:
# "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, ...]",
# "Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, ...]"; older:
# "Capture cuda graph bs [1, 2, ...]")
_CAPTURE = re.compile(r"Capture (?:target (?:decode|prefill) CUDA graph begin\..*?\b(?:bs|num_tokens)=|"
                      r"cuda graph bs )\[([\d,\s]*)\]")


def kernel_set_key(parts: Mapping[str, Any]) -> str:
    """A short stable name for a kernel set: the hash of its parts as canonical JSON."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def served_token_counts(log_paths: Iterable[str | os.PathLike]) -> CachedKernels:
    """The prefill batch sizes (``#new-token`` of each prefill line) and CUDA-graph capture sizes
    that SGLang servers ran, from their logs (plain or gzipped; a missing log adds nothing)."""
    prefill: set[int] = set()
    graphs: set[int] = set()
    for path in log_paths:
        try:
            lines = _read_lines(Path(path))
        except OSError as exc:
            log.debug("kernel ledger: cannot read %s: %s", path, exc)
            continue
        capture = [line for line in lines if "apture" in line]
        for line in capture:
            m = _CAPTURE.search(line)
            if m:
                graphs.update(int(v) for v in m[1].replace(" ", "").split(",") if v)
        prefill.update(ev.new_tokens for ev in parse_step_lines(lines) if isinstance(ev, PrefillLine))
    prefill.discard(0)
    graphs.discard(0)
    return CachedKernels(tuple(prefill), tuple(graphs))


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.readlines()


@dataclass(frozen=True)
class KernelLedger:
    """The ledger of one Triton cache directory."""

    cache_dir: Path

    @property
    def path(self) -> Path:
        return Path(self.cache_dir) / LEDGER_FILE

    def sets(self) -> dict[str, dict]:
        """Every kernel set recorded here: its parts, the sizes its servers ran and when it was last
        extended (an empty mapping where there is no ledger yet)."""
        return self._read()

    def cached(self, key: str) -> CachedKernels | None:
        """What servers of kernel set ``key`` left built in this cache (None: nothing recorded)."""
        entry = self._read().get(key)
        if not entry:
            return None
        try:
            cached = CachedKernels.from_dict({k: entry.get(k) or [] for k in ("prefill_tokens", "graph_tokens")})
        except ConfigError as exc:
            log.warning("kernel ledger %s: entry %s unreadable (%s); taken as nothing cached", self.path, key, exc)
            return None
        return cached or None

    def record(self, key: str, parts: Mapping[str, Any], served: CachedKernels) -> CachedKernels:
        """Adds what a server of kernel set ``key`` ran to the record; returns the set's record."""
        Path(self.cache_dir).mkdir(parents=True, exist_ok=True)
        with self._locked():
            doc = self._read()
            entry = doc.get(key) or {}
            prefill = set(_ints(entry.get("prefill_tokens"))) | set(served.prefill_tokens)
            graphs = set(_ints(entry.get("graph_tokens"))) | set(served.graph_tokens)
            if len(prefill) + len(graphs) > MAX_TOKEN_COUNTS:
                log.warning("kernel ledger %s: set %s holds over %d sizes; not extended", self.path, key,
                            MAX_TOKEN_COUNTS)
                return CachedKernels(tuple(_ints(entry.get("prefill_tokens"))), tuple(_ints(entry.get("graph_tokens"))))
            doc[key] = {"parts": dict(parts), "prefill_tokens": sorted(prefill), "graph_tokens": sorted(graphs),
                        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._write(doc)
        return CachedKernels(tuple(prefill), tuple(graphs))

    # ---- file --------------------------------------------------------------------------
    def _read(self) -> dict[str, dict]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("kernel ledger %s unreadable (%s); taken as empty", self.path, exc)
            return {}
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or doc.get("format") != LEDGER_FORMAT or not isinstance(doc.get("sets"), dict):
            self._set_aside("not a " + LEDGER_FORMAT + " file")
            return {}
        return {k: v for k, v in doc["sets"].items() if isinstance(v, dict)}

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(self.path.name + ".unreadable")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
            log.warning("kernel ledger %s: %s; moved to %s and started anew", self.path, why, aside.name)

    def _write(self, sets: dict[str, dict]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": LEDGER_FORMAT, "sets": sets}, indent=1) + "\n")
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _ints(values) -> list[int]:
    return [v for v in values or [] if isinstance(v, int) and not isinstance(v, bool) and v > 0]


__all__ = ["KernelLedger", "LEDGER_FILE", "LEDGER_FORMAT", "kernel_set_key", "served_token_counts"]
