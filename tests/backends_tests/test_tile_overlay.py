"""Per-trial tile files: SGLANG_MOE_CONFIG_DIR and the GEMM config overlay of the sglang package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.backends import moe_configs
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.kernels.configfile import write_configs

REF = Path(os.environ.get("TUNER_SGLANG_REF", "/work/ref"))
CFG = {1: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}}
GEMM = "N=5120,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
UP = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


def _pkg(version):
    p = REF / f"sglang-{version}" / "sglang"
    if not p.is_dir():
        pytest.skip(f"SGLang {version} source not unpacked")
    return p


def _tuned(tmp_path) -> Path:
    src = tmp_path / "tuned"
    write_configs(src / "configs/triton_3_6_0" / UP, CFG)
    write_configs(src / "configs/triton_3_6_0" / UP.replace(".json", "_down.json"), CFG)
    write_configs(src / "gemm_configs" / GEMM, CFG)
    return src


def _resolve(site: Path, dotted: str) -> Path:
    """Where Python's path finder loads ``dotted`` from with ``site`` first: each package is the first
    ``<name>/`` directory on its parent's path (regular or namespace), a module ``<name>.py``."""
    here = site
    parts = dotted.split(".")
    for part in parts[:-1]:
        here = here / part
        assert here.is_dir(), here
    module = here / f"{parts[-1]}.py"
    assert module.is_file(), module
    return module


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_overlay_puts_our_gemm_file_where_sglang_looks(tmp_path, version):
    from tuner.kernels.sglang_layout import LAYOUTS

    pkg = _pkg(version)
    src = _tuned(tmp_path)
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "trial", src, triton_version="3.6.0",
                                                   include_shipped=False, sglang_package=pkg)
    site = tiles.gemm_site
    module = _resolve(site, LAYOUTS[version].gemm_kernel_import)
    # the module Python loads is the overlay's copy, so realpath(__file__) stays in the overlay ...
    assert module == site / "sglang" / LAYOUTS[version].gemm_kernel_module and not module.is_symlink()
    assert os.path.realpath(module).startswith(str(site.resolve()))
    assert module.read_bytes() == (pkg / LAYOUTS[version].gemm_kernel_module).read_bytes()
    configs = Path(os.path.dirname(os.path.realpath(module))) / "configs"
    # ... and its configs/ holds our file (a copy) beside links to every shipped file
    assert (configs / GEMM).is_file() and not (configs / GEMM).is_symlink()
    shipped = sorted(p.name for p in (pkg / LAYOUTS[version].gemm_config_subdir).iterdir())
    assert set(shipped) <= {p.name for p in configs.iterdir()}
    # the rest of the package resolves to the installed files
    other = _resolve(site, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config")
    assert os.path.realpath(other) == str((pkg / "srt/layers/moe/moe_runner/triton_utils/"
                                           "fused_moe_triton_config.py").resolve())
    # nothing was written into the installed package
    assert not (pkg / LAYOUTS[version].gemm_config_subdir / GEMM).exists()
    env = tiles.env(inherited_pythonpath="/tmp/site")
    assert env["PYTHONPATH"] == f"{site.resolve()}{os.pathsep}/tmp/site"
    assert env["SGLANG_MOE_CONFIG_DIR"] == str(tiles.moe_dir.resolve())
    assert set(tiles.expected) == {UP, UP.replace(".json", "_down.json"), GEMM}


def test_expected_files_follow_the_trials_model(tmp_path):
    pkg = _pkg("0.5.17")
    src = _tuned(tmp_path)
    write_configs(src / "configs/triton_3_6_0/E=257,N=256,device_name=NVIDIA_H200.json", CFG)
    model, gpu = get_model("qwen3-30b-a3b"), get_gpu("h200")
    keys = moe_configs.trial_config_keys(model, gpu, "fp8_block", tp_size=1, ep_size=1)
    gemm = moe_configs.trial_gemm_file_names(model, gpu, "fp8_block", tp_size=1)
    assert gemm[0] == GEMM
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0", include_shipped=False,
                                                   required=keys, required_gemm=gemm, sglang_package=pkg)
    assert sorted(tiles.expected) == sorted([UP, UP.replace(".json", "_down.json"), GEMM])
    assert moe_configs.trial_gemm_file_names(model, gpu, "bf16", tp_size=1) == []


def test_no_gemm_files_no_overlay(tmp_path):
    src = tmp_path / "tuned"
    write_configs(src / "configs/triton_3_6_0" / UP, CFG)
    site, written = moe_configs.prepare_trial_gemm_overlay(tmp_path / "t", src)
    assert site is None and written == []
    assert "PYTHONPATH" not in moe_configs.env_for(moe_configs.prepare_trial_moe_dir(
        tmp_path / "t", src, triton_version="3.6.0", include_shipped=False)[0])


def test_corrupt_gemm_file_is_refused_before_building(tmp_path):
    pkg = _pkg("0.5.17")
    src = tmp_path / "tuned"
    (src / "gemm_configs").mkdir(parents=True)
    (src / "gemm_configs" / GEMM).write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        moe_configs.prepare_trial_gemm_overlay(tmp_path / "t", src, sglang_package=pkg)
    assert not (tmp_path / "t" / "sglang-site").exists()


def test_tuned_files_come_from_the_documented_places_only(tmp_path):
    src = _tuned(tmp_path)
    # a tuned directory nested inside another (results/kernels/h200/sglang in results/kernels/h200)
    write_configs(src / "sglang/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json", CFG)
    write_configs(src / "sglang/gemm_configs" / GEMM.replace("N=5120", "N=2048"), CFG)
    write_configs(src / "triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200.json", CFG)
    write_configs(src / "E=4,N=16,device_name=NVIDIA_H200.json", CFG)  # flat
    files = [(v, p.relative_to(src).as_posix()) for v, p in moe_configs._tuned_files(src, "triton_3_6_0")]
    assert files == [("triton_3_5_1", "triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200.json"),
                     ("triton_3_6_0", f"configs/triton_3_6_0/{UP}"),
                     ("triton_3_6_0", f"configs/triton_3_6_0/{UP.replace('.json', '_down.json')}"),
                     ("triton_3_6_0", "E=4,N=16,device_name=NVIDIA_H200.json")]
    assert [p.relative_to(src).as_posix() for p in moe_configs.tuned_gemm_files(src)] == [f"gemm_configs/{GEMM}"]


def test_the_same_tuned_file_in_two_places_is_refused(tmp_path):
    src = _tuned(tmp_path)
    write_configs(src / "triton_3_6_0" / UP, CFG)
    with pytest.raises(ConfigError, match="in both"):
        moe_configs.prepare_trial_moe_dir(tmp_path / "t", src, triton_version="3.6.0", include_shipped=False)
    write_configs(src / GEMM, CFG)
    with pytest.raises(ConfigError, match="in both"):
        moe_configs.tuned_gemm_files(src)


@pytest.mark.parametrize("weights", ["bf16", "fp8_block"])
def test_qwen3_study_uses_the_committed_h200_directory(tmp_path, monkeypatch, weights):
    from tests.conftest import REPO
    from tuner.config.load import load_study

    pkg = _pkg("0.5.17")
    monkeypatch.chdir(REPO)
    spec = load_study(str(REPO / "studies/h200-sglang-qwen3.yaml"))
    source = moe_configs.tuned_source_dir(spec.backend_options, spec.hardware.gpu)
    assert source == Path("results/kernels/h200/sglang")
    model, gpu = get_model(spec.model), get_gpu(spec.hardware.gpu)
    keys = moe_configs.trial_config_keys(model, gpu, weights, tp_size=1, ep_size=1)
    gemm = moe_configs.trial_gemm_file_names(model, gpu, weights, tp_size=1)
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", source, triton_version="3.6.0",
                                                   include_shipped=False, required=keys, required_gemm=gemm,
                                                   sglang_package=pkg)
    up = "E=128,N=768,device_name=NVIDIA_H200" + (",dtype=fp8_w8a8,block_shape=[128, 128]" if weights != "bf16" else "")
    # the committed directory holds both of Qwen3's fp8 linear shapes: qkv (N=5120, K=2048) and o_proj
    o_proj = GEMM.replace("N=5120,K=2048", "N=2048,K=4096")
    want = [f"{up}.json", f"{up}_down.json"] + ([GEMM, o_proj] if weights != "bf16" else [])
    assert sorted(tiles.expected) == sorted(want)
    assert (tiles.gemm_site is None) == (weights == "bf16")  # a bf16 model reads no fp8 GEMM file
    assert (tiles.moe_dir / "configs/triton_3_6_0" / f"{up}.json").is_file()
