"""The one place tuner reaches into Optuna: opening studies on our storage, heartbeats, trial ids
and trial states. The proposer asks through it, the ledger tells through it; neither touches
Optuna's private attributes (``Study._storage``, ``Trial._trial_id``).

Optuna is imported inside the functions that need the module: it costs a second of start-up that
commands such as ``tuner --help`` must not pay.
"""

from __future__ import annotations

import logging
import os
import random
import time
import warnings
from typing import Any

from tuner.errors import UserError
from tuner.storage import db, faults

log = logging.getLogger(__name__)

# A trial whose heartbeat is older than the grace period belongs to a dead driver (resume takes it
# over). TUNER_HEARTBEAT_GRACE_S shortens it, e.g. for tests that kill a driver and resume at once.
HEARTBEAT_GRACE_S = max(2, int(os.environ.get("TUNER_HEARTBEAT_GRACE_S", "30")))
HEARTBEAT_INTERVAL_S = max(1, min(10, HEARTBEAT_GRACE_S // 3))


def quiet_optuna():
    """Optuna, with its per-trial log lines and experimental-feature warnings silenced."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def rdb_storage(url: str):
    """Optuna's RDB storage on the study database, with heartbeats (for trials of drivers of
    older tuners, which took no lease), its engine's faults translated like ours. Creating
    Optuna's tables is retried: several first starts on a fresh database race to create them."""
    optuna = quiet_optuna()
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

    kwargs: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": HEARTBEAT_GRACE_S}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": db.SQLITE_BUSY_TIMEOUT_MS / 1000}}
    for attempt in range(db.SCHEMA_CREATE_ATTEMPTS):
        try:
            storage = optuna.storages.RDBStorage(db.sqlalchemy_url(url), **kwargs)
            break
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            fault = faults.fault_of(getattr(exc, "orig", exc), db.sqlite_path(url))
            if fault is not None:
                raise faults.fault_error(fault, db.describe(url), exc.orig, db.sqlite_path(url)) from None
            created_meanwhile = isinstance(exc, IntegrityError) or "already exists" in str(exc).lower() \
                or "duplicate" in str(exc).lower()
            if attempt == db.SCHEMA_CREATE_ATTEMPTS - 1 or not created_meanwhile:
                raise
            time.sleep(random.uniform(0.02, 0.2))
        except SQLAlchemyError as exc:
            fault = faults.fault_of(getattr(exc, "orig", exc), db.sqlite_path(url))
            if fault is None:
                raise
            raise faults.fault_error(fault, db.describe(url), exc.orig, db.sqlite_path(url)) from None
    db.watch(storage.engine, url)
    return storage


class OptunaStudy:
    """An Optuna study as the study driver uses it (ask/tell interface, maximising capacity)."""

    def __init__(self, study):
        self.study = study

    # ---------------------------------------------------------------- opening
    @classmethod
    def create(cls, name: str, storage_url: str, sampler) -> "OptunaStudy":
        """A new study; UserError when one of that name exists (a concurrent start made it)."""
        optuna = quiet_optuna()
        try:
            return cls(optuna.create_study(study_name=name, storage=rdb_storage(storage_url),
                                           direction="maximize", sampler=sampler))
        except optuna.exceptions.DuplicatedStudyError:
            raise UserError(f"study {name!r} already exists in {db.describe(storage_url)}; continue it with "
                            f"`tuner study resume {name}` or choose another storage") from None

    @classmethod
    def load(cls, name: str, storage_url: str, sampler) -> "OptunaStudy":
        optuna = quiet_optuna()
        return cls(optuna.load_study(study_name=name, storage=rdb_storage(storage_url), sampler=sampler))

    @classmethod
    def load_or_create(cls, name: str, storage_url: str, sampler) -> "OptunaStudy":
        """The study, created when missing: a start that died between writing tuner's study row
        and Optuna's leaves a study with no Optuna side and no trials yet."""
        optuna = quiet_optuna()
        storage = rdb_storage(storage_url)
        return cls(optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=sampler,
                                       load_if_exists=True))

    @classmethod
    def in_memory(cls, sampler) -> "OptunaStudy":
        """A study that lives only in this process (dry runs, tests)."""
        optuna = quiet_optuna()
        return cls(optuna.create_study(direction="maximize", sampler=sampler))

    # ---------------------------------------------------------------- asking
    def ask(self):
        """A new trial (the next enqueued configuration first, if any). On a storage with
        heartbeats its first heartbeat is recorded at once: Optuna never counts a trial without
        any heartbeat as stale, so a driver killed before its first beat would leave a trial that
        no resume could take over."""
        with warnings.catch_warnings():
            # we record heartbeats ourselves (ask/tell, not Study.optimize)
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        try:
            self.heartbeat(trial)
        except Exception:
            log.debug("first heartbeat failed", exc_info=True)
        return trial

    def enqueue(self, params: dict, *, skip_if_exists: bool = True) -> None:
        self.study.enqueue_trial(params, skip_if_exists=skip_if_exists)

    def heartbeat(self, trial) -> None:
        record = getattr(self.study._storage, "record_heartbeat", None)  # RDB storage only
        if record is not None:
            record(trial._trial_id)

    @staticmethod
    def trial_id(trial) -> int:
        """Optuna's storage id of the trial (recorded with our row, links the two tables)."""
        return trial._trial_id

    # ---------------------------------------------------------------- telling
    def tell_value(self, trial, value: float) -> None:
        self.study.tell(trial, value)

    def tell_failed(self, trial) -> None:
        optuna = quiet_optuna()
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def tell_pruned(self, trial) -> None:
        optuna = quiet_optuna()
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    # ---------------------------------------------------------------- resuming
    def fail_stale_trials(self) -> None:
        """Trials whose heartbeat stopped (their driver died) become FAIL."""
        optuna = quiet_optuna()
        optuna.storages.fail_stale_trials(self.study)

    def fail_running_trials(self) -> list[int]:
        """Every running trial becomes FAIL (their driver is known dead: its lease says so).
        Returns their numbers."""
        optuna = quiet_optuna()
        failed = []
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            try:
                if self.study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL):
                    failed.append(t.number)
            except optuna.exceptions.UpdateFinishedTrialError:  # finished meanwhile
                pass
        return failed

    def running_trial_numbers(self) -> list[int]:
        optuna = quiet_optuna()
        states = (optuna.trial.TrialState.RUNNING,)
        return [t.number for t in self.study.get_trials(deepcopy=False, states=states)]
