"""`tuner study export` of a trial with tuned tiles ships the files beside the YAML: the MoE files
for SGLANG_MOE_CONFIG_DIR, the fp8 block GEMM files with where the target SGLang version reads them."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tuner.kernels.configfile import read_configs, write_configs

CFG = {1: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}}
GEMM = "N=5120,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
UP = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


def _tuned_study(tmp_path):
    src = tmp_path / "tuned"
    write_configs(src / "configs/triton_3_6_0" / UP, CFG)
    write_configs(src / "gemm_configs" / GEMM, CFG)
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "engine": "sglang",
        "params": {"quantization": {"values": ["fp8"]}, "moe-tile-configs": {"values": ["tuned"]}}}))
    study = tmp_path / "tiles.yaml"
    study.write_text(yaml.safe_dump({
        "name": "tiles", "model": "qwen3-30b-a3b",
        "hardware": {"gpu": "h200", "gpus_per_node": 1, "nodes": 1, "host_memory_gb": 128},
        "workload": "coding-agent-40k", "search_space": "t",
        "slo": {"p90_ttft_s": 1.5, "p90_tpot_s": 0.025}, "target_users": 8,
        "capacity": {"start_users": 4, "max_users": 16, "resolution_users": 4},
        "measurement": {"warmup_s": 5, "duration_s": 20},
        "baseline": {"quantization": "fp8", "moe-tile-configs": "tuned"},
        "trials": 1, "backend": "simulator", "backend_options": {"moe_config_dir": str(src)}}))
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--no-ray", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return storage


@pytest.fixture(scope="module")
def tuned_study(tmp_path_factory):
    """One finished study with tuned tiles, for the tests that only export it (each into its own
    directory); a test that damages the tuned files runs a study of its own."""
    return _tuned_study(tmp_path_factory.mktemp("tiles"))


def test_export_ships_moe_and_gemm_tiles_and_names_where_each_version_reads_gemm_files(tmp_path, tuned_study):
    storage = tuned_study
    for version, subdir in (("0.5.17", "sglang/kernels/ops/quantization/configs/"),
                            ("0.5.23", "sglang/kernels/ops/gemm/configs/")):
        out = tmp_path / version / "best.yaml"
        out.parent.mkdir()
        r = run_cli(["study", "export", "tiles", "--storage", storage, "-o", str(out), "--sglang-version", version],
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        header = [line for line in out.read_text().splitlines() if line.startswith("#")]
        (moe_line,) = [h for h in header if h.startswith("# MoE tile configs: tuned")]
        moe_dir = moe_line.split("SGLANG_MOE_CONFIG_DIR=")[1].split()[0]
        assert moe_dir.startswith(str((out.parent / "best-moe").resolve()))
        assert read_configs(f"{moe_dir}/configs/triton_3_6_0/{UP}") == CFG  # where SGLang looks under it
        assert read_configs(out.parent / "best-gemm" / GEMM) == CFG
        (gemm_line,) = [h for h in header if "fp8 block GEMM tiles" in h]
        assert "best-gemm/*.json" in gemm_line and f"<site-packages>/{subdir}" in gemm_line


def test_a_corrupt_tuned_gemm_file_is_refused_not_shipped(tmp_path):
    storage = _tuned_study(tmp_path)
    (tmp_path / "tuned" / "gemm_configs" / GEMM).write_text("{not json")
    out = tmp_path / "best.yaml"
    r = run_cli(["study", "export", "tiles", "--storage", storage, "-o", str(out), "--sglang-version", "0.5.17"],
                cwd=tmp_path)
    assert r.returncode == 2 and GEMM in r.stderr
    assert not (tmp_path / "best-gemm").exists() and not (tmp_path / "best-moe").exists() and not out.exists()


def _fake_sglang(tmp_path, shipped: dict[int, dict]):
    """An importable (never imported) sglang package that ships ``UP`` with ``shipped`` entries."""
    site = tmp_path / "site"
    pkg = site / "sglang"
    (pkg / "_version.py").parent.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text('__version__ = "0.5.17"\n')
    write_configs(pkg / "srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0" / UP, shipped)
    return site


def test_export_merges_the_tuned_file_over_sglangs_shipped_one_where_sglang_is_installed(tmp_path, tuned_study):
    storage = tuned_study
    big = {**CFG[1], "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}
    site = _fake_sglang(tmp_path, {1: big, 2048: big})
    out = tmp_path / "best.yaml"
    r = run_cli(["study", "export", "tiles", "--storage", storage, "-o", str(out), "--sglang-version", "0.5.17"],
                cwd=tmp_path, env={"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])})
    assert r.returncode == 0, r.stderr[-2000:]
    merged = read_configs(tmp_path / "best-moe/moe/configs/triton_3_6_0" / UP)
    assert merged == {1: CFG[1], 2048: big}  # tuned at 1, SGLang's own at the batch size not tuned
    assert "2048 (not tuned)" in r.stdout + r.stderr
    # no other file of SGLang's is copied beside the export
    assert sorted(p.name for p in (tmp_path / "best-moe/moe/configs/triton_3_6_0").iterdir()) == [UP]
