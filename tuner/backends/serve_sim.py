"""``tuner serve-sim`` as a process backend: every trial launches a real HTTP server whose token
timing comes from the simulator, so the live evaluator (start, wait ready, replay, watch, stop,
reap) runs end to end without GPUs.

One launch::

    python -m tuner serve-sim --model M --hardware G --gpus N --config '{"tp-size": 8, ...}'
        --host 127.0.0.1 --port P --time-scale S [--fault F]

``backend_options`` of the study (all optional):

* ``time_scale``: simulated time runs this many times faster than real time (default 1);
* ``startup_timeout_s``: seconds the server may take to answer ``/health`` (default 60);
* ``request_gpus``: ask Ray for the configuration's GPUs (tp-size x dp-size), as SGLang would,
  and pass the assigned ones as ``CUDA_VISIBLE_DEVICES`` (default false: a CPU-only trial);
* ``faults``: a testing aid that injects a server fault into chosen trials, keyed by trial number:
  ``{"1": "crash_after_s=2", "2": "hang_after_s=1", "3": "oom", "4": "exit_at_start",
  "5": "slow_start_s=120", "6": "port_in_use"}``. ``port_in_use`` is done here: the chosen port
  is held by a listening socket (another process's, as far as the server can tell) until the
  next trial is planned; the others are ``serve-sim --fault`` modes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import tuner
from tuner.backends.base import LaunchPlan, ProcessBackend, cuda_visible_devices, try_get_json
from tuner.backends.process import ServerLaunch, free_port
from tuner.catalog import get_model
from tuner.errors import ConfigError
from tuner.planner import parse_layout

DEFAULT_STARTUP_TIMEOUT_S = 60.0
SERVER_FAULTS = ("exit_at_start", "crash_after_s", "hang", "hang_after_s", "oom", "slow_start_s")
BACKEND_FAULTS = ("port_in_use",)
OPTIONS = ("time_scale", "startup_timeout_s", "request_gpus", "faults")

# ports held for the port_in_use fault, by trial number (released when another trial is planned)
_SQUATTERS: dict[int, list[socket.socket]] = {}
_SQUAT_LOCK = threading.Lock()


def options_of(study) -> dict[str, Any]:
    opts = dict(getattr(study, "backend_options", {}) or {})
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for the serve-sim backend; valid: "
                          + ", ".join(OPTIONS), key="backend_options")
    return opts


def fault_for(opts: dict[str, Any], trial_number: int) -> str | None:
    """The fault injected into this trial (``backend_options.faults``), checked."""
    faults = opts.get("faults") or {}
    if not isinstance(faults, dict):
        raise ConfigError("must map trial numbers to faults, e.g. {\"1\": \"crash_after_s=2\"}",
                          key="backend_options.faults")
    fault = faults.get(str(trial_number), faults.get(trial_number))
    if fault is None:
        return None
    name = str(fault).partition("=")[0]
    if name not in SERVER_FAULTS + BACKEND_FAULTS:
        raise ConfigError(f"unknown fault {fault!r}; valid: exit_at_start, crash_after_s=N, hang, hang_after_s=N, oom, "
                          f"slow_start_s=N, port_in_use", key=f"backend_options.faults.{trial_number}")
    return str(fault)


def _squat(trial_number: int, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    with _SQUAT_LOCK:
        _SQUATTERS.setdefault(trial_number, []).append(sock)


def _release_squatters(except_trial: int) -> None:
    with _SQUAT_LOCK:
        for number in [n for n in _SQUATTERS if n != except_trial]:
            for sock in _SQUATTERS.pop(number):
                sock.close()


def _tuner_root() -> str:
    return str(Path(tuner.__file__).resolve().parent.parent)


class ServeSimBackend(ProcessBackend):
    kind = "serve-sim"

    def availability(self) -> tuple[bool, str]:
        if importlib.util.find_spec("aiohttp") is None:
            return False, "aiohttp is not installed"
        return True, "simulator-timed HTTP server (tuner serve-sim)"

    def gpus_needed(self, request) -> int:
        if not options_of(request.study).get("request_gpus"):
            return 0
        layout = parse_layout(get_model(request.study.model), dict(request.flags),
                              request.study.hardware.total_gpus)
        return layout.tp * layout.dp

    def build_plan(self, request, trial_dir: Path) -> LaunchPlan:
        study = request.study
        opts = options_of(study)
        fault = fault_for(opts, request.trial_number)
        _release_squatters(except_trial=request.trial_number)
        model = get_model(study.model)
        config = {k: v for k, v in {**request.flags, **request.knobs}.items() if v is not None}
        trial_dir = Path(trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        argv = [sys.executable, "-m", "tuner", "serve-sim", "--model", str(study.model),
                "--hardware", str(study.hardware.gpu), "--gpus", str(study.hardware.gpus_per_node),
                "--config", json.dumps(config, sort_keys=True), "--host", "127.0.0.1", "--port", str(port),
                "--time-scale", repr(float(opts.get("time_scale", 1.0)))]
        if fault and fault.partition("=")[0] in SERVER_FAULTS:
            argv += ["--fault", fault]
        root = _tuner_root()
        env: dict[str, str | None] = {
            "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
            "PYTHONUNBUFFERED": "1",
        }
        cuda = None
        if opts.get("request_gpus"):
            cuda = cuda_visible_devices(request.gpu_ids).get("CUDA_VISIBLE_DEVICES",
                                                             os.environ.get("CUDA_VISIBLE_DEVICES", ""))
            env["CUDA_VISIBLE_DEVICES"] = cuda
        if fault == "port_in_use":
            _squat(request.trial_number, port)
        spec = ServerLaunch(
            name="serve-sim",
            argv=argv,
            port=port,
            log_path=str(trial_dir / "serve-sim.log"),
            env=env,
            ready_paths=("/health",),
            startup_timeout_s=float(opts.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)),
            ready_poll_interval_s=0.1,
        )
        (trial_dir / "launch.json").write_text(json.dumps({"argv": argv, "env": env}, indent=2) + "\n")
        return LaunchPlan(
            servers=[spec],
            api="completions",
            served_model=model.name,
            vocab_size=int(model.vocab_size),
            send_ignore_eos=True,
            prompt_format="ids",
            files={"launch": str(trial_dir / "launch.json")},
            facts={"fault": fault, "cuda_visible_devices": cuda, "config": config},
        )

    def server_facts(self, plan: LaunchPlan) -> dict[str, Any]:
        info = try_get_json(plan.base_url + "/server_info", timeout_s=10) or {}
        per_pool = info.get("max_total_num_tokens")
        pools = len(info.get("internal_states") or []) or 1
        return {"server_info": info,
                "kv_capacity_tokens_total": int(per_pool) * pools if per_pool is not None else None}
