"""The ledger: the one writer of a study's records and the one caller of Optuna's ``tell``.

Everything the driver learns goes through it: a proposal settled without launching, a trial
started, deployed, measured, closed and finished, a trial a dead driver left behind. It writes our
rows (through ``Records``), tells Optuna (through ``OptunaStudy``), keeps the study's counters and
the best capacity so far (the pruning threshold), and reports each event to ``on_event`` (the
progress display). Workers never write: they return results to the driver, which hands them here.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from tuner.errors import StorageFaultError
from tuner.lifecycle import Outcome, StopReason, TrialStatus
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Decision, Proposal
from tuner.study.samplers import mark_feasible
from tuner.study.signals import deferred
from tuner.workload.metrics import LoadPointMetrics

log = logging.getLogger(__name__)


class Records(Protocol):
    """Where the ledger writes one study's rows (tuner.storage.repo.StudyRecords in a database)."""

    def create_study(self, **fields: Any) -> None: ...
    def start_trial(self, **fields: Any) -> None: ...
    def update_trial(self, trial_number: int, **fields: Any) -> None: ...
    def finish_trial(self, trial_number: int, outcome: Outcome, **fields: Any) -> None: ...
    def add_measurement(self, **fields: Any) -> None: ...
    def set_status(self, status) -> None: ...
    def set_budget(self, trials_budget: int) -> None: ...
    def delete_new_study(self, lease_token: str) -> None: ...
    def running_trial_numbers(self) -> list[int]: ...


@dataclass
class Counters:
    launched: int = 0  # trials started (the budget counts these), earlier runs of the study included
    failed: int = 0
    infeasible: int = 0  # constraint, planner or backend said it cannot run
    prescreened: int = 0  # of those, screened out by the planner without launching
    duplicates: int = 0
    pruned: int = 0
    enqueued: int = 0  # configurations asked from the queue (warm start, seeds, grid)


# what a deploy result leaves in the trial's telemetry: where it ran and what it started
PLACEMENT_KEYS = ("node", "ray_node_id", "cuda_visible_devices", "gpu_ids", "process_identities")


def placement(info: dict) -> dict:
    return {k: info[k] for k in PLACEMENT_KEYS if info.get(k) is not None}


def jsonable(d: dict) -> dict:
    """JSON-safe copy (numpy scalars -> Python, anything else -> its text)."""
    return json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _uninterrupted(method):
    """A ledger write runs to its end before a stop signal is raised (``signals.deferred``)."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        with deferred():
            return method(self, *args, **kwargs)
    return write


class Ledger:
    def __init__(self, records: Records, optuna: OptunaStudy | None, *, backend_kind: str,
                 on_event: Callable[[str, dict], None] | None = None, counters: Counters | None = None,
                 incumbent_users: int | None = None):
        self.records = records
        self.optuna = optuna
        self.backend_kind = backend_kind
        self.on_event = on_event or (lambda kind, data: None)
        self.counters = counters or Counters()
        self.incumbent_users = incumbent_users  # best capacity of a completed trial

    # ---------------------------------------------------------------- the study
    @_uninterrupted
    def create_study(self, **fields: Any) -> None:
        self.records.create_study(**fields)

    @_uninterrupted
    def conclude(self, stop: StopReason) -> None:
        self.records.set_status(stop.study_status)

    @_uninterrupted
    def set_budget(self, trials_budget: int) -> None:
        """``resume --trials N``: the study's budget from now on."""
        self.records.set_budget(trials_budget)

    @_uninterrupted
    def discard_new_study(self, lease_token: str) -> None:
        """A start that could not finish creating the study takes back what it wrote."""
        self.records.delete_new_study(lease_token)

    # ---------------------------------------------------------------- proposals
    @_uninterrupted
    def settle(self, proposal: Proposal) -> None:
        """A proposal the loop does not launch: told now, recorded if it is a trial of its own."""
        self._annotate(proposal)
        if proposal.from_queue:
            self.counters.enqueued += 1
        if proposal.decision is Decision.DUPLICATE_RUNNING:
            self.counters.duplicates += 1
            self.optuna.tell_pruned(proposal.trial)  # the same configuration is running: ask again later
            return
        if proposal.decision is Decision.DUPLICATE:
            self.counters.duplicates += 1
            capacity = proposal.duplicate_capacity_users
            proposal.trial.set_user_attr("duplicate", True)
            mark_feasible(proposal.trial, capacity > 0)
            self.optuna.tell_value(proposal.trial, float(capacity))
            return
        outcome = proposal.not_launched_outcome()
        self.counters.infeasible += 1
        if outcome.screened_by_planner:
            self.counters.prescreened += 1
        self._start_row(proposal)
        self.records.finish_trial(proposal.number, outcome)
        mark_feasible(proposal.trial, False)
        proposal.trial.set_user_attr("failure", outcome.reason)
        self.optuna.tell_value(proposal.trial, outcome.objective_value)
        self.on_event("trial_end", {"number": proposal.number, "status": outcome.status,
                                    "capacity": outcome.capacity_users, "reason": outcome.reason, "launched": False})

    @_uninterrupted
    def started(self, proposal: Proposal) -> None:
        self._annotate(proposal)
        if proposal.from_queue:
            self.counters.enqueued += 1
        self.counters.launched += 1
        self._start_row(proposal)
        self.on_event("trial_start", {"number": proposal.number, "config": proposal.values,
                                      "baseline": proposal.is_baseline, "repeat_of": proposal.repeat_of,
                                      "repeat_changes": proposal.repeat_changes})

    @_uninterrupted
    def search_starts(self, proposal: Proposal, users: int, basis: str) -> None:
        """Where the trial's capacity search starts, and why (a guided start is a prediction)."""
        proposal.trial.set_user_attr("capacity_search_start", {"users": users, "basis": basis})
        self.on_event("capacity_start", {"number": proposal.number, "users": users, "basis": basis})

    # ---------------------------------------------------------------- a launched trial
    @_uninterrupted
    def deployed(self, proposal: Proposal, info: dict) -> None:
        predicted = info.get("predicted_kv_capacity_tokens_total")
        self.records.update_trial(
            proposal.number, pids=info.get("pids", []), gpu_ids=info.get("gpu_ids", []),
            telemetry=jsonable({**(info.get("startup") or {}), **placement(info)}), log_path=info.get("log_path"),
            # live backends predict nothing: keep the planner's figure from the start
            **({"predicted_kv_capacity_tokens": predicted} if predicted is not None else {}),
            measured_kv_capacity_tokens=info.get("measured_kv_capacity_tokens_total"))

    @_uninterrupted
    def measured(self, proposal: Proposal, step: int, metrics: LoadPointMetrics, passed: bool, wall_time_s: float,
                 capacity_users: int) -> None:
        """Load point ``step`` of the capacity search; ``capacity_users``: the search's result so far."""
        self.records.add_measurement(trial_number=proposal.number, step=step, backend_kind=self.backend_kind,
                                     metrics=metrics, meets_slo=passed, wall_time_s=wall_time_s)
        try:
            proposal.trial.report(float(capacity_users), step + 1)
        except StorageFaultError:  # the database cannot be written: the study stops, whatever the write was
            raise
        except Exception:  # an intermediate value is informative; the trial goes on without it
            log.debug("report failed", exc_info=True)
        self.on_event("measurement", {"number": proposal.number, "users": metrics.users, "passed": passed,
                                      "p90_ttft_s": metrics.p90_ttft_s, "p90_tpot_s": metrics.p90_tpot_s})

    @_uninterrupted
    def closed(self, proposal: Proposal, deploy_info: dict, teardown_telemetry: dict | None) -> None:
        if teardown_telemetry:
            self.records.update_trial(proposal.number,
                                      telemetry=jsonable({**placement(deploy_info), **teardown_telemetry}))

    @_uninterrupted
    def finish(self, proposal: Proposal, outcome: Outcome) -> None:
        """A launched trial ended: counted, recorded, told."""
        if outcome.status is TrialStatus.COMPLETE:
            self.incumbent_users = max(self.incumbent_users or 0, outcome.capacity_users or 0)
        elif outcome.status is TrialStatus.PRUNED:
            self.counters.pruned += 1
        elif outcome.status is TrialStatus.FAILED:
            self.counters.failed += 1
        elif outcome.status is TrialStatus.INFEASIBLE:
            self.counters.infeasible += 1
        self.records.finish_trial(proposal.number, outcome)
        trial = proposal.trial
        if outcome.status is TrialStatus.INTERRUPTED:
            self.optuna.tell_failed(trial)
        else:
            mark_feasible(trial, outcome.status.measured)
            if outcome.status is TrialStatus.PRUNED:
                trial.set_user_attr(TrialStatus.PRUNED.value, outcome.reason)  # why it was pruned
            elif outcome.reason:
                trial.set_user_attr("failure", f"{outcome.failure_class}: {outcome.reason}")
            self.optuna.tell_value(trial, outcome.objective_value)
        self.on_event("trial_end", {"number": proposal.number, "status": outcome.status,
                                    "capacity": outcome.capacity_users, "reason": outcome.reason,
                                    "failure_class": outcome.failure_class, "launched": True,
                                    "baseline": proposal.is_baseline})

    # ---------------------------------------------------------------- resume
    @_uninterrupted
    def interrupted_by_dead_driver(self, trial_number: int, reason: str, telemetry: dict) -> None:
        """A trial a dead driver left running (its Optuna trial is failed first)."""
        self.records.finish_trial(trial_number, Outcome.interrupted(reason), telemetry=telemetry)

    @_uninterrupted
    def close_out(self, reason: str) -> list[int]:
        """Before the driver lets the study go: no trial of it may stay running, ours or Optuna's
        (a stop that came between recording a trial's end and telling Optuna leaves one)."""
        left = self.records.running_trial_numbers()
        for number in left:
            self.records.finish_trial(number, Outcome.interrupted(reason))
        if self.optuna is not None:
            self.optuna.fail_running_trials()
        return left

    # ---------------------------------------------------------------- helpers
    def _annotate(self, proposal: Proposal) -> None:
        if proposal.is_baseline:
            proposal.trial.set_user_attr("baseline", True)
        proposal.trial.set_user_attr("config", dict(proposal.values))
        if proposal.repeat_of is not None:
            proposal.trial.set_user_attr("repeat_of", proposal.repeat_of)
        if proposal.repeat_changes:
            proposal.trial.set_user_attr("repeat_changes", dict(proposal.repeat_changes))

    def _start_row(self, proposal: Proposal) -> None:
        self.records.start_trial(
            trial_number=proposal.number, optuna_trial_id=OptunaStudy.trial_id(proposal.trial),
            backend_kind=self.backend_kind, params=proposal.values, flags=proposal.flags, knobs=proposal.knobs,
            is_baseline=proposal.is_baseline, predicted_kv_capacity_tokens=proposal.predicted_kv_capacity_tokens)

    def summary(self) -> dict:
        return asdict(self.counters)
