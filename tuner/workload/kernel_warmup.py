"""Compile a fresh server's lazily built kernels before anything is measured.

SGLang builds its Triton fused-MoE and block-fp8 GEMM kernels on first use per *variant*: the tile
config of the config-file entry whose batch-size key is nearest the step's token count M, and
whether M (x top-k for the MoE) is divisible by 16 (Triton specialises integer arguments on it). A
fresh server therefore stalls, 0.3-0.6 s a kernel, the first time a prefill step reaches a new
variant: measured on real SGLang 0.5.17 servers, where those stalls fell into the first load
point's window even after a 45 s warm-up (`docs/calibration.md`, fresh-server stalls), and where a
second server built them again (its Triton cache was another directory than the first one's; tuner
now pins the directory, and a server started on a cache another filled skips almost all of them).

The kernel warm-up sends one prompt per (key, parity) pair, one at a time with one output token,
so each prefill step's M is exactly the prompt's length and every variant the traffic can reach
(up to SGLang's largest key; longer prefills use its config) is compiled before the window.
Prompts are fresh random token ids (no prefix shared with each other or with the workload); those
longer than the chunk also build the extend-attention kernel over a cached prefix. Checked on an
H100 DeepSeek-V3-shaped server: after these prompts, extends over cached prefixes, bursts of
prompts and of extends, decode batches and prompts joining a decoding batch built nothing more
(`results/h100-sglang/stall_probe.py`). Decode batches beyond the captured CUDA graphs are not
covered: they run eagerly only above the largest graph batch size.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Iterable

from tuner.workload.client import StreamingClient
from tuner.workload.replay import run_sync
from tuner.workload.session import TokenSpace

#: a session id no replayed session uses, so warm-up prompts share nothing with the workload's
_WARMUP_SESSION_BASE = 1 << 40
#: a server that fails this many prompts in a row is not warmed further (the replay finds out why)
MAX_FAILURES_IN_A_ROW = 3


def prompt_lengths(batch_keys: Iterable[int], max_prompt_tokens: int) -> list[int]:
    """Prompt lengths that reach every kernel variant: each key and key + 1 (the other parity of
    M x top-k for even top-k), up to ``max_prompt_tokens``."""
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    keys = sorted({int(k) for k in batch_keys})
    if not keys or keys[0] < 1:
        raise ValueError(f"batch keys must be positive integers, got {keys}")
    return sorted({n for k in keys for n in (k, k + 1) if n <= max_prompt_tokens})


@dataclass(frozen=True)
class KernelWarmupResult:
    """What the warm-up sent and how long it took (kept with the load point it preceded)."""

    requests: int
    failed: int
    prompt_tokens: int
    cached_prompt_tokens: int  # the server's prefix-cache hits on them (0: each step's M is its prompt)
    max_prompt_tokens: int
    seconds: float
    slowest_request_s: float
    first_error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


async def warm_kernels(base_url: str, lengths: list[int], *, api: str = "completions", model: str | None = None,
                       vocab_size: int = 32000, reserved_ids=(), send_ignore_eos: bool = True,
                       prompt_format: str = "ids", request_timeout_s: float = 120, seed: int = 0,
                       transport: str = "auto") -> KernelWarmupResult:
    """Send one prompt per length, one after another, each for one output token; stop after
    ``MAX_FAILURES_IN_A_ROW`` failures in a row."""
    space = TokenSpace(vocab_size=vocab_size, seed=seed, reserved_ids=frozenset(reserved_ids))
    failed, in_a_row, sent, cached, slowest, first_error = 0, 0, [], 0, 0.0, None
    t0 = time.perf_counter()
    async with StreamingClient(base_url, api=api, model=model, send_ignore_eos=send_ignore_eos,
                               prompt_format=prompt_format, request_timeout_s=request_timeout_s,
                               transport=transport) as client:
        for i, n in enumerate(lengths):
            ids = space.new_ids(_WARMUP_SESSION_BASE + i, 0, n)
            res = await client.stream(client.body(client.prompt_json(ids.tolist()), 1))
            sent.append(n)
            slowest = max(slowest, time.perf_counter() - res.start)
            if res.error is None:
                in_a_row, cached = 0, cached + int(res.cached_tokens or 0)
                continue
            failed, in_a_row = failed + 1, in_a_row + 1
            first_error = first_error or res.error
            if in_a_row >= MAX_FAILURES_IN_A_ROW:
                break
    return KernelWarmupResult(requests=len(sent), failed=failed, prompt_tokens=sum(sent), cached_prompt_tokens=cached,
                              max_prompt_tokens=max(sent, default=0), seconds=round(time.perf_counter() - t0, 2),
                              slowest_request_s=round(slowest, 3), first_error=first_error)


def run_kernel_warmup(base_url: str, lengths: list[int], **kwargs) -> KernelWarmupResult:
    """``warm_kernels`` on a fresh event loop (also from a thread that has none)."""
    return run_sync(warm_kernels(base_url, lengths, **kwargs))

