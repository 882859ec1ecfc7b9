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

import asyncio
import dataclasses
import gzip
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tuner.backends import gpu
from tuner.backends.base import LaunchPlan, ProcessBackend
from tuner.backends.process import ProcessStack
from tuner import paths
from tuner.backends.sglang import SGLangBackend
from tuner.backends.transformers import TransformersBackend
from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import Deployment, Evaluator, TrialRequest
from tuner.evaluation.kernel_ledger import KernelLedger, kernel_set_key, served_token_counts
from tuner.evaluation.prediction import PREDICTION_KEY, predict
from tuner.sim.warmup import CachedKernels
from tuner.lifecycle import FailureClass
from tuner.kernels.targets import SGLANG_BATCH_SIZES
from tuner.workload.kernel_warmup import prompt_lengths, run_kernel_warmup
from tuner.workload.metrics import KERNEL_CACHE_KEY, LoadPointMetrics
from tuner.backends.prometheus import BREAKDOWN_LABELS, scrape, window_delta

log = logging.getLogger(__name__)

PORT_RETRIES = 2  # a free port can be taken between choosing and binding it
HEALTH_PROBE_TIMEOUT_S = 30.0  # SGLang's /health itself gives up after 20 s (SGLANG_HEALTH_CHECK_TIMEOUT)
HANG_PROBE_INTERVAL_S = 15.0  # during a replay, /health is probed this often ...
HANG_PROBE_FAILURES = 3  # ... and this many failures in a row while the process lives is a hang
# a replay that broke off with an error waits this long for a server that is still exiting: a crash
# breaks the client's connections before the process is reaped, and the crash is the trial's failure
EXIT_GRACE_S = 3.0


def trial_dir_for(request: TrialRequest) -> Path:
    """``<workdir>/trial-<n>``: each trial's files and logs in its own directory."""
    try:
        return paths.inside(request.workdir, f"trial-{request.trial_number:04d}")
    except paths.PathOutsideError as exc:  # a link planted where the trial directory goes
        raise TrialError("internal", str(exc)) from None


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
            before_mib = gpu.memory_used_mib(request.gpu_ids)  # what close() must return to
            kernel_cache = self.backend.kernel_cache_state(plan)
            ledger = _LedgerView.before_start(self.backend, plan)  # what the servers will find built
            stack = ProcessStack()
            try:
                _start(stack, plan)
            except TrialError as exc:
                stack.close()
                if exc.failure_class == FailureClass.PORT_IN_USE and attempt < PORT_RETRIES:
                    log.warning("trial %d: %s; retrying with new ports", request.trial_number, exc.reason)
                    last = exc
                    continue
                detailed = _with_startup_detail(self.backend, plan, exc)
                if detailed is exc:
                    raise
                raise detailed from None
            except BaseException:
                stack.close()
                raise
            return LiveDeployment(self.backend, request, plan, stack, gpu_before_start_mib=before_mib,
                                  kernel_cache_before_start=kernel_cache, kernel_ledger=ledger)
        raise last  # pragma: no cover - loop always returns or raises


def _with_startup_detail(backend: ProcessBackend, plan: LaunchPlan, exc: TrialError) -> TrialError:
    """The failure with where in start-up the server died, from its own log (e.g. "while capturing
    decode CUDA graphs after the KV pool was allocated")."""
    log_path = exc.log_path or (plan.servers[0].log_path if plan.servers else None)
    if not log_path or exc.failure_class in ("port_in_use",):
        return exc
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return exc
    detail = backend.startup_failure_detail(text[-2_000_000:])
    if not detail or detail in exc.reason:
        return exc
    return TrialError(exc.failure_class, f"{exc.reason} ({detail})", log_path=exc.log_path)


def _start(stack: ProcessStack, plan: LaunchPlan) -> None:
    # Workers load in parallel (each on its own GPUs), then the router starts in front of them.
    servers = [stack.start(spec, wait=False) for spec in plan.servers]
    for server in servers:
        for other in servers:
            other.check_alive("startup") if other.proc and other.poll() is not None else None
        server.wait_ready()
    if plan.router is not None:
        stack.start(plan.router, wait=True)


class _LedgerView:
    """A deployment's view of its pinned Triton cache's ledger (``tuner.evaluation.kernel_ledger``):
    what its kernel set had built there before its servers started, and the records it adds."""

    def __init__(self, ledger: KernelLedger, key: str, parts: dict, cached: CachedKernels | None):
        self.ledger, self.key, self.parts, self.cached = ledger, key, parts, cached

    @classmethod
    def before_start(cls, backend: ProcessBackend, plan: LaunchPlan) -> "_LedgerView | None":
        cache_dir, parts = backend.kernel_cache_dir(plan), backend.kernel_set(plan)
        if cache_dir is None or not parts:
            return None
        ledger, key = KernelLedger(cache_dir), kernel_set_key(parts)
        try:
            cached = ledger.cached(key)
        except OSError as exc:  # a cache directory that cannot be read: nothing known to be built
            log.warning("kernel ledger in %s unreadable: %s", cache_dir, exc)
            cached = None
        return cls(ledger, key, parts, cached)

    def describe(self, cached: CachedKernels | None) -> dict[str, Any]:
        return {"kernel_set": self.key, "cache_dir": str(self.ledger.cache_dir),
                "cached": cached.to_dict() if cached else None}

    def record(self, plan: LaunchPlan) -> None:
        try:
            served = served_token_counts(s.log_path for s in plan.servers if s.log_path)
            self.ledger.record(self.key, self.parts, served)
        except (OSError, ConfigError) as exc:  # the record is for later trials: it never fails this one
            log.warning("kernel ledger in %s not updated: %s", self.ledger.cache_dir, exc)


class LiveDeployment(Deployment):
    def __init__(self, backend: ProcessBackend, request: TrialRequest, plan: LaunchPlan, stack: ProcessStack,
                 gpu_before_start_mib: dict | None = None, kernel_cache_before_start: dict | None = None,
                 kernel_ledger: "_LedgerView | None" = None):
        self.backend = backend
        self.request = request
        self.plan = plan
        self.stack = stack
        self.kind = backend.kind
        self.log_path = plan.servers[0].log_path if plan.servers else None
        self._closed = False
        self._close_report: dict[str, Any] = {}
        self._gpu_ids = tuple(request.gpu_ids)
        self._gpu_before_start = dict(gpu_before_start_mib or {})  # close() waits until used is back near it
        self._kernel_cache_before_start = kernel_cache_before_start  # cached kernels skip first-use compiles
        self._ledger = kernel_ledger  # which of them, per batch size (None: the cache is not pinned)
        self._gpu_after_ready = gpu.memory_used_mib(self._gpu_ids)
        self.facts = backend.server_facts(plan)
        self._gpu_after_warmup = gpu.memory_used_mib(self._gpu_ids)  # engines that allocate at first use
        self.measured_kv_capacity_tokens_total = self.facts.get("kv_capacity_tokens_total")
        self.pids = stack.pids
        self.sampler = gpu.GPUSampler(self._gpu_ids).start()
        self.measurements = 0

    # ---- measuring -----------------------------------------------------------------------
    def _replay_kwargs(self, users: int) -> dict[str, Any]:
        study = self.request.study
        m = study.measurement
        return dict(
            warmup_s=m.warmup_for(self.measurements),
            duration_s=max(1.0, float(m.duration_s)),
            seed=self.request.seed + 1009 * self.measurements,
            api=self.plan.api,
            model=self.plan.served_model,
            vocab_size=self.plan.vocab_size,
            send_ignore_eos=self.plan.send_ignore_eos,
            prompt_format=self.plan.prompt_format,
            use_server_output_ids=self.plan.use_server_output_ids,
            request_timeout_s=float(getattr(m, "request_timeout_s", 600)),
            max_error_rate=float(m.max_error_rate),
            time_scale=float(getattr(m, "time_scale", 1.0)),
        )

    def measure(self, users: int) -> LoadPointMetrics:
        from tuner.workload import replay

        if self._closed:
            raise RuntimeError("measure() after close()")
        self.stack.check_alive("replay")
        kwargs = self._replay_kwargs(users)
        index = self.measurements  # this load point's place on its server (the seed's step)
        m = self.request.study.measurement
        profile = self.request.study.workload_profile()
        warmed = self._warm_kernels(kwargs, profile) if index == 0 and m.kernel_warmup else None
        fresh = m.fresh_kernels(index)  # the server meets kernels it has not run yet
        cached = self._found_built() if fresh else None  # ... unless cached
        metrics_before = self._scrape_metrics()
        gpu_mark = self.sampler.mark()
        worker = _ReplayThread(replay, self.plan.base_url, profile, users, kwargs)
        worker.start()
        watch = _HealthWatch(self._answers_health)
        died = None
        hung = False
        while worker.is_alive():
            worker.join(timeout=0.25)
            dead = self.stack.dead()
            if dead and died is None:
                died = dead[0]
                log.warning("%s died during the replay at %d users", died.spec.name, users)
                worker.cancel()
            if died is None and not hung and watch.failed():
                hung = True
                log.warning("trial %d: /health failed %d times in a row at %d users: hang; stopping servers",
                            self.request.trial_number, HANG_PROBE_FAILURES, users)
                worker.cancel()
                self._stop_servers()
        watch.stop()
        self.measurements += 1
        if died is not None:
            raise died.failure_for_exit("replay")
        if hung:
            raise TrialError("hang", f"server alive but /health failed {HANG_PROBE_FAILURES} times in a row "
                             f"during the replay at {users} users", log_path=self.log_path)
        dead = self.stack.dead()
        if not dead and "error" in worker.result:
            dead = self._dead_within(EXIT_GRACE_S)
        if dead:
            raise dead[0].failure_for_exit("replay")
        if "error" in worker.result:
            raise worker.result["error"]
        metrics: LoadPointMetrics = worker.result["metrics"]
        if not metrics.valid and not self._answers_health():
            raise TrialError(
                "hang",
                f"at {users} users: {metrics.invalid_reason or 'no request completed'}, and "
                f"{self.plan.base_url} no longer answers /health while the process is alive",
                log_path=self.log_path)
        extra = dict(metrics.extra)
        extra.setdefault("backend", self.kind)
        saved = self._save_records(worker.result.get("records"), index, users)
        if saved:
            extra["requests_file"] = saved
        extra["warmup_s"] = kwargs["warmup_s"]  # the window's start, for whoever re-simulates this point
        if warmed is not None:
            extra["kernel_warmup"] = warmed.to_dict()
        if self._ledger is not None:
            extra[KERNEL_CACHE_KEY] = self._ledger.describe(cached)
            self._ledger.record(self.plan)  # what this server has built so far, for the next one
        elif cached is not None:  # an unpinned cache: only what the machine's JIT cache held is known
            extra[KERNEL_CACHE_KEY] = {"cached": cached.to_dict()}
        utilization = self.sampler.utilization_since(gpu_mark)  # NVML over this load point, warm-up included
        if utilization is not None:
            extra["gpu_utilization"] = utilization
        clocks = self.sampler.clocks_since(gpu_mark)
        if clocks is not None:
            extra["gpu_clocks"] = clocks
        metrics_after = self._scrape_metrics()
        server_metrics = _metrics_delta(metrics_before, metrics_after)
        if server_metrics:
            extra["server_metrics"] = server_metrics
            if metrics_after and len(metrics_after) > 1:  # replicas as processes: each one's own
                extra["server_metrics_per_server"] = [
                    _metrics_delta([b], [a]) or {} for b, a in zip(metrics_before or [{}] * len(metrics_after),
                                                                   metrics_after)]
        # the ledger of trust: what the simulator says this load point measures, kept beside it
        try:
            extra[PREDICTION_KEY] = predict(self.request.study, self.request.flags, self.request.knobs, users,
                                            warmup_s=kwargs["warmup_s"], duration_s=kwargs["duration_s"],
                                            seed=kwargs["seed"], fresh_server=fresh, cached_kernels=cached)
        except Exception as exc:  # a prediction that cannot be made never costs the real measurement
            log.warning("trial %d: no simulator prediction at %d users: %s", self.request.trial_number, users, exc)
            extra[PREDICTION_KEY] = {"error": f"prediction failed: {type(exc).__name__}: {exc}"}
        if metrics.kv_capacity_tokens_total is None and self.measured_kv_capacity_tokens_total is not None:
            metrics = dataclasses.replace(metrics, kv_capacity_tokens_total=self.measured_kv_capacity_tokens_total,
                                          extra=extra)
        else:
            metrics = dataclasses.replace(metrics, extra=extra)
        return metrics

    def _found_built(self) -> CachedKernels | None:
        """What the server found built when it started: its kernel set's record in the pinned Triton
        cache, and whether the machine's JIT modules were there (None: nothing known)."""
        found = (self._ledger.cached if self._ledger is not None else None) or CachedKernels()
        jit = (self._kernel_cache_before_start or {}).get("jit")
        if isinstance(jit, dict) and jit.get("modules") == 0:
            found = dataclasses.replace(found, jit_cold=True)
        return found or None

    def _save_records(self, records, index: int, users: int) -> str | None:
        """Each measured request of this load point, beside the trial's logs (one JSON line each,
        gzipped; inter-token gaps left out): what a later reader needs to re-derive any percentile
        or its spread. Returns the file's name, None when there was nothing to write or no room."""
        if not records:
            return None
        path = trial_dir_for(self.request) / f"loadpoint-{index:02d}-{users}u.requests.jsonl.gz"
        try:
            with gzip.open(path, "wt") as f:
                for r in records:
                    d = dataclasses.asdict(r)
                    d.pop("itl_s", None)
                    f.write(json.dumps(d) + "\n")
        except OSError as exc:  # the measurement stands without its request file
            log.warning("trial %d: could not write %s: %s", self.request.trial_number, path, exc)
            return None
        return path.name

    def warm_kernels(self):
        """Run the kernel warm-up now (what a server that has already served has behind it)."""
        return self._warm_kernels(self._replay_kwargs(0), self.request.study.workload_profile())

    def _warm_kernels(self, kwargs: dict, profile):
        """The kernel warm-up before the server's first load point (``measurement.kernel_warmup``)."""
        lengths = prompt_lengths(SGLANG_BATCH_SIZES, min(SGLANG_BATCH_SIZES[-1] + 1, profile.max_context_tokens - 1))
        result = run_kernel_warmup(
            self.plan.base_url, lengths, api=kwargs["api"], model=kwargs["model"], vocab_size=kwargs["vocab_size"],
            send_ignore_eos=kwargs["send_ignore_eos"], prompt_format=kwargs["prompt_format"],
            request_timeout_s=kwargs["request_timeout_s"], seed=kwargs["seed"])
        log.info("trial %d: kernel warm-up: %d prompts (%d tokens) in %.1f s, slowest %.2f s, %d failed",
                 self.request.trial_number, result.requests, result.prompt_tokens, result.seconds,
                 result.slowest_request_s, result.failed)
        self.stack.check_alive("kernel warm-up")
        if result.failed == result.requests:
            raise TrialError(FailureClass.HANG if self._answers_health() else FailureClass.CRASH,
                             f"every kernel warm-up prompt failed ({result.first_error})", log_path=self.log_path)
        return result

    def _scrape_metrics(self) -> list[dict] | None:

        urls = self.backend.metrics_urls(self.plan)
        return [scrape(u, prefix="sglang:", split_labels=BREAKDOWN_LABELS) or {} for u in urls] if urls else None

    def _stop_servers(self) -> None:
        self.pids = tuple(dict.fromkeys((*self.pids, *self.stack.pids)))
        self.stack.close()

    def _dead_within(self, seconds: float) -> list:
        """The stack's servers that exit within ``seconds`` (polled; [] if all still run)."""
        deadline = time.monotonic() + seconds
        while True:
            dead = self.stack.dead()
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)

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
            "gpu_memory_used_mib": {"before_start": self._gpu_before_start, "after_ready": self._gpu_after_ready,
                                    "after_warmup": self._gpu_after_warmup},
            "kernel_cache_before_start": self._kernel_cache_before_start,
            "kernel_ledger": self._ledger.describe(self._ledger.cached) if self._ledger is not None else None,
            "close": self._close_report,
        }

    # ---- teardown ------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        report: dict[str, Any] = {"gpu_summary": self.sampler.stop()}
        pids = self.stack.pids
        survivors = self.stack.close()
        if self._ledger is not None:  # a trial that failed mid-point built kernels too
            self._ledger.record(self.plan)
        report["processes_stopped_s"] = round(time.monotonic() - t0, 3)
        report["survivors"] = sorted(survivors)
        if self._gpu_ids:
            report["gpu_release"] = gpu.wait_memory_released(self._gpu_ids, pids, timeout_s=60.0,
                                                             baseline_mib=self._gpu_before_start or None)
            report["gpu_release"]["before_start_mib"] = self._gpu_before_start
            if report["gpu_release"].get("released") is False:
                log.error("trial %d: GPU memory not released: %s", self.request.trial_number,
                          report["gpu_release"])
        if survivors:
            log.error("trial %d: processes %s survived teardown", self.request.trial_number, sorted(survivors))
        report["teardown_s"] = round(time.monotonic() - t0, 3)  # until the GPU memory was back (where NVML works)
        self._close_report = report

    @property
    def close_report(self) -> dict[str, Any]:
        """What close() found: survivors and whether the GPU memory came back (empty before close)."""
        return dict(self._close_report)


def _metrics_delta(before: list[dict] | None, after: list[dict] | None) -> dict | None:
    """Server metrics over one load point, summed over servers (counters as deltas)."""

    if not after:
        return None
    total: dict[str, float] = {}
    for b, a in zip(before or [{}] * len(after), after):
        for name, value in (window_delta(b, a) or {}).items():
            total[name] = round(total.get(name, 0.0) + value, 6)
    return total or None


class _ReplayThread(threading.Thread):
    """Runs one load point on its own event loop, so a dead or hung server can cancel it.

    Uses ``replay.replay_closed_loop`` (a coroutine) when the replay module has it; otherwise the
    blocking ``run_load_point``, which then cannot be cancelled and runs out its window.
    """

    def __init__(self, replay, base_url, profile, users, kwargs):
        super().__init__(name=f"replay-{users}", daemon=True)
        self.replay, self.base_url, self.profile, self.users, self.kwargs = replay, base_url, profile, users, kwargs
        self.result: dict[str, Any] = {}
        self._loop = None
        self._task = None
        self._cancelled = threading.Event()

    def run(self):
        coro_fn = getattr(self.replay, "replay_closed_loop", None)
        try:
            if coro_fn is None:
                self.result["metrics"] = self.replay.run_load_point(self.base_url, self.profile, self.users,
                                                                    **self.kwargs)
                return
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                self._task = loop.create_task(coro_fn(self.base_url, self.profile, self.users, **self.kwargs))
                if self._cancelled.is_set():
                    self._task.cancel()
                try:
                    out = loop.run_until_complete(self._task)
                    self.result["metrics"] = getattr(out, "metrics", out)
                    self.result["records"] = getattr(out, "records", None)
                except asyncio.CancelledError:
                    self.result["error"] = RuntimeError("replay cancelled")
                finally:
                    pending = asyncio.all_tasks(loop)
                    for t in pending:
                        t.cancel()
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                    loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
        except BaseException as exc:  # surfaced in the caller's thread
            self.result["error"] = exc

    def cancel(self):
        self._cancelled.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # loop closed in between
                pass


class _HealthWatch:
    """Probes health every HANG_PROBE_INTERVAL_S in its own thread; counts failures in a row."""

    def __init__(self, probe):
        self._probe = probe
        self._stop = threading.Event()
        self.consecutive_failures = 0
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(HANG_PROBE_INTERVAL_S):
            ok = self._probe()
            self.consecutive_failures = 0 if ok else self.consecutive_failures + 1

    def failed(self) -> bool:
        return self.consecutive_failures >= HANG_PROBE_FAILURES

    def stop(self):
        self._stop.set()


# ---- the registry's classes --------------------------------------------------------------


class SGLangEvaluator(LiveEvaluator):
    def __init__(self):
        super().__init__(SGLangBackend())


class TransformersEvaluator(LiveEvaluator):
    def __init__(self):
        super().__init__(TransformersBackend())
