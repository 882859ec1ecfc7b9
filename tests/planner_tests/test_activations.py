"""Peak activations of one chunked-prefill forward, against shapes worked by hand."""

from __future__ import annotations

from tuner.catalog import get_model
from tuner.planner import parse_layout
from tuner.planner.activations import prefill_activations


def test_deepseek_v3_8192_tokens_on_one_gpu():
    model = get_model("deepseek-v3")
    a = prefill_activations(model, parse_layout(model, {}, 1), 8192, "fp8_block")
    t = 8192
    assert a.hidden_bytes == 2 * t * 7168 * 2
    # MLA prefill: q (128 x 192), kv_b output (128 x 256), k (128 x 192), output (128 x 128), bf16
    assert a.attention_bytes == t * 128 * (192 + 256 + 192 + 128) * 2
    # fused MoE caches: top-8 x (2 x 2048 + 2048 + 7168), plus one shared expert's 3 x 2048
    assert a.mlp_bytes == (t * 8 * (4096 + 2048 + 7168) + t * 3 * 2048) * 2
    assert a.quant_bytes == t * 7168
    assert a.peak_bytes == a.hidden_bytes + a.mlp_bytes + a.quant_bytes and a.largest == "MLP"


def test_tensor_parallel_splits_heads_and_expert_slices():
    model = get_model("deepseek-v3")
    one = prefill_activations(model, parse_layout(model, {}, 1), 4096)
    tp8 = prefill_activations(model, parse_layout(model, {"tp-size": 8}, 8), 4096)
    assert tp8.attention_bytes * 8 == one.attention_bytes
    assert tp8.hidden_bytes == one.hidden_bytes  # every rank holds the whole hidden state
    assert tp8.mlp_bytes < one.mlp_bytes and tp8.quant_bytes == 0


def test_gqa_counts_qkv_and_output_and_scales_with_tokens():
    model = get_model("qwen3-30b-a3b")
    a = prefill_activations(model, parse_layout(model, {}, 1), 2048)
    assert a.attention_bytes == (2048 * (32 + 2 * 4) * 128 + 2048 * 32 * 128) * 2
    assert prefill_activations(model, parse_layout(model, {}, 1), 4096).peak_bytes == 2 * a.peak_bytes


def test_an_mla_chunk_over_a_cached_prefix_on_triton_holds_the_absorbed_tensors():
    """The Triton backend runs a chunk with a cached prefix in the absorbed form: q (192), its
    latent projection (512), the kernel's input (512 + 64) and output (512) a head, alive together
    when the output is allocated; other backends run it as MHA."""
    model = get_model({"name": "deepseek-v3", "overrides": {"num_hidden_layers": 5}})
    layout = parse_layout(model, {}, 1)
    mha = prefill_activations(model, layout, 8192, "fp8_block")
    absorbed = prefill_activations(model, layout, 8192, "fp8_block", absorbed_extend=True)
    assert absorbed.attention_bytes == 8192 * 128 * (192 + 512 + 576 + 512) * 2
    assert absorbed.attention_bytes > 2 * mha.attention_bytes and absorbed.largest == "attention"
    # a GQA model has no absorbed form
    qwen = get_model("qwen3-30b-a3b")
    ql = parse_layout(qwen, {}, 1)
    assert prefill_activations(qwen, ql, 8192, absorbed_extend=True) == prefill_activations(qwen, ql, 8192)
