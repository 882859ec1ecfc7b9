"""Exception tree. It imports only the failure classes (tuner.lifecycle) a TrialError carries.

UserError and its subclasses print ``Error: <what>`` and exit with their ``exit_code``:
1 (a study that kept failing, other user errors), 2 (bad input: file, flag, storage URL, schema),
3 (a storage fault: the database could not be read or written), 4 (the study is driven by another
process). A study stopped by a signal exits 128 + the signal's number (130 for Ctrl-C).
TrialError is a failed trial: recorded, never fatal to a study.
"""

from __future__ import annotations

from tuner.lifecycle import FailureClass
from tuner.vocabulary import StrEnum


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
    """The storage cannot be used as given: bad URL, unreachable, missing, schema of another tuner."""

    exit_code = 2


class StorageFault(StrEnum):
    """What went wrong reading or writing the study database (``StorageFaultError.fault``)."""

    DISK_FULL = "disk_full"
    CORRUPT = "corrupt"  # damaged pages
    NOT_A_DATABASE = "not_a_database"  # not SQLite at all (or its first page is damaged): exit 2
    READ_ONLY = "read_only"  # the file, its directory or its file system cannot be written
    PERMISSION = "permission"  # the file or its directory cannot be opened
    LOCKED = "locked"  # another process held the database past the busy timeout
    IO = "io"  # any other I/O error of the database


class StorageFaultError(StorageError):
    """The study database could not be read or written. Exit code 3."""

    exit_code = 3

    def __init__(self, fault: StorageFault | str, message: str):
        self.fault = StorageFault(fault)
        if self.fault is StorageFault.NOT_A_DATABASE:  # most often a --storage naming the wrong file
            self.exit_code = 2
        super().__init__(message)


class DriverBusyError(UserError):
    """Another live process drives the study (its driver lease is held). Exit code 4."""

    exit_code = 4


class LeaseLostError(DriverBusyError):
    """Another driver took this driver's study over (its heartbeat had stalled past the lease)."""


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

