"""Timing one tile config of the MoE layer on the GPU (imports torch and triton).

What is timed: the two grouped GEMMs of one MoE layer (GEMM1 gate/up and GEMM2 down, both with the
candidate config): the work the tile config changes. Routing, alignment, activation and
quantisation are config-independent and prepared outside the timed region.

How: ROTATIONS routing draws, each with its own expert choice, are captured back to back in one
CUDA graph (no launch gaps), so each repeat touches other experts' weights and small batches are not
served from L2. Replays are timed with CUDA events; the figure is the median replay / ROTATIONS.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch

from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import TileConfig
from tuner.kernels.triton_moe import (
    FP8_DTYPE,
    Alignment,
    invoke_moe_gemm,
    moe_align_block_size,
    quantize_fp8_groups,
    quantize_fp8_tensor,
)

ROTATIONS = 8


class ConfigFailed(Exception):
    """The config does not compile or launch on this GPU (e.g. out of shared memory)."""


@dataclass
class _Rotation:
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor  # flat [M*topk] fp32
    aligned: dict[int, Alignment] = field(default_factory=dict)


class MoEProblem:
    """Weights for a shape plus, per batch size, inputs and ROTATIONS routings; reused across configs."""

    def __init__(self, shape: MoEShape, device="cuda", seed: int = 0, num_experts: int | None = None):
        self.shape = shape
        self.device = torch.device(device)
        self.fp8 = shape.dtype == "fp8_w8a8"
        self.block_shape = shape.block_shape
        gen = torch.Generator(device=self.device).manual_seed(seed)
        E = num_experts or shape.num_experts  # a smaller E compiles the same kernels (strides do not change)
        N, K = shape.intermediate, shape.hidden
        self.num_experts = E
        self.w1 = self._weight((E, 2 * N, K), gen)
        self.w2 = self._weight((E, K, N), gen)
        self.w1_scale = self.w2_scale = None
        if self.fp8:
            if self.block_shape:
                bn, bk = self.block_shape
                self.w1_scale = self._scale((E, -(-2 * N // bn), -(-K // bk)), gen)
                self.w2_scale = self._scale((E, -(-K // bn), -(-N // bk)), gen)
            else:
                self.w1_scale = self._scale((E,), gen)
                self.w2_scale = self._scale((E,), gen)
        self._batch: dict[int, dict] = {}

    def _weight(self, size, gen):
        w = torch.randn(size, generator=gen, device=self.device, dtype=torch.float32) * 0.05
        return w.to(FP8_DTYPE) if self.fp8 else w.to(torch.bfloat16)

    def _scale(self, size, gen):
        return (torch.rand(size, generator=gen, device=self.device) * 0.01 + 0.001).contiguous()

    def _quant(self, x):
        if self.block_shape:
            return quantize_fp8_groups(x, self.block_shape[1])
        return quantize_fp8_tensor(x)

    def batch(self, M: int) -> dict:
        """Inputs, outputs and routings for M tokens (built once)."""
        if M in self._batch:
            return self._batch[M]
        s, E = self.shape, self.num_experts
        topk = min(s.topk, E)
        gen = torch.Generator(device=self.device).manual_seed(1000 + M)
        x = torch.randn(M, s.hidden, generator=gen, device=self.device).to(torch.bfloat16)
        act = torch.randn(M * topk, s.intermediate, generator=gen, device=self.device).to(torch.bfloat16)
        b = {"M": M, "topk": topk}
        if self.fp8:
            b["a1"], b["a1_scale"] = self._quant(x)
            b["a2"], b["a2_scale"] = self._quant(act)
        else:
            b["a1"], b["a1_scale"], b["a2"], b["a2_scale"] = x, None, act, None
        b["cache1"] = torch.empty(M * topk, 2 * s.intermediate, dtype=torch.bfloat16, device=self.device)
        b["cache3"] = torch.empty(M * topk, s.hidden, dtype=torch.bfloat16, device=self.device)
        rots = []
        for _ in range(ROTATIONS):
            logits = torch.randn(M, E, generator=gen, device=self.device)
            weights, ids = torch.softmax(logits, -1).topk(topk, -1)
            rots.append(_Rotation(ids.to(torch.int32), weights.reshape(-1).contiguous()))
        b["rotations"] = rots
        self._batch[M] = b
        return b

    def drop_batch(self, M: int) -> None:
        self._batch.pop(M, None)

    def launch(self, M: int, config: TileConfig, rotation: int = 0):
        """Both GEMMs of one MoE layer for routing draw ``rotation``; returns GEMM1's compiled kernel."""
        b = self.batch(M)
        rot = b["rotations"][rotation]
        align = rot.aligned.get(config.BLOCK_SIZE_M)
        if align is None:
            align = rot.aligned[config.BLOCK_SIZE_M] = moe_align_block_size(rot.topk_ids, config.BLOCK_SIZE_M,
                                                                           self.num_experts)
        n_valid = M * b["topk"]
        k1 = invoke_moe_gemm(b["a1"], self.w1, b["cache1"], align, config, top_k=b["topk"], topk_weights=None,
                             a_scale=b["a1_scale"], b_scale=self.w1_scale, block_shape=self.block_shape,
                             num_valid_tokens=n_valid)
        invoke_moe_gemm(b["a2"], self.w2, b["cache3"], align, config, top_k=1, topk_weights=rot.topk_weights,
                        a_scale=b["a2_scale"], b_scale=self.w2_scale, block_shape=self.block_shape,
                        num_valid_tokens=n_valid)
        return k1


def _is_resource_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in ("OutOfResources", "CompilationError", "PTXASError") or "out of resource" in str(exc).lower()


class Timer:
    """Times configs on one MoEProblem. ``measure`` returns microseconds per MoE layer call."""

    def __init__(self, problem: MoEProblem, target_ms: float = 25.0, max_replays: int = 12):
        self.problem = problem
        self.target_ms = target_ms
        self.max_replays = max_replays
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()

    def measure(self, M: int, config: TileConfig, cutoff_us: float | None = None,
                replays: int | None = None) -> float:
        """Median time (us) of one MoE layer's two GEMMs with ``config`` at M tokens.

        With ``cutoff_us``, a config whose first timed replay is already above it is not timed further.
        Raises ConfigFailed if the config cannot compile or launch.
        """
        p = self.problem
        try:
            p.launch(M, config, 0)  # compile / load and build the alignments outside the capture
            for r in range(1, ROTATIONS):
                p.launch(M, config, r)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - Triton raises several types for resource failures
            if _is_resource_error(exc):
                raise ConfigFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from None
            raise
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            for r in range(ROTATIONS):
                p.launch(M, config, r)
        try:
            graph.replay()  # warm: instruction cache, TLBs
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times_ms: list[float] = []
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
            per_call_us = times_ms[0] * 1000 / ROTATIONS
            if cutoff_us is not None and per_call_us > cutoff_us:
                return per_call_us
            n = replays or max(3, min(self.max_replays, math.ceil(self.target_ms / max(times_ms[0], 1e-3))))
            for _ in range(n - 1):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times_ms.append(start.elapsed_time(end))
            return statistics.median(times_ms) * 1000 / ROTATIONS
        finally:
            graph.reset()
