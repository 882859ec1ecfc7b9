"""Our fused-MoE Triton kernel (GPU only: imports torch and triton).

Same tile semantics as SGLang's ``fused_moe_kernel``: token-expert pairs are sorted by expert and
each expert's run padded to BLOCK_SIZE_M (``moe_align_block_size``); one program computes a
BLOCK_SIZE_M x BLOCK_SIZE_N tile of one expert's GEMM, stepping BLOCK_SIZE_K along K, with
programs ordered in groups of GROUP_SIZE_M rows for L2 reuse. The MoE layer is
GEMM1 (x @ w1[e].T, w1: [E, 2N, K]) -> SiLU(gate) * up -> GEMM2 (@ w2[e].T, w2: [E, K, N]) with the
router weight applied in GEMM2 -> sum over the top-k experts.

GROUP_SIZE_M and the token counts are run-time arguments that Triton does not specialise on, so one
compiled binary serves every batch size and all four group sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tuner.kernels.space import TileConfig

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)


@triton.jit(do_not_specialize=["EM", "num_valid_tokens", "group_size_m"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr,
    sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, EM, num_valid_tokens, group_size_m, top_k,
    stride_am, stride_be, stride_bn, stride_cm,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    group_n, group_k,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr, QUANT: tl.constexpr, EVEN_K: tl.constexpr,
):
    # QUANT: 0 = bf16, 1 = fp8 per-tensor scales, 2 = fp8 block-wise scales.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pids_per_group = group_size_m * num_pid_n
    group = pid // pids_per_group
    first_m = group * group_size_m
    rows = min(num_pid_m - first_m, group_size_m)
    pid_m = first_m + (pid % pids_per_group) % rows
    pid_n = (pid % pids_per_group) // rows

    # Tiles past the padded end of the sorted list have no work.
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    tokens = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)
    valid = tokens < num_valid_tokens
    rows_a = tokens // top_k
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N  # wrap: loads need no mask
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + rows_a[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]

    if QUANT == 1:
        a_s = tl.load(a_scale_ptr)
        b_s = tl.load(b_scale_ptr + expert)
    if QUANT == 2:
        a_scale_ptrs = a_scale_ptr + rows_a * stride_asm
        b_scale_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // group_n) * stride_bsn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kb * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=valid[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if QUANT == 2:
            k_group = (kb * BLOCK_SIZE_K) // group_k
            a_s = tl.load(a_scale_ptrs + k_group * stride_ask, mask=valid, other=0.0)
            b_s = tl.load(b_scale_ptrs + k_group * stride_bsk)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b, acc=acc)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K

    if QUANT == 1:
        acc = acc * (a_s * b_s)
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + tokens, mask=valid, other=0.0)
        acc = acc * w[:, None]

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + tokens[:, None] * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_cn[None, :] < N))


@dataclass
class Alignment:
    """Token-expert pairs sorted by expert, each expert's run padded to block_m."""

    sorted_token_ids: torch.Tensor  # [EM] int32; padding = num_valid_tokens
    expert_ids: torch.Tensor  # [cdiv(EM, block_m)] int32
    num_tokens_post_padded: torch.Tensor  # [1] int32
    em: int  # rows the launch grid covers
    block_m: int


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> Alignment:
    """Sort (token, k) pairs by expert and pad each expert's run to a multiple of block_m."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    max_len = numel + num_experts * (block_m - 1)
    max_len = (max_len + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    run_start_padded = torch.cumsum(padded, 0) - padded
    run_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=flat.device) - run_start[sorted_experts]
    sorted_ids = torch.full((max_len,), numel, dtype=torch.int32, device=flat.device)
    sorted_ids[run_start_padded[sorted_experts] + rank] = order.to(torch.int32)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_m)
    expert_ids = torch.zeros(max_len // block_m, dtype=torch.int32, device=flat.device)
    expert_ids[: blocks.numel()] = blocks.to(torch.int32)
    total = padded.sum().reshape(1).to(torch.int32)
    # Like SGLang: when there are fewer tokens than BLOCK_SIZE_M, at most numel blocks can hold work.
    num_tokens = topk_ids.shape[0]
    em = min(max_len, numel * block_m) if num_tokens < block_m else max_len
    return Alignment(sorted_ids, expert_ids, total, em, block_m)


def quantize_fp8_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group fp8 quantisation: x [M, K] -> (q [M, K] fp8, scales [M, K/group] fp32)."""
    M, K = x.shape
    xg = x.float().reshape(M, K // group, group)
    scale = xg.abs().amax(-1).clamp(min=1e-10) / FP8_MAX
    q = (xg / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(M, K), scale.contiguous()


def quantize_fp8_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.float().abs().amax().clamp(min=1e-10) / FP8_MAX).reshape(1)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_weight_blocks(w: torch.Tensor, block_n: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise weight quantisation: w [E, R, C] -> (q fp8, scales [E, cdiv(R,bn), cdiv(C,bk)])."""
    E, R, C = w.shape
    rn, ck = triton.cdiv(R, block_n), triton.cdiv(C, block_k)
    wp = torch.zeros(E, rn * block_n, ck * block_k, dtype=torch.float32, device=w.device)
    wp[:, :R, :C] = w.float()
    blocks = wp.reshape(E, rn, block_n, ck, block_k)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-10) / FP8_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(E, rn * block_n, ck * block_k)[:, :R, :C].contiguous(), scale.contiguous()


def invoke_moe_gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, align: Alignment, config: TileConfig,
                    *, top_k: int, topk_weights: torch.Tensor | None, a_scale: torch.Tensor | None = None,
                    b_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                    num_valid_tokens: int):
    """One grouped GEMM: c[token] = a[token // top_k] @ b[expert].T (x router weight if given).

    a: [rows, K]; b: [E, Nout, K] (K contiguous); c: [num_valid_tokens, Nout].
    Returns Triton's compiled kernel (for its resource figures).
    """
    n_out, k = b.shape[1], b.shape[2]
    assert a.stride(1) == 1 and b.stride(2) == 1 and c.stride(1) == 1, "K (and C's columns) must be contiguous"
    assert config.BLOCK_SIZE_M == align.block_m, "alignment was made for another BLOCK_SIZE_M"
    if a.dtype == FP8_DTYPE:
        quant = 2 if block_shape else 1
    else:
        quant = 0
    if quant == 2:
        group_n, group_k = block_shape
        assert group_k % config.BLOCK_SIZE_K == 0, "BLOCK_SIZE_K must divide block_k"
        strides_s = (a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), b_scale.stride(2))
    else:
        group_n = group_k = 0
        strides_s = (0, 0, 0, 0, 0)
    dummy = c  # unused pointer arguments
    grid = (triton.cdiv(align.em, config.BLOCK_SIZE_M) * triton.cdiv(n_out, config.BLOCK_SIZE_N),)
    return _moe_gemm_kernel[grid](
        a, b, c,
        a_scale if a_scale is not None else dummy, b_scale if b_scale is not None else dummy,
        topk_weights if topk_weights is not None else dummy,
        align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        n_out, k, align.em, num_valid_tokens, config.GROUP_SIZE_M, top_k,
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        *strides_s, group_n, group_k,
        BLOCK_SIZE_M=config.BLOCK_SIZE_M, BLOCK_SIZE_N=config.BLOCK_SIZE_N, BLOCK_SIZE_K=config.BLOCK_SIZE_K,
        MUL_ROUTED_WEIGHT=topk_weights is not None, QUANT=quant, EVEN_K=(k % config.BLOCK_SIZE_K == 0),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    n = h.shape[-1] // 2
    return torch.nn.functional.silu(h[..., :n].float()) * h[..., n:].float()


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, config: TileConfig, *, w1_scale=None, w2_scale=None,
              block_shape: tuple[int, int] | None = None, fp8: bool = False) -> torch.Tensor:
    """The whole MoE layer with one tile config for both GEMMs. x: [M, K] bf16 -> [M, K] bf16."""
    M, K = x.shape
    E, two_n, _ = w1.shape
    topk = topk_ids.shape[1]
    align = moe_align_block_size(topk_ids, config.BLOCK_SIZE_M, E)
    weights = topk_weights.reshape(-1).float().contiguous()
    cache1 = torch.empty(M * topk, two_n, dtype=torch.bfloat16, device=x.device)
    a1, a1_scale, a2_scale = x, None, None
    if fp8:
        a1, a1_scale = quantize_fp8_groups(x, block_shape[1]) if block_shape else quantize_fp8_tensor(x)
    invoke_moe_gemm(a1, w1, cache1, align, config, top_k=topk, topk_weights=None, a_scale=a1_scale,
                    b_scale=w1_scale, block_shape=block_shape, num_valid_tokens=M * topk)
    act = silu_and_mul(cache1)
    if fp8:
        a2, a2_scale = quantize_fp8_groups(act, block_shape[1]) if block_shape else quantize_fp8_tensor(act)
    else:
        a2 = act.to(torch.bfloat16)
    cache3 = torch.empty(M * topk, K, dtype=torch.bfloat16, device=x.device)
    invoke_moe_gemm(a2, w2, cache3, align, config, top_k=1, topk_weights=weights, a_scale=a2_scale,
                    b_scale=w2_scale, block_shape=block_shape, num_valid_tokens=M * topk)
    return cache3.view(M, topk, K).float().sum(1).to(torch.bfloat16)
