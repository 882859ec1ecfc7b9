"""Memory SGLang allocates at start-up after the KV pool, from what ``mem-fraction-static`` left.

The KV pool is sized to use everything except ``pre_model_load_memory x (1 - mem_fraction_static)``
(``KVCacheConfigurator._profile_available_bytes``). What start-up allocates afterwards must fit in
that slack, or the server dies with CUDA out of memory before it serves:

* the request-to-token table: ``(max_running_requests + 1) x context_len`` int32
  (``ReqToTokenPool``, allocated with the KV pool from the slack);
* the attention backend's CUDA-graph state (``init_cuda_graph_state``, called by the decode
  CUDA-graph runner with ``max_bs`` = the largest captured batch, capped by max_running_requests).
  For the Triton backend (``TritonAttnBackend``) that is
  ``attn_logits [max_bs, heads, max_kv_splits, v_head_dim]`` and ``attn_lse [max_bs, heads,
  max_kv_splits]`` in fp32 plus ``kv_indices [max_bs x context_len]`` int64, where
  ``max_kv_splits`` is ``--triton-attention-num-kv-splits`` (8) or, for MLA,
  ``max(8, min(next_pow2(SMs), next_pow2(ceil(context_len / 32))))`` (``_mla_decode_kv_splits_cap``);
  for DeepSeek-V3 on one H200 that is 256 x 128 x 256 x 512 x 4 B = 16 GiB. Other backends keep a
  page table of ``max_bs x context_len / page`` int32 and a workspace (UNVERIFIED size);
* the decode CUDA graphs themselves (SGLang's own estimate: 2 MiB per captured batch size unit,
  ``reserve_for_graph_mb``) and, when enabled, the prefill graphs;
* what the server takes between its KV pool and its first graph capture (SGLang logs both
  ``avail mem`` figures: "Memory pool end", "Capture ... begin"): 0.10 GiB plus 47 bytes per token
  of the KV pool, within 0.023 GiB on all 37 committed SGLang 0.5.17 servers (Qwen3-30B-A3B with
  0.09-1.9M tokens, 2-layer Qwen3 and DeepSeek-V3 with 10-16M; the H100 and the H200); the token
  allocator keeps its free list as an int64 ``arange`` of the pool (``TokenToKVPoolAllocator.clear``),
  and the caching allocator holds its transient copies (the split per tensor is UNVERIFIED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.catalog import GPUDescription, ModelDescription

from .parallel import ParallelLayout

MIB = 2**20
TRITON_DEFAULT_KV_SPLITS = 8  # --triton-attention-num-kv-splits
MLA_DECODE_MIN_BLOCK_KV = 32  # triton_backend._MLA_DECODE_MIN_BLOCK_KV
OTHER_BACKEND_WORKSPACE_BYTES = 256 * MIB  # fa3 / flashinfer workspaces (UNVERIFIED)
# taken between the KV pool and the first graph capture: fixed, and per token of the KV pool (the docstring)
PRE_CAPTURE_FIXED_BYTES = int(0.10 * 2**30)
PRE_CAPTURE_BYTES_PER_KV_TOKEN = 47


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


@dataclass(frozen=True)
class StartupMemory:
    """Bytes per GPU allocated at start-up after the KV pool, by purpose."""

    req_to_token_bytes: int
    attention_graph_state_bytes: int
    decode_graph_bytes: int
    prefill_graph_bytes: int
    attention_backend: str
    max_kv_splits: int
    graph_max_bs: int

    workspace_bytes: int = 0  # before the first graph capture (PRE_CAPTURE_*)

    @property
    def total_bytes(self) -> int:
        return (self.req_to_token_bytes + self.attention_graph_state_bytes + self.decode_graph_bytes
                + self.prefill_graph_bytes + self.workspace_bytes)


def triton_max_kv_splits(model: ModelDescription, gpu: GPUDescription, context_len: int, flag_value: int | None) -> int:
    splits = flag_value or TRITON_DEFAULT_KV_SPLITS
    if model.is_mla:
        ctx_cap = _next_pow2(math.ceil(context_len / MLA_DECODE_MIN_BLOCK_KV))
        splits = max(splits, min(_next_pow2(gpu.sm_count), ctx_cap))
    return splits


def startup_memory(model: ModelDescription, gpu: GPUDescription, layout: ParallelLayout, *, attention_backend: str,
                   context_len: int, max_running_per_rank: int, decode_graph: bool, graph_max_bs: int,
                   prefill_graph_mib: float, page_size: int, triton_kv_splits: int | None = None,
                   kv_tokens: int = 0) -> StartupMemory:
    """``kv_tokens``: the KV pool's size in tokens (SGLang's ``max_total_num_tokens``)."""
    req_to_token = (max_running_per_rank + 1) * (context_len + 4) * 4
    max_bs = min(graph_max_bs, max_running_per_rank) if decode_graph else 0
    heads = max(1, model.num_attention_heads // layout.attn_tp)
    splits = 0
    state = 0
    if max_bs:
        if attention_backend == "triton":
            splits = triton_max_kv_splits(model, gpu, context_len, triton_kv_splits)
            v_dim = model.kv_lora_rank if model.is_mla else model.head_dim
            state = max_bs * heads * splits * (v_dim + 1) * 4 + max_bs * context_len * 8
        else:
            state = max_bs * -(-context_len // max(1, page_size)) * 4 + OTHER_BACKEND_WORKSPACE_BYTES
    decode = int(2 * max_bs * MIB)
    workspace = PRE_CAPTURE_FIXED_BYTES + PRE_CAPTURE_BYTES_PER_KV_TOKEN * max(0, int(kv_tokens))
    return StartupMemory(req_to_token_bytes=req_to_token, attention_graph_state_bytes=state,
                         decode_graph_bytes=decode, prefill_graph_bytes=int(prefill_graph_mib * MIB),
                         attention_backend=attention_backend, max_kv_splits=splits, graph_max_bs=max_bs,
                         workspace_bytes=workspace)


def default_attention_backend(model: ModelDescription, gpu: GPUDescription, flags: dict | None) -> str:
    """``--attention-backend`` (or the decode one), else SGLang's default: fa3 on Hopper;
    trtllm_mha / trtllm_mla / flashinfer on SM100; dsa for DSA models; triton otherwise."""
    flags = flags or {}
    chosen = flags.get("decode-attention-backend") or flags.get("attention-backend")
    if chosen:
        return str(chosen)
    if model.attention == "dsa":
        return "dsa"
    if gpu.sm_version == 90:
        return "fa3"
    if gpu.sm_version == 100:
        if model.is_mla:
            return "trtllm_mla" if model.architecture == "DeepseekV3ForCausalLM" else "flashinfer"
        return "trtllm_mha"
    return "flashinfer" if model.is_mla else "triton"
