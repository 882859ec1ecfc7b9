import json
import pickle

import pytest

from tuner.errors import TrialError
from tuner.lifecycle import FailureClass, Operation, Outcome, StopReason, StudyStatus, TrialStatus


def test_statuses_are_their_values_in_comparisons_formatting_and_json():
    assert TrialStatus.COMPLETE == "complete" and f"{TrialStatus.PRUNED}" == "pruned"
    assert json.dumps({"s": TrialStatus.INFEASIBLE}) == '{"s": "infeasible"}'
    assert TrialStatus("interrupted") is TrialStatus.INTERRUPTED
    assert pickle.loads(pickle.dumps(Operation.MEASURE)) is Operation.MEASURE  # crosses Ray workers


def test_finished_and_measured():
    assert not TrialStatus.RUNNING.is_finished()
    assert all(s.is_finished() for s in TrialStatus if s is not TrialStatus.RUNNING)
    assert {s for s in TrialStatus if s.measured} == {TrialStatus.COMPLETE, TrialStatus.PRUNED}


@pytest.mark.parametrize("stop,status,code", [
    (StopReason.BUDGET_SPENT, StudyStatus.FINISHED, 0),
    (StopReason.SPACE_EXHAUSTED, StudyStatus.FINISHED, 0),
    (StopReason.MAX_FAILURES, StudyStatus.STOPPED, 1),
    (StopReason.INTERRUPTED, StudyStatus.STOPPED, 130),
])
def test_the_stop_reason_decides_status_and_exit_code(stop, status, code):
    assert stop.study_status is status and stop.exit_code == code


def test_stop_messages():
    assert StopReason.BUDGET_SPENT.message(study="s") is None
    assert StopReason.MAX_FAILURES.message(study="s", failed=3, max_failures=3) == (
        "stopped after 3 failed trials (--max-failures 3); see `tuner study status s` for the reasons")


def test_outcomes():
    assert Outcome.complete(40) == Outcome(TrialStatus.COMPLETE, 40)
    assert Outcome.failure("infeasible", "no").status is TrialStatus.INFEASIBLE
    assert Outcome.failure("infeasible", "no").capacity_users == 0, "infeasible counts as 0 users"
    crash = Outcome.failure(FailureClass.CRASH, "segfault", "/l.log")
    assert crash.status is TrialStatus.FAILED and crash.capacity_users is None and crash.log_path == "/l.log"
    assert crash.objective_value == 0.0
    screened = Outcome.not_launched("planner: no room", screened_by_planner=True)
    assert not screened.launched and screened.screened_by_planner and screened.failure_class is FailureClass.INFEASIBLE
    assert Outcome("pruned", 8).status is TrialStatus.PRUNED, "values read back become members"
    with pytest.raises(ValueError):
        Outcome("done", 8)


def test_trial_errors_carry_a_failure_class():
    err = TrialError("oom", "CUDA out of memory")
    assert err.failure_class is FailureClass.OOM and str(err) == "oom: CUDA out of memory"
    assert pickle.loads(pickle.dumps(err)).failure_class is FailureClass.OOM
    with pytest.raises(ValueError, match="unknown failure class 'melted'"):
        TrialError("melted", "x")
