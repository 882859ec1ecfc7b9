"""Multi-fidelity pruning, planner pre-screen counts, warm-start enqueuing in the runner."""

from __future__ import annotations

import pytest

from tests.study_tests._tiny import TINY_SPACE, write_tiny_study
from tuner.evaluation.capacity import CapacitySearch
from tuner.config.load import load_study
from tuner.storage import db, repo
from tuner.study.pruning import replay_pruned, should_prune
from tuner.study.runner import StudyRunner
from tuner.study.warm_start import top_k_configs


def _search(steps):
    s = CapacitySearch(start_users=16, max_users=256, resolution_users=4)
    for users, passed in steps:
        assert s.next_users() == users
        s.record(users, passed)
    return s


def test_prune_only_when_the_upper_bound_cannot_beat_the_incumbent():
    s = _search([(16, True), (32, False)])  # capacity in [16, 31]
    assert s.upper_bound() == 31
    assert should_prune(s, 31) and should_prune(s, 40)
    assert not should_prune(s, 30), "31 users would still beat 30"
    assert not should_prune(s, None) and not should_prune(s, 0)
    galloping = _search([(16, True), (32, True)])  # no miss yet: could reach max_users
    assert not should_prune(galloping, 200)
    done = _search([(16, True), (32, False), (24, True), (28, False)])
    assert done.done and not should_prune(done, 100), "a finished search is complete, not pruned"


def test_replay_stops_at_the_first_step_that_settles_the_comparison(tmp_path):
    study = load_study(str(write_tiny_study(tmp_path, max_users=64)))
    steps = [[4, True], [8, True], [16, False], [12, True]]
    assert replay_pruned(study, steps, incumbent_users=15) == (3, 8, True)  # after 16 fails: at most 15
    assert replay_pruned(study, steps, incumbent_users=14) == (4, 12, False)
    assert replay_pruned(study, steps, incumbent_users=None) == (4, 12, False)
    with pytest.raises(ValueError):
        replay_pruned(study, [[5, True]], None)


def _run(tmp_path, name, trials, **kw):
    path = write_tiny_study(tmp_path, name=name, trials=trials, sampler=kw.pop("sampler", "tpe"),
                            space=kw.pop("space", None))
    study = load_study(str(path))
    storage = f"sqlite:///{tmp_path}/{name}.db"
    runner = StudyRunner(study, storage_url=storage, backend_kind="simulator", use_ray=False,
                         workdir=str(tmp_path / "runs"), **kw)
    runner.create()
    outcome = runner.run(trials)
    return outcome, repo.trials(db.get_engine(storage), name), storage


def test_runner_prunes_trials_that_cannot_beat_the_baseline(tmp_path):
    # every configuration of the tiny space reaches max_users (16): once the baseline has, no other
    # trial can exceed it, so each stops after its first load point with that point as lower bound
    outcome, trials, storage = _run(tmp_path, "prune", 3)
    base, rest = trials[0], [t for t in trials[1:] if t.launched]
    assert base.status == "complete" and base.capacity_users == 16
    assert rest and all(t.status == "pruned" for t in rest)
    assert all(t.capacity_users == 4 and t.failure_reason.startswith("stopped early") for t in rest)
    for t in rest:
        assert len(repo.measurements(db.get_engine(storage), "prune", t.trial_number)) == 1
    assert outcome.trials_pruned == len(rest) and outcome.best_capacity_users == 16


def test_runner_without_pruning_completes_every_search(tmp_path):
    outcome, trials, _ = _run(tmp_path, "noprune", 3, prune=False)
    assert [t.status for t in trials] == ["complete"] * 3
    assert outcome.trials_pruned == 0


def test_initial_configs_run_right_after_the_baseline(tmp_path):
    cfg = {"tp-size": 8, "attn-dp-size": 8, "kv-cache-dtype": "fp8_e4m3", "router-policy": "cache_aware",
           "quantization": "modelopt_fp4"}
    outcome, trials, _ = _run(tmp_path, "warm", 2, initial_configs=[cfg])
    assert trials[0].is_baseline
    assert trials[1].params == cfg
    assert outcome.enqueued == 1


def test_planner_screened_configurations_are_counted_and_not_launched(tmp_path):
    from tests.conftest import run_cli
    import json

    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "attn-dp-size": {"values": [8]},
                                     "quantization": {"values": [None, "modelopt_fp4"]}})
    # bf16 GLM-5.1 does not fit on 8xH200: the planner settles those configurations without launching
    outcome, trials, storage = _run(tmp_path, "screen", 3, space=space, prune=False)
    screened = [t for t in trials if t.screened_by_planner]
    assert screened and outcome.prescreened == len(screened)
    assert all(not t.launched and t.failure_reason.startswith("planner:") and not t.measured_kv_capacity_tokens
               for t in screened)
    r = run_cli(["study", "status", "screen", "--storage", storage, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["prescreened"] == len(screened)
    assert status["cost"]["launched_trials"] == outcome.trials_run


def test_top_k_configs_are_distinct_completed_and_ranked(tmp_path):
    study = load_study(str(write_tiny_study(tmp_path)))
    a = {"tp-size": 8, "attn-dp-size": 8, "kv-cache-dtype": None, "router-policy": "cache_aware",
         "quantization": "modelopt_fp4"}
    b = {"tp-size": 8, "attn-dp-size": 1, "kv-cache-dtype": "fp8_e4m3", "router-policy": None,
         "quantization": "modelopt_fp4"}
    rows = [{"params": {"tp-size": 8, "quantization": "modelopt_fp4"}, "status": "complete", "capacity_users": 99,
             "is_baseline": True},
            {"params": b, "status": "complete", "capacity_users": 20},
            {"params": a, "status": "complete", "capacity_users": 40},
            {"params": a, "status": "complete", "capacity_users": 40},
            {"params": b, "status": "failed", "capacity_users": None}]
    top = top_k_configs(study, rows, 5)
    assert top[0] == a
    assert top[1] == {k: v for k, v in b.items() if k != "router-policy"}, "knobs whose condition fails drop out"
    assert len(top) == 2
    assert top_k_configs(study, rows, 1) == [a]
