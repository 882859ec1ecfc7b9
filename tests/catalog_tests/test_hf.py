"""Models as Hugging Face config.json: every catalog model survives a round trip, a directory or a
name with overrides becomes the same kind of description, and bad configs are refused clearly."""

from __future__ import annotations

import json

import pytest

from tuner.catalog import ModelRef, get_model, models, resolve_ref
from tuner.catalog.hf import ARCHITECTURES, checkpoint_format, model_from_hf_config, render_hf_config, write_model_dir
from tuner.errors import ConfigError

SHAPE_FIELDS = ("architecture", "attention", "hidden_size", "num_layers", "first_k_dense", "num_attention_heads",
                "num_kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                "experts_per_token", "index_n_heads", "index_head_dim", "index_topk", "mtp_layers", "vocab_size",
                "tie_word_embeddings", "max_context_tokens")


@pytest.mark.parametrize("name", sorted(models()))
def test_every_catalog_model_round_trips_through_its_rendered_config(name):
    model = get_model(name)
    cfg = render_hf_config(model, "bf16")
    again = model_from_hf_config(cfg, name=name, checkpoints=model.checkpoints)
    assert {f: getattr(again, f) for f in SHAPE_FIELDS} == {f: getattr(model, f) for f in SHAPE_FIELDS}
    assert cfg["architectures"] == [model.architecture] and cfg["architectures"][0] in ARCHITECTURES


def test_quantization_config_follows_the_checkpoint():
    model = get_model("qwen3-30b-a3b")
    assert "quantization_config" not in render_hf_config(model, "bf16")
    fp8 = render_hf_config(model, "fp8_block")
    assert fp8["quantization_config"]["weight_block_size"] == [128, 128] and checkpoint_format(fp8) == "fp8_block"
    with pytest.raises(ConfigError, match="unknown weight format"):
        render_hf_config(model, "int3")


def test_a_directory_and_overrides_give_descriptions_the_planner_uses(tmp_path):
    d = write_model_dir(get_model("deepseek-v3"), "fp8_block", tmp_path / "dsv3")
    from_dir = get_model(str(d))
    assert from_dir.attention == "mla" and from_dir.kv_lora_rank == 512 and from_dir.num_layers == 61
    assert set(from_dir.checkpoints) == {"fp8"}  # what its quantization_config says
    small = get_model(resolve_ref(ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})))
    assert (small.num_layers, small.first_k_dense, small.num_moe_layers) == (8, 3, 5)
    assert set(small.checkpoints) == set(get_model("deepseek-v3").checkpoints)  # the catalog's checkpoints
    from tuner.planner import plan_memory

    full = plan_memory("deepseek-v3", "h200", 8, {"tp-size": 8, "quantization": "fp8"})
    cut = plan_memory(small, "h200", 8, {"tp-size": 8, "quantization": "fp8"})
    assert cut.weights_gb_per_gpu < full.weights_gb_per_gpu / 4


def test_bad_configs_and_overrides_are_refused_with_the_key(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'num_hidden_layers'"):
        resolve_ref(ModelRef(name="qwen3-30b-a3b", overrides={"num_hiden_layers": 4}))
    with pytest.raises(ConfigError, match="must be int"):
        resolve_ref(ModelRef(name="qwen3-30b-a3b", overrides={"num_hidden_layers": "four"}))
    with pytest.raises(ConfigError, match="architecture cannot be overridden"):
        resolve_ref(ModelRef(name="qwen3-30b-a3b", overrides={"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "mamba").mkdir()
    (tmp_path / "mamba" / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ConfigError, match="unsupported architecture 'MambaForCausalLM'"):
        get_model(str(tmp_path / "mamba"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_ref(ModelRef(name=str(tmp_path / "empty")))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        resolve_ref(ModelRef(name=str(tmp_path / "broken")))
