"""What a killed or stopped driver costs: ``tuner bench crash``.

Each repeat runs a small serve-sim study (real `tuner serve-sim` servers on loopback, each in its
own session, so they outlive a killed driver as SGLang servers do) in a fresh directory, as a
user runs it (`python -m tuner study start`), and, once a trial is in the middle of a
measurement:

* **kill -9**: kills the driver, starts `tuner study resume` at once and measures the time from
  the kill until the resume has taken the study over and until it has run the study to its
  budget; then counts the completed trials and measurements lost and the processes left behind;
* **SIGTERM**: sends SIGTERM to the driver and measures the time until it has exited (its servers
  stopped, the running trial recorded as interrupted); then counts the trials left running, the
  completed trials lost and the processes left behind.

Processes left behind are found by an environment variable every process of the run inherits
(``TUNER_BENCH_MARK``), however deep and whoever re-parented it; the benchmark kills them
afterwards so that one repeat cannot spoil the next. The targets are 0 trials lost and 0 orphans.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from tuner.backends.process import pid_alive
from tuner.errors import UserError

MARK_ENV = "TUNER_BENCH_MARK"
_STUDY = """\
name: {name}
description: crash benchmark study (serve-sim servers, tiny workload)
model: glm-5.1
hardware: {{gpu: h200, gpus_per_node: 8, nodes: 1, host_memory_gb: 2048}}
workload:
  name: tiny-agent
  system_prefix_tokens: 64
  first_turn_context_tokens: {{mu: 3.9, sigma: 0.3, min: 16, max: 128}}
  new_tokens_per_turn: {{mu: 3.0, sigma: 0.4, min: 4, max: 64}}
  output_tokens_per_turn: {{mu: 2.8, sigma: 0.3, min: 4, max: 32}}
  turns_per_session: {{mu: 1.1, sigma: 0.3, min: 1, max: 5}}
  think_time_s: {{mu: -1.2, sigma: 0.4, min: 0.05, max: 1.0}}
  max_context_tokens: 2048
search_space: glm-5.1
slo: {{p90_ttft_s: 30.0, p90_tpot_s: 0.05}}
target_users: 2
capacity: {{start_users: 2, max_users: 8, resolution_users: 2}}
measurement: {{warmup_s: 0, duration_s: 1, max_error_rate: 0.05, request_timeout_s: 4}}
baseline: {{tp-size: 8, quantization: modelopt_fp4}}
trials: {trials}
backend: serve-sim
backend_options: {{time_scale: 10}}
"""


def _query(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def _marked(mark: str) -> list[int]:
    needle = f"{MARK_ENV}={mark}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(int(entry)):
            out.append(int(entry))
    return out


def _wait(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


class _Run:
    """One repeat's directory, study, database and mark."""

    def __init__(self, root: Path, name: str, trials: int, ray: bool):
        self.dir = root / name
        self.dir.mkdir()
        self.name = name
        self.trials = trials
        self.db = self.dir / "tuner.db"
        self.storage = f"sqlite:///{self.db}"
        (self.dir / f"{name}.yaml").write_text(_STUDY.format(name=name, trials=trials))
        self.mark = uuid.uuid4().hex
        self.env = {**os.environ, MARK_ENV: self.mark}
        self.ray_args = [] if ray else ["--no-ray"]

    def spawn(self, *args: str, log: str) -> tuple[subprocess.Popen, Path]:
        err = self.dir / f"{log}.err"
        with open(err, "wb") as err_file:  # the child keeps its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "tuner", *args, "--storage", self.storage, *self.ray_args],
                                    cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL, stderr=err_file,
                                    stdin=subprocess.DEVNULL)
        return proc, err

    def mid_measurement(self) -> bool:
        return bool(_query(self.db, "SELECT 1 FROM tuner_trials t WHERE t.status = 'running' AND (SELECT count(*) "
                                    "FROM tuner_measurements m WHERE m.study_name = t.study_name AND "
                                    "m.trial_number = t.trial_number) >= 1"))

    def completed(self) -> dict[int, int]:
        return dict(_query(self.db, "SELECT trial_number, capacity_users FROM tuner_trials WHERE status = 'complete'"))

    def measurements(self) -> set[tuple]:
        return set(_query(self.db, "SELECT id, trial_number, users FROM tuner_measurements"))

    def running(self) -> int:
        ours = _query(self.db, "SELECT count(*) FROM tuner_trials WHERE status = 'running'")
        theirs = _query(self.db, "SELECT count(*) FROM trials WHERE state = 'RUNNING'")
        return (ours[0][0] if ours else 0) + (theirs[0][0] if theirs else 0)

    def orphans(self, wait_s: float = 10.0) -> int:
        _wait(lambda: not _marked(self.mark), wait_s, 0.2)
        return len(_marked(self.mark))

    def clean_up(self) -> None:
        for pid in _marked(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def start_until_mid_measurement(self) -> subprocess.Popen:
        proc, err = self.spawn("study", "start", str(self.dir / f"{self.name}.yaml"), "--no-pruning", log="start")
        if not _wait(lambda: self.mid_measurement() or proc.poll() is not None, 300):
            proc.kill()
            raise UserError("the benchmark study did not reach a measurement in 300 s")
        if proc.poll() is not None:
            raise UserError(f"the benchmark study ended early: {err.read_text()[-500:]}")
        return proc


def kill_9_once(root: Path, index: int, *, ray: bool) -> dict:
    run = _Run(root, f"kill9-{index}", trials=3, ray=ray)
    try:
        driver = run.start_until_mid_measurement()
        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        driver.wait(timeout=30)
        left_at_kill = len(_marked(run.mark))  # the dead driver's servers (and its Ray): resume must reap them
        completed, measured = run.completed(), run.measurements()
        resume, err = run.spawn("study", "resume", run.name, log="resume")
        took_over = _wait(lambda: "took over from the dead driver" in err.read_text() or resume.poll() is not None, 120,
                          0.01)
        taken_over_s = time.monotonic() - killed if took_over else None
        code = resume.wait(timeout=600)
        done_s = time.monotonic() - killed
        after = run.completed()
        return {"repeat": index, "resume_exit_code": code, "kill_to_taken_over_s": taken_over_s,
                "kill_to_budget_spent_s": done_s, "processes_left_at_kill": left_at_kill,
                "trials_lost": sum(1 for n, c in completed.items() if after.get(n) != c),
                "measurements_lost": len(measured - run.measurements()),
                "trials_left_running": run.running(), "orphans": run.orphans()}
    finally:
        run.clean_up()


def sigterm_once(root: Path, index: int, *, ray: bool) -> dict:
    run = _Run(root, f"sigterm-{index}", trials=3, ray=ray)
    try:
        driver = run.start_until_mid_measurement()
        completed = run.completed()
        running_at_signal = len(_marked(run.mark)) - 1  # the driver's servers (and its Ray), not itself
        os.kill(driver.pid, signal.SIGTERM)
        sent = time.monotonic()
        code = driver.wait(timeout=600)
        stopped_s = time.monotonic() - sent
        after = run.completed()
        interrupted = _query(run.db, "SELECT count(*) FROM tuner_trials WHERE status = 'interrupted'")
        return {"repeat": index, "exit_code": code, "signal_to_exit_s": stopped_s,
                "processes_at_signal": running_at_signal,
                "trials_lost": sum(1 for n, c in completed.items() if after.get(n) != c),
                "trials_interrupted": interrupted[0][0] if interrupted else 0,
                "trials_left_running": run.running(),
                "lease_left": bool(_query(run.db, "SELECT 1 FROM tuner_driver_leases")), "orphans": run.orphans()}
    finally:
        run.clean_up()


def bench_crash(*, repeats: int = 3, ray: bool = False, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Both experiments ``repeats`` times; the figures per repeat and in all."""
    with tempfile.TemporaryDirectory(prefix="tuner-crash-bench-") as tmp:
        root = Path(tmp)
        kills, terms = [], []
        for i in range(repeats):
            kills.append(kill_9_once(root, i, ray=ray))
            progress(f"kill -9 #{i}: {json.dumps(kills[-1])}")
            terms.append(sigterm_once(root, i, ray=ray))
            progress(f"SIGTERM #{i}: {json.dumps(terms[-1])}")

    def figures(rows: list[dict], key: str) -> dict:
        values = [r[key] for r in rows if r[key] is not None]
        return {"median": round(statistics.median(values), 2), "max": round(max(values), 2)} if values else {}

    doc = {
        "repeats": repeats, "ray": ray,
        "kill_9": {"runs": kills, "trials_lost": sum(r["trials_lost"] for r in kills),
                   "measurements_lost": sum(r["measurements_lost"] for r in kills),
                   "trials_left_running": sum(r["trials_left_running"] for r in kills),
                   "orphans": sum(r["orphans"] for r in kills),
                   "resumed_ok": all(r["resume_exit_code"] == 0 for r in kills),
                   "processes_left_at_kill": sum(r["processes_left_at_kill"] for r in kills),
                   "kill_to_taken_over_s": figures(kills, "kill_to_taken_over_s"),
                   "kill_to_budget_spent_s": figures(kills, "kill_to_budget_spent_s")},
        "sigterm": {"runs": terms, "trials_lost": sum(r["trials_lost"] for r in terms),
                    "trials_left_running": sum(r["trials_left_running"] for r in terms),
                    "orphans": sum(r["orphans"] for r in terms),
                    "exit_codes": sorted({r["exit_code"] for r in terms}),
                    "leases_left": sum(r["lease_left"] for r in terms),
                    "processes_at_signal": sum(r["processes_at_signal"] for r in terms),
                    "signal_to_exit_s": figures(terms, "signal_to_exit_s")},
    }
    k, t = doc["kill_9"], doc["sigterm"]
    doc["passed"] = (k["resumed_ok"] and not any(k[f] for f in ("trials_lost", "measurements_lost",
                                                                 "trials_left_running", "orphans"))
                     and not any(t[f] for f in ("trials_lost", "trials_left_running", "orphans", "leases_left")))
    return doc


def format_lines(doc: dict) -> list[str]:
    """The two lines `tuner bench crash` prints: one per experiment."""
    k, t = doc["kill_9"], doc["sigterm"]
    repeats = doc["repeats"]
    return [
        f"kill -9 ({repeats}x): trials lost {k['trials_lost']}, measurements lost {k['measurements_lost']}, "
        f"left running {k['trials_left_running']}, orphans {k['orphans']} (of {k['processes_left_at_kill']} "
        f"process(es) the killed drivers left); kill -> resume took over {k['kill_to_taken_over_s'].get('median')} s "
        f"(max {k['kill_to_taken_over_s'].get('max')}), -> budget spent {k['kill_to_budget_spent_s'].get('median')} s; "
        f"every resume exit 0: {'yes' if k['resumed_ok'] else 'NO'}",
        f"SIGTERM ({repeats}x): trials lost {t['trials_lost']}, left running {t['trials_left_running']}, orphans "
        f"{t['orphans']} (of {t['processes_at_signal']} process(es) the drivers ran), leases left {t['leases_left']}, "
        f"exit codes {t['exit_codes']}; signal -> exit {t['signal_to_exit_s'].get('median')} s "
        f"(max {t['signal_to_exit_s'].get('max')})",
    ]
