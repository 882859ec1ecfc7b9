"""Where trials run: Ray actors (local Ray by default, a cluster by address) or in-process.

The driver talks to trials through three operations -- deploy, measure(users), close -- submitted
asynchronously and collected with ``wait``. Workers only compute and return; the driver writes.
A trial that needs GPUs gets its own actor with ``num_gpus`` (Ray sets CUDA_VISIBLE_DEVICES for it)
and the actor is destroyed at the end so the GPUs are free again; CPU-only trials (the simulator)
reuse a pool of actors to avoid process start-up per trial.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import tuner

from tuner.backends import gpu
from tuner.backends.process import identify
from tuner.errors import TrialError, UserError
from tuner.evaluation.registry import get_evaluator
from tuner.lifecycle import FailureClass, Operation

log = logging.getLogger(__name__)


@dataclass
class OpResult:
    key: int  # trial number
    op: Operation
    ok: bool
    value: Any  # deploy: info dict; measure: (LoadPointMetrics, wall_time_s); close: None
    error: TrialError | None = None


class TrialWorker:
    """Holds one deployment at a time. Runs inside a Ray actor or in-process."""

    def __init__(self, gpu_ids=()):
        self._deployment = None
        self._evaluator = None
        self._gpu_ids = list(gpu_ids)  # without Ray: the GPUs the in-process executor gives this trial

    def deploy(self, kind: str, request) -> dict:
        if self._deployment is not None:
            self.close()
        gpu_ids = _assigned_gpu_ids() or self._gpu_ids
        if gpu_ids:
            request = replace(request, gpu_ids=tuple(gpu_ids))
        self._evaluator = get_evaluator(kind)
        self._deployment = self._evaluator.deploy(request)
        d = self._deployment
        return {
            "predicted_kv_capacity_tokens_total": d.predicted_kv_capacity_tokens_total,
            "measured_kv_capacity_tokens_total": d.measured_kv_capacity_tokens_total,
            "pids": list(d.pids),
            "process_identities": _identities(d.pids),
            "log_path": d.log_path,
            "gpu_ids": list(gpu_ids),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "node": os.uname().nodename,
            "ray_node_id": _ray_node_id(),  # several Ray nodes may share one host name
            "startup": _startup_facts(d),
        }

    def measure(self, users: int):
        if self._deployment is None:
            raise TrialError(FailureClass.INTERNAL, "measure() before deploy()")
        t0 = time.perf_counter()
        metrics = self._deployment.measure(users)
        return metrics, time.perf_counter() - t0

    def close(self) -> dict:
        d, self._deployment = self._deployment, None
        if d is None:
            return {}
        try:
            telemetry = d.telemetry()
        except Exception as exc:  # telemetry is best effort; teardown is not
            telemetry = {"error": str(exc)}
        d.close()
        report = getattr(d, "close_report", None)  # teardown facts (GPU memory released) exist only now
        if report:
            telemetry["close"] = report
        return telemetry

    def call(self, op: Operation, *args):
        """Run ``op`` and turn any failure into data, so one bad trial never stops the study."""
        op = Operation(op)
        try:
            return True, getattr(self, op.value)(*args), None
        except TrialError as exc:
            if op is not Operation.CLOSE:
                self._safe_close()
            return False, None, exc
        except Exception as exc:  # a bug in a backend: the trial fails, the study goes on
            log.exception("trial %s failed with an internal error", op)
            self._safe_close()
            return False, None, TrialError(FailureClass.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _safe_close(self):
        try:
            self.close()
        except Exception:
            log.exception("teardown after a failure raised")


STARTUP_KEYS = ("backend", "base_url", "ready_after_s", "server", "server_info", "plan", "files", "logs",
                "gpu_memory_used_mib")


def _startup_facts(deployment) -> dict:
    """What the deployment knows once it answers (start-up times, the server's own report): recorded
    at deploy, so that a trial stopped before its teardown (Ctrl-C, a time limit's backstop) keeps
    them; the teardown's telemetry replaces them with the whole record."""
    try:
        tel = deployment.telemetry()
    except Exception:  # noqa: BLE001 - best effort, as the teardown's telemetry is
        return {}
    return {k: tel[k] for k in STARTUP_KEYS if tel.get(k) is not None}


def _identities(pids) -> list[dict]:
    """PID + start time + command line of each live process, so a later resume can reap exactly
    these processes (and never a process that reused the PID)."""
    out = []
    for pid in pids:
        ident = identify(int(pid))
        if ident is not None:
            out.append(ident.to_dict())
    return out


def _ray_node_id() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return None


def _assigned_gpu_ids() -> list:
    try:
        import ray

        if ray.is_initialized():
            return [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        pass
    return []


def _local_gpu_ids(n: int) -> list[str]:
    """The first ``n`` GPUs of this process (one trial at a time, so no bookkeeping): the ids in
    CUDA_VISIBLE_DEVICES where it is set, else NVML's indices. Fewer when fewer exist."""
    if n <= 0:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        ids = [str(g.index) for g in gpu.detect_gpus()]
    return ids[:n]


def deploy_here(evaluator, request):
    """``request`` deployed on this machine's first GPUs, outside Ray (an export check, a tile A/B:
    one deployment at a time)."""
    gpu_ids = tuple(int(g) for g in _local_gpu_ids(evaluator.gpus_needed(request)))
    return evaluator.deploy(replace(request, gpu_ids=gpu_ids))


class InProcessExecutor:
    """Runs operations one at a time in the driver process (no Ray): for debugging and small runs."""

    def __init__(self):
        self._workers: dict[int, TrialWorker] = {}
        self._queue: list[tuple[int, Operation, tuple]] = []

    @staticmethod
    def concurrent_trials(num_gpus: int) -> tuple[int, str]:
        """Trials at once, and why: one, since every operation runs in this one thread (and GPU
        trials would share the first GPUs)."""
        return 1, "without Ray (--no-ray) trials run one at a time in this process"

    def submit(self, key: int, op: Operation, *args, num_gpus: int = 0) -> None:
        if key not in self._workers:
            self._workers[key] = TrialWorker(gpu_ids=_local_gpu_ids(num_gpus))
        self._queue.append((key, op, args))

    def wait(self, timeout_s: float = 0.5) -> list[OpResult]:
        if not self._queue:
            time.sleep(min(timeout_s, 0.05))
            return []
        key, op, args = self._queue.pop(0)
        ok, value, err = self._workers[key].call(op, *args)
        if op == Operation.CLOSE:
            self._workers.pop(key, None)
        return [OpResult(key, op, ok, value, err)]

    def shutdown(self) -> None:
        for w in self._workers.values():
            w._safe_close()
        self._workers.clear()


class RayExecutor:
    def __init__(self, address: str | None = None, *, cpus_per_trial: float = 1.0):
        import ray

        self._ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                          logging_level=logging.WARNING, configure_logging=True)
            # "local" starts a Ray of our own: without it ray.init() joins any cluster this machine
            # started last (ray start, another program's Ray), whose nodes and lifetime are not ours
            kwargs["address"] = address or "local"
            # workers import tuner from the same place the driver does
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": _pythonpath()}}
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise UserError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
        self._actor_cls = ray.remote(TrialWorker)
        self._cpus = cpus_per_trial
        self._actors: dict[int, Any] = {}
        self._actor_gpus: dict[int, int] = {}
        self._idle_cpu_actors: list = []
        self._pending: dict[Any, tuple[int, Operation]] = {}
        self._refused: list[OpResult] = []
        self._cluster: dict[str, float] | None = None

    def _resources(self) -> dict[str, float]:
        """What the whole cluster declares (read once: nodes joining later are not seen)."""
        if self._cluster is None:
            self._cluster = {k: float(v) for k, v in self._ray.cluster_resources().items()}
        return self._cluster

    def cluster_gpus(self) -> float:
        return self._resources().get("GPU", 0.0)

    def cluster_cpus(self) -> float:
        return self._resources().get("CPU", 0.0)

    def concurrent_trials(self, num_gpus: int) -> tuple[int, str] | None:
        """How many CPU-only trials the cluster holds at once, and why (None: no limit here). A
        CPU-only trial's actor keeps its CPU between trials (it is reused), so one launched beyond
        the CPUs would wait for ever; a GPU trial's actor is destroyed at its end, so GPU trials
        beyond the free GPUs wait their turn, and one that needs more than the cluster has is
        refused at submit."""
        if num_gpus > 0:
            return None
        cpus = self.cluster_cpus()
        return int(cpus // self._cpus), (f"the Ray cluster has {cpus:g} CPU(s) and each CPU-only trial takes "
                                         f"{self._cpus:g}")

    def submit(self, key: int, op: Operation, *args, num_gpus: int = 0) -> None:
        actor = self._actors.get(key)
        if actor is None and num_gpus > 0 and num_gpus > self.cluster_gpus():
            # Ray would keep such an actor pending forever: settle the trial now instead
            self._refused.append(OpResult(key, op, False, None, TrialError(
                FailureClass.INFEASIBLE, f"needs {num_gpus} GPU(s) but the Ray cluster has {self.cluster_gpus():g} in all "
                              f"(run on a GPU node, or join a cluster with --ray-address)")))
            return
        if actor is None and num_gpus == 0 and not self._idle_cpu_actors and self.cluster_cpus() < self._cpus:
            self._refused.append(OpResult(key, op, False, None, TrialError(
                FailureClass.INFEASIBLE, f"needs {self._cpus:g} CPU but the Ray cluster has {self.cluster_cpus():g} "
                                         f"(join a cluster with CPUs to spare with --ray-address)")))
            return
        if actor is None:
            if num_gpus == 0 and self._idle_cpu_actors:
                actor = self._idle_cpu_actors.pop()
            else:
                actor = self._actor_cls.options(num_gpus=num_gpus, num_cpus=self._cpus if num_gpus == 0 else 0.5,
                                                max_restarts=0).remote()
            self._actors[key] = actor
            self._actor_gpus[key] = num_gpus
        ref = actor.call.remote(op, *args)
        self._pending[ref] = (key, op)

    def wait(self, timeout_s: float = 0.5) -> list[OpResult]:
        if self._refused:
            out, self._refused = self._refused, []
            return out
        if not self._pending:
            time.sleep(min(timeout_s, 0.05))
            return []
        ready, _ = self._ray.wait(list(self._pending), num_returns=1, timeout=timeout_s)
        out = []
        for ref in ready:
            key, op = self._pending.pop(ref)
            try:
                ok, value, err = self._ray.get(ref)
            except Exception as exc:  # the actor process died (e.g. killed by the OOM killer)
                ok, value, err = False, None, TrialError(FailureClass.CRASH,
                                                         f"trial worker died: {type(exc).__name__}: {exc}")
                self._discard(key, kill=True)
            if op == Operation.CLOSE or not ok:
                self._release(key)
            out.append(OpResult(key, op, ok, value, err))
        return out

    def _release(self, key: int) -> None:
        actor = self._actors.pop(key, None)
        gpus = self._actor_gpus.pop(key, 0)
        if actor is None:
            return
        if gpus == 0:
            self._idle_cpu_actors.append(actor)
        else:
            self._ray.kill(actor)  # frees its GPUs for the next trial

    def _discard(self, key: int, kill: bool) -> None:
        actor = self._actors.pop(key, None)
        self._actor_gpus.pop(key, None)
        if actor is not None and kill:
            try:
                self._ray.kill(actor)
            except Exception:
                pass

    def shutdown(self) -> None:
        for actor in list(self._actors.values()) + self._idle_cpu_actors:
            try:
                self._ray.kill(actor)
            except Exception:
                pass
        self._actors.clear()
        self._idle_cpu_actors.clear()


def shutdown_ray() -> None:
    """Stop the Ray this process started, if any (its raylet, GCS server, agents, workers)."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:
        log.warning("ray.shutdown() failed", exc_info=True)


def _pythonpath() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(tuner.__file__)))
    existing = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + existing if existing else "")
