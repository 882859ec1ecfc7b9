"""The study driver: ask Optuna for configurations, run each trial's capacity search on a worker,
record every measurement, tell Optuna the capacity, until the trial budget is spent.

It is three parts wired together here: the **proposer** (tuner.study.proposer) chooses what to try
and whether it is worth launching, the **ledger** (tuner.study.ledger) is the only writer of the
study's records and the only caller of Optuna's ``tell``, and the **loop** (tuner.study.loop)
launches trials into free slots and advances them by their workers' results.

Only this process writes to the database. A failed trial (cannot start, crash, out of memory) is
recorded with its failure class and the study goes on; Optuna learns it as an infeasible region
(capacity 0 with a violated constraint). Trial 0 is always the baseline: SGLang's defaults for the
hardware with TP = GPUs of the node.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

import tuner
from tuner import paths
from tuner.backends.process import PID_FILE_SUFFIX, reap_pids
from tuner.errors import StudyNotFoundError, UserError
from tuner.evaluation.registry import get_evaluator
from tuner.lifecycle import StopReason, TrialStatus
from tuner.config.load import spec_hash
from tuner.config.schema import StudySpec
from tuner.storage import db, repo
from tuner.study.executor import InProcessExecutor, RayExecutor
from tuner.study.ledger import Counters, Ledger
from tuner.study.loop import TrialLoop
from tuner.study.optuna_adapter import HEARTBEAT_GRACE_S, HEARTBEAT_INTERVAL_S, OptunaStudy
from tuner.study.proposer import Proposer, TriedTrial
from tuner.study.samplers import grid_configs, make_sampler
from tuner.vocabulary import Sampler

log = logging.getLogger(__name__)


@dataclass
class StudyOutcome:
    name: str
    backend_kind: str
    backend_reason: str
    trials_run: int
    trials_failed: int
    trials_infeasible: int
    prescreened: int
    duplicates: int
    best_trial_number: int | None
    best_capacity_users: int | None
    baseline_capacity_users: int | None
    wall_time_s: float
    stopped_reason: str | None = None  # the sentence for the user (None: the budget was spent)
    trials_pruned: int = 0  # launched, stopped early: could not beat the best (tuner.study.pruning)
    enqueued: int = 0  # configurations enqueued behind the baseline (planner seeds, warm start, grid)
    stop: StopReason = StopReason.BUDGET_SPENT  # decides the study's status and the CLI's exit code

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class StudyRunner:
    def __init__(self, study: StudySpec, *, storage_url: str, backend_kind: str, backend_reason: str = "",
                 parallel: int = 1, ray_address: str | None = None, use_ray: bool = True, seed: int | None = None,
                 max_failures: int | None = None, on_event: Callable[[str, dict], None] | None = None,
                 workdir: str = "results/runs", prescreen: bool = True, prune: bool = True,
                 initial_configs: list[dict] | None = None, time_limit_s: float | None = None):
        self.study = study
        self.time_limit_s = time_limit_s  # wall-clock budget of one run (tuner.study.loop)
        self.prune = prune  # stop capacity searches that cannot beat the best (tuner.study.pruning)
        self.initial_configs = list(initial_configs or [])  # launched right after the baseline
        self.storage_url = storage_url
        self.backend_kind = str(backend_kind)  # a tuner.vocabulary.BackendKind value
        self.backend_reason = backend_reason
        self.parallel = max(1, parallel)
        self.ray_address = ray_address
        self.use_ray = use_ray
        self.seed = study.seed if seed is None else seed
        self.max_failures = max_failures
        self.on_event = on_event or (lambda kind, data: None)
        self.workdir = os.path.abspath(workdir)  # Ray workers run elsewhere: trial dirs as the driver sees them
        paths.inside(self.workdir, study.name)  # the study's directory must lie inside the runs directory
        self.prescreen = prescreen
        self.engine = db.get_engine(storage_url)
        self.records = repo.StudyRecords(self.engine, study.name)

    # ---------------------------------------------------------------- set-up
    def create(self, budget: int | None = None) -> None:
        """Create the study rows (Optuna's and ours). Refuses an existing name, and a grid sampler
        whose grid does not fit in ``budget`` trials (default: the study's), before writing anything."""
        if self.study.sampler == Sampler.GRID:
            grid_configs(self.study, budget or self.study.trials)
        db.ensure_schema(self.engine)
        if repo.get_study(self.engine, self.study.name) is not None:
            raise UserError(f"study {self.study.name!r} already exists in {self.storage_url}; "
                            f"continue it with `tuner study resume {self.study.name}` or choose another storage")
        optuna = OptunaStudy.create(self.study.name, self.storage_url, make_sampler(self.study.sampler, self.seed))
        spec_yaml = yaml.safe_dump(self.study.model_dump(mode="json"), sort_keys=False)
        Ledger(self.records, optuna, backend_kind=self.backend_kind).create_study(
            spec_yaml=spec_yaml, spec_hash=spec_hash(self.study), source_path=self.study.source_path,
            backend_kind=self.backend_kind, target_users=self.study.target_users,
            p90_ttft_slo_s=self.study.slo.p90_ttft_s, p90_tpot_slo_s=self.study.slo.p90_tpot_s,
            trials_budget=self.study.trials, tuner_version=tuner.__version__)

    def _optuna(self) -> OptunaStudy:
        return OptunaStudy.load(self.study.name, self.storage_url, make_sampler(self.study.sampler, self.seed))

    def recover_interrupted(self) -> list[int]:
        """Mark trials left running by a dead driver as interrupted, reap their servers by PID."""
        db.ensure_schema(self.engine)
        optuna = self._optuna()
        optuna.fail_stale_trials()
        if optuna.running_trial_numbers():
            raise UserError(f"study {self.study.name!r} has trials still running in another process "
                            f"(heartbeat within {HEARTBEAT_GRACE_S} s); stop it first or wait")
        ledger = Ledger(self.records, optuna, backend_kind=self.backend_kind)
        recovered = []
        for row in repo.running_trials(self.engine, self.study.name):
            # identities (PID + start time) prove a process is still ours; a bare PID does not
            identities = (row.telemetry or {}).get("process_identities") or []
            # servers started but not yet recorded (the driver died while they started) left PID files
            identities += _pid_files(str(paths.trial_dir(self.workdir, self.study.name, row.trial_number)))
            targets = identities or row.pids or []
            outcomes = reap_pids(targets) if targets else {}  # {pid: gone | not_ours | killed | survived}
            reaped = sorted(pid for pid, outcome in outcomes.items() if outcome == "killed")
            ledger.interrupted_by_dead_driver(
                row.trial_number,
                f"the tuner process died during this trial; reaped {len(reaped)} server process(es) by recorded PID",
                telemetry={**(row.telemetry or {}), "reaped_pids": reaped,
                           "reap_outcomes": {str(p): o for p, o in outcomes.items()}})
            recovered.append(row.trial_number)
        return recovered

    # ---------------------------------------------------------------- a run
    def run(self, trials: int | None = None) -> StudyOutcome:
        t0 = time.time()
        db.ensure_schema(self.engine)
        budget = trials if trials is not None else self.study.trials
        optuna = self._optuna()
        existing = repo.trials(self.engine, self.study.name)
        completed = [t.capacity_users or 0 for t in existing if t.status == TrialStatus.COMPLETE]
        ledger = Ledger(self.records, optuna, backend_kind=self.backend_kind, on_event=self.on_event,
                        counters=Counters(launched=sum(1 for t in existing
                                                       if t.status != TrialStatus.RUNNING and t.launched)),
                        incumbent_users=max(completed) if completed else None)
        proposer = Proposer(self.study, optuna, budget,
                            tried=[TriedTrial(t.params, TrialStatus(t.status), t.capacity_users) for t in existing],
                            initial_configs=self.initial_configs, prescreen=self.prescreen)
        self.on_event("start", {"study": self.study.name, "backend": self.backend_kind, "reason": self.backend_reason,
                                "budget": budget, "done": ledger.counters.launched})
        loop = TrialLoop(self.study, proposer, ledger, self._make_executor(), backend_kind=self.backend_kind,
                         budget=budget, gpus_needed=get_evaluator(self.backend_kind).gpus_needed,
                         workdir=str(paths.inside(self.workdir, self.study.name)), seed=self.seed,
                         parallel=self.parallel, max_failures=self.max_failures, prune=self.prune,
                         time_limit_s=self.time_limit_s)
        stop_heartbeat = threading.Event()
        threading.Thread(target=_heartbeat_loop, args=(optuna, loop, stop_heartbeat), daemon=True).start()
        try:
            stop = loop.run()
        finally:
            stop_heartbeat.set()
        ledger.conclude(stop)
        return self._outcome(ledger, stop, time.time() - t0)

    def _outcome(self, ledger: Ledger, stop: StopReason, wall_time_s: float) -> StudyOutcome:
        best = repo.best_trial(self.engine, self.study.name)
        base = repo.baseline_trial(self.engine, self.study.name)
        c = ledger.counters
        outcome = StudyOutcome(
            name=self.study.name, backend_kind=self.backend_kind, backend_reason=self.backend_reason,
            trials_run=c.launched, trials_failed=c.failed, trials_infeasible=c.infeasible,
            prescreened=c.prescreened, duplicates=c.duplicates,
            best_trial_number=best.trial_number if best else None,
            best_capacity_users=best.capacity_users if best else None,
            baseline_capacity_users=base.capacity_users if base else None,
            wall_time_s=wall_time_s, trials_pruned=c.pruned, enqueued=c.enqueued, stop=stop,
            stopped_reason=stop.message(study=self.study.name, failed=c.failed, max_failures=self.max_failures))
        self.on_event("end", outcome.to_dict())
        return outcome

    def _make_executor(self):
        if not self.use_ray:
            return InProcessExecutor()
        return RayExecutor(self.ray_address)


def _heartbeat_loop(optuna: OptunaStudy, loop: TrialLoop, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_INTERVAL_S / 2):
        for rt in list(loop.running.values()):
            try:
                optuna.heartbeat(rt.proposal.trial)
            except Exception:  # a missed heartbeat is retried next round
                log.debug("heartbeat failed", exc_info=True)


def _pid_files(trial_dir: str) -> list[dict]:
    """Process identities the trial's servers wrote beside their logs (tuner.backends.process)."""
    out = []
    for f in sorted(Path(trial_dir).glob(f"*{PID_FILE_SUFFIX}")):
        try:
            out += [d for d in json.loads(f.read_text()) if isinstance(d, dict) and "pid" in d]
        except (OSError, ValueError):
            log.warning("unreadable PID file %s", f)
    return out


def load_existing(storage_url: str, name: str) -> StudySpec:
    """The study exactly as it was started (its stored snapshot)."""
    engine = db.get_engine(storage_url, create=False)
    if not db.has_schema(engine):
        raise StudyNotFoundError(f"no study {name!r} in {storage_url} (the database has no tuner studies)")
    db.require_current(engine, storage_url)
    row = repo.get_study(engine, name)
    if row is None:
        names = [s.name for s in repo.list_studies(engine)]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise StudyNotFoundError(f"no study {name!r} in {storage_url}{hint}; studies there: {', '.join(names) or 'none'}")
    return StudySpec.model_validate(yaml.safe_load(row.spec_yaml))
