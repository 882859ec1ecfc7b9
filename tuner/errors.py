"""Exception tree. No tuner imports here.

UserError and its subclasses print ``Error: <what>`` and exit 2 (bad input) or 1.
TrialError is a failed trial: recorded, never fatal to a study.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error tuner raises on purpose."""

    exit_code = 1


class UserError(TunerError):
    """Something the user can fix: printed as one message, no traceback."""

    exit_code = 1


class ConfigError(UserError):
    """Invalid input file, flag or combination. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        self.detail = message
        where = ""
        if file and key:
            where = f"{file}: {key}: "
        elif file:
            where = f"{file}: "
        elif key:
            where = f"{key}: "
        super().__init__(f"{where}{message}")


class StudyNotFoundError(UserError):
    exit_code = 2


class StorageError(UserError):
    exit_code = 2


class BackendUnavailableError(UserError):
    exit_code = 2


class TrialError(TunerError):
    """A trial failed: the server could not start, crashed, hung or ran out of memory.

    ``failure_class`` is one of FAILURE_CLASSES.
    """

    def __init__(self, failure_class: str, reason: str, *, log_path: str | None = None):
        if failure_class not in FAILURE_CLASSES:
            raise ValueError(f"unknown failure class {failure_class!r}")
        self.failure_class = failure_class
        self.reason = reason
        self.log_path = log_path
        super().__init__(f"{failure_class}: {reason}")

    def __reduce__(self):  # picklable across Ray workers
        return (_rebuild_trial_error, (self.failure_class, self.reason, self.log_path))


def _rebuild_trial_error(failure_class, reason, log_path):
    return TrialError(failure_class, reason, log_path=log_path)


FAILURE_CLASSES = (
    "infeasible",  # planner predicts it cannot fit / invalid combination
    "oom",  # out of memory at start or during the run
    "exit_at_start",  # server process exited before it became ready
    "startup_timeout",  # server did not become ready in time
    "crash",  # server died during the replay
    "hang",  # server stopped producing tokens
    "port_in_use",  # the server's port was taken
    "replay_invalid",  # too many request errors for the measurement to count
    "interrupted",  # the tuner process died mid-trial (found on resume)
    "internal",  # a bug in tuner itself
)
