"""Live evaluation: start a real server (SGLang, ``transformers serve``) and replay the workload.

``LiveEvaluator`` is generic over a ``tuner.backends.base.ProcessBackend``:

* ``deploy`` builds the backend's launch plan, starts the server process(es) and waits until they
  answer, starts the router in front if the plan has one, reads the KV capacity the server
  reports, and starts a GPU telemetry sampler;
* ``measure(users)`` replays the workload (``tuner.workload.replay.run_load_point``) against the
  server or router while watching every process: a process that dies is ``crash`` (``oom`` when
  its log says so); a live server that produced nothing and no longer answers ``/health`` is
  ``hang``;
* ``close`` stops everything (router first), verifies every PID is gone and, where NVML works,
  that the trial's processes no longer hold GPU memory.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tuner.backends.base import LaunchPlan, ProcessBackend
from tuner.backends.process import ProcessStack
from tuner.errors import TrialError
from tuner.evaluation.base import Deployment, Evaluator, TrialRequest
from tuner.workload.metrics import LoadPointMetrics

log = logging.getLogger(__name__)

PORT_RETRIES = 2  # a free port can be taken between choosing and binding it
HEALTH_PROBE_TIMEOUT_S = 30.0


def trial_dir_for(request: TrialRequest) -> Path:
    """``<workdir>/trial-<n>``: each trial's files and logs in its own directory."""
    return Path(request.workdir) / f"trial-{request.trial_number:04d}"


class LiveEvaluator(Evaluator):
    """Any process backend, measured by the replay client."""

    def __init__(self, backend: ProcessBackend):
        self.backend = backend
        self.kind = backend.kind

    def gpus_needed(self, request: TrialRequest) -> int:
        return self.backend.gpus_needed(request)

    def deploy(self, request: TrialRequest) -> "LiveDeployment":
        trial_dir = trial_dir_for(request)
        last: TrialError | None = None
        for attempt in range(PORT_RETRIES + 1):
            plan = self.backend.build_plan(request, trial_dir)
            stack = ProcessStack()
            try:
                _start(stack, plan)
            except TrialError as exc:
                stack.close()
                if exc.failure_class == "port_in_use" and attempt < PORT_RETRIES:
                    log.warning("trial %d: %s; retrying with new ports", request.trial_number, exc.reason)
                    last = exc
                    continue
                raise
            except BaseException:
                stack.close()
                raise
            return LiveDeployment(self.backend, request, plan, stack)
        raise last  # pragma: no cover - loop always returns or raises


def _start(stack: ProcessStack, plan: LaunchPlan) -> None:
    # Workers load in parallel (each on its own GPUs), then the router starts in front of them.
    servers = [stack.start(spec, wait=False) for spec in plan.servers]
    for server in servers:
        for other in servers:
            other.check_alive("startup") if other.proc and other.poll() is not None else None
        server.wait_ready()
    if plan.router is not None:
        stack.start(plan.router, wait=True)


class LiveDeployment(Deployment):
    def __init__(self, backend: ProcessBackend, request: TrialRequest, plan: LaunchPlan, stack: ProcessStack):
        from tuner.backends import gpu

        self.backend = backend
        self.request = request
        self.plan = plan
        self.stack = stack
        self.kind = backend.kind
        self.log_path = plan.servers[0].log_path if plan.servers else None
        self._closed = False
        self._close_report: dict[str, Any] = {}
        self._gpu_ids = tuple(request.gpu_ids)
        self._gpu_baseline = gpu.memory_used_mib(self._gpu_ids)  # after start: close waits for below
        self.facts = backend.server_facts(plan)
        self.measured_kv_capacity_tokens_total = self.facts.get("kv_capacity_tokens_total")
        self.pids = stack.pids
        self.sampler = gpu.GPUSampler(self._gpu_ids).start()
        self.measurements = 0

    # ---- measuring -----------------------------------------------------------------------
    def _replay_kwargs(self, users: int) -> dict[str, Any]:
        study = self.request.study
        m = study.measurement
        fid = max(0.0, min(1.0, float(self.request.fidelity or 1.0)))
        return dict(
            warmup_s=float(m.warmup_s) * fid,
            duration_s=max(1.0, float(m.duration_s) * fid),
            seed=self.request.seed + 1009 * self.measurements,
            api=self.plan.api,
            model=self.plan.served_model,
            vocab_size=self.plan.vocab_size,
            send_ignore_eos=self.plan.send_ignore_eos,
            request_timeout_s=float(getattr(m, "request_timeout_s", 600)),
            max_error_rate=float(m.max_error_rate),
            time_scale=float(getattr(m, "time_scale", 1.0)),
        )

    def measure(self, users: int) -> LoadPointMetrics:
        from tuner.workload.replay import run_load_point

        if self._closed:
            raise RuntimeError("measure() after close()")
        self.stack.check_alive("replay")
        kwargs = self._replay_kwargs(users)
        profile = self.request.study.workload_profile()
        result: dict[str, Any] = {}

        def target():
            try:
                result["metrics"] = run_load_point(self.plan.base_url, profile, users, **kwargs)
            except BaseException as exc:  # surfaced in the caller's thread
                result["error"] = exc

        worker = threading.Thread(target=target, name=f"replay-{users}", daemon=True)
        worker.start()
        died = None
        while worker.is_alive():
            worker.join(timeout=0.5)
            dead = self.stack.dead()
            if dead and died is None:
                died = dead[0]
                log.warning("%s died during the replay at %d users", died.spec.name, users)
                # the replay's requests now fail fast; let it finish so no client outlives the trial
        self.measurements += 1
        self.pids = tuple(dict.fromkeys((*self.pids, *self.stack.pids)))
        if died is not None or self.stack.dead():
            server = died or self.stack.dead()[0]
            raise server.failure_for_exit("replay")
        if "error" in result:
            raise result["error"]
        metrics: LoadPointMetrics = result["metrics"]
        if _no_progress(metrics) and not self._answers_health():
            raise TrialError(
                "hang",
                f"no tokens at {users} users ({metrics.invalid_reason or 'no request completed'}) and "
                f"{self.plan.base_url}/health does not answer while the process is alive",
                log_path=self.log_path)
        extra = dict(metrics.extra)
        extra.setdefault("backend", self.kind)
        if metrics.kv_capacity_tokens_total is None and self.measured_kv_capacity_tokens_total is not None:
            metrics = dataclasses.replace(metrics, kv_capacity_tokens_total=self.measured_kv_capacity_tokens_total,
                                          extra=extra)
        else:
            metrics = dataclasses.replace(metrics, extra=extra)
        return metrics

    def _answers_health(self) -> bool:
        for spec in self.plan.all_specs:
            try:
                with urllib.request.urlopen(spec.base_url + spec.ready_paths[-1],
                                            timeout=HEALTH_PROBE_TIMEOUT_S) as resp:
                    if resp.status != 200:
                        return False
            except (urllib.error.URLError, OSError):
                return False
        return True

    # ---- records -------------------------------------------------------------------------
    def telemetry(self) -> dict:
        return {
            "backend": self.kind,
            "base_url": self.plan.base_url,
            "plan": self.plan.facts,
            "files": self.plan.files,
            "logs": [s.log_path for s in self.plan.all_specs],
            "ready_after_s": {s.spec.name: s.ready_after_s for s in self.stack.servers},
            "server": {k: v for k, v in self.facts.items() if k != "server_info"},
            "server_info": self.facts.get("server_info"),
            "pids": list(self.pids),
            "process_identities": self.stack.identities(),
            "gpu": self.sampler.summary(),
            "close": self._close_report,
        }

    # ---- teardown ------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        from tuner.backends import gpu

        report: dict[str, Any] = {"gpu_summary": self.sampler.stop()}
        pids = self.stack.pids
        survivors = self.stack.close()
        report["survivors"] = sorted(survivors)
        if self._gpu_ids:
            report["gpu_release"] = gpu.wait_memory_released(self._gpu_ids, pids, timeout_s=60.0)
            if report["gpu_release"].get("released") is False:
                log.error("trial %d: GPU memory not released: %s", self.request.trial_number,
                          report["gpu_release"])
        if survivors:
            log.error("trial %d: processes %s survived teardown", self.request.trial_number, sorted(survivors))
        self._close_report = report


def _no_progress(m: LoadPointMetrics) -> bool:
    """Nothing came back: no request finished, or every one failed."""
    return m.requests == 0 or m.errors >= m.requests


# ---- the registry's classes --------------------------------------------------------------


class SGLangEvaluator(LiveEvaluator):
    def __init__(self):
        from tuner.backends.sglang import SGLangBackend

        super().__init__(SGLangBackend())


class TransformersEvaluator(LiveEvaluator):
    def __init__(self):
        from tuner.backends.transformers import TransformersBackend

        super().__init__(TransformersBackend())
