"""kill -9 of the tuner process in the middle of a measurement, then `tuner study resume` at once.

Real processes throughout: the driver is `python -m tuner study start` with the serve-sim backend,
whose trials launch `tuner serve-sim` HTTP servers on loopback in their own sessions, so they
outlive the killed driver exactly as SGLang servers would. Resume must take the dead driver's
lease over at once (its PID is gone), mark the dead trial interrupted (our table) and failed
(Optuna), reap its servers by recorded identity, leave an unrelated `tuner serve-sim` alone, keep
every completed trial and measurement, and run the study to its budget with no process left
behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.reliability_tests._util import (
    describe, free_port, kill_marked, marked_pids, new_mark, pid_alive, query, run_tuner, spawn_tuner, trial_rows,
    tuner_env, wait_until, write_study,
)

BUDGET = 3


def _mid_measurement(db, study):
    """(trial number, pids) of a running trial (not the first) with >= 1 measurement and PIDs."""
    rows = query(db, "SELECT t.trial_number, t.pids FROM tuner_trials t WHERE t.study_name=? AND t.status='running' "
                     "AND t.trial_number > 0 AND t.pids != '[]' AND (SELECT count(*) FROM tuner_measurements m "
                     "WHERE m.study_name=t.study_name AND m.trial_number=t.trial_number) >= 1", (study,))
    return (rows[0][0], json.loads(rows[0][1])) if rows else None


def _decoy(tmp, env):
    """An unrelated serve-sim process: same program, same arguments shape, not ours."""
    port = free_port()
    decoy_env = {k: v for k, v in env.items() if k != "TUNER_TEST_MARK"}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "serve-sim", "--port", str(port), "--time-scale", "10"],
                            cwd=tmp, env=decoy_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc


def _our_processes(mark: str, cluster_mark: str | None) -> list[int]:
    """Processes this run started: under the driver's mark, and (with a shared Ray cluster) the
    trial workers and servers the cluster's raylets started for it."""
    pids = marked_pids(mark)
    if cluster_mark:
        pids += [p for p, d in zip(marked_pids(cluster_mark), describe(marked_pids(cluster_mark)))
                 if "serve-sim" in d or "TrialWorker" in d]
    return pids


def kill_and_resume(tmp, *, ray_address: str | None = None, cluster_mark: str | None = None):
    """kill -9 the driver mid-measurement, resume, check. Without ``ray_address`` the trials run
    in the driver (`--no-ray`); with it, driver and resume join that Ray cluster, which outlives
    the driver (raylets and all)."""
    ray = ray_address is not None
    mark = new_mark()
    env = tuner_env(mark)
    name = "crash-ray" if ray else "crash"
    study = write_study(tmp, name, trials=BUDGET)
    db = tmp / "tuner.db"
    storage = f"sqlite:///{db}"
    decoy = _decoy(tmp, env)
    driver = None
    try:
        # without pruning every trial runs its whole capacity search: a kill after the first load
        # point lands in the middle of the next one, not while a pruned trial is closing
        args = ["study", "start", str(study), "--storage", storage, "--json", "--no-pruning"]
        args += ["--ray-address", ray_address] if ray else ["--no-ray"]
        driver, driver_err = spawn_tuner(args, cwd=tmp, env=env, log_name="start")
        hit = wait_until(lambda: _mid_measurement(db, name) or driver.poll() is not None, timeout_s=120, interval_s=0.05)
        assert driver.poll() is None, f"driver ended before a trial was mid-measurement:\n{driver_err.read_text()[-2000:]}"
        os.kill(driver.pid, signal.SIGKILL)  # the driver only: its servers are orphaned
        killed_at = time.monotonic()
        driver.wait(timeout=10)

        # what the dead driver left (a pruned trial may have ended between the poll and the kill)
        before_trials = trial_rows(db, name)
        (killed_trial,) = [n for n, t in before_trials.items() if t["status"] == "running"]
        server_pids = sorted({d["pid"] for f in (tmp / "results/runs" / name / f"trial-{killed_trial:04d}")
                              .glob("*.pids.json") for d in json.loads(f.read_text())})
        assert server_pids, "the running trial's server wrote its PID file at start"
        before_meas = query(db, "SELECT id, trial_number, users, p90_ttft_s FROM tuner_measurements WHERE study_name=?",
                            (name,))
        completed_before = {n: t["capacity_users"] for n, t in before_trials.items() if t["status"] == "complete"}
        assert completed_before, "the baseline trial completed before the kill"
        if not ray:  # in-process trials: the server (own session) is orphaned and must be reaped
            assert all(pid_alive(p) for p in server_pids), "the killed trial's server did not outlive the driver"
        assert query(db, "SELECT pid FROM tuner_driver_leases") == [(driver.pid,)], "the dead driver's lease is left"

        # at once: the lease proves the driver dead, no heartbeat grace period to wait out
        args = ["study", "resume", name, "--storage", storage]  # without --json: it says when it took over
        args += ["--ray-address", ray_address] if ray else ["--no-ray"]
        resume, resume_err = spawn_tuner(args, cwd=tmp, env=env, log_name="resume")
        took_over = wait_until(lambda: "took over from the dead driver" in resume_err.read_text()
                               or resume.poll() is not None, 120, 0.02)
        taken_over_s = time.monotonic() - killed_at
        assert took_over and resume.wait(timeout=240) == 0, resume_err.read_text()[-3000:]
        resumed_s = time.monotonic() - killed_at
        assert "took over from the dead driver" in resume_err.read_text()
        r = run_tuner(["study", "status", name, "--storage", storage, "--json"], cwd=tmp, env=env)
        assert r.returncode == 0, r.stderr
        outcome = {"best_capacity_users": (json.loads(r.stdout)["best"] or {}).get("capacity_users")}

        after = trial_rows(db, name)
        dead = after[killed_trial]
        assert dead["status"] == "interrupted" and dead["failure_class"] == "interrupted", dead
        reaped = dead["telemetry"]["reaped_pids"]
        if ray:
            # Ray may kill a dead driver's trial workers and their children itself; whatever it
            # left, resume reaped
            assert set(reaped) <= set(server_pids), dead["telemetry"]
        else:
            assert sorted(reaped) == sorted(server_pids), dead["telemetry"]
        assert not any(pid_alive(p) for p in server_pids), "the interrupted trial's server was not reaped"
        # Optuna's copy of the dead trial failed by heartbeat, none left running
        states = dict(query(db, "SELECT number, state FROM trials t JOIN studies s ON t.study_id=s.study_id "
                                "WHERE s.study_name=?", (name,)))
        assert states[killed_trial] == "FAIL"
        assert "RUNNING" not in states.values()

        # nothing completed was lost or changed
        for number, capacity in completed_before.items():
            assert after[number]["status"] == "complete" and after[number]["capacity_users"] == capacity
        after_meas = set(query(db, "SELECT id, trial_number, users, p90_ttft_s FROM tuner_measurements "
                                   "WHERE study_name=?", (name,)))
        lost = set(before_meas) - after_meas
        assert not lost, f"measurements lost: {lost}"

        # the budget counts the interrupted trial; the study went on to it
        launched = [t for t in after.values() if t["launched"]]
        assert len(launched) == BUDGET
        assert outcome["best_capacity_users"] is not None
        assert query(db, "SELECT status FROM tuner_studies WHERE name=?", (name,))[0][0] == "finished"

        # no orphans: every recorded PID is gone, and nothing started under this test's mark lives
        recorded = {p for t in after.values() for p in t["pids"]}
        assert not [p for p in recorded if pid_alive(p)]
        leftovers = wait_until(lambda: not _our_processes(mark, cluster_mark), timeout_s=20) or \
            _our_processes(mark, cluster_mark)
        assert leftovers is True or leftovers == [], f"orphan processes after resume: {describe(leftovers)}"
        assert decoy.poll() is None, "an unrelated serve-sim process was killed"
        assert query(db, "SELECT count(*) FROM tuner_driver_leases") == [(0,)], "the resume released its lease"
        return {"trials_lost": len(set(completed_before) - {n for n, t in after.items() if t["status"] == "complete"}),
                "measurements_lost": len(lost), "orphans": 0, "kill_to_taken_over_s": round(taken_over_s, 2),
                "kill_to_budget_spent_s": round(resumed_s, 2)}
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        decoy.kill()
        decoy.wait(timeout=10)
        kill_marked(mark)


def test_kill_9_driver_mid_measurement_then_resume(tmp_path):
    figures = kill_and_resume(tmp_path)
    print(f"\nkill -9 and resume: {figures}")


def test_kill_9_while_a_server_starts_then_resume(tmp_path):
    """The driver dies before the deployment is recorded (the server is still starting): the
    server's PID file, written at launch, is what the resume reaps it by."""
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "starting", trials=2,
                        options={"startup_timeout_s": 60, "faults": {"1": "slow_start_s=300"}})
    db = tmp_path / "tuner.db"
    storage = f"sqlite:///{db}"
    pid_dir = tmp_path / "results/runs/starting/trial-0001"
    driver = None
    try:
        driver, driver_err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-ray"],
                                         cwd=tmp_path, env=env, log_name="start")
        assert wait_until(lambda: list(pid_dir.glob("*.pids.json")) or driver.poll() is not None, 120)
        assert driver.poll() is None, driver_err.read_text()[-2000:]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        row = trial_rows(db, "starting")[1]
        assert row["status"] == "running" and row["pids"] == [], "the deployment was not recorded yet"
        server_pids = sorted({d["pid"] for f in pid_dir.glob("*.pids.json") for d in json.loads(f.read_text())})
        assert server_pids and all(pid_alive(p) for p in server_pids)
        r = run_tuner(["study", "resume", "starting", "--storage", storage, "--no-ray", "--json"], cwd=tmp_path,
                      env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        row = trial_rows(db, "starting")[1]
        assert row["status"] == "interrupted"
        assert sorted(row["telemetry"]["reaped_pids"]) == server_pids
        assert not any(pid_alive(p) for p in server_pids)
        assert wait_until(lambda: not marked_pids(mark), 20), describe(marked_pids(mark))
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        kill_marked(mark)
