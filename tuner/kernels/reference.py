"""Plain torch reference of the MoE layer, for checking the Triton kernel (float32 math).

Quantisation points are emulated exactly where the kernel quantises (activations before each
GEMM in fp8 mode), so the comparison isolates the kernel's own arithmetic.
"""

from __future__ import annotations

import torch

from tuner.kernels.triton_moe import FP8_DTYPE, quantize_fp8_groups, quantize_fp8_tensor


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    E, R, C = q.shape
    s = scale.repeat_interleave(block_n, 1)[:, :R].repeat_interleave(block_k, 2)[:, :, :C]
    return q.float() * s


def _qdq(x: torch.Tensor, block_shape) -> torch.Tensor:
    if block_shape:
        q, s = quantize_fp8_groups(x, block_shape[1])
        return q.float() * s.repeat_interleave(block_shape[1], 1)
    q, s = quantize_fp8_tensor(x)
    return q.float() * s


def reference_moe(x, w1, w2, topk_weights, topk_ids, *, w1_scale=None, w2_scale=None, block_shape=None,
                  fp8: bool = False) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * (silu(x W1g^T) * (x W1u^T)) W2^T for expert topk_ids[t,k]."""
    M, K = x.shape
    if fp8:
        if block_shape:
            w1f = dequantize_blocks(w1, w1_scale, *block_shape)
            w2f = dequantize_blocks(w2, w2_scale, *block_shape)
        else:
            w1f = w1.float() * w1_scale.view(-1, 1, 1)
            w2f = w2.float() * w2_scale.view(-1, 1, 1)
        xf = _qdq(x, block_shape)
    else:
        w1f, w2f, xf = w1.float(), w2.float(), x.float()
    n = w1.shape[1] // 2
    out = torch.zeros(M, K, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        h = (xf[tok] @ w1f[e].T).to(torch.bfloat16).float()  # the kernel stores GEMM1 in bf16
        act = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        act = _qdq(act, block_shape) if fp8 else act.to(torch.bfloat16).float()
        y = (act @ w2f[e].T) * topk_weights[tok, slot].float()[:, None]
        out.index_add_(0, tok, y.to(torch.bfloat16).float())
    return out.to(torch.bfloat16)


__all__ = ["reference_moe", "dequantize_blocks", "FP8_DTYPE"]
