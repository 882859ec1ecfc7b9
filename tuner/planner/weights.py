"""Weight memory per GPU by module kind, from the model architecture and the checkpoint format.

Parameter counts follow the HF configs (see docs/calibration.md). Sharding follows SGLang:

* attention: q_b/kv_b/o (MLA) or q/k/v/o (GQA) are split over the attention-TP group
  (tp / attn_dp); MLA's q_a / kv_a projections and the DSA indexer are replicated;
* dense MLP and shared expert: split over the attention-TP group (replicated across attention-DP
  ranks);
* routed experts: experts split over EP ranks and each expert's N over moe-TP = tp / ep, so every
  GPU holds 1/tp of them;
* embedding: vocab-parallel over the attention-TP group (replicated under full attention DP);
  lm_head: vocab-parallel over the full TP group (``enable-dp-lm-head`` off, SGLang's default);
* router and norms: replicated;
* MTP draft layer: loaded only with speculative decoding; sharded like a MoE layer; it shares the
  target's embedding and lm_head (SGLang's EAGLE worker hands them over).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import Checkpoint, ModelDescription

from .parallel import ParallelLayout

# Bytes per parameter of each stored weight format.
#   fp8_block: 1 B value + one fp32 scale per 128x128 block
#   nvfp4: 4-bit value + one FP8 (E4M3) scale per 16 values (+ two fp32 per-tensor globals, negligible)
BYTES_PER_PARAM = {
    "bf16": 2.0,
    "fp8_block": 1.0 + 4.0 / (128 * 128),
    "nvfp4": 0.5 + 1.0 / 16,
}

MODULE_KINDS = (
    "attention", "indexer", "dense_mlp", "shared_expert", "routed_experts", "router",
    "embedding", "lm_head", "norms", "mtp",
)


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, split into replicated and sharded parts."""

    attn_sharded: int
    attn_replicated: int
    indexer: int
    norms: int


def attention_params(m: ModelDescription) -> LayerParams:
    h = m.hidden_size
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q_a = h * m.q_lora_rank
            q_b = m.q_lora_rank * m.num_attention_heads * qk
            q_norm = m.q_lora_rank
        else:
            q_a, q_norm = 0, 0
            q_b = h * m.num_attention_heads * qk
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = m.num_attention_heads * m.v_head_dim * h
        indexer = 0
        if m.attention == "dsa":
            ih, idim = m.index_n_heads, m.index_head_dim
            # wq_b (q_lora -> heads*dim), wk (h -> dim), k_norm (weight+bias), weights_proj (h -> heads)
            indexer = m.q_lora_rank * ih * idim + h * idim + 2 * idim + h * ih
        return LayerParams(q_b + kv_b + o, q_a + kv_a + q_norm + m.kv_lora_rank, indexer, 2 * h)
    hd = m.head_dim
    q = h * m.num_attention_heads * hd
    kv = 2 * h * m.num_kv_heads * hd
    o = m.num_attention_heads * hd * h
    return LayerParams(q + kv + o, 0, 0, 2 * h)


def param_counts(m: ModelDescription) -> dict[str, int]:
    """Total parameters of the checkpoint by module kind (MTP layer counted under ``mtp``)."""
    h = m.hidden_size
    lp = attention_params(m)
    n_moe = m.num_moe_layers
    n_dense = m.num_layers - n_moe
    expert = 3 * h * m.moe_intermediate_size
    counts = {
        "attention": m.num_layers * (lp.attn_sharded + lp.attn_replicated),
        "indexer": m.num_layers * lp.indexer,
        "dense_mlp": n_dense * 3 * h * m.intermediate_size,
        "shared_expert": n_moe * m.n_shared_experts * expert,
        "routed_experts": n_moe * m.n_routed_experts * expert,
        "router": n_moe * (h * m.n_routed_experts + m.n_routed_experts) if m.is_moe else 0,
        "embedding": m.vocab_size * h,
        "lm_head": 0 if m.tie_word_embeddings else m.vocab_size * h,
        "norms": m.num_layers * lp.norms + h,
        "mtp": 0,
    }
    if m.mtp_layers:
        layer = (lp.attn_sharded + lp.attn_replicated + lp.indexer + lp.norms
                 + (m.n_routed_experts + m.n_shared_experts) * expert + h * m.n_routed_experts)
        # eh_proj (2h -> h), enorm, hnorm, shared_head norm
        counts["mtp"] = m.mtp_layers * (layer + 2 * h * h + 3 * h)
    return counts


def _format(kind: str, ckpt: Checkpoint) -> str:
    if kind == "norms" or kind in ckpt.unquantized:
        return "bf16"
    return ckpt.weight_format


def weight_bytes_per_gpu(
    m: ModelDescription, ckpt: Checkpoint, layout: ParallelLayout, *, with_mtp: bool, dp_lm_head: bool = False
) -> dict[str, float]:
    """Bytes each GPU holds per module kind (the largest shard where shards differ)."""
    lp = attention_params(m)
    counts = param_counts(m)
    attn_tp = layout.attn_tp
    h = m.hidden_size
    kv_heads_local = max(1, m.num_kv_heads // attn_tp) if not m.is_mla else 0
    if m.is_mla:
        attn_per_gpu = m.num_layers * (lp.attn_sharded / attn_tp + lp.attn_replicated)
    else:
        # K/V heads are replicated once attn_tp exceeds the KV head count
        q_o = 2 * h * m.num_attention_heads * m.head_dim
        kv = 2 * h * kv_heads_local * m.head_dim
        attn_per_gpu = m.num_layers * (q_o / attn_tp + kv)
    per_gpu = {
        "attention": attn_per_gpu,
        "indexer": counts["indexer"],
        "dense_mlp": counts["dense_mlp"] / attn_tp,
        "shared_expert": counts["shared_expert"] / attn_tp,
        "routed_experts": counts["routed_experts"] / layout.tp,
        "router": counts["router"],
        "embedding": counts["embedding"] / attn_tp,
        "lm_head": counts["lm_head"] / (attn_tp if dp_lm_head else layout.tp),
        "norms": counts["norms"],
        "mtp": 0.0,
    }
    out = {kind: n * BYTES_PER_PARAM[_format(kind, ckpt)] for kind, n in per_gpu.items()}
    if with_mtp and m.mtp_layers:
        expert = 3 * h * m.moe_intermediate_size
        routed = m.mtp_layers * m.n_routed_experts * expert / layout.tp
        rest = counts["mtp"] - m.mtp_layers * m.n_routed_experts * expert
        mtp_fmt = _format("mtp", ckpt)
        # routed experts of the MTP layer follow the routed-expert format unless mtp is excluded
        routed_fmt = "bf16" if "mtp" in ckpt.unquantized else _format("routed_experts", ckpt)
        out["mtp"] = routed * BYTES_PER_PARAM[routed_fmt] + rest / attn_tp * BYTES_PER_PARAM[mtp_fmt]
    return out
