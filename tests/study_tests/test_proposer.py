"""The proposer alone, on an in-memory Optuna study (no database, no Ray)."""

from __future__ import annotations

import pytest

from tests.study_tests._tiny import TINY_SPACE
from tests.study_tests.fakes import tiny_study
from tuner.errors import ConfigError
from tuner.lifecycle import Outcome, TrialStatus
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Decision, Proposer, TriedTrial, baseline_values, config_key
from tuner.study.samplers import make_sampler

FP4_DP8 = {"tp-size": 8, "attn-dp-size": 8, "kv-cache-dtype": "fp8_e4m3", "router-policy": "cache_aware",
           "quantization": "modelopt_fp4"}


def _proposer(study, budget=10, **kw):
    optuna = OptunaStudy.in_memory(make_sampler(study.sampler, 0))
    return Proposer(study, optuna, budget, **kw)


def test_first_the_baseline_then_the_queue_one_per_ask(tmp_path):
    study = tiny_study(tmp_path, sampler="tpe")
    warm = [FP4_DP8, {"tp-size": 8, "attn-dp-size": 1, "kv-cache-dtype": "fp8_e4m3", "quantization": "modelopt_fp4"}]
    p = _proposer(study, initial_configs=warm)
    first = p.propose()
    assert first.is_baseline and first.number == 0 and first.launch and not first.from_queue
    assert first.values == baseline_values(study)
    assert first.flags == {"tp-size": 8, "quantization": "modelopt_fp4"} and first.knobs == {}
    second, third = p.propose(), p.propose()
    assert second.from_queue and second.values == FP4_DP8 and second.knobs == {"router-policy": "cache_aware"}
    assert third.from_queue and {k: v for k, v in third.values.items() if v is not None} == warm[1]
    assert not p.propose().from_queue, "the queue is used up"
    assert p.asks == 4


def test_a_configuration_that_breaks_a_constraint_is_settled_with_its_reason(tmp_path):
    space = dict(TINY_SPACE, constraints=["attn_dp_size == 8"])
    p = _proposer(tiny_study(tmp_path, space=space, sampler="tpe"),
                  initial_configs=[{"tp-size": 8, "attn-dp-size": 1, "quantization": "modelopt_fp4"}])
    p.propose()  # the baseline is exempt from constraints
    rejected = p.propose()
    assert rejected.decision is Decision.CONSTRAINT and not rejected.launch
    assert rejected.reason == "violates constraint(s): attn_dp_size == 8"
    outcome = rejected.not_launched_outcome()
    assert outcome.status is TrialStatus.INFEASIBLE and not outcome.launched and not outcome.screened_by_planner


def test_the_planner_screens_out_what_cannot_fit(tmp_path):
    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "quantization": {"values": [None]}})
    study = tiny_study(tmp_path, space=space, sampler="tpe")
    p = _proposer(study, initial_configs=[{"tp-size": 8, "attn-dp-size": 8, "quantization": None}])
    p.propose()
    screened = p.propose()  # bf16 GLM-5.1 does not fit on 8xH200
    assert screened.decision is Decision.SCREENED and screened.reason.startswith("planner: weights need")
    assert screened.not_launched_outcome().screened_by_planner
    # without the pre-screen it launches, with the planner's KV prediction
    p = _proposer(study, prescreen=False, initial_configs=[{"tp-size": 8, "attn-dp-size": 8, "quantization": None}],
                  verdict=lambda s, flags: (False, "no room", 12345))
    p.propose()
    launched = p.propose()
    assert launched.launch and launched.predicted_kv_capacity_tokens == 12345


def test_duplicates_are_answered_by_what_the_same_configuration_measured(tmp_path):
    one = {name: {"values": [value]} for name, value in FP4_DP8.items()}  # a space of one configuration
    p = _proposer(tiny_study(tmp_path, space=dict(TINY_SPACE, params=one), sampler="tpe"))
    p.propose()
    running = p.propose()
    assert running.launch and running.values == FP4_DP8
    again = p.propose()
    assert again.decision is Decision.DUPLICATE_RUNNING and config_key(again.values) == config_key(running.values)
    p.learn(running, Outcome.pruned(24, "stopped early"))  # a pruned lower bound answers duplicates too
    dup = p.propose()
    assert dup.decision is Decision.DUPLICATE and dup.duplicate_capacity_users == 24
    p.learn(running, Outcome.failure("crash", "segfault"))  # a failure is forgotten: it may be tried again
    assert p.propose().launch


def test_a_resumed_study_has_no_second_baseline_and_remembers_what_completed(tmp_path):
    study = tiny_study(tmp_path, sampler="tpe")
    tried = [TriedTrial(baseline_values(study), TrialStatus.COMPLETE, 16),
             TriedTrial(FP4_DP8, TrialStatus.COMPLETE, 40)]
    p = _proposer(study, tried=tried, initial_configs=[FP4_DP8])
    first = p.propose()
    assert not first.is_baseline, "the baseline ran before"
    assert not first.from_queue, "an already tried warm-start configuration is not enqueued again"


def test_the_grid_sampler_enqueues_every_configuration_once(tmp_path):
    study = tiny_study(tmp_path, sampler="grid", trials=7)
    p = _proposer(study, budget=7)
    proposals = [p.propose() for _ in range(7)]
    assert proposals[0].is_baseline
    grid = proposals[1:]
    assert all(g.from_queue and g.launch for g in grid)
    keys = {config_key(g.values) for g in grid}
    assert len(keys) == 6, "1 x 2 KV dtypes without a router, 1 x 2 x 2 with attention DP"
    assert p.propose().decision in (Decision.DUPLICATE_RUNNING, Decision.DUPLICATE), "nothing new after the grid"


def test_the_grid_sampler_refuses_a_grid_larger_than_the_budget_or_a_continuous_range(tmp_path):
    study = tiny_study(tmp_path, sampler="grid", trials=6)
    with pytest.raises(ConfigError, match=r"sampler: sampler 'grid': the space has 6 configurations but a budget of 6"):
        _proposer(study, budget=6)
    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "mem-fraction-static": {"low": 0.8, "high": 0.9}})
    study = tiny_study(tmp_path, name="cont", space=space, sampler="grid", trials=50)
    with pytest.raises(ConfigError) as exc:
        _proposer(study, budget=50)
    assert "cont.yaml: sampler:" in str(exc.value) and "'mem-fraction-static' is a continuous range" in str(exc.value)
    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "mem-fraction-static": {"low": 0.8, "high": 0.9,
                                                                                        "step": 0.05}})
    study = tiny_study(tmp_path, name="stepped", space=space, sampler="grid", trials=50)
    assert len(_proposer(study, budget=50)._queue) == 18, "a range with a step is a list of values"


def test_a_repeat_launches_a_finished_configuration_again_first(tmp_path):
    from tuner.study.proposer import repeat_configs

    study = tiny_study(tmp_path, sampler="tpe")
    tried = {0: TriedTrial(baseline_values(study), TrialStatus.COMPLETE, 16, is_baseline=True),
             1: TriedTrial(FP4_DP8, TrialStatus.COMPLETE, 40),
             2: TriedTrial(FP4_DP8 | {"router-policy": None}, TrialStatus.INFEASIBLE, None, launched=False)}
    p = _proposer(study, tried=list(tried.values()), initial_configs=[{"tp-size": 8, "attn-dp-size": 1}],
                  repeats=repeat_configs(study, tried, [1]))
    again = p.propose()
    assert again.launch and again.repeat_of == 1 and again.from_queue
    assert config_key(again.values) == config_key(FP4_DP8), "the same configuration, not a duplicate answer"
    assert p.propose().repeat_of is None  # the queue goes on behind the repeats
    for numbers, says in (([9], "has no trial 9"), ([0], "is the baseline"), ([2], "never launched")):
        with pytest.raises(ConfigError, match=says) as err:
            repeat_configs(study, tried, numbers)
        assert err.value.key == "--repeat-trial"


def test_a_varied_repeat_sets_the_named_knobs_otherwise_and_drops_what_their_conditions_exclude(tmp_path):
    from tuner.study.proposer import RepeatRequest, repeat_configs

    study = tiny_study(tmp_path, sampler="tpe")
    tried = {0: TriedTrial(baseline_values(study), TrialStatus.COMPLETE, 16, is_baseline=True),
             1: TriedTrial(FP4_DP8, TrialStatus.COMPLETE, 40)}
    req = RepeatRequest.parse("1:attn-dp-size=1, kv-cache-dtype=null")
    assert req == RepeatRequest(1, {"attn-dp-size": 1, "kv-cache-dtype": None})
    p = _proposer(study, tried=list(tried.values()), repeats=repeat_configs(study, tried, [1, req]))
    same, varied = p.propose(), p.propose()
    assert same.repeat_of == 1 and same.repeat_changes is None and config_key(same.values) == config_key(FP4_DP8)
    assert varied.launch and varied.repeat_of == 1
    assert varied.repeat_changes == {"attn-dp-size": 1, "kv-cache-dtype": None}
    # attention DP off: the router knob's condition fails, so it is not set
    assert varied.values["attn-dp-size"] == 1 and varied.values["kv-cache-dtype"] is None
    assert varied.values.get("router-policy") is None and varied.values["quantization"] == "modelopt_fp4"
    for text, says in (("1:nope=3", "'nope' is not a knob of search space"),
                       ("1:attn-dp-size=4", r"attn-dp-size=4 is not one of its values \[1, 8\]"),
                       ("x:attn-dp-size=1", "expected a trial number"), ("1:attn-dp-size", "expected KNOB=VALUE")):
        with pytest.raises(ConfigError, match=says) as err:
            repeat_configs(study, tried, [RepeatRequest.parse(text)])
        assert err.value.key == "--repeat-trial"
