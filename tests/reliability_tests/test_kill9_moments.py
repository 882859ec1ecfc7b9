"""kill -9 of a driver at several moments, then `tuner study resume` at once (no waiting).

Each case kills the real driver process (`python -m tuner study start|resume`) when the database
shows the moment, resumes right away, and asserts what every case asserts (tests/reliability_tests
/_util.check_case): exit 0, nothing left running (ours or Optuna's), no lease held, no process
left under the test's mark -- the dead driver's trial servers and, with Ray, its local Ray's
raylet, GCS server, agents and workers, reaped by the identities the driver recorded -- plus: no
completed trial or measurement lost and the budget the study was started with kept.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.reliability_tests._util import (
    check_case, describe, kill_marked, marked_pids, new_mark, query, run_tuner, spawn_tuner, trial_rows, tuner_env,
    wait_until, write_study,
)


def _has_lease(db, name):
    return bool(query(db, "SELECT 1 FROM tuner_driver_leases WHERE study_name = ?", (name,)))


def _ray_started(mark):
    return any("gcs_server" in d or "raylet" in d for d in describe(marked_pids(mark)))


def _measuring(db, name, trial_min=0):
    return bool(query(db, "SELECT 1 FROM tuner_trials t WHERE t.study_name = ? AND t.status = 'running' AND "
                          "t.trial_number >= ? AND (SELECT count(*) FROM tuner_measurements m WHERE m.study_name = "
                          "t.study_name AND m.trial_number = t.trial_number) >= 1", (name, trial_min)))


def _starting_server(tmp, name, trial):
    return bool(list((tmp / "results/runs" / name / f"trial-{trial:04d}").glob("*.pids.json")))


CASES = {
    # moment: (driver args beyond the study, study options, budget, when to kill)
    "during Ray start-up, before any trial": (
        [], {}, 2, lambda tmp, db, name, mark: _has_lease(db, name) and _ray_started(mark)),
    "while the baseline's server starts": (
        ["--no-ray"], {"startup_timeout_s": 60, "faults": {"0": "slow_start_s=300"}}, 2,
        lambda tmp, db, name, mark: _starting_server(tmp, name, 0)),
    "mid-measurement with the local Ray": (
        [], {}, 3, lambda tmp, db, name, mark: _measuring(db, name, trial_min=1)),
    "mid-measurement of the first trial": (
        ["--no-ray"], {}, 2, lambda tmp, db, name, mark: _measuring(db, name)),
}


@pytest.mark.parametrize("moment", list(CASES))
def test_kill_9_then_resume_at_once(moment, tmp_path):
    extra, options, budget, when = CASES[moment]
    mark = new_mark()
    env = tuner_env(mark)
    name = "k9"
    study = write_study(tmp_path, name, trials=budget + 3, options=options)  # the file's budget is not the run's
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    driver = None
    try:
        driver, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--trials", str(budget),
                                   "--no-pruning", *extra], cwd=tmp_path, env=env, log_name="start")
        assert wait_until(lambda: when(tmp_path, db, name, mark) or driver.poll() is not None, 180, 0.05)
        assert driver.poll() is None, err.read_text()[-2000:]
        os.kill(driver.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        driver.wait(timeout=10)
        before = trial_rows(db, name)
        completed = {n: t["capacity_users"] for n, t in before.items() if t["status"] == "complete"}
        measured = set(query(db, "SELECT id, trial_number, users FROM tuner_measurements"))

        r = run_tuner(["study", "resume", name, "--storage", storage, "--no-ray", "--json"], cwd=tmp_path, env=env,
                      timeout=240)
        resumed_s = time.monotonic() - killed_at
        check_case(r, code=0, message=r"", db=db, mark=mark)
        outcome = json.loads(r.stdout)
        after = trial_rows(db, name)
        assert all(after[n]["status"] == "complete" and after[n]["capacity_users"] == c for n, c in completed.items())
        assert measured <= set(query(db, "SELECT id, trial_number, users FROM tuner_measurements")), "measurements lost"
        assert outcome["trials_budget"] == budget and sum(t["launched"] for t in after.values()) == budget
        assert query(db, "SELECT trials_budget, status FROM tuner_studies") == [(budget, "finished")]
        for n, t in before.items():
            if t["status"] == "running":
                assert after[n]["status"] == "interrupted" and "died" in after[n]["failure_reason"]
        print(f"\nkill -9 {moment}: resumed to the budget {resumed_s:.1f} s after the kill")
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        kill_marked(mark)


def test_kill_9_of_a_resume_then_resume_again(tmp_path):
    """The resume is itself a driver: killed mid-measurement, the next resume takes it over."""
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "k9r", trials=3)
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    procs = []
    try:
        first, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-ray", "--no-pruning"],
                                 cwd=tmp_path, env=env, log_name="start")
        procs.append(first)
        assert wait_until(lambda: _measuring(db, "k9r") or first.poll() is not None, 120, 0.05) and first.poll() is None
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        second, err = spawn_tuner(["study", "resume", "k9r", "--storage", storage, "--no-ray"], cwd=tmp_path, env=env,
                                  log_name="resume1")
        procs.append(second)
        assert wait_until(lambda: (_measuring(db, "k9r", trial_min=1)
                                   and query(db, "SELECT pid FROM tuner_driver_leases") == [(second.pid,)])
                          or second.poll() is not None, 120, 0.05)
        assert second.poll() is None, err.read_text()[-2000:]
        os.kill(second.pid, signal.SIGKILL)
        second.wait(timeout=10)
        r = run_tuner(["study", "resume", "k9r", "--storage", storage, "--no-ray"], cwd=tmp_path, env=env, timeout=240)
        check_case(r, code=0, message=r"took over from the dead driver \(PID %d" % second.pid, db=db, mark=mark)
        rows = trial_rows(db, "k9r")
        assert sum(t["status"] == "interrupted" for t in rows.values()) == 2, rows
        assert sum(t["launched"] for t in rows.values()) == 3
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        kill_marked(mark)
