"""Peak activation memory of SGLang's largest forward step: one chunked-prefill batch.

What start-up leaves free (SGLang logs it as ``available_gpu_mem``) must hold the tensors of the
largest forward pass, or the server dies with CUDA out of memory on its first long prompts. This
was seen for real: DeepSeek-V3-8L, fp8, fp8 KV, ``mem-fraction-static 0.85`` and the default
``max-running-requests`` (4096) captured decode graphs up to 256 whose Triton MLA state took 16.8
GiB, left 0.92 GiB, and died on its first 8192-token prefill chunk (study h200-sglang-dsv3, trial 4).

The peak is counted from the shapes SGLang's kernels write, per GPU, in bf16 activations:

* hidden states and residual: ``2 x T x hidden``;
* attention, whichever is larger than the MLP: MLA's prefill (MHA) path materialises q, the
  ``kv_b_proj`` output, k and the output (``T x H x (nope+rope | nope+v | nope+rope | v)``,
  ``deepseek_v2.forward_normal``); on the Triton backend a chunk with a cached prefix runs the
  absorbed path instead (``handle_attention_triton``), which holds q, its latent projection, the
  kernel's input and its output when the output is allocated (``T x H x (nope+rope | kv_lora |
  kv_lora+rope | kv_lora)``, ``forward_mla.forward_absorb_core``, ``TritonAttnBackend.forward_extend``);
  GQA its qkv and output;
* the MLP: the fused-MoE caches ``intermediate_cache1/2/3`` (``T x topk x (2I | I | hidden)``,
  ``fused_moe``) plus the shared experts' gate-up, or a dense layer's gate-up and down;
* an fp8 checkpoint adds the quantized copy of the layer input (``T x hidden`` bytes).

Prefill logits (last token per request) and the sampler are left out. PyTorch's caching allocator
cannot hand all of what is free to a chunk's large tensors: at both deaths measured on the H100
(study h100-sglang-dsv3-5l, trials 1 and 2, an 8192-token DeepSeek-V3 chunk over a cached prefix)
0.60 and 0.36 GiB were reserved but unallocated, where the live tensors matched this count (2.71
GiB before the kernel's output against 2.77 counted). ``ALLOCATOR_SLACK`` adds the smaller share
(9.5% of the peak): the need stays a lower bound, so a configuration it refuses cannot serve its chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import ModelDescription

from .parallel import ParallelLayout

ACT_BYTES = 2  # bf16 activations
ALLOCATOR_SLACK = 0.095  # reserved but unallocated at the measured deaths, a share of the peak (above)


@dataclass(frozen=True)
class PrefillActivations:
    """Bytes per GPU of the largest tensors alive in one prefill forward of ``tokens`` tokens."""

    tokens: int
    hidden_bytes: int
    attention_bytes: int
    mlp_bytes: int
    quant_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.hidden_bytes + max(self.attention_bytes, self.mlp_bytes) + self.quant_bytes

    @property
    def need_bytes(self) -> int:
        """What must be free for the chunk: its tensors and the allocator's slack."""
        return int(self.peak_bytes * (1 + ALLOCATOR_SLACK))

    @property
    def largest(self) -> str:
        return "attention" if self.attention_bytes >= self.mlp_bytes else "MLP"


def prefill_activations(model: ModelDescription, layout: ParallelLayout, tokens: int,
                        weight_format: str = "bf16", absorbed_extend: bool = False) -> PrefillActivations:
    """``absorbed_extend``: MLA chunks with a cached prefix run the absorbed path (the Triton backend)."""
    t = max(0, int(tokens))
    h = model.hidden_size
    heads = max(1, model.num_attention_heads // layout.attn_tp)
    if model.is_mla:
        nope, rope, v = model.qk_nope_head_dim or 0, model.qk_rope_head_dim or 0, model.v_head_dim or 0
        attention = t * heads * ((nope + rope) + (nope + v) + (nope + rope) + v)
        if absorbed_extend and model.attention != "dsa":
            lora = model.kv_lora_rank or 0
            attention = max(attention, t * heads * ((nope + rope) + lora + (lora + rope) + lora))
    else:
        d = model.head_dim or h // model.num_attention_heads
        kv = max(1, model.num_kv_heads // layout.attn_tp)
        attention = t * (heads + 2 * kv) * d + t * heads * d
    dense = 0
    if model.first_k_dense or not model.is_moe:
        inter = model.intermediate_size // layout.tp
        dense = t * 3 * inter
    moe = 0
    if model.is_moe:
        inter = model.moe_intermediate_size // layout.moe_tp
        k = model.experts_per_token
        moe = t * k * (2 * inter + inter + h) + t * 3 * inter * model.n_shared_experts
    return PrefillActivations(
        tokens=t, hidden_bytes=2 * t * h * ACT_BYTES, attention_bytes=attention * ACT_BYTES,
        mlp_bytes=max(dense, moe) * ACT_BYTES, quant_bytes=t * h if weight_format == "fp8_block" else 0)
