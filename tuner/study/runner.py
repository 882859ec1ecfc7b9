"""The study driver: ask Optuna for configurations, run each trial's capacity search on a worker,
record every measurement, tell Optuna the capacity, until the trial budget is spent.

It is three parts wired together here: the **proposer** (tuner.study.proposer) chooses what to try
and whether it is worth launching, the **ledger** (tuner.study.ledger) is the only writer of the
study's records and the only caller of Optuna's ``tell``, and the **loop** (tuner.study.loop)
launches trials into free slots and advances them by their workers' results.

Only this process writes to the study's records, and it knows so for sure: it holds the study's
driver lease (tuner.study.lease) from before its first write to after its last. ``create`` takes
it with the study's own row (a second start of the same name gets "already exists");
``take_over`` takes it for a resume, at once from a driver provably dead on this host (whose
processes it then reaps by recorded identity), after its heartbeat expired from another host,
and never from a live one. A failed trial (cannot start, crash, out of memory) is recorded with
its failure class and the study goes on; Optuna learns it as an infeasible region (capacity 0
with a violated constraint). Trial 0 is always the baseline: SGLang's defaults for the hardware
with TP = GPUs of the node.

A stop signal (Ctrl-C, SIGTERM, SIGHUP) stops the servers, records the running trials as
interrupted and the study as stopped (tuner.study.signals); a storage fault stops the servers and
records what it still can (after freeing the disk-space reserve when the disk is full). Either
way no trial is left running and the lease is released.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from sqlalchemy.exc import IntegrityError

import tuner
from tuner import paths
from tuner.backends.process import PID_FILE_SUFFIX, reap_pids
from tuner.errors import (ConfigError, DriverBusyError, LeaseLostError, StorageFault, StorageFaultError,
                          StudyNotFoundError, UserError)
from tuner.evaluation.registry import get_evaluator
from tuner.lifecycle import StopReason, TrialStatus
from tuner.config.load import load_stored_study, spec_hash, stored_spec_yaml
from tuner.config.schema import StudySpec
from tuner.storage import db, repo
from tuner.storage.reserve import SpaceReserve
from tuner.storage.snapshot import read_current
from tuner.study import signals
from tuner.study.executor import InProcessExecutor, RayExecutor, shutdown_ray
from tuner.study.lease import Acquired, DriverLease
from tuner.study.ledger import Counters, Ledger
from tuner.study.loop import TrialLoop
from tuner.study.optuna_adapter import HEARTBEAT_GRACE_S, HEARTBEAT_INTERVAL_S, OptunaStudy
from tuner.study.proposer import Proposer, TriedTrial, repeat_configs
from tuner.study.samplers import grid_configs, make_sampler
from tuner.study.signals import StopSignal, stop_signal
from tuner.vocabulary import Sampler

# a dead driver's processes get this long after SIGTERM before SIGKILL (Ray's agents ignore SIGTERM)
DEAD_DRIVER_REAP_GRACE_S = 3.0
# faults after which writing again may work: the running trials are recorded as interrupted then
_WRITABLE_AGAIN = (StorageFault.DISK_FULL, StorageFault.LOCKED, StorageFault.IO)

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
    trials_budget: int | None = None  # the study's budget (stored; `resume --trials N` changes it)
    interrupted_trials: list[int] | None = None  # recorded as interrupted by this run's stop
    signal: str | None = None  # the stop signal's name (SIGTERM, SIGHUP, SIGINT), if one stopped it
    exit_code: int = 0  # what the CLI exits with (128 + the signal's number after a signal)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class StudyRunner:
    def __init__(self, study: StudySpec, *, storage_url: str, backend_kind: str, backend_reason: str = "",
                 parallel: int = 1, ray_address: str | None = None, use_ray: bool = True, seed: int | None = None,
                 max_failures: int | None = None, on_event: Callable[[str, dict], None] | None = None,
                 workdir: str = "results/runs", prescreen: bool = True, prune: bool = True,
                 initial_configs: list[dict] | None = None, time_limit_s: float | None = None,
                 command: str = "start", repeat_trials: list | None = None):
        self.study = study
        self.time_limit_s = time_limit_s  # wall-clock budget of one run (tuner.study.loop)
        self.prune = prune  # stop capacity searches that cannot beat the best (tuner.study.pruning)
        self.initial_configs = list(initial_configs or [])  # launched right after the baseline
        self.repeat_trials = list(repeat_trials or [])  # earlier trials measured again first (resume)
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
        db.require_writable(storage_url)  # before opening it for writing: a clear refusal, nothing written
        self.engine = db.get_engine(storage_url)
        self.records = repo.StudyRecords(self.engine, study.name)
        self.lease = DriverLease(self.engine, study.name, command=command)
        db_path = db.sqlite_path(storage_url)
        self.reserve = SpaceReserve(db_path, study.name) if db_path is not None else None
        self.acquired: Acquired | None = None  # how resume took the lease (the dead driver it replaced)
        self.dead_driver_reaped: dict[int, str] = {}  # pid -> outcome, of the dead driver's processes

    # ---------------------------------------------------------------- the lease
    def _prepare_storage(self) -> None:
        """Before the first write: the database can be written, has (or gets) this tuner's schema,
        and its pages are sound. Each refusal writes nothing."""
        db.require_writable(self.storage_url)
        db.ensure_schema(self.engine)
        db.require_sound(self.engine)

    def _hold(self) -> None:
        self.lease.start_heartbeat()
        if self.reserve is not None:
            self.reserve.keep()

    def release(self) -> None:
        """Let the study go (idempotent): the lease, and the disk-space reserve."""
        self.lease.release()
        if self.reserve is not None:
            self.reserve.free()

    def create(self, budget: int | None = None) -> None:
        """Create the study rows (ours, with the lease, then Optuna's) and hold the lease. Refuses an
        existing name, and a grid sampler whose grid does not fit in ``budget`` trials (default: the
        study's), before writing anything. ``budget`` is stored: resume keeps it."""
        budget = budget or self.study.trials
        if self.study.sampler == Sampler.GRID:
            grid_configs(self.study, budget)
        self._prepare_storage()
        exists = UserError(f"study {self.study.name!r} already exists in {db.describe(self.storage_url)}; continue "
                           f"it with `tuner study resume {self.study.name}` or choose another storage")
        if repo.get_study(self.engine, self.study.name) is not None:
            raise exists
        spec_yaml = stored_spec_yaml(self.study)
        ledger = Ledger(self.records, None, backend_kind=self.backend_kind)
        try:
            ledger.create_study(
                spec_yaml=spec_yaml, spec_hash=spec_hash(self.study), source_path=self.study.source_path,
                backend_kind=self.backend_kind, target_users=self.study.target_users,
                p90_ttft_slo_s=self.study.slo.p90_ttft_s, p90_tpot_slo_s=self.study.slo.p90_tpot_s,
                trials_budget=budget, tuner_version=tuner.__version__, lease=self.lease.fields())
        except IntegrityError:  # a concurrent start of the same name wrote its row first
            raise exists from None
        self.lease.created()
        try:
            OptunaStudy.create(self.study.name, self.storage_url, make_sampler(self.study.sampler, self.seed))
        except BaseException:
            try:  # as it was: no half-made study left behind (resume would finish making it)
                ledger.discard_new_study(self.lease.token)
                self.lease.held = False
            except Exception as exc:
                log.warning("could not take back the half-made study %s (%s)", self.study.name, exc)
            raise
        self._hold()

    def take_over(self, *, on_wait: Callable[[str], None] | None = None) -> Acquired:
        """Take the study's lease for a resume (tuner.study.lease says when) and reap, by recorded
        identity, every process a dead driver left: its local Ray's and its trials' servers."""
        self._prepare_storage()
        self.acquired = self.lease.acquire(wait=True, on_wait=on_wait)
        self._hold()
        previous = self.acquired.previous
        if previous is not None and previous.processes:
            self.dead_driver_reaped = reap_pids(previous.processes, tree=True, grace_s=DEAD_DRIVER_REAP_GRACE_S)
        return self.acquired

    def _optuna(self) -> OptunaStudy:
        return OptunaStudy.load_or_create(self.study.name, self.storage_url,
                                          make_sampler(self.study.sampler, self.seed))

    def recover_interrupted(self) -> list[int]:
        """Mark trials left running by a dead driver as interrupted, reap their servers by PID.
        Takes the lease first (``take_over``) if this runner does not hold it."""
        if not self.lease.held:
            self.take_over()
        optuna = self._optuna()
        if self.acquired is None or self.acquired.previous is None:
            # no lease was left: a driver of an older tuner (which takes none) may still run the study
            optuna.fail_stale_trials()
            if optuna.running_trial_numbers():
                self.release()
                raise DriverBusyError(f"study {self.study.name!r} has trials still running in another process "
                                      f"(heartbeat within {HEARTBEAT_GRACE_S} s); stop it first or wait")
        else:
            optuna.fail_running_trials()  # their driver is dead: its lease proved it
        ledger = Ledger(self.records, optuna, backend_kind=self.backend_kind)
        recovered = []
        for row in repo.running_trials(self.engine, self.study.name):
            killed, outcomes = self._reap(row.trial_number, (row.telemetry or {}).get("process_identities") or [])
            ledger.interrupted_by_dead_driver(
                row.trial_number,
                f"the tuner process died during this trial; reaped {len(killed)} server process(es) by recorded PID",
                telemetry={**(row.telemetry or {}), "reaped_pids": killed,
                           "reap_outcomes": {str(p): o for p, o in outcomes.items()}})
            recovered.append(row.trial_number)
        return recovered

    def _reap(self, trial_number: int, identities: list[dict]) -> tuple[list[int], dict[int, str]]:
        """Stop a trial's servers by recorded identity (PID + start time + command line): those
        recorded at deploy, and those its servers wrote beside their logs when they started."""
        identities = list(identities) + _pid_files(str(paths.trial_dir(self.workdir, self.study.name, trial_number)))
        outcomes = reap_pids(identities, tree=True) if identities else {}  # {pid: gone | not_ours | killed | survived}
        for ident in identities:  # reaped already with the dead driver's own processes
            pid = int(ident.get("pid", -1))
            if self.dead_driver_reaped.get(pid) == "killed" and outcomes.get(pid) == "gone":
                outcomes[pid] = "killed"
        return sorted(pid for pid, outcome in outcomes.items() if outcome == "killed"), outcomes

    # ---------------------------------------------------------------- a run
    def run(self, trials: int | None = None) -> StudyOutcome:
        """Run the study to ``trials`` launched trials (default: its stored budget; a different
        number becomes the stored budget), then release the lease."""
        if not self.lease.held:
            self.take_over()
        try:
            return self._run(trials)
        finally:
            self.release()

    def _run(self, trials: int | None) -> StudyOutcome:
        t0 = time.time()
        row = repo.get_study(self.engine, self.study.name)
        budget = trials if trials is not None else (row.trials_budget if row is not None else self.study.trials)
        optuna = self._optuna()
        existing = repo.trials(self.engine, self.study.name)
        completed = [t.capacity_users or 0 for t in existing if t.status == TrialStatus.COMPLETE]
        ledger = Ledger(self.records, optuna, backend_kind=self.backend_kind, on_event=self.on_event,
                        counters=Counters(launched=repo.launched_count(existing)),
                        incumbent_users=max(completed) if completed else None)
        if row is not None and row.trials_budget != budget:
            ledger.set_budget(budget)  # resume --trials N: the study's budget from now on
        tried = {t.trial_number: TriedTrial.of_row(t) for t in existing}
        proposer = Proposer(self.study, optuna, budget, tried=list(tried.values()),
                            initial_configs=self.initial_configs, prescreen=self.prescreen,
                            repeats=repeat_configs(self.study, tried, self.repeat_trials))
        self.on_event("start", {"study": self.study.name, "backend": self.backend_kind, "reason": self.backend_reason,
                                "budget": budget, "done": ledger.counters.launched})
        stop_heartbeat = threading.Event()
        stopped_by: StopSignal | None = None
        loop: TrialLoop | None = None
        try:
            executor = self._start_executor()
            evaluator = get_evaluator(self.backend_kind)
            loop = TrialLoop(self.study, proposer, ledger, executor, backend_kind=self.backend_kind,
                             budget=budget, gpus_needed=evaluator.gpus_needed,
                             windows_take_wall_time=evaluator.windows_take_wall_time,
                             workdir=str(paths.inside(self.workdir, self.study.name)), seed=self.seed,
                             parallel=self.parallel, max_failures=self.max_failures, prune=self.prune,
                             time_limit_s=self.time_limit_s, reap_servers=self._reap_running,
                             on_event=self._event(self.on_event), lease_lost=self.lease.lost)
            threading.Thread(target=_heartbeat_loop, args=(optuna, loop, stop_heartbeat), daemon=True).start()
            stop = loop.run()
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the loop recorded its trials
            stopped_by, stop = stop_signal(exc), StopReason.INTERRUPTED
        except LeaseLostError:
            raise  # another driver owns the records now: write nothing more
        except StorageFaultError as exc:
            self._after_storage_fault(exc, loop, ledger)
        except BaseException as exc:  # a bug: record the running trials as interrupted, then report it
            self._after_crash(exc, loop, ledger)
            raise
        finally:
            stop_heartbeat.set()
        interrupted = loop.interrupted if loop is not None else []
        ledger.close_out(stopped_by.reason if stopped_by else "the run ended before this trial was recorded")
        ledger.conclude(stop)
        outcome = self._outcome(ledger, stop, time.time() - t0)
        outcome.trials_budget = budget
        if stopped_by is not None:
            outcome.signal, outcome.exit_code = stopped_by.name, stopped_by.exit_code
            outcome.interrupted_trials = interrupted
            done = (f"trial(s) {', '.join(map(str, interrupted))} recorded as interrupted and their servers stopped"
                    if interrupted else "no trial was running")
            outcome.stopped_reason = (f"{stopped_by.reason}: {done}; continue with "
                                      f"`tuner study resume {self.study.name}`")
        return outcome

    def _start_executor(self):
        """Ray (or in-process), with our stop signals in place again afterwards: ``ray.init``
        puts in a SIGTERM handler of its own (it exits at once, recording nothing)."""
        try:
            with self.lease.watching_closely():  # Ray's processes appear now: record them as they do
                executor = self._make_executor()
        except SystemExit as exc:  # Ray's handler: SIGTERM came while Ray started
            if exc.code == signal.SIGTERM:
                shutdown_ray()
                raise StopSignal(signal.SIGTERM) from None
            raise
        except BaseException:
            shutdown_ray()  # a Ray half started (e.g. Ctrl-C during ray.init) must not outlive us
            raise
        signals.install()
        self.lease.beat()  # record the local Ray's processes now, not at the next heartbeat
        return executor

    def _event(self, forward: Callable[[str, dict], None]) -> Callable[[str, dict], None]:
        def on_event(kind: str, data: dict) -> None:
            if kind == "trial_start":
                try:  # what the new trial starts (Ray workers, servers) is recorded soon after
                    self.lease.beat()
                except Exception:
                    log.debug("lease beat failed", exc_info=True)
            forward(kind, data)
        return on_event

    def _reap_running(self, trial_number: int, deploy_info: dict) -> list[int]:
        killed, _ = self._reap(trial_number, deploy_info.get("process_identities") or [])
        return killed

    def _after_storage_fault(self, exc: StorageFaultError, loop: TrialLoop | None, ledger: Ledger) -> None:
        """The servers are stopped (the loop did it); record the running trials as interrupted
        where writing may work again, then re-raise with what is left for the resume."""
        unrecorded = sorted(loop.running) if loop is not None else []
        if exc.fault in _WRITABLE_AGAIN:
            if exc.fault is StorageFault.DISK_FULL and self.reserve is not None:
                self.reserve.free()  # room for the last writes
            reason = f"the study stopped: the study database could not be written ({exc.fault})"
            if loop is not None:
                _, unrecorded = loop.abandon(reason)
            try:
                ledger.close_out(reason)
                ledger.conclude(StopReason.STORAGE_FAULT)
            except Exception:
                unrecorded = unrecorded or sorted(set(self.records.running_trial_numbers()))
        note = (f"; trial(s) {', '.join(map(str, unrecorded))} could not be recorded as interrupted: "
                f"`tuner study resume {self.study.name}` records them" if unrecorded else "")
        text = str(exc).replace("`tuner study resume NAME`", f"`tuner study resume {self.study.name}`")
        raise StorageFaultError(exc.fault, f"{text}{note}") from exc

    def _after_crash(self, exc: BaseException, loop: TrialLoop | None, ledger: Ledger) -> None:
        reason = f"the driver stopped on an unexpected error ({type(exc).__name__}: {str(exc)[:200]})"
        try:
            if loop is not None:
                loop.abandon(reason)
            ledger.close_out(reason)
            ledger.conclude(StopReason.INTERRUPTED)
        except Exception as exc:  # the next resume records what could not be recorded now
            log.warning("could not record the running trials of %s as interrupted (%s)", self.study.name, exc)

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
            stopped_reason=stop.message(study=self.study.name, failed=c.failed, max_failures=self.max_failures),
            exit_code=stop.exit_code)
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


def _stored_study(engine, storage_url: str, name: str, *, upgrade: bool):
    if not db.has_schema(engine):
        raise StudyNotFoundError(f"no study {name!r} in {storage_url} (the database has no tuner studies)")
    if upgrade:
        db.require_current(engine, storage_url)
    row = repo.get_study(engine, name)
    if row is None:
        names = [s.name for s in repo.list_studies(engine)]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise StudyNotFoundError(f"no study {name!r} in {storage_url}{hint}; studies there: {', '.join(names) or 'none'}")
    return row


def load_existing(storage_url: str, name: str, *, notes: list[str] | None = None) -> StudySpec:
    """The study exactly as it was started (its stored snapshot), validated by this tuner's schema.

    A stored value this tuner no longer accepts (its bounds became stricter) is a ConfigError
    naming the key, for a driver (``notes`` None: resume must not run a study it would refuse
    today); a reader passes ``notes`` and gets the field's default, with a note appended there."""
    if notes is None:  # a driver: it is about to write, so an older schema is upgraded in place now
        engine = db.reader_engine(storage_url)
        row = _stored_study(engine, storage_url, name, upgrade=True)
    else:  # a reader writes nothing (an older schema is read through an upgraded copy)
        with read_current(storage_url) as engine:
            row = _stored_study(engine, storage_url, name, upgrade=False)
    where = f"{db.describe(storage_url)} (study {name!r} as stored by tuner {row.tuner_version})"
    try:
        data = yaml.safe_load(row.spec_yaml)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the stored study cannot be read: {exc}", file=where) from None
    try:
        spec, found = load_stored_study(data, where, repair=notes is not None)
    except ConfigError as exc:
        if notes is None:
            raise ConfigError(f"{exc.detail}\nthis tuner does not accept the value(s) above any more, so it cannot "
                              f"resume the study as stored; `status` and `export` still read it. Start a new study "
                              f"from a corrected study file", file=exc.file) from None
        raise
    if notes is not None:
        notes.extend(found)
    return spec
