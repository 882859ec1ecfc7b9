"""The one place tuner reaches into Optuna: opening studies on our storage, heartbeats, trial ids
and trial states. The proposer asks through it, the ledger tells through it; neither touches
Optuna's private attributes (``Study._storage``, ``Trial._trial_id``).

Optuna is imported inside the functions that need the module: it costs a second of start-up that
commands such as ``tuner --help`` must not pay.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from tuner.storage import db

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
    """Optuna's RDB storage on the study database, with heartbeats (for resume)."""
    optuna = quiet_optuna()
    kwargs: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": HEARTBEAT_GRACE_S}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": db.SQLITE_BUSY_TIMEOUT_MS / 1000}}
    return optuna.storages.RDBStorage(db.sqlalchemy_url(url), **kwargs)


class OptunaStudy:
    """An Optuna study as the study driver uses it (ask/tell interface, maximising capacity)."""

    def __init__(self, study):
        self.study = study

    # ---------------------------------------------------------------- opening
    @classmethod
    def create(cls, name: str, storage_url: str, sampler) -> "OptunaStudy":
        optuna = quiet_optuna()
        return cls(optuna.create_study(study_name=name, storage=rdb_storage(storage_url), direction="maximize",
                                       sampler=sampler))

    @classmethod
    def load(cls, name: str, storage_url: str, sampler) -> "OptunaStudy":
        optuna = quiet_optuna()
        return cls(optuna.load_study(study_name=name, storage=rdb_storage(storage_url), sampler=sampler))

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

    def enqueue(self, params: dict) -> None:
        self.study.enqueue_trial(params, skip_if_exists=True)

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

    def running_trial_numbers(self) -> list[int]:
        optuna = quiet_optuna()
        states = (optuna.trial.TrialState.RUNNING,)
        return [t.number for t in self.study.get_trials(deepcopy=False, states=states)]
