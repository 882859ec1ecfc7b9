"""Server lifecycle with real subprocesses: the failure classes, teardown and reap-by-PID."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.backends.base import LaunchPlan, ProcessBackend
from tuner.backends.process import (
    ServerLaunch, ProcessStack, ServerProcess, classify_log, free_port, identify, pid_alive, reap_pids,
)
from tuner.errors import TrialError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.live import LiveEvaluator
from tuner.workload.metrics import RequestRecord, aggregate

FAKE = str(Path(__file__).with_name("fake_server.py"))


def spec(tmp_path, mode="ok", *, after=1.0, timeout=10.0, extra=(), port=None, name="fake"):
    port = port or free_port()
    return ServerLaunch(
        name=name, argv=[sys.executable, FAKE, "--port", str(port), "--mode", mode, "--after", str(after), *extra],
        port=port, log_path=str(tmp_path / f"{name}-{mode}.log"), ready_paths=("/ready", "/health"),
        startup_timeout_s=timeout, ready_poll_interval_s=0.05, ready_request_timeout_s=2.0,
    )


def start_failure(s: ServerLaunch) -> TrialError:
    server = ServerProcess(s)
    try:
        server.start()
        server.wait_ready()
    except TrialError as exc:
        return exc
    finally:
        server.stop(grace_s=2)
    raise AssertionError("server became ready")


def test_ready_then_stop_kills_the_whole_tree(tmp_path):
    server = ServerProcess(spec(tmp_path, extra=["--child"])).start()
    took = server.wait_ready()
    assert 0 < took < 10
    with urllib.request.urlopen(server.base_url + "/server_info", timeout=5) as r:
        assert r.status == 200
    pids = server.snapshot_pids()
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)  # server and its child
    assert server.stop(grace_s=5) == set()
    assert not any(pid_alive(p) for p in pids)
    assert server.stop() == set()  # idempotent


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    server = ServerProcess(spec(tmp_path, extra=["--child", "--ignore-term"])).start()
    server.wait_ready()
    pids = server.snapshot_pids()
    t0 = time.monotonic()
    assert server.stop(grace_s=0.5) == set()
    assert time.monotonic() - t0 < 8
    assert not any(pid_alive(p) for p in pids)


def test_exit_at_start(tmp_path):
    exc = start_failure(spec(tmp_path, "exit_at_start"))
    assert exc.failure_class == "exit_at_start"
    assert "status 1" in exc.reason and "invalid value for --tp-size" in exc.reason
    assert exc.log_path and Path(exc.log_path).exists()


def test_oom_message_at_start(tmp_path):
    exc = start_failure(spec(tmp_path, "oom"))
    assert exc.failure_class == "oom"
    assert "CUDA out of memory" in exc.reason


def test_startup_timeout(tmp_path):
    t0 = time.monotonic()
    exc = start_failure(spec(tmp_path, "slow_start", timeout=1.0))
    assert exc.failure_class == "startup_timeout"
    assert time.monotonic() - t0 < 6


def test_port_taken_before_start(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(TrialError) as err:
            ServerProcess(spec(tmp_path, port=port)).start()
    assert err.value.failure_class == "port_in_use"


def test_port_taken_seen_in_log(tmp_path):
    # the server binds a second port the test holds: the failure is read from its log
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        exc = start_failure(spec(tmp_path, "port_taken", extra=["--bind-port", str(taken)]))
    assert exc.failure_class == "port_in_use"


def test_classify_log_patterns():
    assert classify_log("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static") == "oom"
    assert classify_log("OSError: [Errno 98] Address already in use") == "port_in_use"
    assert classify_log("ValueError: bad flag") is None


def test_argv_must_be_a_list(tmp_path):
    with pytest.raises(ValueError):
        ServerProcess(ServerLaunch("x", "python -m http.server", 1, str(tmp_path / "x.log")))


# ---- reap by recorded PID -----------------------------------------------------------------

def _sleeper(tag: str) -> subprocess.Popen:
    # same command line for both: only the recorded identity tells them apart
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag], start_new_session=True)


def test_reap_kills_only_the_recorded_process():
    ours = ServerProcess(ServerLaunch("s", [sys.executable, "-c", "import time; time.sleep(60)", "fake_server"],
                                    free_port(), "/dev/null", ready_paths=()))
    ours.start()
    stranger = _sleeper("fake_server")  # same name, not started by us
    try:
        ident = identify(ours.pid)
        # PID reuse: a record whose start time does not match the live process is not ours
        fake_record = {"pid": stranger.pid, "start_ticks": ident.start_ticks - 1, "cmdline": ident.cmdline}
        assert reap_pids([fake_record], "fake_server") == {stranger.pid: "not_ours"}
        # same name, but it lacks our launch token
        assert reap_pids([stranger.pid], "fake_server", token=ours.token) == {stranger.pid: "not_ours"}
        # a bare PID proves nothing: never killed
        assert reap_pids([stranger.pid]) == {stranger.pid: "not_ours"}
        assert stranger.poll() is None
        out = reap_pids([ident.to_dict()], "fake_server", token=ours.token, grace_s=3)
        assert out == {ours.pid: "killed"}
        ours.proc.wait(timeout=5)
        assert stranger.poll() is None  # the unrelated process survived all of it
        assert reap_pids([ours.pid], "fake_server") == {ours.pid: "gone"}
    finally:
        stranger.kill()
        stranger.wait()
        ours.stop(grace_s=1)


# ---- the live evaluator over a fake backend: crash and hang mid-replay ---------------------

class FakeBackend(ProcessBackend):
    kind = "fake"

    def __init__(self, mode="ok", after=1.0, taken_first=False):
        self.mode, self.after, self.taken_first, self.plans = mode, after, taken_first, 0

    def availability(self):
        return True, "test"

    def gpus_needed(self, request):
        return 0

    def build_plan(self, request, trial_dir):
        self.plans += 1
        s = spec(Path(trial_dir), self.mode, after=self.after, timeout=10)
        s.log_path = str(Path(trial_dir) / f"fake{self.plans}.log")
        if self.taken_first and self.plans == 1:
            self._holder = socket.socket()
            self._holder.bind(("127.0.0.1", s.port))
            self._holder.listen()
        return LaunchPlan(servers=[s])

    def server_facts(self, plan):
        from tuner.backends.sglang import kv_capacity_from_server_info
        from tuner.backends.base import try_get_json

        return {"kv_capacity_tokens_total": kv_capacity_from_server_info(
            try_get_json(plan.servers[0].base_url + "/server_info", 5))}


def _fake_run_load_point(base_url, profile, users, *, warmup_s, duration_s, request_timeout_s=5, **kw):
    """Minimal closed-loop client: POST until the window ends, one record per request."""
    records, t_end = [], time.monotonic() + duration_s
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        try:
            req = urllib.request.Request(base_url + "/v1/completions", data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=request_timeout_s) as r:
                r.read()
            records.append(RequestRecord(0, 0, t0, 10, 2, 0.01, time.monotonic()))
        except (OSError, http.client.HTTPException) as exc:  # a server that dies mid-response: IncompleteRead
            records.append(RequestRecord(0, 0, t0, 10, 0, None, None, error=str(exc)))
            time.sleep(0.05)
    return aggregate(records, users=users, duration_s=duration_s)


async def _fake_replay_closed_loop(base_url, profile, users, *, duration_s, request_timeout_s=5, **kw):
    """The cancellable coroutine form: same requests through aiohttp."""
    import asyncio

    import aiohttp

    records, t_end = [], time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            try:
                async with http.post(base_url + "/v1/completions", data=b"{}") as r:
                    await r.read()
                records.append(RequestRecord(0, 0, t0, 10, 2, 0.01, time.monotonic()))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                records.append(RequestRecord(0, 0, t0, 10, 0, None, None, error=repr(exc)))
                await asyncio.sleep(0.05)
    return SimpleNamespace(metrics=aggregate(records, users=users, duration_s=duration_s))


@pytest.fixture(params=["blocking", "coroutine"])
def fake_replay(monkeypatch, request):
    mod = types.ModuleType("tuner.workload.replay")
    mod.run_load_point = _fake_run_load_point
    if request.param == "coroutine":
        mod.replay_closed_loop = _fake_replay_closed_loop
    monkeypatch.setitem(sys.modules, "tuner.workload.replay", mod)
    # `from tuner.workload import replay` reads the package attribute once the real module was imported
    import tuner.workload

    monkeypatch.setattr(tuner.workload, "replay", mod, raising=False)
    return request.param


def _request(tmp_path, duration_s=1.5):
    study = SimpleNamespace(
        measurement=SimpleNamespace(warmup_s=0, duration_s=duration_s, max_error_rate=0.05,
                                    request_timeout_s=1.0, time_scale=1.0, warmup_for=lambda load_point: 0.0,
                                    kernel_warmup=False, fresh_kernels=lambda load_point: load_point == 0),
        workload_profile=lambda: None, backend_options={})
    return TrialRequest(study=study, trial_number=3, flags={}, workdir=str(tmp_path))


def test_live_deployment_measures_and_closes(tmp_path, fake_replay):
    dep = LiveEvaluator(FakeBackend("ok")).deploy(_request(tmp_path, 0.5))
    m = dep.measure(4)
    assert m.valid and m.requests > 0 and m.errors == 0
    assert dep.measured_kv_capacity_tokens_total == 2000  # rank 0's 1000 tokens x 2 attention-DP ranks
    assert m.kv_capacity_tokens_total == 2000 and m.extra["backend"] == "fake"
    pids = dep.pids
    assert pids and all(pid_alive(p) for p in pids)
    dep.close()
    dep.close()
    assert not any(pid_alive(p) for p in pids)
    assert dep.telemetry()["close"]["survivors"] == []


def test_crash_mid_replay(tmp_path, fake_replay):
    dep = LiveEvaluator(FakeBackend("crash_after", after=0.5)).deploy(_request(tmp_path))
    with pytest.raises(TrialError) as err:
        dep.measure(4)
    dep.close()
    assert err.value.failure_class == "crash"
    assert "NCCL error" in err.value.reason and "signal" not in err.value.reason


def test_a_replay_broken_off_before_the_dying_server_is_reaped_is_that_servers_crash(tmp_path, monkeypatch):
    """A crash breaks the client's connections a moment before the process exits: the replay's error
    (here at once, the server dying 1 s into serving) is the crash, not an internal error."""
    mod = types.ModuleType("tuner.workload.replay")

    def broken_off(*args, **kwargs):
        raise http.client.IncompleteRead(b"", 63)

    mod.run_load_point = broken_off
    monkeypatch.setitem(sys.modules, "tuner.workload.replay", mod)
    import tuner.workload

    monkeypatch.setattr(tuner.workload, "replay", mod, raising=False)
    dep = LiveEvaluator(FakeBackend("crash_after", after=1.0)).deploy(_request(tmp_path))
    with pytest.raises(TrialError) as err:
        dep.measure(4)
    dep.close()
    assert err.value.failure_class == "crash" and "NCCL error" in err.value.reason


def test_hang_mid_replay(tmp_path, fake_replay, monkeypatch):
    monkeypatch.setattr("tuner.evaluation.live.HEALTH_PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr("tuner.evaluation.live.HANG_PROBE_INTERVAL_S", 0.2)
    dep = LiveEvaluator(FakeBackend("hang_after", after=0.3)).deploy(
        _request(tmp_path, 30.0 if fake_replay == "coroutine" else 3.0))
    server = dep.stack.servers[0]
    t0 = time.monotonic()
    with pytest.raises(TrialError) as err:
        dep.measure(4)
    if fake_replay == "coroutine":  # cancelled: detected long before the 30 s window ends
        assert time.monotonic() - t0 < 10
    assert server.stopped and server.proc.returncode is not None  # stopped by us, not crashed
    dep.close()
    assert err.value.failure_class == "hang"


def test_deploy_retries_a_port_taken_race(tmp_path, fake_replay):
    backend = FakeBackend("ok", taken_first=True)
    dep = LiveEvaluator(backend).deploy(_request(tmp_path))
    try:
        assert backend.plans == 2
    finally:
        dep.close()
        backend._holder.close()


def test_failed_deploy_leaves_nothing_running(tmp_path, fake_replay):
    with pytest.raises(TrialError) as err:
        LiveEvaluator(FakeBackend("oom")).deploy(_request(tmp_path))
    assert err.value.failure_class == "oom"


def test_stack_stops_router_before_workers(tmp_path):
    stack = ProcessStack()
    a = stack.start(spec(tmp_path, name="worker"))
    b = stack.start(spec(tmp_path, name="router"))
    order = []
    for s in (a, b):
        orig = s.stop
        s.stop = (lambda o, n: (lambda **kw: (order.append(n), o(**kw))[1]))(orig, s.spec.name)
    stack.close(grace_s=2)
    assert order == ["router", "worker"]
    assert stack.close() == set()
