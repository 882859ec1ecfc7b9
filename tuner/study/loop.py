"""The trial loop: launch proposals into free slots, advance each trial by the results its worker
returns, stop on the budget, an exhausted space or too many failures.

One round (``_round``) is three named phases, read top to bottom: launch, collect, check. A
launched trial moves through deploy -> measure (each load point of its capacity search) -> close;
after every load point it may be pruned (it can no longer beat the best). What to launch comes
from the proposer, every record and every ``tell`` goes through the ledger, and the executor only
runs operations and returns their results.

Trials run at once up to ``parallel`` and up to what the executor's resources hold (a CPU-only
trial that found no free CPU would wait for ever: Ray keeps an idle actor's CPU); the first
launch that meets the lower limit says so once (``on_event("notice")``). A run that ends by an
exception stops every running trial's servers (``executor.shutdown`` and ``reap_servers``); one
ended by Ctrl-C or another stop signal also records them as interrupted (``abandon``), and the
runner calls ``abandon`` itself after other faults once it has made room to write.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.errors import LeaseLostError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.capacity import CapacitySearch
from tuner.evaluation.prediction import predicted_capacity
from tuner.lifecycle import Operation, Outcome, StopReason, TrialStatus
from tuner.config.schema import StudySpec
from tuner.study.ledger import Ledger
from tuner.study.proposer import Proposal, Proposer, max_asks
from tuner.study.pruning import prune_reason, should_prune
from tuner.vocabulary import CapacityStart
from tuner.study.signals import StopSignal, signals_received, stop_signal

RESULT_WAIT_S = 0.5  # how long one round waits for a worker's result


def _median_s(walls_s: list[float]) -> float:
    """The median of this run's walls of one kind, 0 before there is any."""
    return statistics.median(walls_s) if walls_s else 0.0


@dataclass
class RunningTrial:
    proposal: Proposal
    search: CapacitySearch
    num_gpus: int
    started_at: float = field(default_factory=time.time)
    step: int = 0  # load points measured
    last_point_wall_s: float = 0.0  # how long its last measured load point took
    info: dict = field(default_factory=dict)  # what the deploy reported (placement, pids, KV)
    outcome: Outcome | None = None  # decided before the close, recorded after it


@dataclass
class TrialLoop:
    study: StudySpec
    proposer: Proposer
    ledger: Ledger
    executor: Any  # tuner.study.executor.InProcessExecutor | RayExecutor (submit, wait, shutdown)
    backend_kind: str
    budget: int  # launched trials, earlier runs of the study included
    gpus_needed: Callable[[TrialRequest], int]
    workdir: str  # the study's trial directories are under it (backends add trial-NNNN)
    seed: int
    parallel: int = 1
    max_failures: int | None = None
    prune: bool = True
    # wall-clock budget of this run: no trial starts that this run's own trials say cannot finish
    # in the time left, no load point starts that cannot end before it, and at the limit running
    # trials close after their current load point
    time_limit_s: float | None = None
    windows_take_wall_time: bool = True  # False: the backend simulates its windows (no clock time)
    # stops the servers of a running trial by recorded identity, returns the PIDs it killed (the
    # executor's shutdown may leave them: a killed Ray actor never runs its trial's teardown)
    reap_servers: Callable[[int, dict], list[int]] | None = None
    on_event: Callable[[str, dict], None] = lambda kind, data: None
    lease_lost: threading.Event | None = None  # set when another driver took the study over
    stop: StopReason | None = None
    running: dict[int, RunningTrial] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    trial_walls_s: list[float] = field(default_factory=list)  # launched trials of this run that ended
    deploy_walls_s: list[float] = field(default_factory=list)  # launch to ready, trials of this run
    point_walls_s: list[float] = field(default_factory=list)  # load points of this run, warm-up included
    winding_down: str | None = None  # why running trials close early (the time limit ran out)
    slots: int | None = None  # trials at once: min(parallel, what the resources hold), once known
    reaped: dict[int, list[int]] = field(default_factory=dict)  # trial -> server PIDs stopped by reaping
    interrupted: list[int] = field(default_factory=list)  # trials ``abandon`` recorded as interrupted
    _shut_down: bool = False

    def run(self) -> StopReason:
        try:
            while self._round():
                pass
        except KeyboardInterrupt as exc:
            self.stop = StopReason.INTERRUPTED
            self.abandon(stop_signal(exc).reason if isinstance(exc, StopSignal) or signals_received()
                         else "interrupted by the user")
            raise
        except BaseException:
            self.shut_down()  # the servers stop now; the runner records what it can
            raise
        self.shut_down()
        return self.stop or StopReason.BUDGET_SPENT

    # ---------------------------------------------------------------- an early end
    def shut_down(self) -> None:
        """Stop the executor and every running trial's servers (idempotent); records nothing."""
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self.executor.shutdown()
        finally:
            if self.reap_servers is not None:
                for number, rt in list(self.running.items()):
                    self.reaped[number] = self.reap_servers(number, rt.info)

    def abandon(self, reason: str) -> tuple[list[int], list[int]]:
        """Stop the servers and record every running trial as interrupted (``reason``); returns
        (trials recorded, trials whose record failed: a resume records them)."""
        self.shut_down()
        recorded, failed = [], []
        for number, rt in sorted(self.running.items()):
            try:
                self._finish(rt, Outcome.interrupted(reason))
                recorded.append(number)
            except Exception:  # the database may be what failed; the next driver records it
                failed.append(number)
        self.interrupted += recorded
        return recorded, failed

    def _round(self) -> bool:
        """Check the clock, launch, collect, check; False once nothing runs and nothing more will be launched."""
        if self.lease_lost is not None and self.lease_lost.is_set():
            raise LeaseLostError(f"another driver took study {self.study.name!r} over (this driver's lease "
                                 f"heartbeat had stalled); this driver stopped its trial servers and wrote nothing more")
        self._check_time_limit()
        self._launch_into_free_slots()
        if not self.running:
            return False
        for result in self.executor.wait(timeout_s=RESULT_WAIT_S):
            self._advance(result)
        self._check_failure_limit()
        return True

    # ---------------------------------------------------------------- launch
    def _launch_into_free_slots(self) -> None:
        while (self.stop is None and self.ledger.counters.launched < self.budget
               and len(self.running) < (self.slots or self.parallel)):
            if (late := self._new_trial_would_overrun()) is not None:
                self.stop = StopReason.TIME_LIMIT  # running trials finish, no new ones start
                self.on_event("notice", {"message": late})
                return
            if self.proposer.asks >= max_asks(self.budget):
                self.stop = StopReason.SPACE_EXHAUSTED
                return
            proposal = self.proposer.propose()
            if proposal.launch:
                self._launch(proposal)
            else:
                self.ledger.settle(proposal)

    def _launch(self, p: Proposal) -> None:
        request = TrialRequest(study=self.study, trial_number=p.number, flags=p.flags, knobs=p.knobs,
                               workdir=self.workdir, seed=self.seed + p.number)
        num_gpus = self.gpus_needed(request)
        self._fit_slots(num_gpus)
        self.ledger.started(p)
        self.running[p.number] = RunningTrial(p, self._capacity_search(p), num_gpus)
        self.executor.submit(p.number, Operation.DEPLOY, self.backend_kind, request, num_gpus=num_gpus)

    def _capacity_search(self, p: Proposal) -> CapacitySearch:
        """The trial's capacity search: from the study's start_users, or from the simulator's prediction."""
        if self.study.capacity.start != CapacityStart.SIMULATOR:
            return CapacitySearch.for_study(self.study)
        users, basis = predicted_capacity(self.study, p.flags, p.knobs, seed=self.seed + p.number)
        search = CapacitySearch.for_study(self.study, predicted_users=users)
        self.ledger.search_starts(p, search.next_users(), basis if users is not None else
                                  f"start_users: {basis}")
        return search

    def _fit_slots(self, num_gpus: int) -> None:
        """At the first launch: how many trials of this size the executor holds at once; fewer
        than ``parallel`` is said once, and the loop runs that many."""
        if self.slots is not None:
            return
        fits = getattr(self.executor, "concurrent_trials", None)
        limit = fits(num_gpus) if fits is not None else None
        if limit is None or limit[0] >= self.parallel:
            self.slots = self.parallel
            return
        self.slots = max(1, limit[0])
        self.on_event("notice", {"message": f"--parallel {self.parallel} is more than the resources allow: "
                                            f"{limit[1]}; running {self.slots} trial(s) at a time"})

    # ---------------------------------------------------------------- collect
    def _advance(self, result) -> None:
        """One operation's result moves its trial to the next operation (or to its end)."""
        rt = self.running.get(result.key)
        if rt is None:
            return
        if result.op == Operation.CLOSE:  # recorded whether or not the teardown reported anything
            self.ledger.closed(rt.proposal, rt.info, result.value if result.ok else None)
            self._finish(rt, rt.outcome)
        elif not result.ok:
            err = result.error
            self._finish(rt, Outcome.failure(err.failure_class, err.reason, err.log_path))
        elif result.op == Operation.DEPLOY:
            rt.info = result.value or {}
            self.deploy_walls_s.append(time.time() - rt.started_at)
            self.ledger.deployed(rt.proposal, rt.info)
            self._next_load_point(rt)
        else:
            self._measured(rt, *result.value)

    def _measured(self, rt: RunningTrial, metrics, wall_time_s: float) -> None:
        passed = rt.search.meets(metrics)
        rt.search.record(metrics.users, passed, marginal=rt.search.marginal(metrics), point=metrics)
        self.ledger.measured(rt.proposal, rt.step, metrics, passed, wall_time_s, rt.search.capacity_users)
        rt.step += 1
        rt.last_point_wall_s = wall_time_s
        self.point_walls_s.append(wall_time_s)
        incumbent = self.ledger.incumbent_users
        if self.prune and not rt.proposal.is_baseline and should_prune(rt.search, incumbent):
            self._close(rt, Outcome.pruned(rt.search.capacity_users, prune_reason(rt.search, incumbent)))
        else:
            self._next_load_point(rt)

    def _next_load_point(self, rt: RunningTrial) -> None:
        users = rt.search.next_users()
        if users is None:  # the search has its answer, whatever the clock says
            self._close(rt, Outcome.complete(rt.search.capacity_users))
        elif self.winding_down:  # the run's time is up: keep what was measured, free the GPUs
            self._close(rt, Outcome.interrupted(self.winding_down))
        elif (late := self._point_would_overrun(rt)) is not None:
            self._close(rt, Outcome.interrupted(late))
        else:
            self.executor.submit(rt.proposal.number, Operation.MEASURE, users)

    def _close(self, rt: RunningTrial, outcome: Outcome) -> None:
        rt.outcome = outcome
        self.executor.submit(rt.proposal.number, Operation.CLOSE)

    def _finish(self, rt: RunningTrial, outcome: Outcome) -> None:
        self.running.pop(rt.proposal.number, None)
        if outcome.status.measured or outcome.status == TrialStatus.FAILED:
            self.trial_walls_s.append(time.time() - rt.started_at)
        self.ledger.finish(rt.proposal, outcome)
        self.proposer.learn(rt.proposal, outcome)

    def _point_would_overrun(self, rt: RunningTrial) -> str | None:
        """Why the trial's next load point is not started: it would end past the time limit (its
        warm-up and window, or as long as this trial's last point took when that was longer); None
        when it fits. A point begun at the limit's edge would hold the GPU a whole window past it."""
        if self.time_limit_s is None:
            return None
        expected_s = max(self._window_s(rt.step), rt.last_point_wall_s)
        left_s = self._time_left_s()
        if expected_s <= left_s:
            return None
        return (f"time limit of {self.time_limit_s:g} s: the next load point takes about {expected_s:.0f} s "
                f"and {max(0.0, left_s):.0f} s are left")

    def _time_left_s(self) -> float:
        return self.time_limit_s - (time.time() - self.started_at)

    def _window_s(self, step: int) -> float:
        """Clock time of a load point's warm-up and window at this step of a search (0 where the
        backend simulates them)."""
        if not self.windows_take_wall_time:
            return 0.0
        m = self.study.measurement
        return m.warmup_for(step) + float(m.duration_s)

    # ---------------------------------------------------------------- check
    def _check_failure_limit(self) -> None:
        if self.stop is None and self.max_failures is not None and self.ledger.counters.failed >= self.max_failures:
            self.stop = StopReason.MAX_FAILURES  # running trials finish, no new ones start

    def _check_time_limit(self) -> None:
        if self.time_limit_s is None or self.winding_down is not None:
            return
        if self._time_left_s() <= 0:
            self.stop = self.stop or StopReason.TIME_LIMIT
            self.winding_down = f"time limit of {self.time_limit_s:g} s reached"

    def _new_trial_would_overrun(self) -> str | None:
        """Why no trial is launched now: it would end past the time limit; None when it fits. A
        trial takes as long as this run's trials took (their median), and never less than a deploy
        and one load point (as long as this run's took, the point at least its window): a trial
        closed because its next point did not fit leaves no wall of its own, and a fresh one
        needs more than that point."""
        if self.time_limit_s is None:
            return None
        floor_s = max(self._window_s(0), _median_s(self.point_walls_s)) + _median_s(self.deploy_walls_s)
        expected_s = max(_median_s(self.trial_walls_s), floor_s)
        left_s = self._time_left_s()
        if expected_s <= left_s:
            return None
        return (f"no new trial: time limit of {self.time_limit_s:g} s: a trial takes about {expected_s:.0f} s "
                f"and {max(0.0, left_s):.0f} s are left")
