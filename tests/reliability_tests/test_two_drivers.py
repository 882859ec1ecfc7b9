"""Two drivers racing: concurrent starts on a fresh SQLite and PostgreSQL database, a resume during
a driver's start-up, two resumes of a dead driver's study, a start beside a running resume, and
a driver on another host. Real `python -m tuner` processes; each case asserts the exit codes, the
messages, a consistent database (nothing running, no lease left) and no orphan process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.reliability_tests._util import (
    check_case, kill_marked, new_mark, no_orphans, query, run_tuner, spawn_tuner, table_rows, trial_rows, tuner_env,
    wait_until, write_study,
)
from tests.reliability_tests.test_kill9_moments import _measuring, _starting_server
from tests.storage_tests.pg import fresh_pg_database, needs_pg


class _Done:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


def _start_together(tmp_path, studies, storage, env, extra=()):
    """Start one `tuner study start` per study file at the same moment; their (exit code, stderr)."""
    procs = [subprocess.Popen([sys.executable, "-m", "tuner", "study", "start", str(s), "--storage", storage,
                               "--no-ray", "--no-pruning", *extra], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for s in studies]
    return [_Done(p.wait(timeout=300), p.stderr.read()) for p in procs]


def _pg_running(url):
    from sqlalchemy import text

    from tuner.storage import db

    with db.get_engine(url, create=False).connect() as conn:
        ours = conn.execute(text("SELECT count(*) FROM tuner_trials WHERE status = 'running'")).scalar()
        theirs = conn.execute(text("SELECT count(*) FROM trials WHERE state = 'RUNNING'")).scalar()
        held = conn.execute(text("SELECT count(*) FROM tuner_driver_leases")).scalar()
        studies = sorted(r[0] for r in conn.execute(text("SELECT name FROM tuner_studies")))
        budgets = sorted(r[0] for r in conn.execute(text("SELECT trials_budget FROM tuner_studies")))
    return ours, theirs, held, studies, budgets


@pytest.mark.parametrize("round_", [1, 2])
def test_concurrent_starts_of_two_studies_on_a_fresh_sqlite_database_both_succeed(round_, tmp_path):
    mark = new_mark()
    try:
        db = tmp_path / "tuner.db"
        studies = [write_study(tmp_path, n, trials=2, backend="simulator") for n in ("first", "second")]
        for done in _start_together(tmp_path, studies, f"sqlite:///{db}", tuner_env(mark)):
            check_case(done, code=0, message=r"backend: simulator", mark=mark)
        check_case(done, code=0, message=r"", db=db, mark=mark)
        assert query(db, "SELECT name, status, trials_budget FROM tuner_studies ORDER BY name") == [
            ("first", "finished", 2), ("second", "finished", 2)]
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("round_", [1, 2])
def test_concurrent_starts_of_one_study_on_a_fresh_sqlite_database_one_says_already_exists(round_, tmp_path):
    mark = new_mark()
    try:
        db = tmp_path / "tuner.db"
        study = write_study(tmp_path, "same", trials=2, backend="simulator")
        results = sorted(_start_together(tmp_path, [study, study], f"sqlite:///{db}", tuner_env(mark)),
                         key=lambda d: d.returncode)
        check_case(results[0], code=0, message=r"backend: simulator", mark=mark)
        check_case(results[1], code=1, db=db, mark=mark,
                   message=r"Error: study 'same' already exists in .*; continue it with `tuner study resume same`")
        assert query(db, "SELECT name, status FROM tuner_studies") == [("same", "finished")]
        assert len(trial_rows(db, "same")) >= 2
    finally:
        kill_marked(mark)


@needs_pg
@pytest.mark.parametrize("same", [False, True], ids=["two studies", "one study"])
@pytest.mark.parametrize("round_", [1, 2])
def test_concurrent_starts_on_a_fresh_postgresql_database(same, round_, tmp_path):
    mark = new_mark()
    url, drop = fresh_pg_database()
    try:
        names = ("same", "same") if same else ("first", "second")
        studies = [write_study(tmp_path, n, trials=2, backend="simulator") for n in set(names)]
        if same:
            studies = studies * 2
        results = sorted(_start_together(tmp_path, studies, url, tuner_env(mark)), key=lambda d: d.returncode)
        check_case(results[0], code=0, message=r"backend: simulator", mark=mark)
        if same:
            check_case(results[1], code=1, mark=mark, message=r"Error: study 'same' already exists in postgresql://")
        else:
            check_case(results[1], code=0, message=r"backend: simulator", mark=mark)
        ours, theirs, held, studies_there, budgets = _pg_running(url)
        assert (ours, theirs, held) == (0, 0, 0)
        assert studies_there == sorted(set(names)) and set(budgets) == {2}
    finally:
        kill_marked(mark)
        drop()


def test_a_resume_during_the_drivers_start_up_is_refused_with_who_holds_it(tmp_path):
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "busy", trials=2, options={"startup_timeout_s": 60, "faults": {"0": "slow_start_s=300"}})
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    driver, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-ray"], cwd=tmp_path, env=env,
                              log_name="start")
    try:
        assert wait_until(lambda: _starting_server(tmp_path, "busy", 0) or driver.poll() is not None, 120, 0.05)
        assert driver.poll() is None, err.read_text()[-2000:]
        before = table_rows(db, live_driver=True)
        r = run_tuner(["study", "resume", "busy", "--storage", storage, "--no-ray"], cwd=tmp_path, env=env, timeout=60)
        check_case(r, code=4, db=db, before=before, allow_running=True, live_driver=True,
                   message=rf"Error: study 'busy' is being run by `tuner study start` PID {driver.pid} on host \S+ "
                           rf"\(since .*\); stop it first \(`kill -TERM {driver.pid}`")
        r = run_tuner(["study", "status", "busy", "--storage", storage, "--json"], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        driver_row = json.loads(r.stdout)["driver"]
        assert (driver_row["pid"], driver_row["command"]) == (driver.pid, "start") and driver_row["heartbeat_age_s"] < 30
        # and the same for a second start of the study: the ordinary message
        r = run_tuner(["study", "start", str(study), "--storage", storage, "--no-ray"], cwd=tmp_path, env=env, timeout=60)
        check_case(r, code=1, db=db, before=before, allow_running=True, live_driver=True,
                   message=r"study 'busy' already exists")
        os.kill(driver.pid, signal.SIGTERM)
        assert driver.wait(timeout=60) == 143
        check_case(_Done(143, err.read_text()), code=143, message=r"stopped by SIGTERM", db=db, mark=mark)
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_marked(mark)


def test_two_resumes_of_a_dead_drivers_study_one_takes_it_over(tmp_path):
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "twice", trials=3)
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    procs = []
    try:
        driver, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-ray", "--no-pruning"],
                                  cwd=tmp_path, env=env, log_name="start")
        procs.append(driver)
        assert wait_until(lambda: _measuring(db, "twice") or driver.poll() is not None, 120, 0.05)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        resumes = [subprocess.Popen([sys.executable, "-m", "tuner", "study", "resume", "twice", "--storage", storage,
                                     "--no-ray"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True) for _ in range(2)]
        procs += resumes
        done = sorted((_Done(p.wait(timeout=300), p.stderr.read()) for p in resumes), key=lambda d: d.returncode)
        check_case(done[0], code=0, message=rf"took over from the dead driver \(PID {driver.pid}", mark=mark)
        check_case(done[1], code=4, message=r"Error: study 'twice' is being run by `tuner study resume` PID \d+",
                   db=db, mark=mark)
        rows = trial_rows(db, "twice")
        assert sum(t["launched"] for t in rows.values()) == 3 and sum(t["status"] == "interrupted" for t in rows.values()) == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        kill_marked(mark)


@pytest.fixture(scope="module")
def one_trial_run(tmp_path_factory):
    """What each remote-lease case starts from, run once: a real `tuner study start --trials 1` of
    the 2-trial study `remote` (serve-sim), finished; each case resumes a copy of its database."""
    tmp = tmp_path_factory.mktemp("one-trial")
    mark = new_mark()
    study = write_study(tmp, "remote", trials=2)
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{tmp}/tuner.db", "--no-ray", "--trials",
                       "1"], cwd=tmp, env=tuner_env(mark, TUNER_LEASE_TTL_S="3"), timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert no_orphans(mark) == []
    finally:
        kill_marked(mark)
    return tmp


def _copy_of_run(src, tmp_path):
    """The finished one-trial run's study file and database (SQLite's backup: a consistent copy)."""
    import shutil
    import sqlite3

    shutil.copy(src / "remote.yaml", tmp_path / "remote.yaml")
    db = tmp_path / "tuner.db"
    source, copy = sqlite3.connect(src / "tuner.db"), sqlite3.connect(db)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return db


def _remote_lease(db, name, *, age_s: float, token="remote") -> None:
    from tuner.storage import db as db_mod, leases
    from tuner.study.lease import DriverIdentity

    me = DriverIdentity.current()
    leases.try_insert(db_mod.get_engine(f"sqlite:///{db}"), name, {
        "token": token, "command": "start", "host": "elsewhere", "boot_id": "b", "pid_namespace": me.pid_namespace,
        "pid": 4242, "pid_start_ticks": 1, "cmdline": "tuner study start", "tuner_version": "0.1.0",
        "acquired_at": time.time() - age_s, "heartbeat_at": time.time() - age_s, "heartbeat_count": 7,
        "processes": []})


@pytest.mark.parametrize("age_s", [0.0, 600.0], ids=["fresh heartbeat", "heartbeat long expired"])
def test_a_driver_on_another_host_is_taken_over_once_its_heartbeat_expires(age_s, tmp_path, one_trial_run):
    mark = new_mark()
    ttl = 3.0
    env = tuner_env(mark, TUNER_LEASE_TTL_S=str(ttl))
    db = _copy_of_run(one_trial_run, tmp_path)  # `remote` after `study start --trials 1`
    storage = f"sqlite:///{db}"
    try:
        _remote_lease(db, "remote", age_s=age_s)
        t0 = time.monotonic()
        r = run_tuner(["study", "resume", "remote", "--storage", storage, "--no-ray", "--trials", "2"], cwd=tmp_path,
                      env=env, timeout=120)
        waited = time.monotonic() - t0
        check_case(r, code=0, db=db, mark=mark,
                   message=r"held by `tuner study start` PID 4242 on host elsewhere.*waiting up to.*took over from the "
                           r"dead driver \(PID 4242 on elsewhere: its heartbeat stopped")
        assert waited >= (ttl if age_s == 0 else 1.5 * ttl / 6), waited
        assert query(db, "SELECT trials_budget, status FROM tuner_studies") == [(2, "finished")]
    finally:
        kill_marked(mark)


def test_a_driver_on_another_host_whose_heartbeat_moves_is_refused(tmp_path, one_trial_run):
    """A beating remote lease (a thread of this test renews it, as that host's driver would)."""
    import threading

    from tuner.storage import db as db_mod, leases

    mark = new_mark()
    env = tuner_env(mark, TUNER_LEASE_TTL_S="3")
    db = _copy_of_run(one_trial_run, tmp_path)  # `remote` after `study start --trials 1`
    storage = f"sqlite:///{db}"
    stop = threading.Event()
    try:
        _remote_lease(db, "remote", age_s=0)
        engine = db_mod.get_engine(storage)
        beating = threading.Thread(target=lambda: [leases.beat(engine, "remote", "remote") for _ in iter(
            lambda: stop.wait(0.2), True)])
        beating.start()
        r = run_tuner(["study", "resume", "remote", "--storage", storage, "--no-ray", "--trials", "2"], cwd=tmp_path,
                      env=env, timeout=60)
        stop.set()
        beating.join()
        check_case(r, code=4, db=db, mark=mark, allow_running=True,
                   message=r"study 'remote' is being run by `tuner study start` PID 4242 on host elsewhere .*"
                           r"its heartbeat is live")
        assert query(db, "SELECT token FROM tuner_driver_leases") == [("remote",)]
        assert [t["launched"] for t in trial_rows(db, "remote").values()].count(True) == 1, "nothing ran"
    finally:
        stop.set()
        kill_marked(mark)
