"""The study database on SQLite and on a real PostgreSQL server (``TUNER_TEST_POSTGRES_URL``,
started by tests/run.sh): the same repository round trip, and the study CLI end to end
(start, resume, status, list, export) with a plain ``postgresql://`` URL.

Each PostgreSQL test gets a database of its own, created on the server and dropped afterwards.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.storage_tests.pg import PG_URL, fresh_pg_database, needs_pg
from tuner.storage import db, repo
from tuner.workload.metrics import RequestRecord, aggregate


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/tuner.db"
        return
    url, drop = fresh_pg_database()
    try:
        yield url
    finally:
        drop()


def _metrics(users, ttft):
    recs = [RequestRecord(session_id=i, turn=0, start_s=0.0, input_tokens=1000, output_tokens=11,
                          ttft_s=ttft, end_s=ttft + 0.5, cached_tokens=600) for i in range(users)]
    return aggregate(recs, users=users, duration_s=10.0, kv_capacity_tokens_total=123456)


@needs_pg
def test_plain_postgresql_url_uses_psycopg3():
    engine = db.get_engine(PG_URL)
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
    assert db.sqlalchemy_url("postgresql://u:p%40w@h:5433/d") == "postgresql+psycopg://u:p%40w@h:5433/d"
    assert db.sqlalchemy_url("sqlite:///x.db") == "sqlite:///x.db"


def test_repository_round_trip(storage_url):
    engine = db.get_engine(storage_url)
    db.ensure_schema(engine)
    repo.create_study(engine, name="s", spec_yaml="name: s\n", spec_hash="abc", source_path=None,
                      backend_kind="simulator", target_users=50, p90_ttft_slo_s=30, p90_tpot_slo_s=0.05,
                      trials_budget=3, tuner_version="0.1.0")
    repo.start_trial(engine, study_name="s", trial_number=0, optuna_trial_id=1, backend_kind="simulator",
                     params={"tp-size": 8, "kv-cache-dtype": None}, flags={"tp-size": 8}, knobs={}, is_baseline=True)
    repo.update_trial(engine, "s", 0, pids=[123], telemetry={"node": "n1", "cuda_visible_devices": "0,1"})
    for step, (u, ttft) in enumerate([(16, 1.0), (32, 50.0)]):
        m = _metrics(u, ttft)
        repo.add_measurement(engine, study_name="s", trial_number=0, step=step, backend_kind="simulator", metrics=m,
                             meets_slo=m.meets(30, 0.05), wall_time_s=0.1)
    assert [t.trial_number for t in repo.running_trials(engine, "s")] == [0]
    repo.finish_trial(engine, "s", 0, status="complete", capacity_users=16)
    (t,) = repo.trials(engine, "s")
    assert t.status == "complete" and t.capacity_users == 16 and t.is_baseline
    assert t.params == {"tp-size": 8, "kv-cache-dtype": None} and t.pids == [123]
    assert t.telemetry["cuda_visible_devices"] == "0,1"
    assert [m.users for m in repo.measurements(engine, "s", 0)] == [16, 32]
    assert repo.best_trial(engine, "s").trial_number == 0
    assert not repo.running_trials(engine, "s")


def test_study_cli_start_resume_status_list_export(storage_url, tmp_path):
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data.update(name="pg", trials=3)
    data["capacity"] = {"start_users": 16, "max_users": 64, "resolution_users": 16}
    data["measurement"] = {"warmup_s": 30, "duration_s": 120}
    study = tmp_path / "pg.yaml"
    study.write_text(yaml.safe_dump(data))

    r = run_cli(["study", "start", str(study), "--trials", "2", "--storage", storage_url, "--no-ray", "--json"],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["trials_run"] == 2
    r = run_cli(["study", "resume", "pg", "--trials", "3", "--storage", storage_url, "--no-ray", "--json"],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["trials_run"] == 3

    r = run_cli(["study", "status", "pg", "--storage", storage_url, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert len(status["trials"]) >= 3 and status["best"]["capacity_users"] > 0
    assert all(t["status"] != "running" for t in status["trials"])
    r = run_cli(["study", "list", "--storage", storage_url, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in json.loads(r.stdout)["studies"]] == ["pg"]
    out = tmp_path / "best.yaml"
    r = run_cli(["study", "export", "pg", "-o", str(out), "--storage", storage_url], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"capacity: {status['best']['capacity_users']} concurrent users" in out.read_text()

    # Optuna's tables live in the same database, one trial per tuner trial
    from sqlalchemy import text

    with db.get_engine(storage_url, create=False).connect() as conn:
        n_optuna = conn.execute(text("SELECT count(*) FROM trials")).scalar()
    assert n_optuna == len(status["trials"])
    db.get_engine(storage_url, create=False).dispose()


def test_unreachable_postgresql_is_a_clear_error(tmp_path):
    r = run_cli(["study", "list", "--storage", "postgresql://nobody@127.0.0.1:1/none"], cwd=tmp_path)
    assert r.returncode == 2
    assert "cannot reach storage" in r.stderr and "Internal error" not in r.stderr
