"""SIGTERM and SIGHUP do what Ctrl-C (SIGINT) does, at several moments of a real driver.

Each case sends the signal to `python -m tuner study start|resume` and asserts what every case
asserts (_util.check_case): the exit code 128 + the signal's number, the message naming the
signal and the trial recorded as interrupted, nothing left running (ours or Optuna's), the lease
released, no process left under the test's mark -- plus that the driver exited promptly and the
study then resumes to its budget.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.reliability_tests._util import (
    check_case, kill_marked, new_mark, query, run_tuner, spawn_tuner, table_rows, trial_rows, tuner_env, wait_until,
    write_study,
)
from tests.reliability_tests.test_kill9_moments import _has_lease, _measuring, _ray_started, _starting_server

PROMPT_S = 15.0  # from the signal to the driver's exit, servers stopped and trials recorded


class _Done:
    """A finished driver as check_case reads it."""

    def __init__(self, proc, err_path):
        self.returncode = proc.returncode
        self.stderr = err_path.read_text()


def _drive(tmp_path, *, name, args, options=None, trials=3, when, sig, mark, second_signal=False):
    env = tuner_env(mark)
    study = write_study(tmp_path, name, trials=trials, options=options)
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    proc, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-pruning", *args], cwd=tmp_path,
                            env=env, log_name="start")
    try:
        assert wait_until(lambda: when(tmp_path, db, name, mark) or proc.poll() is not None, 180, 0.05)
        assert proc.poll() is None, err.read_text()[-2000:]
        running = [n for n, t in trial_rows(db, name).items() if t["status"] == "running"]
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        if second_signal:  # a service manager's repeated SIGTERM, or a second Ctrl-C, during the clean-up
            time.sleep(0.3)
            if proc.poll() is None:
                os.kill(proc.pid, sig)
        proc.wait(timeout=120)
        stopped_s = time.monotonic() - t0
        return _Done(proc, err), db, storage, running, stopped_s
    finally:
        if proc.poll() is None:
            proc.kill()


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP, "SIGINT": signal.SIGINT}
REASON = {"SIGTERM": "stopped by SIGTERM", "SIGHUP": "stopped by SIGHUP", "SIGINT": r"interrupted by the user \(Ctrl-C\)"}


@pytest.mark.parametrize("signame", list(SIGNALS))
def test_a_signal_mid_measurement_stops_the_servers_and_records_the_trial(signame, tmp_path):
    mark = new_mark()
    try:
        done, db, storage, running, stopped_s = _drive(tmp_path, name="sig", args=["--no-ray"], mark=mark, trials=2,
                                                       sig=SIGNALS[signame], when=lambda t, d, n, m: _measuring(d, n))
        assert running, "a trial was running when the signal came"
        check_case(done, code=128 + SIGNALS[signame], db=db, mark=mark,
                   message=rf"Error: {REASON[signame]}: trial\(s\) {running[0]} recorded as interrupted and their "
                           rf"servers stopped; continue with `tuner study resume sig`")
        assert stopped_s < PROMPT_S, stopped_s
        rows = trial_rows(db, "sig")
        assert rows[running[0]]["status"] == "interrupted"
        assert rows[running[0]]["failure_reason"] == REASON[signame].replace("\\", "")
        assert query(db, "SELECT status FROM tuner_studies") == [("stopped",)]
        if signame == "SIGTERM":  # the study goes on from there (the other signals leave the same records)
            r = run_tuner(["study", "resume", "sig", "--storage", storage, "--no-ray", "--json"], cwd=tmp_path,
                          env=tuner_env(mark), timeout=240)
            check_case(r, code=0, message=r"", db=db, mark=mark)
            assert json.loads(r.stdout)["trials_run"] == 2  # the interrupted trial 0 and one more
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_a_server_starts(signame, tmp_path):
    mark = new_mark()
    try:
        done, db, storage, running, stopped_s = _drive(
            tmp_path, name="sigstart", args=["--no-ray"], mark=mark, sig=SIGNALS[signame],
            options={"startup_timeout_s": 60, "faults": {"1": "slow_start_s=300"}},
            when=lambda t, d, n, m: _starting_server(t, n, 1))
        check_case(done, code=128 + SIGNALS[signame], db=db, mark=mark,
                   message=rf"{REASON[signame]}: trial\(s\) 1 recorded as interrupted")
        assert stopped_s < PROMPT_S
        assert trial_rows(db, "sigstart")[1]["status"] == "interrupted"
    finally:
        kill_marked(mark)


def test_sigterm_with_the_local_ray_stops_ray_and_the_servers(tmp_path):
    mark = new_mark()
    try:
        done, db, storage, running, stopped_s = _drive(tmp_path, name="sigray", args=[], mark=mark,
                                                       sig=signal.SIGTERM, when=lambda t, d, n, m: _measuring(d, n, 1))
        check_case(done, code=143, db=db, mark=mark, message=r"stopped by SIGTERM: trial\(s\) \d+ recorded as interrupted")
        assert stopped_s < PROMPT_S
    finally:
        kill_marked(mark)


def test_sigterm_during_ray_start_up_leaves_nothing(tmp_path):
    mark = new_mark()
    try:
        done, db, storage, running, stopped_s = _drive(
            tmp_path, name="sigboot", args=[], mark=mark, sig=signal.SIGTERM,
            when=lambda t, d, n, m: _has_lease(d, n) and _ray_started(m) and not trial_rows(d, n))
        check_case(done, code=143, db=db, mark=mark, message=r"stopped by SIGTERM")
        assert stopped_s < PROMPT_S
        assert query(db, "SELECT status FROM tuner_studies") in ([("stopped",)], [("running",)])
    finally:
        kill_marked(mark)


def test_a_second_sigterm_during_the_clean_up_is_noted_and_the_clean_up_finishes(tmp_path):
    mark = new_mark()
    try:
        done, db, storage, running, stopped_s = _drive(tmp_path, name="sig2", args=["--no-ray"], mark=mark,
                                                       sig=signal.SIGTERM, second_signal=True,
                                                       when=lambda t, d, n, m: _measuring(d, n))
        check_case(done, code=143, db=db, mark=mark, message=r"stopped by SIGTERM: trial\(s\) \d+ recorded as interrupted")
        assert trial_rows(db, "sig2")[running[0]]["status"] == "interrupted"
    finally:
        kill_marked(mark)


def test_sigterm_to_a_resume_waiting_for_another_hosts_lease_leaves_the_lease_alone(tmp_path):
    """A resume waiting for a lease held on another host stops at once and takes nothing."""
    from tuner.storage import db as db_mod, leases
    from tuner.study.lease import DriverIdentity

    mark = new_mark()
    env = tuner_env(mark, TUNER_LEASE_TTL_S="120")
    study = write_study(tmp_path, "waiting", trials=2)
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", storage, "--no-ray", "--trials", "1"], cwd=tmp_path,
                      env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        me = DriverIdentity.current()
        leases.try_insert(db_mod.get_engine(storage), "waiting", {
            "token": "remote", "command": "resume", "host": "elsewhere", "boot_id": "b", "pid_namespace": me.pid_namespace,
            "pid": 4242, "pid_start_ticks": 1, "cmdline": "tuner", "tuner_version": "0.1.0", "acquired_at": time.time(),
            "heartbeat_at": time.time(), "heartbeat_count": 0, "processes": []})
        before = table_rows(db)
        proc, err = spawn_tuner(["study", "resume", "waiting", "--storage", storage, "--no-ray", "--trials", "2"],
                                cwd=tmp_path, env=env, log_name="resume")
        assert wait_until(lambda: "waiting up to" in err.read_text() or proc.poll() is not None, 60, 0.05)
        assert proc.poll() is None, err.read_text()
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 5
        check_case(_Done(proc, err), code=143, message=r"held by `tuner study resume` PID 4242 on host elsewhere.*"
                                                       r"Error: stopped by SIGTERM", db=db, before=before,
                   allow_running=True, mark=mark)
        assert query(db, "SELECT token FROM tuner_driver_leases") == [("remote",)]
    finally:
        kill_marked(mark)
