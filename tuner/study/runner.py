"""The study driver: ask Optuna for configurations, run each trial's capacity search on a worker,
record every measurement, tell Optuna the capacity, until the trial budget is spent.

Only this process writes to the database. A failed trial (cannot start, crash, out of memory) is
recorded with its failure class and the study goes on; Optuna learns it as an infeasible region
(capacity 0 with a violated constraint). Trial 0 is always the baseline: SGLang's defaults for the
hardware with TP = GPUs of the node.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

import tuner
from tuner import paths
from tuner.errors import StudyNotFoundError, TrialError, UserError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.capacity import CapacitySearch
from tuner.spec.load import spec_hash
from tuner.spec.schema import StudySpec
from tuner.storage import db, repo
from tuner.study import space as space_mod
from tuner.study.fidelity import prune_reason, should_prune
from tuner.study.samplers import make_sampler, mark_feasible, seed_configs

log = logging.getLogger(__name__)

# A trial whose heartbeat is older than the grace period belongs to a dead driver (resume takes it
# over). TUNER_HEARTBEAT_GRACE_S shortens it, e.g. for tests that kill a driver and resume at once.
HEARTBEAT_GRACE_S = max(2, int(os.environ.get("TUNER_HEARTBEAT_GRACE_S", "30")))
HEARTBEAT_INTERVAL_S = max(1, min(10, HEARTBEAT_GRACE_S // 3))


@dataclass
class RunningTrial:
    number: int
    optuna_trial: Any
    values: dict
    flags: dict
    knobs: dict
    search: CapacitySearch
    num_gpus: int
    is_baseline: bool
    started_at: float = field(default_factory=time.time)
    step: int = 0
    phase: str = "deploy"  # deploy | measure | close
    pending_outcome: tuple | None = None  # (status, capacity, failure_class, reason)
    info: dict = field(default_factory=dict)
    last_metrics: Any = None


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
    stopped_reason: str | None = None
    trials_pruned: int = 0  # launched, stopped early: could not beat the best (tuner.study.fidelity)
    enqueued: int = 0  # configurations enqueued behind the baseline (planner seeds, warm start)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def optuna_storage(url: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    kwargs = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": HEARTBEAT_GRACE_S}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": db.SQLITE_BUSY_TIMEOUT_MS / 1000}}
    return optuna.storages.RDBStorage(db.sqlalchemy_url(url), **kwargs)


def baseline_values(study: StudySpec) -> dict:
    """Trial 0: every knob at SGLang's default except the study's ``baseline`` flags."""
    values = {name: None for name in study.space().params}
    values.setdefault("tp-size", None)
    values.update(study.baseline)
    if values.get("tp-size") is None and study.space().engine == "sglang":
        values["tp-size"] = study.hardware.gpus_per_node
    return values


class StudyRunner:
    def __init__(self, study: StudySpec, *, storage_url: str, backend_kind: str, backend_reason: str = "",
                 parallel: int = 1, ray_address: str | None = None, use_ray: bool = True, seed: int | None = None,
                 max_failures: int | None = None, on_event: Callable[[str, dict], None] | None = None,
                 workdir: str = "results/runs", prescreen: bool = True, prune: bool = True,
                 initial_configs: list[dict] | None = None, time_limit_s: float | None = None):
        self.study = study
        # wall-clock budget of this run: no trial starts that the run's own trials say cannot
        # finish inside it, and trials still running when it ends are interrupted
        self.time_limit_s = time_limit_s
        self._trial_walls: list[float] = []
        self._winding_down: str | None = None  # reason running trials are being closed early
        self.prune = prune  # stop capacity searches that cannot beat the best (tuner.study.fidelity)
        self.initial_configs = list(initial_configs or [])  # launched right after the baseline
        self.storage_url = storage_url
        self.backend_kind = backend_kind
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
        self.env = space_mod.env_for(study)
        self._running: dict[int, RunningTrial] = {}
        self._stop = threading.Event()
        self._counts = {"failed": 0, "infeasible": 0, "prescreened": 0, "duplicates": 0, "pruned": 0,
                        "enqueued": 0}
        self._queue: list[dict] = []  # configurations to enqueue, one per ask, after the baseline
        self._incumbent: int | None = None  # best capacity of a finished trial (pruning threshold)
        self._seen: dict[str, int | None] = {}  # config key -> capacity (None while running)

    # ---------------------------------------------------------------- set-up
    def create(self) -> None:
        """Create the study rows (Optuna's and ours). Refuses an existing name."""
        import optuna

        db.ensure_schema(self.engine)
        if repo.get_study(self.engine, self.study.name) is not None:
            raise UserError(f"study {self.study.name!r} already exists in {self.storage_url}; "
                            f"continue it with `tuner study resume {self.study.name}` or choose another storage")
        storage = optuna_storage(self.storage_url)
        optuna.create_study(study_name=self.study.name, storage=storage, direction="maximize",
                            sampler=make_sampler(self.study.sampler, self.seed))
        spec_yaml = yaml.safe_dump(self.study.model_dump(mode="json"), sort_keys=False)
        repo.create_study(self.engine, name=self.study.name, spec_yaml=spec_yaml, spec_hash=spec_hash(self.study),
                          source_path=self.study.source_path, backend_kind=self.backend_kind,
                          target_users=self.study.target_users, p90_ttft_slo_s=self.study.slo.p90_ttft_s,
                          p90_tpot_slo_s=self.study.slo.p90_tpot_s, trials_budget=self.study.trials,
                          tuner_version=tuner.__version__)

    def _optuna_study(self):
        import optuna

        storage = optuna_storage(self.storage_url)
        return optuna.load_study(study_name=self.study.name, storage=storage,
                                 sampler=make_sampler(self.study.sampler, self.seed, resumed=True))

    def recover_interrupted(self) -> list[int]:
        """Mark trials left running by a dead driver as interrupted, reap their servers by PID."""
        import optuna

        ostudy = self._optuna_study()
        stale = optuna.storages.fail_stale_trials(ostudy) if hasattr(optuna.storages, "fail_stale_trials") else None
        _ = stale
        fresh_running = [t for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
        if fresh_running:
            raise UserError(f"study {self.study.name!r} has trials still running in another process "
                            f"(heartbeat within {HEARTBEAT_GRACE_S} s); stop it first or wait")
        recovered = []
        for row in repo.running_trials(self.engine, self.study.name):
            # identities (PID + start time) prove a process is still ours; a bare PID does not
            identities = (row.telemetry or {}).get("process_identities") or []
            # servers started but not yet recorded (the driver died while they started) left PID files
            identities += _pid_files(str(paths.trial_dir(self.workdir, self.study.name, row.trial_number)))
            outcomes = _reap(identities or row.pids or [])
            reaped = sorted(pid for pid, outcome in outcomes.items() if outcome == "killed")
            repo.finish_trial(self.engine, self.study.name, row.trial_number, status="interrupted",
                              capacity_users=None, failure_class="interrupted",
                              failure_reason=f"the tuner process died during this trial; reaped {len(reaped)} "
                                             f"server process(es) by recorded PID",
                              telemetry={**(row.telemetry or {}), "reaped_pids": reaped,
                                         "reap_outcomes": {str(p): o for p, o in outcomes.items()}})
            recovered.append(row.trial_number)
        return recovered

    # ---------------------------------------------------------------- main loop
    def run(self, trials: int | None = None) -> StudyOutcome:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        t0 = time.time()
        ostudy = self._optuna_study()
        budget = trials if trials is not None else self.study.trials
        existing = repo.trials(self.engine, self.study.name)
        self._has_trials = bool(existing)  # the first trial of a study is its baseline
        done_before = [t for t in existing
                       if t.status not in ("running",) and not (t.telemetry or {}).get("not_launched")]
        for t in existing:
            if t.status == "complete":
                self._seen[_config_key(t.params)] = t.capacity_users
                self._incumbent = max(self._incumbent or 0, t.capacity_users or 0)
        launched = len(done_before)
        self._queue = self._initial_queue({_config_key(t.params) for t in existing})
        self.on_event("start", {"study": self.study.name, "backend": self.backend_kind, "reason": self.backend_reason,
                                "budget": budget, "done": launched})
        executor = self._make_executor()
        heartbeat = threading.Thread(target=self._heartbeat_loop, args=(ostudy,), daemon=True)
        heartbeat.start()
        stopped_reason = None
        asks = 0
        try:
            while True:
                if self.time_limit_s is not None and self._winding_down is None:
                    why = self._time_limit_reason(time.time() - t0)
                    if why and stopped_reason is None:
                        stopped_reason = why
                    if why and time.time() - t0 >= self.time_limit_s:
                        self._winding_down = why  # running trials close after their current step
                can_start = (launched < budget and len(self._running) < self.parallel and stopped_reason is None
                             and not self._stop.is_set())
                if can_start:
                    asks += 1
                    if asks > 20 * budget + 50:
                        stopped_reason = "the search space has no more new feasible configurations to try"
                        continue
                    if self._start_next(ostudy, executor):
                        launched += 1
                    continue
                if not self._running:
                    break
                for res in executor.wait(timeout_s=0.5):
                    self._handle(res, ostudy, executor)
                if self.max_failures is not None and self._counts["failed"] >= self.max_failures and stopped_reason is None:
                    stopped_reason = (f"stopped after {self._counts['failed']} failed trials (--max-failures "
                                      f"{self.max_failures}); see `tuner study status {self.study.name}` for the reasons")
                    launched = budget  # let running trials finish, start no new ones
        except KeyboardInterrupt:
            stopped_reason = "interrupted by the user"
            raise
        finally:
            self._stop.set()
            executor.shutdown()
            if stopped_reason == "interrupted by the user":
                for rt in list(self._running.values()):
                    self._finish(rt, ostudy, "interrupted", None, "interrupted", "interrupted by the user")
        status = "stopped" if stopped_reason and "no more" not in stopped_reason else "finished"
        repo.set_study_status(self.engine, self.study.name, status)
        best = repo.best_trial(self.engine, self.study.name)
        base = repo.baseline_trial(self.engine, self.study.name)
        outcome = StudyOutcome(
            name=self.study.name, backend_kind=self.backend_kind, backend_reason=self.backend_reason,
            trials_run=launched, trials_failed=self._counts["failed"], trials_infeasible=self._counts["infeasible"],
            prescreened=self._counts["prescreened"], duplicates=self._counts["duplicates"],
            best_trial_number=best.trial_number if best else None,
            best_capacity_users=best.capacity_users if best else None,
            baseline_capacity_users=base.capacity_users if base else None,
            wall_time_s=time.time() - t0, stopped_reason=stopped_reason, trials_pruned=self._counts["pruned"],
            enqueued=self._counts["enqueued"])
        self.on_event("end", outcome.to_dict())
        return outcome

    def _time_limit_reason(self, elapsed_s: float) -> str | None:
        """Why the time limit stops this run now (None: it does not)."""
        if elapsed_s >= self.time_limit_s:
            return f"time limit of {self.time_limit_s:g} s reached"
        if self._trial_walls and not self._running:
            import statistics

            expected = statistics.median(self._trial_walls)
            if elapsed_s + expected > self.time_limit_s:
                return (f"time limit: {self.time_limit_s - elapsed_s:.0f} s left, a trial here takes about "
                        f"{expected:.0f} s")
        return None

    def _make_executor(self):
        from tuner.study.executor import InProcessExecutor, RayExecutor

        if not self.use_ray:
            return InProcessExecutor()
        return RayExecutor(self.ray_address)

    def _heartbeat_loop(self, ostudy):
        storage = ostudy._storage
        while not self._stop.wait(HEARTBEAT_INTERVAL_S / 2):
            for rt in list(self._running.values()):
                try:
                    storage.record_heartbeat(rt.optuna_trial._trial_id)
                except Exception:  # a missed heartbeat is retried next round
                    log.debug("heartbeat failed", exc_info=True)

    # ---------------------------------------------------------------- one trial
    def _start_next(self, ostudy, executor) -> bool:
        """Ask for a configuration; launch it, or settle it at once. True if launched."""
        has_trials = self._has_trials
        self._has_trials = True
        if has_trials and self._queue:
            # one at a time, so Optuna holds no waiting trial the budget never reaches
            ostudy.enqueue_trial(self._queue.pop(0), skip_if_exists=True)
            self._counts["enqueued"] += 1
        with warnings.catch_warnings():
            # we record heartbeats ourselves (ask/tell, not Study.optimize)
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            otrial = ostudy.ask()
        # at once: Optuna never counts a trial without any heartbeat as stale, so a driver killed
        # before the loop's first beat would leave a trial that no resume could take over
        try:
            ostudy._storage.record_heartbeat(otrial._trial_id)
        except Exception:
            log.debug("first heartbeat failed", exc_info=True)
        is_baseline = not has_trials
        if is_baseline:
            values = baseline_values(self.study)
            otrial.set_user_attr("baseline", True)
        else:
            values = space_mod.suggest(otrial, self.study.space(), self.env)
        engine_name = self.study.space().engine
        flags, knobs = space_mod.split(values, engine_name, space_mod.pinned_flags(self.study))
        otrial.set_user_attr("config", {k: v for k, v in values.items()})
        number = otrial.number

        violated = space_mod.violated_constraints(self.study.space(), values, self.env) if not is_baseline else []
        if violated:
            self._counts["infeasible"] += 1
            self._settle_without_launch(ostudy, otrial, values, flags, knobs, is_baseline, "infeasible",
                                        "infeasible", "violates constraint(s): " + "; ".join(violated))
            return False
        key = _config_key(values)
        if key in self._seen and not is_baseline:
            self._counts["duplicates"] += 1
            cap = self._seen[key]
            if cap is None:  # same configuration is running right now: ask again later
                ostudy.tell(otrial, state=__import__("optuna").trial.TrialState.PRUNED)
                return False
            otrial.set_user_attr("duplicate", True)
            mark_feasible(otrial, cap > 0)
            ostudy.tell(otrial, float(cap))
            return False
        predicted_kv = None
        if engine_name == "sglang":
            fits, reason, predicted_kv = _prescreen(self.study, flags)
            if not fits and self.prescreen:
                self._counts["prescreened"] += 1
                self._counts["infeasible"] += 1
                self._settle_without_launch(ostudy, otrial, values, flags, knobs, is_baseline, "infeasible",
                                            "infeasible", f"planner: {reason}", predicted_kv=predicted_kv)
                return False

        self._seen[key] = None
        request = TrialRequest(study=self.study, trial_number=number, flags=flags, knobs=knobs,
                               workdir=str(paths.inside(self.workdir, self.study.name)),  # backends add trial-NNNN
                               seed=self.seed + number)
        from tuner.evaluation.registry import get_evaluator

        num_gpus = get_evaluator(self.backend_kind).gpus_needed(request)
        repo.start_trial(self.engine, study_name=self.study.name, trial_number=number,
                         optuna_trial_id=otrial._trial_id, backend_kind=self.backend_kind, params=values,
                         flags=flags, knobs=knobs, is_baseline=is_baseline,
                         predicted_kv_capacity_tokens=predicted_kv)
        rt = RunningTrial(number=number, optuna_trial=otrial, values=values, flags=flags, knobs=knobs,
                          search=CapacitySearch.for_study(self.study), num_gpus=num_gpus, is_baseline=is_baseline)
        self._running[number] = rt
        executor.submit(number, "deploy", self.backend_kind, request, num_gpus=num_gpus)
        self.on_event("trial_start", {"number": number, "config": values, "baseline": is_baseline})
        return True

    def _initial_queue(self, tried: set[str]) -> list[dict]:
        """Launched right after the baseline: warm-start configurations, then the default sampler's
        planner-ranked seeds (tuner.study.samplers.seed_configs); those already tried are skipped."""
        configs = list(self.initial_configs)
        if self.study.sampler == "default":
            try:
                configs += seed_configs(self.study)
            except Exception:  # seeds are an optimisation: a planner gap must not stop the study
                log.warning("planner-ranked seeds unavailable", exc_info=True)
        out, keys = [], set(tried)
        for cfg in configs:
            if _config_key(cfg) not in keys:
                keys.add(_config_key(cfg))
                out.append(cfg)
        return out

    def _settle_without_launch(self, ostudy, otrial, values, flags, knobs, is_baseline, status, failure_class,
                               reason, predicted_kv=None):
        repo.start_trial(self.engine, study_name=self.study.name, trial_number=otrial.number,
                         optuna_trial_id=otrial._trial_id, backend_kind=self.backend_kind, params=values,
                         flags=flags, knobs=knobs, is_baseline=is_baseline, predicted_kv_capacity_tokens=predicted_kv)
        repo.finish_trial(self.engine, self.study.name, otrial.number, status=status, capacity_users=0,
                          failure_class=failure_class, failure_reason=reason, telemetry={"not_launched": True})
        mark_feasible(otrial, False)
        otrial.set_user_attr("failure", reason)
        ostudy.tell(otrial, 0.0)
        self.on_event("trial_end", {"number": otrial.number, "status": status, "capacity": 0, "reason": reason,
                                    "launched": False})

    def _handle(self, res, ostudy, executor) -> None:
        rt = self._running.get(res.key)
        if rt is None:
            return
        if res.op == "close":
            if res.ok and res.value:
                repo.update_trial(self.engine, self.study.name, rt.number,
                                  telemetry=_jsonable({**_placement(rt.info), **res.value}))
            status, cap, fclass, reason = rt.pending_outcome
            self._finish(rt, ostudy, status, cap, fclass, reason)
            return
        if not res.ok:
            err = res.error
            status = "infeasible" if err.failure_class == "infeasible" else "failed"
            self._finish(rt, ostudy, status, 0 if status == "infeasible" else None, err.failure_class, err.reason,
                         log_path=err.log_path)
            return
        if res.op == "deploy":
            rt.info = res.value or {}
            predicted = rt.info.get("predicted_kv_capacity_tokens_total")
            repo.update_trial(self.engine, self.study.name, rt.number,
                              pids=rt.info.get("pids", []), gpu_ids=rt.info.get("gpu_ids", []),
                              telemetry=_jsonable(_placement(rt.info)),
                              log_path=rt.info.get("log_path"),
                              # live backends predict nothing: keep the planner's figure from the start
                              **({"predicted_kv_capacity_tokens": predicted} if predicted is not None else {}),
                              measured_kv_capacity_tokens=rt.info.get("measured_kv_capacity_tokens_total"))
            self._next_step(rt, executor)
            return
        if res.op == "measure":
            metrics, wall = res.value
            passed = rt.search.meets(metrics)
            repo.add_measurement(self.engine, study_name=self.study.name, trial_number=rt.number, step=rt.step,
                                 backend_kind=self.backend_kind, metrics=metrics, meets_slo=passed, wall_time_s=wall)
            rt.search.record(metrics.users, passed)
            rt.step += 1
            rt.last_metrics = metrics
            try:
                rt.optuna_trial.report(float(rt.search.capacity_users), rt.step)
            except Exception:
                log.debug("report failed", exc_info=True)
            self.on_event("measurement", {"number": rt.number, "users": metrics.users, "passed": passed,
                                          "p90_ttft_s": metrics.p90_ttft_s, "p90_tpot_s": metrics.p90_tpot_s})
            if self.prune and not rt.is_baseline and should_prune(rt.search, self._incumbent):
                rt.pending_outcome = ("pruned", rt.search.capacity_users, None,
                                      prune_reason(rt.search, self._incumbent))
                executor.submit(rt.number, "close")
                return
            self._next_step(rt, executor)

    def _next_step(self, rt: RunningTrial, executor) -> None:
        if self._winding_down:  # the run's time is up: keep what was measured, free the GPUs
            rt.pending_outcome = ("interrupted", None, "interrupted", self._winding_down)
            executor.submit(rt.number, "close")
            return
        users = rt.search.next_users()
        if users is not None:
            executor.submit(rt.number, "measure", users)
            return
        rt.pending_outcome = ("complete", rt.search.capacity_users, None, None)
        executor.submit(rt.number, "close")

    def _finish(self, rt, ostudy, status, capacity, failure_class, reason, log_path=None) -> None:
        self._running.pop(rt.number, None)
        if status in ("complete", "pruned", "failed"):
            self._trial_walls.append(time.time() - rt.started_at)
        extra = {"log_path": log_path} if log_path else {}
        repo.finish_trial(self.engine, self.study.name, rt.number, status=status, capacity_users=capacity,
                          failure_class=failure_class, failure_reason=reason, **extra)
        key = _config_key(rt.values)
        if status in ("complete", "pruned"):
            self._seen[key] = capacity  # pruned: its lower bound, which cannot beat the best either
            if status == "complete":
                self._incumbent = max(self._incumbent or 0, capacity or 0)
            else:
                self._counts["pruned"] += 1
        else:
            self._seen.pop(key, None)
            if status == "failed":
                self._counts["failed"] += 1
            elif status == "infeasible":
                self._counts["infeasible"] += 1
        import optuna

        if status == "interrupted":
            ostudy.tell(rt.optuna_trial, state=optuna.trial.TrialState.FAIL)
        else:
            feasible = status in ("complete", "pruned")
            mark_feasible(rt.optuna_trial, feasible)
            if status == "pruned":
                rt.optuna_trial.set_user_attr("pruned", reason)
            elif reason:
                rt.optuna_trial.set_user_attr("failure", f"{failure_class}: {reason}")
            ostudy.tell(rt.optuna_trial, float(capacity or 0))
        self.on_event("trial_end", {"number": rt.number, "status": status, "capacity": capacity,
                                    "reason": reason, "failure_class": failure_class, "launched": True,
                                    "baseline": rt.is_baseline})


def _config_key(values: dict) -> str:
    return repr(sorted((k, v) for k, v in values.items() if v is not None))


def _placement(info: dict) -> dict:
    """Where the deploy ran and what it started, kept in the trial's telemetry."""
    keys = ("node", "ray_node_id", "cuda_visible_devices", "gpu_ids", "process_identities")
    return {k: info[k] for k in keys if info.get(k) is not None}


def _jsonable(d: dict) -> dict:
    import json

    return json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _prescreen(study: StudySpec, flags: dict) -> tuple[bool, str, int | None]:
    """Planner verdict before launching: (fits, reason, predicted KV tokens of the node/cluster)."""
    try:
        from tuner.catalog import get_gpu, get_model
        from tuner.planner import plan_memory
    except ImportError:
        return True, "", None
    try:
        plan = plan_memory(get_model(study.model), get_gpu(study.hardware.gpu), study.hardware.gpus_per_node,
                           flags, nodes=study.hardware.nodes, host_memory_gb=study.hardware.host_memory_gb)
    except TrialError as exc:
        return False, exc.reason, None
    except UserError as exc:
        return False, str(exc), None
    return bool(plan.fits), plan.reason or "", plan.kv_capacity_tokens_total


def _pid_files(trial_dir: str) -> list[dict]:
    """Process identities the trial's servers wrote beside their logs (tuner.backends.process)."""
    import json
    from pathlib import Path

    from tuner.backends.process import PID_FILE_SUFFIX

    out = []
    for f in sorted(Path(trial_dir).glob(f"*{PID_FILE_SUFFIX}")):
        try:
            out += [d for d in json.loads(f.read_text()) if isinstance(d, dict) and "pid" in d]
        except (OSError, ValueError):
            log.warning("unreadable PID file %s", f)
    return out


def _reap(pids: list) -> dict[int, str]:
    """{pid: gone | not_ours | killed | survived} for the recorded processes of a dead trial."""
    if not pids:
        return {}
    from tuner.backends.process import reap_pids

    return reap_pids(pids)


def load_existing(storage_url: str, name: str) -> StudySpec:
    """The study exactly as it was started (its stored snapshot)."""
    engine = db.get_engine(storage_url, create=False)
    if not db.has_schema(engine):
        raise StudyNotFoundError(f"no study {name!r} in {storage_url} (the database has no tuner studies)")
    row = repo.get_study(engine, name)
    if row is None:
        names = [s.name for s in repo.list_studies(engine)]
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise StudyNotFoundError(f"no study {name!r} in {storage_url}{hint}; studies there: {', '.join(names) or 'none'}")
    return StudySpec.model_validate(yaml.safe_load(row.spec_yaml))
