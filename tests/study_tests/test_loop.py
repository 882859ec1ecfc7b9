"""The trial loop with its real proposer and ledger, a scripted executor for workers and
in-memory records: budget, parallel slots, pruning, failure limit, exhausted space, Ctrl-C."""

from __future__ import annotations

import dataclasses

import pytest

from tests.study_tests._tiny import TINY_SPACE
from tests.study_tests.fakes import MemoryRecords, ScriptedExecutor, load_point, tiny_study
from tuner.errors import TrialError
from tuner.lifecycle import Operation, StopReason, TrialStatus
from tuner.study.ledger import Ledger
from tuner.study.loop import TrialLoop
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Proposer, max_asks
from tuner.study.samplers import make_sampler


def _loop(tmp_path, executor, budget, *, space=None, max_users=64, **kw):
    # the scripts' verdicts are step functions (1 s or 100 s), whose P90s say nothing about where
    # the SLO is crossed: the midpoint keeps each search's load points worked out by hand below
    study = tiny_study(tmp_path, space=space, sampler="tpe", max_users=max_users, bisect="midpoint")
    optuna = OptunaStudy.in_memory(make_sampler("tpe", 0))
    records = MemoryRecords()
    ledger = Ledger(records, optuna, backend_kind="simulator")
    loop = TrialLoop(study, Proposer(study, optuna, budget), ledger, executor, backend_kind="simulator",
                     budget=budget, gpus_needed=lambda request: 0, workdir=str(tmp_path), seed=0, **kw)
    return loop, records


def _statuses(records):
    return {n: t["status"] for n, t in records.trials.items()}


def test_each_trial_deploys_measures_and_closes_until_the_budget(tmp_path):
    ex = ScriptedExecutor(capacity=lambda n: 30)
    loop, records = _loop(tmp_path, ex, 3, prune=False)
    assert loop.run() is StopReason.BUDGET_SPENT
    launched = [n for n, t in records.trials.items() if t["outcome"].launched]
    assert len(launched) == 3 and loop.ledger.counters.launched == 3
    for n in launched:
        ops = [op for key, op in ex.submitted if key == n]
        assert ops[0] is Operation.DEPLOY and ops[-1] is Operation.CLOSE
        assert set(ops[1:-1]) == {Operation.MEASURE}
        # the capacity search: 4 pass, 8, 16 pass, 32 fails, bisect to the resolution (4) -> 28
        assert records.trials[n]["status"] == TrialStatus.COMPLETE and records.trials[n]["outcome"].capacity_users == 28
    assert ex.shut_down and not loop.running


def test_trials_run_in_parallel_up_to_the_slots(tmp_path):
    ex = ScriptedExecutor(capacity=lambda n: 30)
    loop, _ = _loop(tmp_path, ex, 4, parallel=2, prune=False)
    loop.run()
    assert ex.max_in_flight == 2


def test_a_trial_that_cannot_beat_the_best_is_pruned_and_closed(tmp_path):
    ex = ScriptedExecutor(capacity=lambda n: 60 if n == 0 else 20)  # 32 users fail: at most 31 < 60
    loop, records = _loop(tmp_path, ex, 3)
    loop.run()
    base = records.trials[0]["outcome"]
    assert base.status is TrialStatus.COMPLETE and base.capacity_users == 60
    for n, t in list(records.trials.items())[1:]:
        if t["outcome"].launched:
            assert t["outcome"].status is TrialStatus.PRUNED and t["outcome"].reason.startswith("stopped early")
            assert [op for key, op in ex.submitted if key == n][-1] is Operation.CLOSE
    assert loop.ledger.counters.pruned >= 1


def test_the_failure_limit_stops_new_launches(tmp_path):
    ex = ScriptedExecutor(capacity=lambda n: 30,
                          fail=lambda n, op: TrialError("exit_at_start", "exit 1") if op is Operation.DEPLOY else None)
    loop, records = _loop(tmp_path, ex, 10, max_failures=2)
    assert loop.run() is StopReason.MAX_FAILURES
    assert loop.ledger.counters.failed == 2 and loop.ledger.counters.launched == 2
    assert all(s == TrialStatus.FAILED for s in _statuses(records).values())


def test_a_space_with_nothing_new_ends_the_run(tmp_path):
    one = {"tp-size": {"values": [8]}, "quantization": {"values": ["modelopt_fp4"]}}  # only the baseline
    ex = ScriptedExecutor(capacity=lambda n: 30)
    loop, records = _loop(tmp_path, ex, 5, space=dict(TINY_SPACE, params=one, constraints=[]))
    assert loop.run() is StopReason.SPACE_EXHAUSTED
    assert loop.proposer.asks == max_asks(5) and loop.ledger.counters.launched == 1
    assert StopReason.SPACE_EXHAUSTED.study_status == "finished"


def test_ctrl_c_marks_the_running_trials_interrupted(tmp_path):
    ex = ScriptedExecutor(capacity=lambda n: 30, interrupt_after=3)
    loop, records = _loop(tmp_path, ex, 4, parallel=2)
    with pytest.raises(KeyboardInterrupt):
        loop.run()
    assert loop.stop is StopReason.INTERRUPTED and ex.shut_down
    assert _statuses(records) == {0: TrialStatus.INTERRUPTED, 1: TrialStatus.INTERRUPTED}
    assert records.trials[0]["outcome"].reason == "interrupted by the user"


def test_a_simulator_start_begins_each_search_at_the_predicted_capacity(tmp_path):
    from tuner.evaluation.prediction import predicted_capacity

    ex = ScriptedExecutor(capacity=lambda n: 12)
    loop, records = _loop(tmp_path, ex, 2, prune=False)
    loop.study = loop.study.model_copy(update={"capacity": loop.study.capacity.model_copy(update={"start": "simulator"})})
    loop.run()
    for n, t in records.trials.items():
        if not t["outcome"].launched:
            continue
        measured = [args for key, op, *args in ex.calls if key == n and op is Operation.MEASURE]
        proposal_flags, proposal_knobs = t["flags"], t["knobs"]
        predicted, basis = predicted_capacity(loop.study, proposal_flags, proposal_knobs, seed=n)
        assert predicted is not None and "simulator" in basis
        assert measured[0][0] == max(1, min(predicted, 64))  # the first load point is the prediction
        assert t["outcome"].capacity_users == 12  # and the search still finds the true capacity


class _ClockRunsOut(ScriptedExecutor):
    """The run's time limit is reached just as the load point at ``at_users`` comes back."""

    def __init__(self, at_users, **kw):
        super().__init__(**kw)
        self.at_users, self.loop = at_users, None

    def wait(self, timeout_s=0.5):
        results = super().wait(timeout_s)
        for r in results:
            if r.op is Operation.MEASURE and r.value[0].users == self.at_users:
                self.loop.winding_down = "time limit of 1 s reached"
                self.loop.stop = StopReason.TIME_LIMIT
        return results


@pytest.mark.parametrize("at_users, status", [(28, TrialStatus.COMPLETE), (24, TrialStatus.INTERRUPTED)])
def test_at_the_time_limit_a_finished_search_completes_and_an_unfinished_one_is_interrupted(tmp_path, at_users, status):
    # capacity 30 from 4 by 4: 4, 8, 16, 32 (miss), 24, 28 -> done after 28
    ex = _ClockRunsOut(at_users, capacity=lambda n: 30)
    loop, records = _loop(tmp_path, ex, 3, prune=False)
    ex.loop = loop
    loop.run()
    first = records.trials[0]["outcome"]
    assert first.status is status
    if status is TrialStatus.COMPLETE:
        assert first.capacity_users == 28
    assert [op for key, op in ex.submitted if key == 0][-1] is Operation.CLOSE
    assert len([n for n, t in records.trials.items() if t["outcome"].launched]) == 1  # nothing new started


class _TwoWindowsAtTheEdge(ScriptedExecutor):
    """The script's capacity, except that 28 users' windows measure the given P90 TTFTs in turn
    (30 s is the limit), the first with a P90 interval that holds the limit: a marginal verdict."""

    def __init__(self, capacity: int, ttfts_s: tuple[float, float], interval_s: tuple[float, float]):
        super().__init__(capacity=lambda n: capacity)
        self.ttfts_s, self.interval_s = ttfts_s, interval_s
        self.seen_28: dict[int, int] = {}

    def wait(self, timeout_s=0.5):
        out = []
        for r in super().wait(timeout_s):
            if r.op is Operation.MEASURE and r.ok and r.value[0].users == 28:
                k = self.seen_28[r.key] = self.seen_28.get(r.key, 0) + 1
                m = load_point(28, self.ttfts_s[min(k, 2) - 1])
                if k == 1:
                    m = dataclasses.replace(m, extra={"p90_spread": {"ttft_s": list(self.interval_s)}})
                r = dataclasses.replace(r, value=(m, r.value[1]))
            out.append(r)
        return out


# a pass the second window takes away (1 s then 100 s: 50.5 s together), and a miss it gives back
# (40 s then 1 s: 20.5 s together); without confirmation the first window decides
@pytest.mark.parametrize("capacity, ttfts_s, interval_s, confirm, expected, points_at_28", [
    (30, (1.0, 100.0), (0.9, 40.0), False, 28, 1), (30, (1.0, 100.0), (0.9, 40.0), True, 24, 2),
    (26, (40.0, 1.0), (20.0, 45.0), False, 24, 1), (26, (40.0, 1.0), (20.0, 45.0), True, 28, 2)])
def test_a_marginal_verdict_is_measured_again_and_decided_with_both_windows(
        tmp_path, capacity, ttfts_s, interval_s, confirm, expected, points_at_28):
    ex = _TwoWindowsAtTheEdge(capacity, ttfts_s, interval_s)
    loop, records = _loop(tmp_path, ex, 1)
    loop.study = loop.study.model_copy(update={"capacity": loop.study.capacity.model_copy(
        update={"confirm_marginal": confirm})})
    loop.run()
    (trial,) = records.trials.values()
    assert trial["outcome"].capacity_users == expected
    measured = [args[0] for _, op, *args in ex.calls if op is Operation.MEASURE]
    assert measured.count(28) == points_at_28


class _PointsTakeLong(ScriptedExecutor):
    """Each load point reports ``point_wall_s`` of wall time, and the run's clock is moved on by as
    much when it comes back (the loop reads its own start time)."""

    def __init__(self, point_wall_s, **kw):
        super().__init__(**kw)
        self.point_wall_s, self.loop = point_wall_s, None

    def wait(self, timeout_s=0.5):
        out = []
        for r in super().wait(timeout_s):
            if r.op is Operation.MEASURE and r.ok:
                self.loop.started_at -= self.point_wall_s
                for rt in self.loop.running.values():
                    rt.started_at -= self.point_wall_s
                r = dataclasses.replace(r, value=(r.value[0], self.point_wall_s))
            out.append(r)
        return out


# capacity 30 from 4 by 4 takes six points (4, 8, 16, 32, 24, 28): at 100 s a point and a 1,000 s
# limit all six fit (600 s); at 300 s a point the fourth would end at 1,200 s, so it never starts
@pytest.mark.parametrize("point_wall_s, points, status", [(100.0, 6, TrialStatus.COMPLETE),
                                                          (300.0, 3, TrialStatus.INTERRUPTED)])
def test_a_load_point_that_would_end_past_the_time_limit_is_not_started(tmp_path, point_wall_s, points, status):
    ex = _PointsTakeLong(point_wall_s, capacity=lambda n: 30)
    loop, records = _loop(tmp_path, ex, 1, prune=False, time_limit_s=1000.0)
    ex.loop = loop
    loop.run()
    outcome = records.trials[0]["outcome"]
    measured = [args[0] for key, op, *args in ex.calls if key == 0 and op is Operation.MEASURE]
    assert len(measured) == points and outcome.status is status
    if status is TrialStatus.INTERRUPTED:
        assert "next load point takes about 300 s" in outcome.reason and "100 s are left" in outcome.reason
        assert [op for key, op in ex.submitted if key == 0][-1] is Operation.CLOSE
    else:
        assert outcome.capacity_users == 28


class _Graded(ScriptedExecutor):
    """P90 TTFT rising smoothly with users, crossing the 30 s limit at 45.5 users."""

    def wait(self, timeout_s=0.5):
        import math

        out = []
        for r in super().wait(timeout_s):
            if r.op is Operation.MEASURE and r.ok:
                users = r.value[0].users
                r = dataclasses.replace(r, value=(load_point(users, 30.0 * math.exp(0.04 * (users - 45.5))), r.value[1]))
            out.append(r)
        return out


def test_the_default_search_reads_the_p90s_inside_a_bracket(tmp_path):
    """The study's default bisection (interpolate) gets the loop's measured P90s: a capacity
    within the resolution, as the midpoint search's, in fewer load points."""
    found = {}
    for bisect in ("interpolate", "midpoint"):
        (tmp_path / bisect).mkdir()
        study = tiny_study(tmp_path / bisect, space=None, sampler="tpe", max_users=64,
                           **({} if bisect == "interpolate" else {"bisect": bisect}))
        assert study.capacity.bisect == bisect
        optuna = OptunaStudy.in_memory(make_sampler("tpe", 0))
        records = MemoryRecords()
        ex = _Graded(capacity=lambda n: 0)
        loop = TrialLoop(study, Proposer(study, optuna, 1), Ledger(records, optuna, backend_kind="simulator"), ex,
                         backend_kind="simulator", budget=1, gpus_needed=lambda request: 0, workdir=str(tmp_path),
                         seed=0, prune=False)
        loop.run()
        found[bisect] = (records.trials[0]["outcome"].capacity_users,
                         [args[0] for key, op, *args in ex.calls if op is Operation.MEASURE])
    assert found["midpoint"] == (44, [4, 8, 16, 32, 64, 48, 40, 44])
    # the crossing read from 32 and 46 users' P90s is 45.5: 42 (the resolution below the miss) closes it
    assert found["interpolate"] == (42, [4, 8, 16, 32, 64, 46, 42])


def test_a_trial_cut_by_the_time_limit_launches_no_new_one(tmp_path):
    """A trial whose next load point would overrun leaves no trial wall of its own; a fresh trial
    needs a deploy and a point as long as this run's points took (300 s), and 100 s are left."""
    ex = _PointsTakeLong(300.0, capacity=lambda n: 30)
    notices = []
    loop, records = _loop(tmp_path, ex, 3, prune=False, time_limit_s=1000.0,
                          on_event=lambda kind, data: notices.append(data.get("message", "")) if kind == "notice" else None)
    ex.loop = loop
    assert loop.run() is StopReason.TIME_LIMIT
    launched = [n for n, t in records.trials.items() if t["outcome"].launched]
    assert launched == [0] and records.trials[0]["outcome"].status is TrialStatus.INTERRUPTED
    assert any(m.startswith("no new trial") and "takes about 300 s" in m and "100 s are left" in m for m in notices)


@pytest.mark.parametrize("elapsed_s, launches", [(500.0, True), (520.0, False)])
def test_a_new_trial_needs_a_deploy_and_a_load_point_in_the_time_left(tmp_path, elapsed_s, launches):
    """Deploys of this run took 450 s (median), its points 10 s, under the window (10 s warm-up +
    30 s): a new trial needs 490 s, which 500 s left hold and 480 s do not."""
    import time

    loop, _ = _loop(tmp_path, ScriptedExecutor(capacity=lambda n: 30), 3, time_limit_s=1000.0)
    loop.deploy_walls_s, loop.point_walls_s = [400.0, 450.0, 900.0], [10.0]
    loop.started_at = time.time() - elapsed_s
    late = loop._new_trial_would_overrun()
    assert (late is None) is launches
    if not launches:
        assert "a trial takes about 490 s" in late and "480 s are left" in late


def test_simulated_windows_take_no_clock_time_from_the_limit(tmp_path):
    """A simulator run's windows (40 s here) are simulated in moments: a 5 s limit still runs
    its trials to their capacity."""
    ex = ScriptedExecutor(capacity=lambda n: 30)
    loop, records = _loop(tmp_path, ex, 2, prune=False, time_limit_s=5.0, windows_take_wall_time=False)
    assert loop.run() is StopReason.BUDGET_SPENT
    assert [t["outcome"].capacity_users for t in records.trials.values() if t["outcome"].launched] == [28, 28]
