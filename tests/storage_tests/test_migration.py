"""Schema upgrades, tested on committed databases written by tuner's first and second schemas
(data/README.md): 1 -> 2 -> 3 and 2 -> 3, on SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.storage_tests.pg import fresh_pg_database, needs_pg
from tuner.errors import StorageError
from tuner.lifecycle import TrialStatus
from tuner.storage import db, repo
from tuner.storage.models import SCHEMA_VERSION
from tuner.study.summary import study_summary

V1 = Path(__file__).parent / "data" / "schema-v1.db.gz"
V2 = Path(__file__).parent / "data" / "schema-v2.db.gz"


def unpack(src: Path, path: Path) -> None:
    """Write the gzipped committed database ``src`` to ``path``."""
    with gzip.open(src) as f, open(path, "wb") as out:
        shutil.copyfileobj(f, out)


@pytest.fixture
def v1(tmp_path):
    path = tmp_path / "tuner.db"
    unpack(V1, path)
    return path, f"sqlite:///{path}"


@pytest.fixture
def v2(tmp_path):
    path = tmp_path / "tuner.db"
    unpack(V2, path)
    return path, f"sqlite:///{path}"


def _tables(path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


def _v1_rows(path):
    con = sqlite3.connect(path)
    rows = con.execute("SELECT trial_number, status, telemetry, failure_reason FROM tuner_trials "
                       "ORDER BY trial_number").fetchall()
    con.close()
    return {n: (status, json.loads(tel or "{}"), reason) for n, status, tel, reason in rows}


def test_version_1_becomes_version_3_through_2_with_launched_and_screened_columns(v1):
    path, url = v1
    before = _v1_rows(path)
    engine = db.get_engine(url)
    assert db.schema_version(engine) == 1
    db.ensure_schema(engine)
    assert db.schema_version(engine) == SCHEMA_VERSION == 3
    assert "tuner_driver_leases" in _tables(path)
    after = {t.trial_number: t for t in repo.trials(engine, "v1")}
    assert set(after) == set(before)
    for number, (status, telemetry, reason) in before.items():
        t = after[number]
        assert t.status == status and t.failure_reason == reason, "statuses and readable reasons stay"
        assert t.launched == (not telemetry.get("not_launched", False))
        assert t.screened_by_planner == (not t.launched and (reason or "").startswith("planner: "))
        assert "not_launched" not in (t.telemetry or {}), "one place for the fact: the column"
    assert sum(t.screened_by_planner for t in after.values()) == 4
    assert sum(not t.launched for t in after.values()) == 8
    assert {t.status for t in after.values()} == {TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.INFEASIBLE}
    db.ensure_schema(engine)  # a second time: nothing to do
    assert db.schema_version(engine) == 3


def test_version_2_becomes_version_3_with_the_lease_table_and_nothing_else_changes(v2):
    path, url = v2
    assert "tuner_driver_leases" not in _tables(path)
    con = sqlite3.connect(path)
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
              for t in ("tuner_studies", "tuner_trials", "tuner_measurements", "trials")}
    con.close()
    engine = db.get_engine(url)
    assert db.schema_version(engine) == 2
    assert db.upgrade(engine) == [3]
    assert db.schema_version(engine) == 3 and "tuner_driver_leases" in _tables(path)
    con = sqlite3.connect(path)
    after = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in before}
    assert con.execute("SELECT count(*) FROM tuner_driver_leases").fetchone() == (0,)
    con.close()
    assert after == before, "the upgrade only adds the lease table"
    assert db.upgrade(engine) == [], "upgraded already: nothing to do"


def test_a_version_2_study_left_running_by_a_dead_driver_resumes_to_its_stored_budget(v2, tmp_path):
    """Schema 2 took no lease: the dead driver's trial is found by its stale Optuna heartbeat,
    marked interrupted, and the study runs on to the budget schema 2 stored (the file's 5)."""
    from tuner.study.runner import StudyRunner, load_existing

    path, url = v2
    spec = load_existing(url, "v2")  # upgrades the database
    assert db.schema_version(db.get_engine(url)) == 3
    runner = StudyRunner(spec, storage_url=url, backend_kind="simulator", use_ray=False, workdir=str(tmp_path),
                         command="resume")
    acquired = runner.take_over()
    assert acquired.previous is None, "schema 2 left no lease"
    assert runner.recover_interrupted() == [3]
    outcome = runner.run()
    assert outcome.trials_budget == 5 and outcome.trials_run == 5
    trials = {t.trial_number: t for t in repo.trials(db.get_engine(url), "v2")}
    assert trials[3].status == TrialStatus.INTERRUPTED and trials[3].failure_class == "interrupted"
    assert not any(t.status == TrialStatus.RUNNING for t in trials.values())
    con = sqlite3.connect(path)
    assert con.execute("SELECT state FROM trials WHERE number = 3").fetchone() == ("FAIL",)
    assert con.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM tuner_driver_leases").fetchone() == (0,), "released at the end"
    con.close()


def _files_of(path) -> dict[str, bytes]:
    """The database and its write-ahead log, byte for byte (a reader must not change them; a
    read-only reader of a WAL database may leave an empty log and the shared-memory index)."""
    files = {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")) if p.suffix != ".db-shm"}
    return {name: data for name, data in files.items() if data or name == path.name}


def test_readers_read_an_older_database_through_an_upgraded_copy_and_never_write_it(v1):
    path, url = v1
    before = path.read_bytes()
    s = study_summary(url, "v1")
    assert s["trials_launched"] == 4 and s["counts"] == {"complete": 1, "infeasible": 8, "pruned": 3}
    assert sum(t["screened_by_planner"] for t in s["trials"]) == 4, "read at schema 3: the v2 column is there"
    assert s["driver"] is None
    assert path.read_bytes() == before and db.schema_version(db.get_engine(url, create=False, readonly=True)) == 1
    path.chmod(0o444)  # a read-only file reads the same way
    try:
        assert study_summary(url, "v1")["best"]["capacity_users"] == 16
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == before


def test_status_list_and_export_of_an_older_database_leave_it_byte_identical(v2, tmp_path):
    path, url = v2
    before = _files_of(path)
    r = run_cli(["study", "status", "v2", "--storage", url, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["counts"] == {"complete": 1, "pruned": 2, "running": 1} and s["driver"] is None
    r = run_cli(["study", "list", "--storage", url, "--json"], cwd=tmp_path)
    assert r.returncode == 0 and [row["name"] for row in json.loads(r.stdout)["studies"]] == ["v2"], r.stderr
    r = run_cli(["study", "export", "v2", "--storage", url, "-o", str(tmp_path / "best.yaml")], cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "best.yaml").is_file(), r.stderr
    assert _files_of(path) == before, "readers never upgrade in place: writers do"
    assert db.schema_version(db.get_engine(url, create=False, readonly=True)) == 2


@needs_pg
def test_an_older_postgresql_database_is_refused_by_readers_with_the_upgrade_command():
    """There is no file to copy: readers name the command that upgrades it, and write nothing."""
    from sqlalchemy import text

    url, drop = fresh_pg_database()
    try:
        engine = db.get_engine(url)
        db.ensure_schema(engine)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE tuner_driver_leases"))
            conn.execute(text("UPDATE tuner_schema SET version = 2"))
        with pytest.raises(StorageError, match=r"tuner schema 2; this tuner reads schema 3. Upgrade it once with "
                                               r"`tuner db upgrade --storage postgresql"):
            study_summary(url, "any")
        assert db.schema_version(engine) == 2
    finally:
        drop()


def test_tuner_db_upgrade(v1, tmp_path):
    path, url = v1
    r = run_cli(["db", "upgrade", "--storage", url, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"storage": url, "from_version": 1, "to_version": 3, "steps": [2, 3]}
    r = run_cli(["db", "upgrade", "--storage", url], cwd=tmp_path)
    assert r.returncode == 0 and "at schema 3 already" in r.stdout
    r = run_cli(["db", "upgrade", "--storage", f"sqlite:///{tmp_path}/none.db"], cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "none.db").exists()


def test_an_upgraded_study_resumes(v1, tmp_path):
    from tuner.study.runner import StudyRunner, load_existing

    path, url = v1
    spec = load_existing(url, "v1")  # upgrades the database
    runner = StudyRunner(spec, storage_url=url, backend_kind="simulator", use_ray=False, workdir=str(tmp_path))
    assert runner.recover_interrupted() == []
    outcome = runner.run(6)
    assert outcome.trials_run == 6 and outcome.best_capacity_users == 16
    trials = repo.trials(db.get_engine(url), "v1")
    new = [t for t in trials if t.trial_number > 11]
    assert new and sum(t.launched for t in new) == 2, "two more launches reach the budget of 6"
    assert sum(t.is_baseline for t in trials) == 1, "no second baseline"


@needs_pg
def test_the_upgrade_runs_on_postgresql():
    """PostgreSQL cannot load the committed SQLite file: a version-1 table is made there by removing
    the version-2 columns and the version-3 table, with rows as schema 1 wrote them."""
    from sqlalchemy import text

    url, drop = fresh_pg_database()
    try:
        engine = db.get_engine(url)
        db.ensure_schema(engine)
        repo.create_study(engine, name="s", spec_yaml="name: s\n", spec_hash="abc", source_path=None,
                          backend_kind="simulator", target_users=50, p90_ttft_slo_s=30, p90_tpot_slo_s=0.05,
                          trials_budget=3, tuner_version="0.1.0")
        for n in range(3):
            repo.start_trial(engine, study_name="s", trial_number=n, optuna_trial_id=n, backend_kind="simulator",
                             params={}, flags={}, knobs={}, is_baseline=n == 0)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE tuner_trials DROP COLUMN launched"))
            conn.execute(text("ALTER TABLE tuner_trials DROP COLUMN screened_by_planner"))
            conn.execute(text("DROP TABLE tuner_driver_leases"))
            conn.execute(text("UPDATE tuner_schema SET version = 1"))
            conn.execute(text("""UPDATE tuner_trials SET status = 'infeasible', telemetry = '{"not_launched": true}',
                                 failure_reason = CASE trial_number WHEN 1 THEN 'planner: no room'
                                 ELSE 'violates constraint(s): x' END WHERE trial_number > 0"""))
        assert db.schema_version(engine) == 1
        assert db.upgrade(engine) == [2, 3]
        from sqlalchemy import inspect

        assert inspect(engine).has_table("tuner_driver_leases")
        rows = {t.trial_number: t for t in repo.trials(engine, "s")}
        assert [rows[n].launched for n in range(3)] == [True, False, False]
        assert [rows[n].screened_by_planner for n in range(3)] == [False, True, False]
        assert rows[1].telemetry == {}
    finally:
        drop()


def test_the_dashboard_serves_an_old_database_from_an_upgraded_copy_and_names_the_upgrade(v1, tmp_path):
    import re
    import subprocess
    import sys
    import urllib.request

    from tests.reliability_tests._util import tuner_env

    path, url = v1
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--storage", url, "--port", "0"],
                            cwd=tmp_path, env=tuner_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        note = proc.stderr.readline()
        assert "has tuner schema 1; serving an upgraded copy" in note and "tuner db upgrade --storage" in note, note
        address = proc.stderr.readline()
        port = re.search(r"http://127\.0\.0\.1:(\d+)/", address)
        assert port, address
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/api/studies/v1", timeout=30) as r:
            body = json.loads(r.read())
        assert len(body["trials"]) == 12 and sum(t["screened_by_planner"] for t in body["trials"]) == 4
        assert "tuner-snapshot" not in json.dumps(body), "the copy's path is internal"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err
    assert path.read_bytes() == before and db.schema_version(db.get_engine(url, create=False, readonly=True)) == 1
