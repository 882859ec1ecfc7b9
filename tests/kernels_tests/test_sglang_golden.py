"""File names, directories, shapes, spaces and log strings against what SGLang 0.5.17 and 0.5.23 read.

The golden literals below hold everywhere; where the two SGLang sources are unpacked (directory
``$TUNER_SGLANG_REF``, default /work/ref, as sglang-<version>/sglang), the tests also read them and
check that the code there still says so.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tuner.kernels.configfile import moe_config_filename
from tuner.kernels.gemm_shapes import gemm_shapes
from tuner.kernels.sglang_env import Found, sglang_at, shipped_down_configs, shipped_gemm_configs, shipped_moe_configs
from tuner.kernels.sglang_layout import (LAYOUTS, LOG_TEMPLATES, MOE_CONFIG_DIR_ENV, MOE_CONFIG_MODULE,
                                         gemm_config_filename, layout_for, parse_gemm_config_filename)
from tuner.kernels.shapes import moe_shape
from tuner.kernels.space import (GEMM_PARAM_VALUES, PARAM_VALUES, TileConfig, default_config, gemm_default_config,
                                 gemm_search_space, search_space_for)

REF = Path(os.environ.get("TUNER_SGLANG_REF", "/work/ref"))
VERSIONS = ("0.5.17", "0.5.23")


def _pkg(version: str) -> Path:
    p = REF / f"sglang-{version}" / "sglang"
    if not p.is_dir():
        pytest.skip(f"SGLang {version} source not unpacked at {p}")
    return p


# ---- golden names (always run) ------------------------------------------------------------------------

@pytest.mark.parametrize("model,tp,dtype,block,name", [
    ("qwen3-30b-a3b", 1, "bf16", None, "E=128,N=768,device_name=NVIDIA_H200.json"),
    ("qwen3-30b-a3b", 1, "fp8_w8a8", (128, 128),
     "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"),
    ("deepseek-v3", 1, "fp8_w8a8", (128, 128),
     "E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"),
    ("deepseek-v3", 8, "fp8_w8a8", (128, 128),
     "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"),
])
def test_moe_file_names(model, tp, dtype, block, name):
    s = moe_shape(model, tp, 1, dtype, block)
    assert moe_config_filename(s.num_experts, s.intermediate, "NVIDIA H200", s.config_dtype, s.block_shape) == name
    down = moe_config_filename(s.num_experts, s.intermediate, "NVIDIA H200", s.config_dtype, s.block_shape, down=True)
    assert down == name.removesuffix(".json") + "_down.json"


def test_gemm_file_names_and_qwen3_shapes():
    # Qwen3-30B-A3B fp8 at TP1: qkv (32 + 2*4 heads of 128) x 2048 and o_proj 2048 x 4096
    assert [(g.N, g.K) for g in gemm_shapes("qwen3-30b-a3b", 1)] == [(5120, 2048), (2048, 4096)]
    assert gemm_config_filename(5120, 2048, "NVIDIA H200") == \
        "N=5120,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert parse_gemm_config_filename("N=5120,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json") \
        == (5120, 2048, "NVIDIA_H200", (128, 128))
    # KV heads are replicated once TP exceeds them
    assert (gemm_shapes("qwen3-30b-a3b", 8)[0].N) == (4 + 2 * 1) * 128


def test_gemm_config_directories_per_version():
    assert LAYOUTS["0.5.17"].gemm_config_subdir == "kernels/ops/quantization/configs"
    assert LAYOUTS["0.5.23"].gemm_config_subdir == "kernels/ops/gemm/configs"
    assert all(lay.gemm_config_env is None for lay in LAYOUTS.values())
    assert all(lay.reads_down_files for lay in LAYOUTS.values())
    assert LAYOUTS["0.5.17"].gemm_kernel_import == "sglang.kernels.ops.quantization.fp8_kernel"


def test_spaces_sizes():
    assert len(search_space_for("bf16", None)) == 1920
    assert len(search_space_for("fp8_w8a8", (128, 128))) == 1280
    assert len(gemm_search_space((128, 128))) == 1280
    assert gemm_default_config((128, 128)) == TileConfig(64, 128, 128, 32, num_warps=4, num_stages=3)


# ---- against the sources ----------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_layout_matches_the_source(version):
    pkg = _pkg(version)
    sgl = sglang_at(pkg)
    assert sgl.version == version
    assert sgl.layout == LAYOUTS[version]
    gemm_src = (pkg / LAYOUTS[version].gemm_kernel_module).read_text()
    # the GEMM file name and its directory, as get_w8a8_block_fp8_configs builds them
    assert ('json_file_name = f"N={N},K={K},device_name={device_name},dtype=fp8_w8a8,'
            'block_shape=[{block_n}, {block_k}].json"') in gemm_src
    assert 'os.path.dirname(os.path.realpath(__file__)), "configs", json_file_name' in gemm_src
    assert "environ" not in gemm_src.split("def get_w8a8_block_fp8_configs(")[1].split("\ndef ")[0]
    # the MoE directory variable and the triton_<version> directory
    moe_src = (pkg / MOE_CONFIG_MODULE).read_text()
    assert f'"{MOE_CONFIG_DIR_ENV}", os.path.dirname(os.path.realpath(__file__))' in moe_src
    assert "version_dir = f\"triton_{triton_version.replace('.', '_')}\"" in moe_src
    assert 'down_moe_selector = "_down" if down_moe else ""' in moe_src
    assert 'f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}' in moe_src
    fused = (pkg / "srt/layers/moe/moe_runner/triton_utils/fused_moe.py").read_text()
    assert "return_down_config=True" in fused
    up_pop = re.search(r'(?<![_\w])config\.pop\("USE_TMA", False\)', fused) is not None
    assert up_pop == LAYOUTS[version].up_config_takes_use_tma
    assert 'down_config.pop("USE_TMA", False)' in fused
    # an unlisted version is recognised from its package
    assert layout_for("9.9.9", pkg).gemm_kernel_module == LAYOUTS[version].gemm_kernel_module


@pytest.mark.parametrize("version", VERSIONS)
def test_log_templates_are_in_the_source(version):
    pkg = _pkg(version)
    moe_src = (pkg / MOE_CONFIG_MODULE).read_text()
    gemm_src = (pkg / LAYOUTS[version].gemm_kernel_module).read_text()
    for key, template in LOG_TEMPLATES.items():
        assert template in (gemm_src if key.startswith("gemm") else moe_src), key


@pytest.mark.parametrize("version", VERSIONS)
def test_default_config_rules_match_the_source(version):
    src = (_pkg(version) / MOE_CONFIG_MODULE).read_text()
    body = src.split("def get_default_config(")[1].split("\ndef ")[0]
    # the block-fp8 and bf16 branches our default_config reimplements
    assert '"BLOCK_SIZE_N": block_shape[0],' in body and '"GROUP_SIZE_M": 32,' in body
    assert "if M <= E or (is_marlin and M <= 32):" in body
    assert default_config(4, 128, 768, 2048, 8, None) == TileConfig(16, 32, 64, 1)
    assert default_config(4096, 128, 768, 2048, 8, None) == TileConfig(64, 64, 32, 8)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_issues_lookups(version):
    """What a server on the H200 with triton 3.6.0 finds for the study's shapes."""
    sgl = sglang_at(_pkg(version))
    root, v = sgl.moe_config_root, "triton_3_6_0"
    bf16 = shipped_moe_configs(root, "E=128,N=768,device_name=NVIDIA_H200.json", v)
    assert bf16.found is Found.EXACT and bf16.path.parent.name == v
    fp8 = shipped_moe_configs(root, "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json", v)
    assert fp8.found is Found.FALLBACK and fp8.path.parent.name == "triton_3_2_0"
    up = "E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    ds = shipped_down_configs(root, up, up.replace(".json", "_down.json"), v)
    assert ds.found is Found.NONE
    for g in gemm_shapes("qwen3-30b-a3b", 1):
        assert shipped_gemm_configs(sgl.gemm_config_dir, g.N, g.K, "NVIDIA H200").found is Found.NONE


@pytest.mark.parametrize("version", VERSIONS)
def test_deepseek_tp8_gemm_shapes_are_the_ones_sglang_ships(version):
    """SGLang ships H200 GEMM files for DeepSeek-V3 at TP8: our (N, K) must name exactly those files."""
    sgl = sglang_at(_pkg(version))
    for g in gemm_shapes("deepseek-v3", 8):
        lk = shipped_gemm_configs(sgl.gemm_config_dir, g.N, g.K, "NVIDIA H200")
        assert lk.found is Found.EXACT, (g.N, g.K)
        assert set(lk.configs) >= {1, 64, 4096}


@pytest.mark.parametrize("version", VERSIONS)
def test_shipped_gemm_configs_lie_in_our_gemm_space(version):
    sgl = sglang_at(_pkg(version))
    space = set(gemm_search_space((128, 128)))
    files = sorted(sgl.gemm_config_dir.glob("*device_name=NVIDIA_H*,dtype=fp8_w8a8,block_shape=[[]128, 128[]].json"))
    assert len(files) > 10
    for f in files:
        for m, cfg in json.loads(f.read_text()).items():
            assert TileConfig.from_dict(cfg) in space, (f.name, m, cfg)


@pytest.mark.parametrize("version", VERSIONS)
def test_shipped_h200_moe_configs_use_our_parameter_values(version):
    """SGLang's recent H200 tunings (triton 3.6.0 files) use only the values of its tuner's space."""
    sgl = sglang_at(_pkg(version))
    files = sorted((sgl.moe_config_root / "configs" / "triton_3_6_0").glob("*NVIDIA_H200*.json"))
    assert files
    for f in files:
        for cfg in json.loads(f.read_text()).values():
            for k, values in PARAM_VALUES.items():
                assert cfg[k] in values, (f.name, k, cfg[k])
            assert set(cfg) <= set(PARAM_VALUES) | {"USE_TMA"}
            if "USE_TMA" in cfg and not f.name.endswith("_down.json"):
                assert LAYOUTS[version].up_config_takes_use_tma, f.name


def test_gemm_param_values_are_sglangs_block_k_choices():
    assert GEMM_PARAM_VALUES["BLOCK_SIZE_K"] == (64, 128)
    assert all(128 % c.BLOCK_SIZE_K == 0 for c in gemm_search_space((128, 128)))


def test_source_regex_for_block_shape_glob_sanity():
    # the glob in the GEMM test must match SGLang's bracketed names
    assert re.fullmatch(r".*\[128, 128\]\.json", gemm_config_filename(1, 1, "X"))


def test_the_committed_key_groups_are_what_sglangs_own_files_give():
    """`tuner/sim/calibration/sglang-moe-config-groups.yaml` against SGLang 0.5.17's configs/ under
    the Triton the kit runs (3.6.0), for every catalog GPU."""
    import yaml

    from tuner.catalog import gpus
    from tuner.kernels.config_groups import config_root_of, groups_table
    from tuner.sim.warmup import SHIPPED_GROUPS_FILE

    committed = yaml.safe_load(SHIPPED_GROUPS_FILE.read_text())["0.5.17"]
    assert committed["triton_version"] == "3.6.0"
    fresh = groups_table(config_root_of(_pkg("0.5.17")), sorted({g.torch_name for g in gpus().values()}), "3.6.0")
    assert committed["devices"] == fresh
