"""The benchmark's grid-only pass and the summary update, with the GPU parts replaced by fakes."""

from __future__ import annotations

import json
import math
import sys
import time
import types

import pytest

from tuner.kernels import benchmark, summarize
from tuner.kernels.shapes import moe_shape
from tuner.kernels.space import TileConfig, default_config, search_space_for

SHAPE = moe_shape("glm-5.1", 8, 1, "fp8_w8a8", (128, 128))


def _fake_us(M, cfg):
    # deterministic "time": smaller tiles are slower, one config is the clear best
    if cfg == TileConfig(32, 64, 128, 16, 4, 3):
        return 100.0
    return 200.0 + cfg.BLOCK_SIZE_M + cfg.BLOCK_SIZE_N / 2 + cfg.num_stages + cfg.GROUP_SIZE_M / 100


class _Timer:
    calls: list = []

    def __init__(self, problem, target_ms=25.0, max_replays=12):
        pass

    def measure(self, M, cfg, cutoff_us=None, replays=None):
        _Timer.calls.append((M, cfg, cutoff_us))
        return _fake_us(M, cfg)


class _Pool:
    def __init__(self, shape):
        pass

    def ensure(self, configs):
        return {}

    def failed(self, cfg):
        return "out of shared memory" if cfg.BLOCK_SIZE_M == 256 and cfg.num_stages == 5 else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Problem:
    def __init__(self, shape, seed=0):
        pass

    def drop_batch(self, M):
        pass


@pytest.fixture
def fakes(monkeypatch):
    own = types.ModuleType("tuner.kernels.own_kernel")
    own.MoEProblem = _Problem
    timing = types.ModuleType("tuner.kernels.timing")
    timing.GraphTimer = _Timer
    timing.ConfigFailed = type("ConfigFailed", (Exception,), {})
    compile_mod = types.ModuleType("tuner.kernels.compile")
    compile_mod.CompilePool = _Pool
    worker = types.ModuleType("tuner.kernels.worker")
    worker.device_facts = lambda: {"device_name": "fake", "triton_version": "0", "torch_version": "0"}
    for name, mod in (("own_kernel", own), ("timing", timing), ("compile", compile_mod), ("worker", worker)):
        monkeypatch.setitem(sys.modules, f"tuner.kernels.{name}", mod)
    _Timer.calls = []
    return _Timer


def _found():
    return {1024: TileConfig(64, 128, 128, 16, 4, 3), 4096: TileConfig(64, 128, 128, 64, 4, 3)}


def test_grid_only_times_found_and_default_first_and_in_full(fakes, tmp_path):
    res = benchmark.run_grid_only(SHAPE, [1024], _found(), tmp_path)
    row = res["batch_sizes"][0]
    space = search_space_for(SHAPE.dtype, SHAPE.block_shape)
    dflt = default_config(1024, SHAPE.num_experts, SHAPE.intermediate, SHAPE.hidden, SHAPE.topk,
                          SHAPE.config_dtype, SHAPE.block_shape)
    assert fakes.calls[0] == (1024, _found()[1024], None)  # found first, no cutoff
    assert fakes.calls[1] == (1024, dflt, None)  # then SGLang's default, no cutoff
    assert row["complete"] and row["configs_visited"] == len(space)
    assert row["grid_best_us"] == 100.0 and row["grid_best_config"] == TileConfig(32, 64, 128, 16, 4, 3).as_dict()
    assert row["found_us"] == _fake_us(1024, _found()[1024])
    assert row["fraction_of_grid_best"] == pytest.approx(100.0 / row["found_us"])
    failed = sum(1 for c in space if c.BLOCK_SIZE_M == 256 and c.num_stages == 5)
    assert row["grid_timed"] == len(space) - failed
    lines = [json.loads(x) for x in (tmp_path / "grid_257_256_6144.jsonl").read_text().splitlines()]
    assert len(lines) == len(space) and lines[0]["role"] == "found" and lines[1]["role"] == "default"
    assert set(row["remeasured_us"]) >= {"found", "default", "grid0"}
    on_disk = json.loads((tmp_path / "grid_only_257_256_6144.json").read_text())
    assert on_disk["batch_sizes"][0]["grid_best_us"] == 100.0


def test_grid_only_deadline_stops_cleanly_and_marks_incomplete(fakes, tmp_path):
    res = benchmark.run_grid_only(SHAPE, [1024, 4096], _found(), tmp_path, deadline=time.monotonic() - 1)
    assert len(res["batch_sizes"]) == 1  # the next batch size is not started
    row = res["batch_sizes"][0]
    assert row["complete"] is False and row["configs_visited"] == 0
    doc = {"shapes": [{"shape": SHAPE.to_dict(), "grid_timing_wall_s_per_batch_size": [],
                       "batch_sizes": [{"batch_size": 1024, "grid_best_us": None, "found_us": 459.7,
                                        "found_config": _found()[1024].as_dict(), "evaluations": 128}]}]}
    assert summarize.update_from_grid_only(doc, json.loads(json.dumps(benchmark.json_safe(res)))) == []
    assert doc["shapes"][0]["batch_sizes"][0]["grid_best_us"] is None


def test_summary_update_takes_complete_rows_from_one_pass(fakes, tmp_path):
    res = json.loads(json.dumps(benchmark.json_safe(benchmark.run_grid_only(SHAPE, [1024, 4096], _found(), tmp_path))))
    doc = {"shapes": [{"shape": SHAPE.to_dict(), "grid_timing_wall_s_per_batch_size": [8.3],
                       "batch_sizes": [{"batch_size": M, "grid_best_us": None, "found_us": 1.0, "default_us": None,
                                        "fraction_of_grid_best": None, "evaluations": 128, "grid_size": 1280,
                                        "found_config": c.as_dict()} for M, c in _found().items()]}]}
    assert summarize.update_from_grid_only(doc, res) == [1024, 4096]
    for row, new in zip(doc["shapes"][0]["batch_sizes"], res["batch_sizes"]):
        assert row["evaluations"] == 128  # the search's count is kept
        assert row["found_us"] == new["found_us"] and row["grid_best_us"] == 100.0
        assert row["fraction_of_grid_best"] == pytest.approx(100.0 / new["found_us"], abs=1e-4)
        assert math.isfinite(row["default_us"])
    assert len(doc["shapes"][0]["grid_timing_wall_s_per_batch_size"]) == 3


def test_found_configs_are_read_from_the_committed_summary():
    found = benchmark.found_configs_from("results/kernels/h200/summary.json", SHAPE)
    assert found[1024] == TileConfig(64, 128, 128, 16, 4, 3)
    assert found[4096] == TileConfig(64, 128, 128, 64, 4, 3)
