"""Dashboard latency under concurrent load: ``tuner bench dashboard``.

The dashboard runs as its own process (``tuner dashboard --port 0``, exactly as a user starts it)
over a real study database: by default a fresh simulated study of ``trials`` trials made with
``tuner study start --backend simulator``. A client process then sends rounds of ``concurrency``
simultaneous GETs of the study page's data (``/api/studies/NAME``, the request the page polls) on
fresh connections, without ETags so that every answer carries the whole payload, and records the
time from sending each request to having read its whole body. Rounds are ``interval_s`` apart,
longer than the dashboard's cache lifetime, so every round after the first still finds a stale
cache and the figure includes recomputation.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tuner.errors import UserError
from tuner.workload.replay import run_sync

TARGET_P99_MS = 200.0
_PORT_RE = re.compile(r"http://[^\s:]+:(\d+)/")
_BENCH_STUDY = """\
name: {name}
description: dashboard benchmark study (simulated)
model: glm-5.1
hardware: {{gpu: h200, gpus_per_node: 8, nodes: 1, host_memory_gb: 2048}}
workload: coding-agent
search_space: glm-5.1
slo: {{p90_ttft_s: 30.0, p90_tpot_s: 0.050}}
target_users: 50
capacity: {{start_users: 16, max_users: 256, resolution_users: 4}}
baseline: {{tp-size: 8, quantization: modelopt_fp4}}
trials: {trials}
backend: simulator
"""


def _tuner(args: list[str], **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, **kwargs)


def make_study(workdir: Path, trials: int, name: str = "dash-bench") -> tuple[str, str]:
    """A finished simulated study in ``workdir``: (storage URL, study name)."""
    spec = workdir / f"{name}.yaml"
    spec.write_text(_BENCH_STUDY.format(name=name, trials=trials))
    storage = f"sqlite:///{workdir / 'tuner.db'}"
    r = _tuner(["study", "start", str(spec), "--storage", storage, "--no-ray", "--backend", "simulator"],
               cwd=workdir, timeout=1800)
    if r.returncode != 0:
        raise UserError(f"could not make the benchmark study: {(r.stderr or r.stdout).strip()[-500:]}")
    return storage, name


class Dashboard:
    """``tuner dashboard --port 0`` as a child process; ``port`` is what it printed."""

    def __init__(self, storage: str, runs_dir: str | None = None):
        args = [sys.executable, "-m", "tuner", "dashboard", "--storage", storage, "--port", "0"]
        if runs_dir:
            args += ["--runs-dir", runs_dir]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = _PORT_RE.search(line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.close()
            raise UserError("the dashboard did not start: " + "".join(lines)[-500:])

    def cpu_s(self) -> float | None:
        """CPU seconds the dashboard process has used (Linux), to tell its cost from the machine's load."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _get(port: int, path: str, timeout_s: float = 60.0) -> bool:
    """One GET on its own connection, as a browser sends it (gzip accepted), read to the end.

    A plain socket client, so that the benchmark's own work per request (a few microseconds)
    does not pass for the dashboard's: 200 browsers would each have their own CPU."""
    request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\n"
               "Accept-Encoding: gzip, deflate\r\nConnection: close\r\n\r\n").encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        status = int(head.split(b" ", 2)[1])
        length = None
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await asyncio.wait_for(reader.readexactly(length) if length is not None else reader.read(), timeout_s)
        return status == 200 and len(body) > 0
    finally:
        writer.close()


async def _round(port: int, path: str, concurrency: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    start = asyncio.Event()

    async def one():
        nonlocal errors
        await start.wait()
        t0 = time.perf_counter()
        try:
            ok = await _get(port, path)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            ok = False
        if ok:
            latencies.append(time.perf_counter() - t0)
        else:
            errors += 1

    tasks = [asyncio.create_task(one()) for _ in range(concurrency)]
    await asyncio.sleep(0)  # every task is waiting at the start line
    start.set()
    await asyncio.gather(*tasks)
    return latencies, errors


def bench_dashboard(*, storage: str | None = None, study: str | None = None, trials: int = 30,
                    concurrency: int = 200, rounds: int = 5, interval_s: float = 1.5, path: str | None = None,
                    progress=lambda s: None) -> dict:
    """Run the benchmark; returns a JSON-ready document with p50/p99 per round and overall."""
    with tempfile.TemporaryDirectory(prefix="tuner-dash-bench-") as tmp:
        made = storage is None
        if made:
            progress(f"making a {trials}-trial simulated study (tuner study start --backend simulator) ...")
            t0 = time.monotonic()
            storage, study = make_study(Path(tmp), trials)
            progress(f"  done in {time.monotonic() - t0:.0f} s")
        elif study is None:
            raise UserError("--study is needed with --storage")
        dash = Dashboard(storage, runs_dir=str(Path(tmp) / "results" / "runs") if made else None)
        try:
            path = path or f"/api/studies/{study}"
            url = f"http://127.0.0.1:{dash.port}{path}"
            progress(f"dashboard on port {dash.port}; {rounds} rounds of {concurrency} concurrent GET {url}")
            per_round, every, errors = [], [], 0
            cpu_start = dash.cpu_s()
            load_start = os.getloadavg()[0]
            for i in range(rounds):
                if i:
                    time.sleep(interval_s)
                cpu0 = dash.cpu_s()
                lat, err = run_sync(_round(dash.port, path, concurrency))  # uvloop where installed
                cpu1 = dash.cpu_s()
                errors += err
                every += lat
                ms = np.asarray(lat) * 1000 if lat else np.asarray([np.nan])
                row = {"round": i + 1, "ok": len(lat), "errors": err, "p50_ms": float(np.percentile(ms, 50)),
                       "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
                       "server_cpu_ms": None if cpu0 is None or cpu1 is None else round((cpu1 - cpu0) * 1000, 1)}
                per_round.append(row)
                progress(f"  round {i + 1}: p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms  "
                         f"max {row['max_ms']:.1f} ms  errors {err}  dashboard CPU {row['server_cpu_ms']} ms")
            cpu_end = dash.cpu_s()
            load_end = os.getloadavg()[0]
        finally:
            dash.close()
    ms = np.asarray(every) * 1000 if every else np.asarray([np.nan])
    p99 = float(np.percentile(ms, 99))
    return {
        "url_path": path, "concurrency": concurrency, "rounds": rounds,
        "interval_s": interval_s, "requests": concurrency * rounds, "errors": errors,
        "p50_ms": float(np.percentile(ms, 50)), "p99_ms": p99, "max_ms": float(ms.max()),
        "target_p99_ms": TARGET_P99_MS, "meets_target": bool(errors == 0 and p99 <= TARGET_P99_MS),
        "per_round": per_round, "cpu_count": os.cpu_count(), "study_made": made,
        "server_cpu_ms_per_request": (None if cpu_start is None or cpu_end is None
                                      else round((cpu_end - cpu_start) * 1000 / (concurrency * rounds), 3)),
        "load_average_1min": [round(load_start, 2), round(load_end, 2)],
    }
