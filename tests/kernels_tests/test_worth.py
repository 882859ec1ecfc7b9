"""The rule that makes moe-tile-configs: tuned worth a trial only where measurements say it matters."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_cli
from tuner.errors import ConfigError
from tuner.kernels.configfile import read_configs, write_configs
from tuner.kernels.shapes import moe_shape
from tuner.kernels.targets import SGLANG_BATCH_SIZES
from tuner.kernels.worth import (find_tuned_file, tile_configs_worth_trial, trial_batch_range,
                                 uncovered_batch_sizes)

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


FP8 = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


def _fp8_tuned(tmp_path, keys, complete=True, requested=None):
    shape = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    write_configs(tmp_path / "configs/triton_3_6_0" / FP8, {m: CFG[1] for m in keys})
    (tmp_path / "reports").mkdir()
    rows = [{"batch_size": m, "speedup_vs_baseline": 1.08} for m in keys]
    (tmp_path / "reports" / f"{shape.tag}.json").write_text(json.dumps(
        {"kind": "moe", "tag": shape.tag, "device_name": "NVIDIA H200", "rows": rows, "complete": complete,
         "batch_sizes_requested": requested or list(keys)}))
    return tmp_path


def test_fp8_block_file_is_found_despite_its_brackets(tmp_path):
    # "[128, 128]" in a glob pattern is a character class: the file was never found
    d = _fp8_tuned(tmp_path, [1, 4, 16])
    assert find_tuned_file(d / "configs", FP8) == d / "configs/triton_3_6_0" / FP8
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d)
    assert v.worth and v.best_gain == 1.08, v.reason


def test_newest_triton_directory_wins(tmp_path):
    for vdir in ("triton_3_2_0", "triton_3_10_0", "triton_3_6_0"):
        write_configs(tmp_path / vdir / FP8, CFG)
    (tmp_path / "triton_3_11_0").mkdir()  # a newer directory without the file
    assert find_tuned_file(tmp_path, FP8) == tmp_path / "triton_3_10_0" / FP8
    assert find_tuned_file(tmp_path / "absent", FP8) is None


def test_file_tuned_at_small_batches_only_is_refused_for_a_trial_running_large_ones(tmp_path):
    d = _fp8_tuned(tmp_path, [1, 2, 4, 8, 16], complete=False, requested=[1, 2, 4, 8, 16, 32, 64, 4096])
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=trial_batch_range(8192, cuda_graph_max_bs=256))
    assert not v.worth
    assert "M=4096 would use the M=16 tiles (M is 256x above them)" in v.reason
    assert "incomplete" in v.reason and "[32, 64, 4096]" in v.reason
    # the same file is fine for a trial that never runs more than 24 tokens at once (1.5x above 16)
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=trial_batch_range(24, max_running_requests=16))
    assert v.worth, v.reason
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=trial_batch_range(32, max_running_requests=16))
    assert not v.worth and "M=32 would use the M=16 tiles (M is 2x above them)" in v.reason


def test_a_partial_file_over_sglangs_own_file_or_default_is_judged_by_its_gain_alone(tmp_path):
    # the trial's file is merged over the shipped one: untuned batch sizes keep SGLang's entries
    d = _fp8_tuned(tmp_path, [1, 4, 16], complete=False, requested=[1, 4, 16, 4096])
    rep_path = next((d / "reports").glob("*.json"))
    rep = json.loads(rep_path.read_text())
    rng = trial_batch_range(8192, cuda_graph_max_bs=256)
    # another Triton's file (a fallback) or none shipped: the trial's file is filled from the fallback,
    # or with SGLang's default config, there instead
    for found in ("exact", "fallback", "none"):
        rep_path.write_text(json.dumps({**rep, "shipped_up": {"found": found, "path": None}}))
        v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                     batch_range=rng)
        assert v.worth, (found, v.reason)
    # a report that does not say what SGLang ships: the file itself must cover the range
    rep_path.write_text(json.dumps({k: v for k, v in rep.items() if k != "shipped_up"}))
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=rng)
    assert not v.worth and "M=4096 would use the M=16 tiles" in v.reason
    rep_path.write_text(json.dumps({**rep, "shipped_up": {"found": "exact"},
                                    "rows": [{**r, "speedup_vs_baseline": 1.01} for r in rep["rows"]]}))
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=rng)
    assert not v.worth and "at most 1.010x" in v.reason


def test_file_covering_the_range_is_accepted(tmp_path):
    d = _fp8_tuned(tmp_path, list(SGLANG_BATCH_SIZES))
    v = tile_configs_worth_trial("qwen3-30b-a3b", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 batch_range=trial_batch_range(8192, max_running_requests=128))
    assert v.worth, v.reason


def test_coverage_follows_sglangs_nearest_key_rule():
    # above 4096 every file, SGLang's own too, serves with its M=4096 entry: checked up to there
    assert uncovered_batch_sizes([1, 4, 16], (1, 8192)) == (4096, 16)
    assert uncovered_batch_sizes([64, 4096], (1, 100)) == (1, 64)  # decode M=1 served by M=64 tiles
    assert uncovered_batch_sizes([1, 2, 4], (1, 6)) is None  # 6 = 1.5 x 4
    assert uncovered_batch_sizes([1, 2, 4], (1, 7)) == (7, 4)
    assert uncovered_batch_sizes([1, 2, 4], (1, 16), above=4) is None
    assert uncovered_batch_sizes([4, 8], (2, 8)) is None  # 2 is 2x below 4 (up to 2.5x)
    assert uncovered_batch_sizes([4, 8], (1, 8)) == (1, 4)
    # measured (H200): tiles tuned up to M=512 served M=2048 (4x) 1.33x slower than SGLang's default,
    # and M=1024 and 1280 (2x and 2.5x above the M=512 key, below 2048's) 1.13x and 1.31x
    assert uncovered_batch_sizes([1, 4, 16, 32, 64, 128, 512], (1, 2048)) == (2048, 512)
    assert uncovered_batch_sizes([512, 2048], (512, 2048)) == (1280, 512)
    assert uncovered_batch_sizes([512, 768, 1024, 1536, 2048], (512, 2048)) is None
    # between keys: 16 serves M up to 72, the midpoint of 16 and 128, and 72 / 16 = 4.5
    assert uncovered_batch_sizes([16, 128], (16, 128)) == (72, 16)
    # SGLang's own list of tuning batch sizes covers every M a trial runs
    assert uncovered_batch_sizes(list(SGLANG_BATCH_SIZES), (1, 8192)) is None
    assert uncovered_batch_sizes([], (1, 8)) == (1, 0)


def test_trial_batch_range():
    assert trial_batch_range(8192, None, 256) == (1, 8192)
    assert trial_batch_range(2048, 4096) == (1, 4096)
    with pytest.raises(ConfigError):
        trial_batch_range(0)


def test_cli_on_the_committed_h200_directory():
    d = REPO / "results/kernels/h200/sglang"
    r = run_cli(["kernels", "worth", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--quantization", "fp8",
                 "--tp-size", "1", "--tuned-dir", str(d), "--json"])
    doc = json.loads(r.stdout)
    assert doc["batch_range"] == [1, 8192]  # SGLang's H200 default chunked-prefill size
    has_large = max(read_configs(find_tuned_file(d / "configs", FP8))) >= 2048
    assert r.returncode == (0 if doc["worth"] else 1)
    if not has_large:
        assert not doc["worth"] and "tuned at M=" in doc["reason"], doc
    # a trial running one token at a time is served by the file's M=1 key
    assert 1 in read_configs(find_tuned_file(d / "configs", FP8))
    r = run_cli(["kernels", "worth", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--quantization", "fp8",
                 "--tp-size", "1", "--tuned-dir", str(d), "--chunked-prefill-size", "1",
                 "--max-running-requests", "1"])
    assert r.returncode == 0 and "worth a trial: tuned tiles gain up to" in r.stdout, r.stdout + r.stderr


def _tuned_dsv3(tmp_path, routing):
    shape = moe_shape("deepseek-v3", 1, 1, "fp8_w8a8", (128, 128))
    name = "E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    write_configs(tmp_path / "configs/triton_3_6_0" / name, CFG)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / f"{shape.tag}.json").write_text(json.dumps(
        {"kind": "moe", "tag": shape.tag, "device_name": "NVIDIA H200", "routing": routing,
         "rows": [{"batch_size": 1, "speedup_vs_baseline": 1.2}]}))
    return tmp_path


@pytest.mark.parametrize("routing", ["sglang-tuner", "serving"])
def test_a_collapsed_router_only_takes_tiles_tuned_under_that_routing(tmp_path, routing):
    d = _tuned_dsv3(tmp_path, routing)
    assert tile_configs_worth_trial("deepseek-v3", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d).worth
    v = tile_configs_worth_trial("deepseek-v3", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 collapsed_routing=True)
    assert not v.worth and "routed apart" in v.reason and routing in v.reason and "--routing collapsed" in v.reason


def test_tiles_tuned_under_a_collapsed_routing_are_judged_on_their_gain(tmp_path):
    d = _tuned_dsv3(tmp_path, "collapsed")
    v = tile_configs_worth_trial("deepseek-v3", "NVIDIA_H200", "fp8_block", tp_size=1, tuned_dir=d,
                                 collapsed_routing=True)
    assert v.worth and v.best_gain == 1.2


def test_the_worth_command_reads_random_weights_as_a_collapsed_router_for_a_biased_gate(tmp_path):
    d = _tuned_dsv3(tmp_path, "sglang-tuner")
    base = ["kernels", "worth", "--model", "deepseek-v3", "--gpu", "h200", "--quantization", "fp8", "--tp-size", "1",
            "--tuned-dir", str(d), "--chunked-prefill-size", "1", "--max-running-requests", "1"]
    assert run_cli(base).returncode == 0
    r = run_cli(base + ["--load-format", "dummy"])
    assert r.returncode == 1 and "routed apart" in r.stdout
