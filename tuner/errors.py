"""Exception tree. It imports only the failure classes (tuner.lifecycle) a TrialError carries.

UserError and its subclasses print ``Error: <what>`` and exit 2 (bad input) or 1.
TrialError is a failed trial: recorded, never fatal to a study.
"""

from __future__ import annotations

from tuner.lifecycle import FailureClass


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

    ``failure_class`` is a FailureClass (or its value).
    """

    def __init__(self, failure_class: FailureClass | str, reason: str, *, log_path: str | None = None):
        try:
            failure_class = FailureClass(failure_class)
        except ValueError:
            raise ValueError(f"unknown failure class {failure_class!r}") from None
        self.failure_class = failure_class
        self.reason = reason
        self.log_path = log_path
        super().__init__(f"{failure_class}: {reason}")

    def __reduce__(self):  # picklable across Ray workers
        return (_rebuild_trial_error, (self.failure_class, self.reason, self.log_path))


def _rebuild_trial_error(failure_class, reason, log_path):
    return TrialError(failure_class, reason, log_path=log_path)

