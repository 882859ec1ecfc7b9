"""CPU tests of the tile tuner's pure parts (no torch, no triton)."""

from __future__ import annotations

import json
import math
import random
import sys

import pytest
from click.testing import CliRunner

from tuner.errors import ConfigError
from tuner.kernels.configfile import (config_relpath, covered_by, key_covers, moe_config_filename, nearest_config,
                                      nearest_key, read_configs, triton_dir_name, write_configs)
from tuner.kernels.shapes import moe_shape, parse_block_shape
from tuner.kernels.space import (TileConfig, default_config, feasible_space, neighbours, search_space_for,
                                 sglang_search_space, smem_bytes)


def test_cpu_modules_do_not_import_torch():
    import subprocess

    code = ("import sys, tuner.cli.kernels, tuner.kernels.search, tuner.kernels.tune, tuner.kernels.configfile, "
            "tuner.kernels.shapes, tuner.kernels.space; print(sorted({'torch', 'triton'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("model,tp,ep,expect,topk", [
    ("glm-5.1", 8, 1, (257, 256, 6144), 9),
    ("glm-5.1", 8, 8, (33, 2048, 6144), 9),
    ("deepseek-v3", 8, 8, (33, 2048, 7168), 9),
    ("deepseek-v3", 8, 1, (257, 256, 7168), 9),
    ("deepseek-v3", 1, 1, (257, 2048, 7168), 9),
    ("deepseek-v3", 8, 4, (65, 1024, 7168), 9),
    ("qwen3-235b-a22b", 8, 1, (128, 192, 4096), 8),
    ("qwen3-235b-a22b", 8, 8, (16, 1536, 4096), 8),
    ("qwen3-30b-a3b", 1, 1, (128, 768, 2048), 8),
])
def test_expert_shapes(model, tp, ep, expect, topk):
    # SGLang's deepseek_v2.py: a fused shared expert adds one expert slot and one top-k column
    s = moe_shape(model, tp, ep)
    assert (s.num_experts, s.intermediate, s.hidden) == expect
    assert s.topk == topk
    assert s.routed_topk == 8
    assert s.ep_size == ep


def test_shared_fusion_can_be_disabled():
    assert moe_shape("glm-5.1", 8, 1, disable_shared_experts_fusion=True).num_experts == 256


def test_bad_parallelism_is_config_error():
    with pytest.raises(ConfigError, match="ep_size"):
        moe_shape("glm-5.1", 8, 3)
    with pytest.raises(ConfigError, match="unknown model"):
        moe_shape("glm-9", 8, 1)
    with pytest.raises(ConfigError, match="block_shape"):
        moe_shape("glm-5.1", 8, 1, "bf16", (128, 128))
    with pytest.raises(ConfigError):
        parse_block_shape("128")


def test_sglang_space_size_and_block_rule():
    space = sglang_search_space()
    assert len(space) == 1920 == len(set(space))
    assert len(search_space_for("bf16", None)) == 1920
    fp8 = search_space_for("fp8_w8a8", (128, 128))
    assert len(fp8) == 1280 and {c.BLOCK_SIZE_K for c in fp8} == {64, 128}


def test_shared_memory_estimate_and_filter():
    c = TileConfig(256, 256, 128, 1, 8, 4)
    assert smem_bytes(c, "bf16") == (256 * 128 * 2 + 128 * 256 * 2) * 4
    assert smem_bytes(c, "fp8_w8a8") == smem_bytes(c, "bf16") // 2
    feas = feasible_space("bf16", None, 232_448)
    assert c not in feas and TileConfig(64, 64, 64, 1, 4, 3) in feas
    assert all(smem_bytes(x, "bf16") <= 232_448 for x in feas)
    assert len(feas) < 1920


def test_default_config_rules():
    assert default_config(1, 257, 256, 6144, 8, "fp8_w8a8", (128, 128)) == TileConfig(64, 128, 128, 32, 4, 3)
    assert default_config(300, 257, 256, 6144, 8, "fp8_w8a8", None) == TileConfig(128, 256, 128, 32, 8, 4)
    assert default_config(100, 257, 256, 6144, 8, "fp8_w8a8", None) == TileConfig(64, 128, 128, 1, 4, 4)
    assert default_config(128, 128, 192, 4096, 8, None) == TileConfig(16, 32, 64, 1, 4, 3)
    assert default_config(129, 128, 192, 4096, 8, None) == TileConfig(64, 64, 32, 8, 4, 3)


def test_file_naming():
    assert triton_dir_name("3.6.0") == "triton_3_6_0"
    assert moe_config_filename(257, 256, "NVIDIA H200", "fp8_w8a8", [128, 128]) == \
        "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert moe_config_filename(128, 192, "NVIDIA H100 80GB HBM3", None) == \
        "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert str(config_relpath(128, 192, "NVIDIA H200", "3.6.0")) == \
        "configs/triton_3_6_0/E=128,N=192,device_name=NVIDIA_H200.json"


def test_write_read_roundtrip(tmp_path):
    cfgs = {64: TileConfig(16, 64, 128, 1, 4, 3).as_dict(), 1: TileConfig(16, 32, 64, 16, 4, 5).as_dict()}
    p = write_configs(tmp_path / "configs" / "triton_3_6_0" / "f.json", cfgs)
    raw = json.loads(p.read_text())
    assert list(raw) == ["1", "64"]
    assert list(raw["1"]) == ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"]
    assert read_configs(p) == {1: cfgs[1], 64: cfgs[64]}
    assert nearest_config(read_configs(p), 30) == cfgs[1] and nearest_config(read_configs(p), 40) == cfgs[64]


def test_what_a_key_covers():
    # SGLang reads the nearest key, the first on ties
    assert nearest_key([512, 2048], 1280) == 512 and nearest_key([512, 2048], 1281) == 2048
    # up to 1.5x above a key, 2.5x below it (measured: 2x above the M=512 key ran 1.13x SGLang's default)
    assert key_covers(512, 768) and not key_covers(512, 769) and not key_covers(512, 1024)
    assert key_covers(10, 4) and not key_covers(10, 3) and not key_covers(0, 4)
    assert covered_by([512, 2048], 768) and not covered_by([512, 2048], 1024)  # 1024 reads the M=512 key
    assert covered_by([512, 2048], 1600)  # 2048's, 1.28x below
    assert not covered_by([512, 2048], 2049) and not covered_by([], 1)  # above the largest key, or no key
    assert covered_by([4, 8], 2) and not covered_by([4, 8], 1)


def test_read_rejects_bad_files(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"x": {}}))
    with pytest.raises(ConfigError, match="bad.json"):
        read_configs(p)
    p.write_text(json.dumps({"4": {"BLOCK_SIZE_M": 16}}))
    with pytest.raises(ConfigError, match="missing"):
        read_configs(p)


def test_neighbours_change_one_parameter():
    space = set(search_space_for("fp8_w8a8", (128, 128)))
    c = TileConfig(64, 128, 128, 16, 4, 3)
    ns = neighbours(c, space)
    assert len(ns) == 4 + 3 + 1 + 3 + 1 + 3
    assert all(sum(a != b for a, b in zip(c.as_dict().values(), n.as_dict().values())) == 1 for n in ns)


def test_search_finds_near_optimum_of_synthetic_landscape():
    from tuner.kernels.search import search_batch_size

    space = feasible_space("fp8_w8a8", (128, 128), 232_448)
    rng = random.Random(3)
    noise = {c: rng.uniform(0.95, 1.05) for c in space}

    def cost(c):
        return ((1 + abs(math.log2(c.BLOCK_SIZE_M / 32)) * 0.3) * (1 + abs(math.log2(c.BLOCK_SIZE_N / 128)) * 0.2)
                * (1 + abs(c.num_stages - 4) * 0.1) * (1.1 if c.num_warps == 8 else 1.0) * noise[c])

    calls = []

    def evaluate(cfgs):
        calls.extend(cfgs)
        return [cost(c) for c in cfgs]

    res = search_batch_size(evaluate, space, 128, seed=1)
    assert res.evaluations == len(set(calls)) == len(calls) <= 128
    assert min(cost(c) for c in space) / res.best_us >= 0.97


def test_search_stops_at_its_deadline_after_the_warm_start(monkeypatch):
    from tuner.kernels import search as search_mod

    space = feasible_space("fp8_w8a8", (128, 128), 232_448)
    clock = {"t": 1000.0}
    monkeypatch.setattr(search_mod.time, "monotonic", lambda: clock["t"])

    def evaluate(cfgs):  # one simulated second per timed config
        clock["t"] += len(cfgs)
        return [1.0 + (c.BLOCK_SIZE_M != 32) + 0.1 * c.num_stages for c in cfgs]

    warm = sorted(space, key=str)[:3]
    res = search_mod.search_batch_size(evaluate, space, 128, seed=1, batch=8, warm_start=warm,
                                       deadline=clock["t"] + 20)
    assert res.stopped_by_deadline and 16 <= res.evaluations <= 28  # rounds of 8 until 20 s are spent
    assert set(warm) <= {c for c, _ in res.history}  # the warm start ran first
    # a deadline already past still times the first round, and nothing more
    past = search_mod.search_batch_size(evaluate, space, 128, seed=1, batch=8, warm_start=warm,
                                        deadline=clock["t"] - 1)
    assert past.evaluations == 8 and past.stopped_by_deadline
    # without a deadline the evaluation budget alone decides
    full = search_mod.search_batch_size(evaluate, space, 40, seed=1, batch=8)
    assert full.evaluations == 40 and not full.stopped_by_deadline


def test_cli_shape_json():
    from tuner.cli.kernels import kernels

    r = CliRunner().invoke(kernels, ["shape", "--model", "glm-5.1", "--tp-size", "8", "--dtype", "fp8_w8a8",
                                     "--block-shape", "128,128", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["num_experts"], doc["intermediate"], doc["hidden"], doc["grid_size"]) == (257, 256, 6144, 1280)
    assert doc["default_budget"] == 128


def test_timing_rotations_shrink_only_where_one_call_outgrows_the_l2():
    from tuner.kernels.shapes import moe_shape

    l2 = 50 * 2**20  # the H200's
    qwen = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    dsv3 = moe_shape("deepseek-v3", 1, 1, "fp8_w8a8", (128, 128))
    # one Qwen3 fp8 expert is 4.7 MB: at M=1 its 8 experts (38 MB) would stay in L2 between calls
    assert qwen.expert_weight_bytes == 3 * 768 * 2048
    assert qwen.touched_weight_bytes(1) == 8 * qwen.expert_weight_bytes
    assert [qwen.timing_rotations(M, l2) for M in (1, 2, 4, 4096)] == [8, 8, 2, 2]
    # every expert touched at large M, never more than all of them
    assert qwen.touched_weight_bytes(4096) <= 128 * qwen.expert_weight_bytes
    # DeepSeek-V3's 42 MB experts: even one token's 9 outgrow the L2
    assert dsv3.timing_rotations(1, l2) == 2 and dsv3.touched_weight_bytes(1) == 9 * dsv3.expert_weight_bytes
    assert qwen.timing_rotations(4096, 1 << 50) == 8  # an L2 that holds everything keeps every draw
