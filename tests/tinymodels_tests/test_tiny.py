"""make-tiny: loadable random-weight models whose tokenizer is one token per word."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.conftest import run_cli  # noqa: E402
from tuner.errors import ConfigError  # noqa: E402
from tuner.tinymodels.tiny import TinyModelShape, build_config, make_tiny_model  # noqa: E402
from tuner.tinymodels.tokenizer import words_text  # noqa: E402


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    out = tmp_path_factory.mktemp("m") / "qwen3_moe"
    summary = make_tiny_model(out, TinyModelShape(arch="qwen3_moe", words=500, seed=3))
    return out, summary


def test_tokenizer_maps_n_words_to_n_tokens(tiny_moe):
    from transformers import AutoTokenizer

    out, _ = tiny_moe
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = [7, 0, 499, 123, 123, 42]
    enc = tok(words_text(ids))["input_ids"]
    assert enc == ids  # no BOS, no merges: word i is id i
    for n in (1, 17, 300):
        assert len(tok(words_text(range(n)))["input_ids"]) == n
    assert tok.eos_token_id == 500  # one past the model's vocabulary


def test_model_loads_and_always_generates_max_new_tokens(tiny_moe):
    import torch
    from transformers import AutoModelForCausalLM

    out, summary = tiny_moe
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == 8 and model.config.vocab_size == 500
    assert sum(p.numel() for p in model.parameters()) == summary["parameters"]
    prompt = torch.tensor([[1, 2, 3, 4]])
    gen = model.generate(prompt, max_new_tokens=40)
    assert gen.shape[1] == 4 + 40  # eos has no logit: never stops early
    assert int(gen.max()) < 500


def test_same_seed_same_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    a = make_tiny_model(tmp_path / "a", TinyModelShape(arch="llama", seed=5))
    b = make_tiny_model(tmp_path / "b", TinyModelShape(arch="llama", seed=5))
    c = make_tiny_model(tmp_path / "c", TinyModelShape(arch="llama", seed=6))
    wa, wb, wc = (load_file(f"{s['dir']}/model.safetensors") for s in (a, b, c))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(wa[key], wb[key])
    assert not torch.equal(wa[key], wc[key])


def test_deepseek_v3_is_mla_moe():
    cfg = build_config(TinyModelShape(arch="deepseek_v3", layers=3, dense_layers=1, kv_lora_rank=24))
    assert cfg.model_type == "deepseek_v3"
    assert cfg.kv_lora_rank == 24 and cfg.first_k_dense_replace == 1
    assert cfg.num_key_value_heads == cfg.num_attention_heads


def test_bad_spec_names_the_key():
    with pytest.raises(ConfigError, match="arch.*valid: qwen3_moe, deepseek_v3, llama"):
        TinyModelShape(arch="gpt9").validate()
    with pytest.raises(ConfigError, match="kv_heads"):
        TinyModelShape(arch="llama", heads=4, kv_heads=3).validate()


def test_cli_make_tiny(tmp_path):
    out = tmp_path / "ds"
    res = run_cli(["model", "make-tiny", str(out), "--arch", "deepseek_v3", "--layers", "2",
                   "--words", "300", "--json"])
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["model_type"] == "deepseek_v3" and summary["parameters"] > 0
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    again = run_cli(["model", "make-tiny", str(out)])
    assert again.returncode == 2 and "not empty" in again.stderr
