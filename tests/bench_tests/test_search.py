"""tuner bench search: table cache, the runner's loop against the table, JSON contract, cost."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.study_tests._tiny import write_tiny_study
from tuner.bench.search import SamplerRun, run_sampler, setup, trials_to_reach
from tuner.bench.table import Table, config_key, table_hash
from tuner.config.load import load_study
from tuner.study import cost


def test_trials_to_reach_counts_launched_trials_one_based():
    best = [10, 10, 30, 57, 57, 60]
    assert trials_to_reach(best, 57) == 4
    assert trials_to_reach(best, 0.95 * 60) == 4  # 57.0
    assert trials_to_reach(best, 10) == 1
    assert trials_to_reach(best, 61) is None
    run = SamplerRun("x", 0, best_by_trial=best)
    assert run.best_at(2) == 10 and run.best_at(15) == 60 and run.best_at(30) == 60


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    path = write_tiny_study(tmp)
    return tmp, path


def test_table_is_measured_once_and_reused(tiny):
    tmp, path = tiny
    study = load_study(str(path))
    bs = setup(study, results_dir=tmp / "r1", workers=1, quiet=True)
    assert len(bs.grid) == 6
    assert bs.table.get(bs.baseline)["status"] == "complete"
    again = Table(study, bs.table.path)
    assert again.missing(bs.grid + [bs.baseline]) == []
    # another workload seed measures something else: the stored entries are not reused
    other = study.model_copy(update={"seed": 7})
    assert table_hash(other) != bs.table.hash
    assert len(Table(other, bs.table.path).missing(bs.grid)) == 6


def test_sampler_loop_launches_distinct_configurations_and_counts_duplicates(tiny):
    tmp, path = tiny
    bs = setup(load_study(str(path)), results_dir=tmp / "r1", workers=1, quiet=True)
    run = run_sampler(bs, "random", 0, budget=20)
    keys = [config_key(e["values"]) for e in run.launched]
    assert len(keys) == len(set(keys)), "a configuration is launched once; repeats come from the cache"
    assert len(run.launched) == 7  # baseline + the 6 grid points, then the loop runs out of new ones
    assert run.duplicates > 0
    assert run.best_by_trial == sorted(run.best_by_trial)


def test_default_sampler_launches_planner_seeds_right_after_the_baseline(tiny):
    from tuner.study.samplers import seed_configs

    tmp, path = tiny
    bs = setup(load_study(str(path)), results_dir=tmp / "r1", workers=1, quiet=True)
    seeds = seed_configs(bs.study)
    assert seeds, "the tiny space has two parallelism families"
    run = run_sampler(bs, "default", 0, budget=1 + len(seeds))
    assert run.launched[0]["values"] == bs.baseline
    assert [config_key(e["values"]) for e in run.launched[1:]] == [config_key(s) for s in seeds]


def test_cli_json_contract_and_files(tiny):
    tmp, path = tiny
    out = tmp / "r2"
    r = run_cli(["bench", "search", "--study", str(path), "--seeds", "2", "--budget", "4", "--workers", "1",
                 "--results-dir", str(out), "--warm-start", "1", "--json"], cwd=tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["grid_points"] == 6 and doc["grid_optimum_users"] == 16
    names = [s["name"] for s in doc["samplers"]]
    assert names == ["default", "tpe", "random"]
    for s in doc["samplers"]:
        assert set(s) >= {"name", "trials_to_95pct", "median_trials_to_95pct", "users_at_15", "users_at_30"}
        assert len(s["trials_to_95pct"]) == 2 and len(s["users_at_15"]) == 2 and len(s["users_at_30"]) == 2
        # every configuration of this space reaches max_users: the baseline already meets 95%
        assert s["trials_to_95pct"] == [1, 1] and s["median_trials_to_95pct"] == 1
    w = doc["warm_start"]
    assert len(w["cold_trials_to_95pct"]) == 2 and len(w["warm_trials_to_95pct"]) == 2 and len(w["enqueued"]) == 1
    assert doc["cost"]["grid_launches"] == 6 and doc["cost"]["grid_gpu_hours"] > 0
    assert (out / "bench-tiny-tiny-bench.json").is_file() and (out / "bench-tiny-tiny-bench.md").is_file()
    r = run_cli(["bench", "search", "--study", str(path), "--samplers", "nope", "--results-dir", str(out)], cwd=tmp)
    assert r.returncode == 2 and "valid" in r.stderr


def test_cost_arithmetic_follows_the_documented_assumptions(tiny):
    from tuner.catalog import get_gpu, get_model
    from tuner.planner import plan_memory

    _, path = tiny
    study = load_study(str(path))
    flags = {"tp-size": 8, "attn-dp-size": 8, "quantization": "modelopt_fp4"}
    plan = plan_memory(get_model("glm-5.1"), get_gpu("h200"), 8, flags, nodes=1, host_memory_gb=2048)
    start_s, gpus = cost.server_start_s(study, flags)
    expected = (cost.FIXED_START_S + plan.weights_gb_per_gpu * 8 / cost.STORAGE_READ_GB_PER_S
                + cost.GRAPH_CAPTURE_S_PER_BATCH * (4 + plan.cuda_graph_max_bs_decode / 8))
    assert gpus == 8 and start_s == pytest.approx(expected)
    # 3 load points of (10 s warm-up + 30 s window) on 8 GPUs
    assert cost.trial_gpu_s(study, flags, 3) == pytest.approx((start_s + 3 * 40) * 8)
    assert cost.trial_gpu_s(study, flags, 3, started=False) == 0
    entries = [{"values": {"tp-size": 8, "attn-dp-size": 8, "quantization": "modelopt_fp4"}, "status": "complete",
                "capacity_users": 16, "steps": [[4, True], [8, True], [16, True]], "prescreened": False},
               {"values": {"quantization": None}, "status": "infeasible", "prescreened": True, "steps": []}]
    c = cost.trials_cost(study, entries)
    assert c["launches"] == 1 and c["load_points"] == 3
    assert c["gpu_hours"] == pytest.approx((start_s + 120) * 8 / 3600)
