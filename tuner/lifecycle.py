"""The trial lifecycle, in types: statuses, operations, why a study stops, how a trial ended.

A proposed configuration is either settled at once without launching (a constraint fails, the
planner screens it out: ``infeasible``) or launched. A launched trial runs the operations
``deploy``, ``measure`` (once per load point of its capacity search) and ``close``, and ends
``complete``, ``pruned`` (stopped early: it could not beat the best), ``infeasible`` (it cannot
run: the backend refused it), ``failed`` (it crashed, ran out of memory, hung ...) or
``interrupted`` (the tuner process died or was stopped during it). docs/architecture.md draws it.

Everything here is a ``StrEnum``: members compare equal to, and are stored as, their values.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.vocabulary import StrEnum


class FailureClass(StrEnum):
    """Why a trial did not produce a capacity (``TrialError.failure_class``)."""

    INFEASIBLE = "infeasible"  # planner predicts it cannot fit / invalid combination
    OOM = "oom"  # out of memory at start or during the run
    EXIT_AT_START = "exit_at_start"  # server process exited before it became ready
    STARTUP_TIMEOUT = "startup_timeout"  # server did not become ready in time
    CRASH = "crash"  # server died during the replay
    HANG = "hang"  # server stopped producing tokens
    PORT_IN_USE = "port_in_use"  # the server's port was taken
    REPLAY_INVALID = "replay_invalid"  # too many request errors for the measurement to count
    INTERRUPTED = "interrupted"  # the tuner process died mid-trial (found on resume)
    INTERNAL = "internal"  # a bug in tuner itself


class TrialStatus(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"  # its capacity search ran to the end
    PRUNED = "pruned"  # stopped early; its capacity is a lower bound that cannot beat the best
    INFEASIBLE = "infeasible"  # cannot run: constraint, planner or backend said so (capacity 0)
    FAILED = "failed"  # launched and failed (failure_class says how)
    INTERRUPTED = "interrupted"  # the tuner process died or was stopped during it

    def is_finished(self) -> bool:
        return self is not TrialStatus.RUNNING

    @property
    def measured(self) -> bool:
        """Its capacity (complete) or a lower bound of it (pruned) is known."""
        return self in (TrialStatus.COMPLETE, TrialStatus.PRUNED)


class StudyStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"  # the budget is spent, or the space has nothing new to try
    STOPPED = "stopped"  # stopped before that (too many failures, interrupted)


class Operation(StrEnum):
    """What the driver asks a trial's worker to do (tuner.study.executor)."""

    DEPLOY = "deploy"
    MEASURE = "measure"
    CLOSE = "close"


class StopReason(StrEnum):
    """Why a study's run ended; decides the study's status and the CLI's exit code."""

    BUDGET_SPENT = "budget_spent"
    SPACE_EXHAUSTED = "space_exhausted"  # many asks in a row proposed nothing new to launch
    MAX_FAILURES = "max_failures"  # --max-failures reached
    INTERRUPTED = "interrupted"  # Ctrl-C
    TIME_LIMIT = "time_limit"  # --time-limit: no trial could finish in the time left, or it ran out
    STORAGE_FAULT = "storage_fault"  # the study database could not be written (disk full, ...)

    @property
    def study_status(self) -> StudyStatus:
        if self in (StopReason.BUDGET_SPENT, StopReason.SPACE_EXHAUSTED):
            return StudyStatus.FINISHED
        return StudyStatus.STOPPED

    @property
    def exit_code(self) -> int:
        return {StopReason.MAX_FAILURES: 1, StopReason.INTERRUPTED: 130, StopReason.STORAGE_FAULT: 3}.get(self, 0)

    def message(self, *, study: str, failed: int = 0, max_failures: int | None = None) -> str | None:
        """The sentence shown to the user (None when the budget was simply spent)."""
        if self is StopReason.SPACE_EXHAUSTED:
            return "the search space has no more new feasible configurations to try"
        if self is StopReason.MAX_FAILURES:
            return (f"stopped after {failed} failed trials (--max-failures {max_failures}); "
                    f"see `tuner study status {study}` for the reasons")
        if self is StopReason.INTERRUPTED:
            return "interrupted by the user"
        if self is StopReason.TIME_LIMIT:
            return "time limit reached: resume the study to continue"
        if self is StopReason.STORAGE_FAULT:
            return f"the study database could not be written; resume the study (`tuner study resume {study}`) once it can"
        return None


@dataclass(frozen=True)
class Outcome:
    """How one trial ended: what the ledger records and what Optuna is told."""

    status: TrialStatus
    capacity_users: int | None = None
    failure_class: FailureClass | None = None
    reason: str | None = None
    log_path: str | None = None
    launched: bool = True
    screened_by_planner: bool = False

    def __post_init__(self):  # values read back from storage become members
        object.__setattr__(self, "status", TrialStatus(self.status))
        if self.failure_class is not None:
            object.__setattr__(self, "failure_class", FailureClass(self.failure_class))

    @classmethod
    def complete(cls, capacity_users: int) -> "Outcome":
        return cls(TrialStatus.COMPLETE, capacity_users)

    @classmethod
    def pruned(cls, capacity_users: int, reason: str) -> "Outcome":
        return cls(TrialStatus.PRUNED, capacity_users, reason=reason)

    @classmethod
    def failure(cls, failure_class: FailureClass | str, reason: str, log_path: str | None = None) -> "Outcome":
        """A launched trial that raised ``TrialError``: infeasible (capacity 0) or failed."""
        fc = FailureClass(failure_class)
        if fc is FailureClass.INFEASIBLE:
            return cls(TrialStatus.INFEASIBLE, 0, fc, reason, log_path)
        return cls(TrialStatus.FAILED, None, fc, reason, log_path)

    @classmethod
    def interrupted(cls, reason: str) -> "Outcome":
        return cls(TrialStatus.INTERRUPTED, None, FailureClass.INTERRUPTED, reason)

    @classmethod
    def not_launched(cls, reason: str, *, screened_by_planner: bool = False) -> "Outcome":
        """Settled without launching: a constraint fails or the planner screens it out."""
        return cls(TrialStatus.INFEASIBLE, 0, FailureClass.INFEASIBLE, reason, launched=False,
                   screened_by_planner=screened_by_planner)

    @property
    def objective_value(self) -> float:
        """What Optuna is told (a failure counts as 0 users, with a violated constraint)."""
        return float(self.capacity_users or 0)


def config_key(values: dict) -> str:
    """What makes two launches the same configuration: equal knob values, unset (None) knobs
    dropping out. The proposer's duplicates and the study's repeats use it alike."""
    return repr(sorted((k, v) for k, v in values.items() if v is not None))


__all__ = ["FailureClass", "Operation", "Outcome", "StopReason", "StudyStatus", "TrialStatus", "config_key"]
