from pathlib import Path

import pytest

from tests.conftest import REPO
from tuner import catalog
from tuner.errors import ConfigError


def test_glm_architecture_matches_config():
    m = catalog.get_model("glm-5.1")
    assert (m.hidden_size, m.num_layers, m.first_k_dense) == (6144, 78, 3)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.index_head_dim) == (512, 64, 128)
    assert m.num_moe_layers == 75 and m.n_routed_experts == 256 and m.experts_per_token == 8
    assert m.checkpoint("nvfp4").sglang_quantization == "modelopt_fp4"


def test_glm5_inherits_glm51_architecture():
    a, b = catalog.get_model("glm-5"), catalog.get_model("glm-5.1")
    assert a.hidden_size == b.hidden_size and a.index_topk == b.index_topk
    assert a.checkpoints["nvfp4"].hf_id == "nvidia/GLM-5-NVFP4"


@pytest.mark.parametrize("name", ["glm-5.1", "deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "llama-3.1-70b", "qwen3-30b-a3b"])
def test_required_models_present(name):
    assert catalog.get_model(name).name == name


def test_gpus_from_domain_numbers():
    h200 = catalog.get_gpu("h200")
    assert h200.memory_mib == 143771 and h200.memory_bytes == 150109880320
    assert catalog.get_gpu("b200").fp4_tflops == 9000
    assert catalog.get_gpu("h100").fp4_tflops is None
    assert catalog.get_gpu("rtx-pro-6000").interconnect == "pcie5"
    assert h200.device_name == "NVIDIA_H200"


def test_unknown_names_suggest():
    with pytest.raises(ConfigError, match="did you mean 'h200'"):
        catalog.get_gpu("h20O")
    with pytest.raises(ConfigError, match="valid: .*kimi-k2"):
        catalog.get_model("llama-4")
    with pytest.raises(ConfigError, match="no 'bf16' checkpoint"):
        catalog.get_model("deepseek-v3").checkpoint("bf16")


def test_a_model_name_naming_an_unknown_users_home_is_an_unknown_model(tmp_path):
    from tuner.config.load import load_study
    from tuner.paths import user_path

    # Path("~0").expanduser() raises: there is no user "0"; a model name is not a home directory
    assert user_path("~0") == Path("~0") and user_path("~/m") == Path.home() / "m"
    with pytest.raises(ConfigError, match="unknown model '~0'"):
        catalog.get_model("~0")
    study = tmp_path / "s.yaml"
    study.write_text((REPO / "studies" / "h200.yaml").read_text().replace("model: glm-5.1\n", "model: '~0'\n", 1))
    with pytest.raises(ConfigError, match="~0"):
        load_study(str(study))
