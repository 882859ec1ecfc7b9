"""The operations one GPU runs per forward step of a configuration, with the shapes that GPU sees
(local heads under attention-TP, local experts under EP, the moe-TP slice of each expert).

Shared by the step-time model (which times them from measured tables or a roofline) and by
``tuner profile`` (which measures them on a GPU), so a table measured for one configuration is
found again for every configuration whose GPUs see the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import Checkpoint, ModelDescription
from tuner.planner.memory import kv_dtype_bytes
from tuner.planner.parallel import ParallelLayout


@dataclass(frozen=True)
class Gemm:
    """One linear layer as a GEMM ``[tokens, k] x [k, n]``, ``layers`` times per forward."""

    name: str
    n: int
    k: int
    dtype: str  # weight format: bf16 | fp8_block | nvfp4
    layers: int
    per: str = "token"  # token | logit (lm_head runs once per sequence that samples)

    @property
    def key(self) -> dict:
        return {"n": self.n, "k": self.k, "dtype": self.dtype}


@dataclass(frozen=True)
class AttentionShape:
    arch: str  # gqa | mla | dsa
    q_heads: int  # local query heads
    kv_heads: int  # local KV heads (1 for the MLA latent)
    qk_head_dim: int  # gqa: head_dim; mla: kv_lora + rope (absorbed decode)
    v_head_dim: int  # gqa: head_dim; mla: kv_lora
    kv_dtype: str
    layers: int
    # MLA prefill without a cached prefix runs MHA over expanded K/V (Triton backend: forward_normal)
    mha_qk_head_dim: int = 0
    mha_v_head_dim: int = 0

    @property
    def key(self) -> dict:
        return {"arch": self.arch, "q_heads": self.q_heads, "kv_heads": self.kv_heads,
                "qk_head_dim": self.qk_head_dim, "v_head_dim": self.v_head_dim, "kv_dtype": self.kv_dtype}


@dataclass(frozen=True)
class MoEShape:
    experts: int  # local routed experts (E of the SGLang tile-config file name, without shared fusion)
    n: int  # moe_intermediate / moe-TP
    k: int  # hidden size
    topk: int
    dtype: str
    layers: int
    total_experts: int

    @property
    def key(self) -> dict:
        return {"experts": self.experts, "n": self.n, "k": self.k, "topk": self.topk, "dtype": self.dtype}


# SGLang 0.5.17's staged HiCache write-back: pages gathered per launch (_WRITE_BACK_STAGING_PAGE_CHUNK)
# and the page size from which its copies go as one cudaMemcpyBatchAsync (kLargeCopyThresholdBytes)
HICACHE_STAGING_PAGES = 64
HICACHE_BATCHED_COPY_BYTES = 128 * 1024
# Copies the CUDA driver holds queued on one stream before the issuing thread blocks: measured as
# the backlog left when a long backup's issue loop ends (done_us - us over the time per copy: 986 to
# 1,013 copies in every blocked point of results/profiles/h100/tables)
HICACHE_COPY_QUEUE_CALLS = 1000


@dataclass(frozen=True)
class HostWriteShape:
    """One HiCache write-through backup as SGLang 0.5.17 issues it from the scheduler thread
    (``kernel`` io backend, ``page_first`` host layout): KV tensors (K and V, or MLA's one latent
    buffer), layers, bytes of one token of one tensor in one layer, and the page size, which with
    those sets how many copies one page takes (``StepTimeModel.host_write_cpu_s``)."""

    tensors: int
    layers: int
    element_bytes: int
    page_size: int

    @property
    def page_tensor_bytes(self) -> int:
        return self.page_size * self.layers * self.element_bytes

    @property
    def key(self) -> dict:
        return {"tensors": self.tensors, "layers": self.layers, "element_bytes": self.element_bytes,
                "page_size": self.page_size, "layout": "page_first", "io_backend": "kernel"}


def host_write_shape(model: ModelDescription, layout: ParallelLayout, kv_dtype: str, page_size: int) -> HostWriteShape:
    a = attention_shape(model, layout, kv_dtype)
    itemsize = kv_dtype_bytes(kv_dtype)
    if a.arch == "gqa":
        return HostWriteShape(2, a.layers, round(a.kv_heads * a.qk_head_dim * itemsize), max(1, page_size))
    return HostWriteShape(1, a.layers, round(a.qk_head_dim * itemsize), max(1, page_size))


def _fmt(kind: str, ckpt: Checkpoint) -> str:
    return "bf16" if kind == "norms" or kind in ckpt.unquantized else ckpt.weight_format


def gemms(model: ModelDescription, ckpt: Checkpoint, layout: ParallelLayout) -> list[Gemm]:
    """Every non-expert linear layer one GPU runs, with its local shape."""
    m, h = model, model.hidden_size
    attn_tp = layout.attn_tp
    heads = max(1, m.num_attention_heads // attn_tp)
    layers = m.num_layers
    attn = _fmt("attention", ckpt)
    out: list[Gemm] = []
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        if m.q_lora_rank:
            # q_a and kv_a are fused and replicated on every attention-TP rank
            out.append(Gemm("qkv_a_proj", m.q_lora_rank + latent, h, attn, layers))
            out.append(Gemm("q_b_proj", heads * qk, m.q_lora_rank, attn, layers))
        else:
            out.append(Gemm("q_proj", heads * qk, h, attn, layers))
            out.append(Gemm("kv_a_proj", latent, h, attn, layers))
        out.append(Gemm("kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, attn, layers))
        out.append(Gemm("o_proj", h, heads * m.v_head_dim, attn, layers))
        if m.attention == "dsa":
            idx = _fmt("indexer", ckpt)
            ih, idim = m.index_n_heads, m.index_head_dim
            out.append(Gemm("indexer_wq_b", ih * idim, m.q_lora_rank, idx, layers))
            out.append(Gemm("indexer_wk", idim, h, idx, layers))
            out.append(Gemm("indexer_weights_proj", ih, h, idx, layers))
    else:
        kv = max(1, m.num_kv_heads // attn_tp)
        out.append(Gemm("qkv_proj", (heads + 2 * kv) * m.head_dim, h, attn, layers))
        out.append(Gemm("o_proj", h, heads * m.head_dim, attn, layers))
    n_moe = m.num_moe_layers
    n_dense = layers - n_moe
    if n_dense:
        dense = _fmt("dense_mlp", ckpt)
        inter = m.intermediate_size // attn_tp
        out.append(Gemm("mlp_gate_up", 2 * inter, h, dense, n_dense))
        out.append(Gemm("mlp_down", h, inter, dense, n_dense))
    if n_moe:
        out.append(Gemm("router_gate", m.n_routed_experts, h, _fmt("router", ckpt), n_moe))
        if m.n_shared_experts:
            shared = _fmt("shared_expert", ckpt)
            inter = m.moe_intermediate_size * m.n_shared_experts // attn_tp
            out.append(Gemm("shared_gate_up", 2 * inter, h, shared, n_moe))
            out.append(Gemm("shared_down", h, inter, shared, n_moe))
    # lm_head is vocab-parallel over the full TP group (enable-dp-lm-head off)
    out.append(Gemm("lm_head", -(-m.vocab_size // layout.tp), h, _fmt("lm_head", ckpt), 1, per="logit"))
    return out


def attention_shape(model: ModelDescription, layout: ParallelLayout, kv_dtype: str) -> AttentionShape:
    m = model
    heads = max(1, m.num_attention_heads // layout.attn_tp)
    if m.is_mla:
        return AttentionShape("dsa" if m.attention == "dsa" else "mla", heads, 1,
                              m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank, kv_dtype, m.num_layers,
                              mha_qk_head_dim=m.qk_nope_head_dim + m.qk_rope_head_dim, mha_v_head_dim=m.v_head_dim)
    kv = max(1, m.num_kv_heads // layout.attn_tp)
    return AttentionShape("gqa", heads, kv, m.head_dim, m.head_dim, kv_dtype, m.num_layers,
                          mha_qk_head_dim=m.head_dim, mha_v_head_dim=m.head_dim)


def moe_shape(model: ModelDescription, ckpt: Checkpoint, layout: ParallelLayout) -> MoEShape | None:
    m = model
    if not m.is_moe:
        return None
    return MoEShape(m.n_routed_experts // layout.ep, m.moe_intermediate_size // layout.moe_tp, m.hidden_size,
                    m.experts_per_token, _fmt("routed_experts", ckpt), m.num_moe_layers, m.n_routed_experts)
