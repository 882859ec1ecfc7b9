"""The rule that makes moe-tile-configs: tuned worth a trial only where measurements say it matters."""

from __future__ import annotations

import json

from tuner.kernels.configfile import write_configs
from tuner.kernels.shapes import moe_shape
from tuner.kernels.worth import tile_configs_worth_trial

CFG = {1: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}}


def _tuned(tmp_path, gains):
    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    write_configs(tmp_path / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json", CFG)
    (tmp_path / "reports").mkdir()
    rows = [{"batch_size": m, "speedup_vs_baseline": g} for m, g in gains.items()]
    (tmp_path / "reports" / f"{shape.tag}.json").write_text(json.dumps(
        {"kind": "moe", "tag": shape.tag, "device_name": "NVIDIA H200", "rows": rows}))
    return tmp_path


def test_worth_needs_file_and_measured_gain(tmp_path):
    d = _tuned(tmp_path, {1: 1.01, 64: 1.12, 4096: 0.99})
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "bf16", tp_size=1, tuned_dir=d)
    assert v.worth and v.best_gain == 1.12
    assert not tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "bf16", tp_size=1, tuned_dir=d,
                                        batch_range=(1024, 8192)).worth
    assert not tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "bf16", tp_size=1, tuned_dir=d,
                                        serving_speedups={8: 1.0, 64: 1.01}).worth


def test_not_worth_without_gain_file_or_triton_path(tmp_path):
    d = _tuned(tmp_path, {1: 1.01, 64: 1.02})
    assert not tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "bf16", tp_size=1, tuned_dir=d).worth
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d)
    assert not v.worth and "no tuned file" in v.reason
    assert not tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "nvfp4", tp_size=1, tuned_dir=d).worth
    assert not tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_B200", "bf16", tp_size=1, tuned_dir=d).worth
