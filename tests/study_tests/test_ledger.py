"""The ledger alone: what it records, what it tells Optuna, what it counts (in-memory records and
an in-memory Optuna study: no database, no Ray)."""

from __future__ import annotations

import optuna

from tests.study_tests._tiny import TINY_SPACE
from tests.study_tests.fakes import MemoryRecords, load_point, tiny_study
from tuner.lifecycle import Outcome, StopReason, StudyStatus, TrialStatus
from tuner.study.ledger import Ledger
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Decision, Proposer
from tuner.study.samplers import CONSTRAINT_KEY, make_sampler

TS = optuna.trial.TrialState


def _parts(tmp_path, space=None, initial=()):
    study = tiny_study(tmp_path, space=space, sampler="tpe")
    ostudy = OptunaStudy.in_memory(make_sampler("tpe", 0))
    records = MemoryRecords()
    events = []
    ledger = Ledger(records, ostudy, backend_kind="simulator", on_event=lambda kind, data: events.append((kind, data)))
    return Proposer(study, ostudy, 10, initial_configs=list(initial)), ledger, records, ostudy.study, events


def _frozen(ostudy, number):
    return ostudy.get_trials(deepcopy=False)[number]


def test_a_launched_trial_is_recorded_measured_and_told_its_capacity(tmp_path):
    proposer, ledger, records, ostudy, events = _parts(tmp_path)
    p = proposer.propose()
    ledger.started(p)
    assert records.trials[0]["is_baseline"] and records.trials[0]["status"] == TrialStatus.RUNNING
    ledger.deployed(p, {"pids": [123], "node": "n1", "gpu_ids": ["0"], "log_path": "/x.log"})
    assert records.trials[0]["pids"] == [123] and records.trials[0]["telemetry"] == {"node": "n1", "gpu_ids": ["0"]}
    ledger.measured(p, 0, load_point(8, 1.0), True, 0.5, capacity_users=8)
    assert records.measurements[0]["step"] == 0 and records.measurements[0]["meets_slo"]
    ledger.closed(p, {"node": "n1"}, {"gpu_released": True})
    assert records.trials[0]["telemetry"] == {"node": "n1", "gpu_released": True}
    ledger.finish(p, Outcome.complete(8))
    t = _frozen(ostudy, 0)
    assert t.state == TS.COMPLETE and t.value == 8.0 and t.intermediate_values == {1: 8.0}
    assert t.user_attrs["baseline"] is True and t.user_attrs["config"] == p.values
    assert t.system_attrs[f"constraints:{CONSTRAINT_KEY}"] == 0.0, "feasible"
    assert ledger.incumbent_users == 8 and ledger.counters.launched == 1
    assert [k for k, _ in events] == ["trial_start", "measurement", "trial_end"]
    assert events[-1][1]["status"] == TrialStatus.COMPLETE and events[-1][1]["launched"]


def test_failures_count_and_are_learnt_as_infeasible_regions(tmp_path):
    proposer, ledger, records, ostudy, _ = _parts(tmp_path)
    p = proposer.propose()
    ledger.started(p)
    ledger.finish(p, Outcome.failure("oom", "CUDA out of memory", log_path="/l.log"))
    t = _frozen(ostudy, 0)
    assert t.state == TS.COMPLETE and t.value == 0.0 and t.system_attrs[f"constraints:{CONSTRAINT_KEY}"] == 1.0
    assert t.user_attrs["failure"] == "oom: CUDA out of memory"
    assert records.trials[0]["status"] == TrialStatus.FAILED and ledger.counters.failed == 1
    assert ledger.incumbent_users is None


def test_an_interrupted_trial_fails_in_optuna(tmp_path):
    proposer, ledger, records, ostudy, _ = _parts(tmp_path)
    p = proposer.propose()
    ledger.started(p)
    ledger.finish(p, Outcome.interrupted("interrupted by the user"))
    assert _frozen(ostudy, 0).state == TS.FAIL
    assert records.trials[0]["outcome"].failure_class == "interrupted"
    assert ledger.counters.failed == 0, "an interruption is not the configuration's failure"


def test_settled_proposals_are_recorded_not_launched_and_counted(tmp_path):
    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "quantization": {"values": [None, "modelopt_fp4"]}},
                 constraints=["attn_dp_size == 8"])
    proposer, ledger, records, ostudy, events = _parts(tmp_path, space, initial=[
        {"tp-size": 8, "attn-dp-size": 1, "quantization": "modelopt_fp4"},  # breaks the constraint
        {"tp-size": 8, "attn-dp-size": 8, "quantization": None}])  # bf16: the planner screens it out
    ledger.started(proposer.propose())
    constraint, screened = proposer.propose(), proposer.propose()
    assert (constraint.decision, screened.decision) == (Decision.CONSTRAINT, Decision.SCREENED)
    ledger.settle(constraint)
    ledger.settle(screened)
    for number in (1, 2):
        row, t = records.trials[number], _frozen(ostudy, number)
        assert row["status"] == TrialStatus.INFEASIBLE and not row["outcome"].launched
        assert t.value == 0.0 and t.system_attrs[f"constraints:{CONSTRAINT_KEY}"] == 1.0
    assert records.trials[2]["outcome"].screened_by_planner and not records.trials[1]["outcome"].screened_by_planner
    c = ledger.counters
    assert (c.launched, c.infeasible, c.prescreened, c.enqueued) == (1, 2, 1, 2)
    assert events[-1] == ("trial_end", {"number": 2, "status": TrialStatus.INFEASIBLE, "capacity": 0,
                                        "reason": screened.reason, "launched": False})


def test_duplicates_are_told_without_a_row_of_their_own(tmp_path):
    one = {name: {"values": [value]} for name, value in
           {"tp-size": 8, "attn-dp-size": 8, "quantization": "modelopt_fp4"}.items()}
    proposer, ledger, records, ostudy, _ = _parts(tmp_path, dict(TINY_SPACE, params=one))
    ledger.started(proposer.propose())
    first = proposer.propose()
    ledger.started(first)
    running_dup = proposer.propose()
    ledger.settle(running_dup)
    assert _frozen(ostudy, running_dup.number).state == TS.PRUNED
    ledger.finish(first, Outcome.complete(40))
    proposer.learn(first, Outcome.complete(40))
    dup = proposer.propose()
    ledger.settle(dup)
    t = _frozen(ostudy, dup.number)
    assert t.value == 40.0 and t.user_attrs["duplicate"] is True
    assert set(records.trials) == {0, 1} and ledger.counters.duplicates == 2


def test_the_stop_reason_decides_the_study_status(tmp_path):
    _, ledger, records, _, _ = _parts(tmp_path)
    for stop, status in ((StopReason.BUDGET_SPENT, StudyStatus.FINISHED),
                         (StopReason.SPACE_EXHAUSTED, StudyStatus.FINISHED),
                         (StopReason.MAX_FAILURES, StudyStatus.STOPPED)):
        ledger.conclude(stop)
        assert records.status is status


def test_the_start_up_facts_are_recorded_at_deploy_and_the_teardown_replaces_them(tmp_path):
    # a trial stopped before its teardown (Ctrl-C, a time limit's backstop) keeps how it started
    proposer, ledger, records, ostudy, events = _parts(tmp_path)
    p = proposer.propose()
    ledger.started(p)
    startup = {"ready_after_s": {"sglang0": 200.1}, "server": {"startup": {"capture_s": {"decode": 62.0}}}}
    ledger.deployed(p, {"pids": [1], "node": "n1", "gpu_ids": ["0"], "startup": startup})
    tel = records.trials[0]["telemetry"]
    assert tel["ready_after_s"] == {"sglang0": 200.1} and tel["node"] == "n1"
    assert tel["server"]["startup"]["capture_s"]["decode"] == 62.0
    ledger.closed(p, {"node": "n1", "startup": startup}, {"ready_after_s": {"sglang0": 200.1}, "close": {"ok": 1}})
    assert records.trials[0]["telemetry"] == {"node": "n1", "ready_after_s": {"sglang0": 200.1}, "close": {"ok": 1}}


def test_start_up_facts_are_best_effort():
    from tuner.study.executor import _startup_facts

    class Broken:
        def telemetry(self):
            raise RuntimeError("no /server_info")

    class Live:
        def telemetry(self):
            return {"ready_after_s": {"s": 1.0}, "gpu": {"big": 1}, "close": {}, "server_info": None}

    assert _startup_facts(Broken()) == {}
    assert _startup_facts(Live()) == {"ready_after_s": {"s": 1.0}}  # not the teardown's own parts
