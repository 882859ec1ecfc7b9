"""Shared helpers of the reliability tests: small serve-sim studies, real CLI processes, /proc scans."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from tests.conftest import REPO

MARK_ENV = "TUNER_TEST_MARK"  # inherited by every process a test's tuner starts: finds orphans

TINY_WORKLOAD = {
    "name": "tiny-agent",
    "system_prefix_tokens": 64,
    "first_turn_context_tokens": {"mu": 3.9, "sigma": 0.3, "min": 16, "max": 128},
    "new_tokens_per_turn": {"mu": 3.0, "sigma": 0.4, "min": 4, "max": 64},
    "output_tokens_per_turn": {"mu": 2.8, "sigma": 0.3, "min": 4, "max": 32},
    "turns_per_session": {"mu": 1.1, "sigma": 0.3, "min": 1, "max": 5},
    "think_time_s": {"mu": -1.2, "sigma": 0.4, "min": 0.05, "max": 1.0},
    "max_context_tokens": 2048,
}


def write_study(tmp: Path, name: str, *, trials: int, backend: str = "serve-sim", options: dict | None = None,
                **overrides) -> Path:
    """A GLM-5.1 / 8xH200 study with a tiny workload and two 1-second load points, 2 and 4 users
    (seconds per trial)."""
    data = {
        "name": name,
        "model": "glm-5.1",
        "hardware": {"gpu": "h200", "gpus_per_node": 8, "nodes": 1, "host_memory_gb": 2048},
        "workload": TINY_WORKLOAD,
        "search_space": "glm-5.1",
        "slo": {"p90_ttft_s": 30.0, "p90_tpot_s": 0.05},
        "target_users": 2,
        "capacity": {"start_users": 2, "max_users": 4, "resolution_users": 2},
        "measurement": {"warmup_s": 0, "duration_s": 1, "max_error_rate": 0.05, "request_timeout_s": 4},
        "baseline": {"tp-size": 8, "quantization": "modelopt_fp4"},
        "trials": trials,
        "backend": backend,
        "backend_options": {"time_scale": 10, **(options or {})},
    }
    data.update(overrides)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tuner_env(mark: str | None = None, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TUNER_HEARTBEAT_GRACE_S"] = "2"  # resume may take a killed driver's trials over 2 s later
    if mark:
        env[MARK_ENV] = mark
    env.update(extra)
    return env


def new_mark() -> str:
    return uuid.uuid4().hex


def spawn_tuner(args: list[str], *, cwd: Path, env: dict, log_name: str) -> tuple[subprocess.Popen, Path]:
    out = cwd / f"{log_name}.out"
    err = cwd / f"{log_name}.err"
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env,
                            stdout=open(out, "wb"), stderr=open(err, "wb"), stdin=subprocess.DEVNULL)
    return proc, err


def run_tuner(args: list[str], *, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def query(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Read-only query that tolerates the writer (WAL) and a file that does not exist yet."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment carries ``TUNER_TEST_MARK=mark`` (everything a tuner run
    under that mark started, however deep, even if re-parented)."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in env.split(b"\0") and pid_alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd[:160]}")
    return out


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()


def kill_marked(mark: str) -> None:
    """Test clean-up: SIGKILL whatever a failed test left behind (by PID, from the scan)."""
    for pid in marked_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial_rows(db: Path, study: str) -> dict[int, dict]:
    rows = query(db, "SELECT trial_number, status, failure_class, failure_reason, capacity_users, pids, telemetry, "
                     "launched FROM tuner_trials WHERE study_name=? ORDER BY trial_number", (study,))
    return {r[0]: {"status": r[1], "failure_class": r[2], "failure_reason": r[3], "capacity_users": r[4],
                   "pids": json.loads(r[5] or "[]"), "telemetry": json.loads(r[6] or "{}"), "launched": bool(r[7])}
            for r in rows}


def tuner_run(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """The real CLI entry point (`tuner.cli.main`), in this process: (exit code, stdout, stderr)."""
    from tuner.cli import main

    err, out = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main(args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def tuner_main(args: list[str], cwd: Path) -> tuple[int, str]:
    """``tuner_run`` without stdout: (exit code, stderr)."""
    code, _, err = tuner_run(args, cwd)
    return code, err


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


# ---------------------------------------------------------------------------------------------
# what every fault, signal and race case asserts


def optuna_states(db: Path, study: str) -> dict[int, str]:
    return dict(query(db, "SELECT t.number, t.state FROM trials t JOIN studies s ON t.study_id = s.study_id "
                          "WHERE s.study_name = ?", (study,)))


def running_anywhere(db: Path) -> list[tuple[str, str, int]]:
    """Trials left running, ours or Optuna's, in any study of the database."""
    ours = [("tuner", s, n) for s, n in query(db, "SELECT study_name, trial_number FROM tuner_trials "
                                                  "WHERE status = 'running'")]
    theirs = [("optuna", s, n) for s, n in query(db, "SELECT s.study_name, t.number FROM trials t JOIN studies s "
                                                     "ON t.study_id = s.study_id WHERE t.state = 'RUNNING'")]
    return ours + theirs


def leases_held(db: Path) -> list[tuple]:
    return query(db, "SELECT study_name, command, host, pid FROM tuner_driver_leases")


def table_rows(db: Path, *, live_driver: bool = False) -> dict[str, list]:
    """Every row of every table (tuner's and Optuna's): "the database is unchanged" compares these.
    With ``live_driver``, what a running driver renews by itself (its lease's heartbeat and the
    processes it records, Optuna's trial heartbeats) is left out."""
    tables = [r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    rows = {t: query(db, f'SELECT * FROM "{t}" ORDER BY 1') for t in tables}
    if live_driver:
        rows.pop("trial_heartbeats", None)
        if "tuner_driver_leases" in rows:
            rows["tuner_driver_leases"] = query(db, "SELECT study_name, token, pid, pid_start_ticks, acquired_at "
                                                    "FROM tuner_driver_leases ORDER BY 1")
    return rows


def no_orphans(mark: str, timeout_s: float = 20.0) -> list[str]:
    """Processes still alive under the mark after ``timeout_s`` (described), else []."""
    left = wait_until(lambda: not marked_pids(mark), timeout_s)
    return [] if left is True else describe(marked_pids(mark))


def check_case(result, *, code: int, message: str, db: Path | None = None, before: dict | None = None,
               mark: str | None = None, allow_running: bool = False, live_driver: bool = False) -> None:
    """The four things every case asserts: the exit code, the message (a regular expression, no
    internal error or traceback), the database unchanged (``before``: its rows) or consistent
    (nothing left running, no lease held), and no orphan process under ``mark``."""
    import re

    err = result.stderr if hasattr(result, "stderr") else result[1]
    rc = result.returncode if hasattr(result, "returncode") else result[0]
    assert rc == code, f"exit {rc}, expected {code}:\n{err[-3000:]}"
    assert re.search(message, err, re.S), f"{message!r} not in:\n{err[-3000:]}"
    assert "Internal error" not in err and "Traceback" not in err, err[-3000:]
    if db is not None:
        if before is not None:
            after = table_rows(db, live_driver=live_driver)
            changed = {t: (before.get(t), rows) for t, rows in after.items() if before.get(t) != rows}
            assert not changed and set(after) == set(before), f"the database changed: {changed}"
        if not allow_running:
            assert running_anywhere(db) == [], running_anywhere(db)
            assert leases_held(db) == [], leases_held(db)
    if mark is not None:
        assert no_orphans(mark) == []


def drop_dac_prefix() -> list[str] | None:
    """A command prefix under which file permissions apply to this process: nothing for a normal
    user; for root, setpriv without the capabilities that bypass them (None if not possible)."""
    import shutil

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    probe = subprocess.run([setpriv, "--bounding-set=-dac_override,-dac_read_search", "true"], capture_output=True)
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"] if probe.returncode == 0 else None


def run_tuner_as(prefix: list[str], args: list[str], *, cwd: Path, env: dict, timeout: float = 300):
    return subprocess.run([*prefix, sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
