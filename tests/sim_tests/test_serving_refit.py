"""Refit of the simulator's MoE tile speedups from two measured load-point sets."""

from __future__ import annotations

import json

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.sim import serving_refit as sr


def _point(users, tpot, tput, valid=True):
    return {"users": users, "p50_tpot_s": tpot, "throughput_tokens_per_s": tput, "valid": valid}


def test_pairs_invert_the_moe_share():
    default = [_point(8, 0.020, 400.0), _point(32, 0.040, 800.0)]
    tuned = [_point(8, 0.016, 500.0), _point(32, 0.040, 800.0)]
    # decode batch 0.020 * 400 = 8 tokens; MoE is 48 layers x 200 us = 9.6 ms of the 20 ms step
    pairs = sr.serving_pairs(default, tuned, moe_layers=48, moe_us={1: 200.0, 64: 200.0})
    p8 = pairs[0]
    assert p8.decode_tokens == pytest.approx(8.0)
    assert p8.step_ratio == pytest.approx(1.25)
    assert p8.moe_share == pytest.approx(0.48)
    # 1/1.25 = 0.52 + 0.48 / s  ->  s = 0.48 / 0.28
    assert p8.moe_speedup == pytest.approx(0.48 / 0.28)
    assert pairs[1].moe_speedup == pytest.approx(1.0)
    # without kernel times the whole step change is put on the MoE (the smallest speedup that fits)
    assert sr.serving_pairs(default, tuned)[0].moe_speedup == pytest.approx(1.25)


def test_refit_replaces_nearby_kernel_points_only():
    pairs = sr.serving_pairs([_point(8, 0.02, 400.0)], [_point(8, 0.016, 500.0)])
    cal = sr.refit_from_serving(pairs, {"moe_tuned_speedup": {1: 1.6, 8: 1.4, 9: 1.39, 1024: 1.0}, "x": 1})
    assert cal["moe_tuned_speedup"] == {1: 1.6, 8: 1.25, 1024: 1.0}
    assert cal["x"] == 1


def test_write_keeps_the_files_comments(tmp_path):
    path = tmp_path / "h200.yaml"
    path.write_text("# NVIDIA H200 notes\nmemory_efficiency: 0.8\nmoe_tuned_speedup:\n  1: 1.6\n")
    pairs = sr.serving_pairs([_point(64, 0.03, 2133.4)], [_point(64, 0.025, 2560.0)])
    sr.write_gpu_calibration("h200", pairs, "a.json vs b.json", calibration_dir=tmp_path)
    text = path.read_text()
    assert text.startswith("# NVIDIA H200 notes\n# MoE entries refit from serving a.json vs b.json\n")
    doc = yaml.safe_load(text)
    assert doc["memory_efficiency"] == 0.8
    assert doc["moe_tuned_speedup"] == {1: 1.6, 64: 1.2}


def test_bad_load_points(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"users": 4}]))
    with pytest.raises(ConfigError, match="lacks p50_tpot_s"):
        sr.load_points(f)
    with pytest.raises(ConfigError, match="no user count"):
        sr.serving_pairs([_point(4, 0.02, 10.0)], [_point(8, 0.02, 10.0)])
    (tmp_path / "l.jsonl").write_text(json.dumps(_point(4, 0.02, 10.0)) + "\n")
    assert sr.load_points(tmp_path / "l.jsonl")[0]["users"] == 4


def test_kernel_report_with_one_moe_shape_only():
    one = {"kind": "moe", "tag": "E128_N768_K2048_bf16", "rows": [{"batch_size": 4, "shipped_us": 78.8,
                                                                    "default_us": 83.7}]}
    gemm = {"kind": "gemm", "tag": "N5120_K2048_fp8_b128x128", "rows": [{"batch_size": 1, "default_us": 17.4}]}
    assert sr.default_moe_us_from_report({"reports": [gemm, one]}) == {4: 78.8}
    two = {**one, "tag": "E128_N768_K2048_fp8_w8a8_b128x128"}
    with pytest.raises(ConfigError, match="2 fused-MoE shapes.*reports/<shape>.json"):
        sr.default_moe_us_from_report({"reports": [one, two]})
