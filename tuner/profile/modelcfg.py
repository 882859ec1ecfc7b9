"""A Hugging Face ``config.json`` for a catalog model, so SGLang can be initialised for its shapes
with ``--load-format dummy`` (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.catalog import Checkpoint, ModelDescription
from tuner.errors import ConfigError

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def hf_config(model: ModelDescription, ckpt: Checkpoint) -> dict:
    m = model
    common = {"hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers, "vocab_size": m.vocab_size,
              "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_kv_heads,
              "max_position_embeddings": m.max_context_tokens, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              "tie_word_embeddings": m.tie_word_embeddings, "torch_dtype": "bfloat16"}
    if m.architecture == "Qwen3MoeForCausalLM":
        cfg = {**common, "architectures": [m.architecture], "model_type": "qwen3_moe", "head_dim": m.head_dim,
               "intermediate_size": m.intermediate_size, "moe_intermediate_size": m.moe_intermediate_size,
               "num_experts": m.n_routed_experts, "num_experts_per_tok": m.experts_per_token, "norm_topk_prob": True,
               "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1_000_000.0}
    elif m.architecture == "DeepseekV3ForCausalLM":
        cfg = {**common, "architectures": [m.architecture], "model_type": "deepseek_v3",
               "intermediate_size": m.intermediate_size, "moe_intermediate_size": m.moe_intermediate_size,
               "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.qk_nope_head_dim,
               "qk_rope_head_dim": m.qk_rope_head_dim, "v_head_dim": m.v_head_dim,
               "n_routed_experts": m.n_routed_experts, "n_shared_experts": m.n_shared_experts,
               "num_experts_per_tok": m.experts_per_token, "first_k_dense_replace": m.first_k_dense,
               "moe_layer_freq": 1, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
               "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "norm_topk_prob": True,
               "rope_theta": 10000.0, "num_nextn_predict_layers": m.mtp_layers,
               "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    elif m.architecture == "LlamaForCausalLM":
        cfg = {**common, "architectures": [m.architecture], "model_type": "llama", "head_dim": m.head_dim,
               "intermediate_size": m.intermediate_size, "rope_theta": 500_000.0}
    else:
        raise ConfigError(f"no config.json template for {m.architecture}; give --model-path with a config.json",
                          key="model")
    if ckpt.weight_format == "fp8_block":
        cfg["quantization_config"] = dict(FP8_BLOCK)
    elif ckpt.weight_format != "bf16":
        raise ConfigError(f"weight format {ckpt.weight_format} is not profiled; use bf16 or fp8", key="quantization")
    return cfg


def write_model_dir(model: ModelDescription, ckpt: Checkpoint, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(hf_config(model, ckpt), indent=2) + "\n")
    return d
