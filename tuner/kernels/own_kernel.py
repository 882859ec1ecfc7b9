"""Our own fused-MoE look-alike as a timing problem (imports torch and triton).

Used where SGLang is not importable: it has SGLang's tile semantics (``triton_moe.py``), so its
tuned tiles are a stand-in, not a measurement of SGLang itself. What is timed: the two grouped
GEMMs of one MoE layer (GEMM1 gate/up and GEMM2 down, both with the candidate config). Routing,
alignment, activation and quantisation are config-independent and prepared outside the timed region.
ROTATIONS routing draws are timed by ``timing.GraphTimer``.
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
        self.rotations = ROTATIONS
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
