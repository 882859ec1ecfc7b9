"""End to end: a small simulated study through the real CLI, real local Ray, a real SQLite file."""

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli


def _small_study(tmp_path: Path, trials: int = 5) -> Path:
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data.update(name="e2e", trials=trials)
    data["capacity"] = {"start_users": 16, "max_users": 128, "resolution_users": 8}
    data["measurement"] = {"warmup_s": 30, "duration_s": 120}  # simulated seconds
    p = tmp_path / "e2e.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    study = _small_study(tmp)
    storage = f"sqlite:///{tmp}/tuner.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--parallel", "2", "--json"], cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, storage, json.loads(r.stdout), r.stderr


def test_study_runs_with_ray_and_reports_backend(finished_study):
    _, _, outcome, stderr = finished_study
    assert "backend: simulator" in stderr
    assert outcome["backend_kind"] == "simulator"
    assert outcome["trials_run"] == 5
    assert outcome["best_capacity_users"] is not None
    assert outcome["best_capacity_users"] >= outcome["baseline_capacity_users"]


def test_database_has_trials_and_measurements(finished_study):
    tmp, _, outcome, _ = finished_study
    con = sqlite3.connect(tmp / "tuner.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    trials = con.execute("SELECT trial_number, status, is_baseline, backend_kind, capacity_users FROM tuner_trials "
                         "ORDER BY trial_number").fetchall()
    assert trials[0][2] == 1, "trial 0 is the baseline"
    assert {t[3] for t in trials} == {"simulator"}
    launched = [t for t in trials if t[1] == "complete"]
    assert launched
    for number, status, _, _, capacity in launched:
        rows = con.execute("SELECT users, meets_slo, p90_ttft_s, p90_tpot_s, requests FROM tuner_measurements "
                           "WHERE trial_number=? ORDER BY step", (number,)).fetchall()
        assert rows, f"trial {number} has no measurements"
        assert all(r[4] > 0 and r[2] > 0 for r in rows)
        passing = [r[0] for r in rows if r[1]]
        assert capacity == (max(passing) if passing else 0)
    # Optuna's own tables are in the same database, with one trial per tuner trial
    n_optuna = con.execute("SELECT count(*) FROM trials").fetchone()[0]
    assert n_optuna == len(trials)
    # each capacity step was reported as an intermediate value
    assert con.execute("SELECT count(*) FROM trial_intermediate_values").fetchone()[0] > 0


def test_status_list_and_export(finished_study):
    tmp, storage, outcome, _ = finished_study
    r = run_cli(["study", "status", "e2e", "--storage", storage, "--json"], cwd=tmp)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["best"]["capacity_users"] == outcome["best_capacity_users"]
    r = run_cli(["study", "list", "--storage", storage, "--json"], cwd=tmp)
    assert [s["name"] for s in json.loads(r.stdout)["studies"]] == ["e2e"]
    out = tmp / "best.yaml"
    r = run_cli(["study", "export", "e2e", "-o", str(out), "--storage", storage], cwd=tmp)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "# study: e2e" in text and f"capacity: {outcome['best_capacity_users']} concurrent users" in text
    assert "sglang serve" in text
    # the header says what bounds the exported configuration, in the sentence `study status` shows
    why = status["best"]["bottleneck"]
    assert why["sentence"] and f"# bottleneck: {why['sentence']}" in text
    status_text = " ".join(run_cli(["study", "status", "e2e", "--storage", storage], cwd=tmp).stdout.split())
    assert " ".join(why["sentence"].split()) in status_text
    config = yaml.safe_load(text)
    assert all("_" not in k for k in config), "SGLang --config keys use dashes"
    assert config["model-path"].startswith("nvidia/GLM-5.1") or config["model-path"].startswith("zai-org/")
    best_flags = status["best"]["flags"]
    for k, v in best_flags.items():
        if v is False:
            assert k not in config
        else:
            assert config[k] == v


def test_starting_twice_is_refused_without_writing(finished_study):
    tmp, storage, _, _ = finished_study
    before = (tmp / "tuner.db").stat().st_size
    r = run_cli(["study", "start", str(tmp / "e2e.yaml"), "--storage", storage], cwd=tmp)
    assert r.returncode == 1 and "already exists" in r.stderr
    assert (tmp / "tuner.db").stat().st_size == before


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "studies/h200.yaml").read_text().replace("gpu: h200", "gpu: h20"))
    r = run_cli(["study", "start", str(bad), "--storage", f"sqlite:///{tmp_path}/t.db"], cwd=tmp_path)
    assert r.returncode == 2
    assert "bad.yaml: hardware.gpu: unknown GPU 'h20'" in r.stderr
    assert not (tmp_path / "t.db").exists()
    r = run_cli(["study", "status", "nope", "--storage", f"sqlite:///{tmp_path}/t.db"], cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "t.db").exists()


def test_help_is_fast_and_lazy():
    r = run_cli(["--help"])
    assert r.returncode == 0 and "study" in r.stdout
    import subprocess
    import sys

    code = ("import sys; from tuner.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit: pass\n"
            "heavy = [m for m in ('ray', 'optuna', 'pandas', 'sqlalchemy') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip().endswith("[]"), out.stdout
