"""Key groups of SGLang's shipped fused-MoE config files, found as SGLang finds the files, and the
`tuner calibration moe-groups` command that writes them into the simulator's table."""

import json
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.kernels.config_groups import config_id, config_root_of, device_groups, key_groups, selector_of

A = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
B = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
C = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16}


def _write(root, vdir, name, table):
    d = root / "configs" / vdir
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps({str(k): v for k, v in table.items()}))


def test_a_file_name_splits_into_its_selector_and_device():
    assert selector_of("E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json") == (
        "E=128,N=768,dtype=fp8_w8a8,block_shape=[128, 128]", "NVIDIA_H200", False)
    assert selector_of("E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3_down.json") == (
        "E=128,N=768", "NVIDIA_H100_80GB_HBM3", True)
    assert selector_of("README.md") is None and selector_of("E=1,N=2.json") is None


def test_keys_with_equal_up_and_down_configs_share_a_group():
    assert key_groups({1: A, 2: A, 4: B, 8: A}) == [[1, 2, 8], [4]]
    # a down file splits a group whose up config is shared
    assert key_groups({1: A, 2: A, 4: B}, {1: B, 2: C, 4: B}) == [[1], [2], [4]]
    assert key_groups({}) == []


def test_sglangs_lookup_order_decides_the_file_and_its_groups(tmp_path):
    dev = "NVIDIA H100 80GB HBM3"
    _write(tmp_path, "triton_3_2_0", "E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3.json", {1: A, 2: A, 4: B})
    _write(tmp_path, "triton_3_4_0", "E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3.json", {1: A, 2: B, 4: B})
    _write(tmp_path, "triton_3_6_0", "E=8,N=32,device_name=NVIDIA_H100_80GB_HBM3.json", {1: A, 2: A})
    _write(tmp_path, "triton_3_6_0", "E=8,N=32,device_name=NVIDIA_H100_80GB_HBM3_down.json", {1: A, 2: C})
    _write(tmp_path, "triton_3_6_0", "E=8,N=64,device_name=NVIDIA_H200.json", {1: A})
    got = device_groups(tmp_path, dev, "3.6.0")
    assert set(got) == {"E=8,N=64", "E=8,N=32"}  # the H200's file is not the H100's
    # no 3.6.0 file: the newest other directory, as SGLang falls back
    assert got["E=8,N=64"]["file"] == "triton_3_4_0/E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert got["E=8,N=64"]["groups"] == [[1], [2, 4]] and not got["E=8,N=64"]["exact_triton"]
    assert got["E=8,N=32"]["exact_triton"] and got["E=8,N=32"]["groups"] == [[1], [2]]
    assert got["E=8,N=32"]["down_file"].endswith("_down.json")
    # under Triton 3.2.0 its own directory wins
    assert device_groups(tmp_path, dev, "3.2.0")["E=8,N=64"]["groups"] == [[1, 2], [4]]


def test_the_command_writes_the_table_keeps_other_versions_and_names_a_bad_directory(tmp_path):
    pkg = tmp_path / "sglang"
    root = pkg / "srt/layers/moe/moe_runner/triton_utils"
    _write(root, "triton_3_6_0", "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json", {1: A, 8: A, 64: B})
    assert config_root_of(pkg) == root and config_root_of(tmp_path) == root and config_root_of(root) == root
    linear = pkg / "srt/layers/quantization/configs"
    linear.mkdir(parents=True)
    (linear / "N=7168,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json").write_text(
        json.dumps({"1": A, "8": A, "64": B}))
    (linear / "N=7168,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a8,block_shape=[128, 128].json").write_text(
        json.dumps({"1": A}))  # another dtype: not the fp8 kernel's
    (linear / "N=512,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json").write_text(
        json.dumps({"1": B, "16": A}))  # A and B again, in another weight shape's file
    out = tmp_path / "table.yaml"
    out.write_text(yaml.safe_dump({"0.5.23": {"devices": {}}}))
    res = CliRunner().invoke(cli, ["calibration", "moe-groups", "--sglang-dir", str(pkg), "--sglang-version",
                                   "0.5.17", "--triton-version", "3.6.0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert set(doc) == {"0.5.17", "0.5.23"} and doc["0.5.17"]["triton_version"] == "3.6.0"
    assert doc["0.5.17"]["devices"]["NVIDIA_H100_80GB_HBM3"]["E=128,N=768"]["groups"] == [[1, 8], [64]]
    assert doc["0.5.17"]["devices"]["NVIDIA_H200"] == {}  # every catalog GPU is recorded, with or without files
    # the block-fp8 linear kernel's files, grouped the same way, per device and weight shape
    assert doc["0.5.17"]["block_fp8_linear"]["NVIDIA_H100_80GB_HBM3"] == {"N=7168,K=2048": [[1, 8], [64]],
                                                                          "N=512,K=7168": [[1], [16]]}
    # which config each group runs: equal configs in two files share one id (Triton builds one kernel)
    ids = doc["0.5.17"]["block_fp8_linear_configs"]["NVIDIA_H100_80GB_HBM3"]
    assert ids["N=7168,K=2048"] == [config_id(A), config_id(B)] and ids["N=512,K=7168"] == [config_id(B), config_id(A)]
    assert config_id(A) != config_id(B) and config_id(dict(reversed(list(A.items())))) == config_id(A)
    assert doc["0.5.17"]["block_fp8_linear"]["NVIDIA_H200"] == {}
    bad = subprocess.run([sys.executable, "-m", "tuner", "calibration", "moe-groups", "--sglang-dir",
                          str(tmp_path / "sglang" / "srt"), "--sglang-version", "0.5.17", "--triton-version", "3.6.0",
                          "--out", str(tmp_path / "other.yaml")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--sglang-dir" in bad.stderr and "configs" in bad.stderr
    assert not (tmp_path / "other.yaml").exists()
    with pytest.raises(ConfigError, match="configs"):
        device_groups(tmp_path / "nowhere", "NVIDIA H200", "3.6.0")


def test_a_malformed_shipped_file_is_named(tmp_path):
    _write(tmp_path, "triton_3_6_0", "E=8,N=64,device_name=NVIDIA_H200.json", {1: A})
    (tmp_path / "configs" / "triton_3_6_0" / "E=8,N=64,device_name=NVIDIA_H200.json").write_text('{"one": {}}')
    with pytest.raises(ConfigError, match="E=8,N=64,device_name=NVIDIA_H200.json"):
        device_groups(tmp_path, "NVIDIA H200", "3.6.0")
    (tmp_path / "configs" / "triton_3_6_0" / "E=8,N=64,device_name=NVIDIA_H200.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match="could read"):
        device_groups(tmp_path, "NVIDIA H200", "3.6.0")


def test_a_tune_summarys_files_give_the_tuned_groups_and_a_missing_one_is_named(tmp_path):
    from tuner.kernels.config_groups import tuned_groups

    d = tmp_path / "configs" / "triton_3_6_0"
    d.mkdir(parents=True)
    up = "E=128,N=768,device_name=NVIDIA_H200.json"
    (d / up).write_text(json.dumps({"1": A, "4": A, "16": B}))
    (d / up.replace(".json", "_down.json")).write_text(json.dumps({"1": A, "4": C, "16": B}))
    files = [f"configs/triton_3_6_0/{up}", f"configs/triton_3_6_0/{up.replace('.json', '_down.json')}"]
    summary = {"reports": [{"kind": "moe", "tag": "x", "files": files},
                           {"kind": "gemm", "tag": "y", "files": ["N2048_K4096.json"]}]}
    # the down file splits 1 from 4, whose up configs are equal
    assert tuned_groups(summary, tmp_path) == {"E=128,N=768": [[1], [4], [16]]}
    (d / up).unlink()
    with pytest.raises(ConfigError) as err:
        tuned_groups(summary, tmp_path)
    assert err.value.key == "reports[0].files" and up in str(err.value)
