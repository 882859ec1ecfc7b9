"""A real multi-node Ray cluster on this machine (one raylet per node, each declaring its own
GPUs; no real GPU needed) joined by `tuner study start --ray-address`:

* GPU placement: serve-sim trials ask Ray for tp-size GPUs (``backend_options.request_gpus``);
  an 8-GPU trial can only land on the 8-GPU node, 1- and 2-GPU trials pack the rest, no two
  concurrent trials share a GPU of a node, and each trial's server gets exactly the GPUs Ray
  assigned as CUDA_VISIBLE_DEVICES;
* SQLite under load: 8 simulator trials report at once while the dashboard and a reader process
  query the same database in a loop: no "database is locked" anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.reliability_tests._util import (
    MARK_ENV, free_port, kill_marked, marked_pids, new_mark, query, run_tuner, spawn_tuner, tuner_env, wait_until, write_study,
)
from tuner.lifecycle import TrialStatus

pytestmark = pytest.mark.slow

HEAD = {"num_cpus": 4, "num_gpus": 8}
WORKERS = [{"num_cpus": 2, "num_gpus": 2}, {"num_cpus": 2, "num_gpus": 2}]


@pytest.fixture(scope="module")
def cluster():
    """(cluster, its temp dir, the mark every process it starts carries)."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # short: raylet socket paths are length-limited
    mark = new_mark()
    os.environ[MARK_ENV] = mark  # inherited by the raylets, so by trial workers and their servers
    try:
        c = Cluster(initialize_head=True, head_node_args={**HEAD, "include_dashboard": False, "temp_dir": temp_dir})
        for spec in WORKERS:
            c.add_node(**spec)
    finally:
        del os.environ[MARK_ENV]
    try:
        c.wait_for_nodes()
        yield c, Path(temp_dir), mark
    finally:
        c.shutdown()
        kill_marked(mark)


def test_kill_9_driver_of_a_cluster_study_then_resume(cluster, tmp_path):
    """The cluster (raylets, GCS) outlives the killed driver, as a real one does."""
    from tests.reliability_tests.test_crash_resume import kill_and_resume

    c, _, cluster_mark = cluster
    figures = kill_and_resume(tmp_path, ray_address=c.address, cluster_mark=cluster_mark)
    print(f"\nkill -9 and resume on a Ray cluster: {figures}")
    assert _nodes(c.address), "the cluster is still up"


def _nodes(address: str) -> dict[str, float]:
    """Ray node id -> GPUs it declares, read in a separate process (this one stays off Ray)."""
    code = textwrap.dedent(f"""
        import json, ray
        ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)
        print(json.dumps({{n["NodeID"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


GPU_SPACE = {
    "engine": "sglang",
    "params": {
        "tp-size": {"values": [1, 2, 8]},
        "quantization": {"values": ["fp8"]},
        "mem-fraction-static": {"low": 0.80, "high": 0.90},
    },
}


def test_gpu_trials_are_placed_on_free_gpus_of_the_right_node(cluster, tmp_path):
    c, _, _ = cluster
    nodes = _nodes(c.address)
    assert sorted(nodes.values()) == [2.0, 2.0, 8.0]
    big_node = next(n for n, g in nodes.items() if g == 8)
    mark = new_mark()
    study = write_study(tmp_path, "gpus", trials=6, search_space=GPU_SPACE, model="qwen3-30b-a3b",
                        baseline={"tp-size": 8, "quantization": "fp8"},
                        options={"request_gpus": True})
    db = tmp_path / "tuner.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--ray-address", c.address,
                       "--parallel", "4", "--json"], cwd=tmp_path, env=tuner_env(mark), timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        rows = query(db, "SELECT trial_number, status, params, gpu_ids, telemetry, started_at, finished_at, launched "
                         "FROM tuner_trials WHERE study_name='gpus'")
        placed = []
        for number, status, params, gpu_ids, telemetry, started, finished, launched in rows:
            tel, params, gpu_ids = json.loads(telemetry or "{}"), json.loads(params), json.loads(gpu_ids or "[]")
            if not launched:
                continue
            assert status in ("complete", "pruned"), (number, status, tel)
            tp = params["tp-size"]
            assert len(gpu_ids) == tp, (number, tp, gpu_ids)
            node = tel["ray_node_id"]
            assert node in nodes
            if tp == 8:
                assert node == big_node, "an 8-GPU trial can only run on the 8-GPU node"
            # the server got exactly Ray's GPUs
            assert tel["cuda_visible_devices"] == ",".join(gpu_ids)
            assert tel["plan"]["cuda_visible_devices"] == ",".join(gpu_ids)
            # when it held its GPUs for sure: from its first load point's start to its last one's end
            # (started_at counts the wait for free GPUs too)
            (busy_from, busy_to), = query(db, "SELECT min(created_at - wall_time_s), max(created_at) FROM "
                                              "tuner_measurements WHERE study_name='gpus' AND trial_number=?", (number,))
            placed.append((number, node, set(gpu_ids), busy_from, busy_to))
        assert len({p[1] for p in placed}) >= 2, "trials were spread over more than one node"
        assert any(len(p[2]) == 8 for p in placed) and any(len(p[2]) < 8 for p in placed)
        overlapping = 0
        for i, a in enumerate(placed):
            for b in placed[i + 1:]:
                if a[3] < b[4] and b[3] < a[4]:  # ran at the same time
                    overlapping += 1
                    assert a[1] != b[1] or not (a[2] & b[2]), f"trials {a[0]} and {b[0]} shared GPUs {a[2] & b[2]}"
        assert overlapping >= 1, "some trials ran concurrently"
        assert not (wait_until(lambda: not marked_pids(mark), 20) is not True and marked_pids(mark))
    finally:
        kill_marked(mark)


READER = textwrap.dedent("""
    import json, os, sys, time
    from sqlalchemy import text
    from tuner.storage import db
    from tuner.study.summary import study_summary

    url, name, seconds, stop_file = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    path = url.removeprefix("sqlite:///")
    while not os.path.exists(path):
        time.sleep(0.05)
    engine = db.get_engine(url, create=False, readonly=True)
    done, seen, errors = 0, set(), []
    end = time.time() + seconds
    while time.time() < end and not os.path.exists(stop_file):  # until the study's driver has exited
        try:
            with engine.connect() as conn:
                if db.has_schema(engine):
                    n = conn.execute(text("SELECT count(*) FROM tuner_measurements")).scalar()
                    conn.execute(text("SELECT * FROM trials")).fetchall()
                    seen.add(n)
            if db.has_schema(engine):
                study_summary(url, name)
            done += 1
        except Exception as exc:
            if "no study" in str(exc) or "no such table" in str(exc):  # not created yet
                continue
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"reads": done, "distinct_counts": len(seen), "errors": errors}))
""")


def test_sqlite_under_load_has_no_lock_errors(cluster, tmp_path):
    c, temp_dir, _ = cluster
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "load", trials=12, backend="simulator", options={},
                        capacity={"start_users": 8, "max_users": 64, "resolution_users": 8},
                        measurement={"warmup_s": 5, "duration_s": 20})
    # the simulator backend takes no backend_options
    db_path = tmp_path / "tuner.db"
    url = f"sqlite:///{db_path}"
    port = free_port()
    stop_file = tmp_path / "driver-exited"
    reader = subprocess.Popen([sys.executable, "-c", READER, url, "load", "120", str(stop_file)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    driver, driver_err = spawn_tuner(["study", "start", str(study), "--storage", url, "--ray-address", c.address,
                                      "--parallel", "8", "--json"], cwd=tmp_path, env=env, log_name="driver")
    dash = None
    dash_reads, dash_errors = 0, []
    try:
        wait_until(lambda: query(db_path, "SELECT count(*) FROM tuner_studies") or driver.poll() is not None, 60)
        dash = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--storage", url, "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak_running = 0
        while driver.poll() is None:
            running = query(db_path, "SELECT count(*) FROM tuner_trials WHERE status='running'")
            peak_running = max(peak_running, running[0][0] if running else 0)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/load", timeout=30) as resp:
                    json.loads(resp.read())
                    dash_reads += 1
            except OSError as exc:
                if dash.poll() is not None:
                    dash_errors.append(f"dashboard exited: {exc}")
                    break
            time.sleep(0.05)
        driver.wait(timeout=300)
        stop_file.write_text("")  # the reader has read all the while the trials wrote; it stops now
        out, err = reader.communicate(timeout=120)
        assert driver.returncode == 0, driver_err.read_text()[-3000:]
        stats = json.loads(out.strip().splitlines()[-1])
        dash.terminate()
        _, dash_stderr = dash.communicate(timeout=20)
        texts = {"driver": driver_err.read_text(), "reader": err + json.dumps(stats["errors"]), "dashboard": dash_stderr}
        for log in temp_dir.rglob("*.err"):  # Ray workers' stderr
            texts[str(log)] = log.read_text(errors="replace")
        locked = {k: v.count("database is locked") for k, v in texts.items() if "database is locked" in v}
        assert not locked, f"'database is locked' in {locked}"
        assert not stats["errors"] and not dash_errors, (stats["errors"], dash_errors)
        assert stats["reads"] > 20 and stats["distinct_counts"] > 3, stats  # it read while the trials wrote
        assert dash_reads > 5
        assert peak_running >= 6, f"only {peak_running} trials ran at once"
        statuses = dict(query(db_path, "SELECT status, count(*) FROM tuner_trials GROUP BY status"))
        # every trial measured: complete, or pruned once it could not beat the best (how many the
        # pruner stops depends on the order trials finish in, which the machine's load moves)
        measured = {s for s in TrialStatus if s.measured}
        assert sum(statuses.values()) == 12 and set(statuses) <= measured, statuses
        n = statuses.get(TrialStatus.COMPLETE.value, 0)
        assert n >= 1, statuses  # the study has a best
        # and every trial's measurements reached the file under the concurrent writes
        measured_trials = query(db_path, "SELECT count(DISTINCT trial_number) FROM tuner_measurements "
                                         "WHERE study_name='load'")[0][0]
        assert measured_trials == 12, statuses
        print(f"\nSQLite under load: {n} trials, peak {peak_running} running, {stats['reads']} reader loops, "
              f"{dash_reads} dashboard reads, 0 lock errors")
    finally:
        for p in (driver, reader, dash):
            if p is not None and p.poll() is None:
                p.kill()
        kill_marked(mark)
