"""``study resume --capacity-start simulator``: stored with the study, and each new trial's capacity
search starts at the simulator's predicted capacity of its configuration (real CLI, SQLite)."""

from __future__ import annotations

import json

import optuna
import yaml

from tests.conftest import run_cli
from tests.study_tests._tiny import write_tiny_study


def test_resume_with_a_simulator_start_is_stored_and_starts_searches_at_the_prediction(tmp_path):
    study = write_tiny_study(tmp_path, name="guided", max_users=64, trials=2)
    storage = f"sqlite:///{tmp_path}/g.db"
    assert run_cli(["study", "start", str(study), "--storage", storage, "--no-ray", "--json"],
                   cwd=tmp_path).returncode == 0
    r = run_cli(["study", "resume", "guided", "--storage", storage, "--no-ray", "--trials", "5",
                 "--capacity-start", "simulator", "--first-warmup-s", "15", "--kernel-warmup",
                 "--confirm-marginal", "--duration-s", "45"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "starts from simulator (was start_users)" in r.stderr

    from tuner.storage import db, repo

    stored = yaml.safe_load(repo.get_study(db.get_engine(storage, create=False), "guided").spec_yaml)
    assert stored["capacity"]["start"] == "simulator"
    assert stored["capacity"]["confirm_marginal"] is True  # both capacity changes kept together
    assert "a marginal pass is measured again before it counts" in r.stderr
    assert stored["measurement"]["first_warmup_s"] == 15
    assert stored["measurement"]["kernel_warmup"] is True
    assert "kernels are warmed up before its first load point" in r.stderr
    assert "first load point warms up 15 s (was 10 s)" in r.stderr
    assert stored["measurement"]["duration_s"] == 45 and "measures a 45 s window (was " in r.stderr

    summary = json.loads(run_cli(["study", "status", "guided", "--storage", storage, "--json"],
                                 cwd=tmp_path).stdout)
    by_number = {t["number"]: t for t in summary["trials"]}
    ostudy = optuna.load_study(study_name="guided", storage=storage)
    guided = [t for t in ostudy.trials if "capacity_search_start" in t.user_attrs]
    assert guided and all(t.number >= 2 for t in guided)  # trials of the first run start at start_users
    compared = 0
    for t in guided:
        start = t.user_attrs["capacity_search_start"]
        assert "simulator" in start["basis"]
        row = by_number.get(t.number)
        if row and row.get("measurements"):
            assert row["measurements"][0]["users"] == start["users"]
            compared += 1
    assert compared >= 1
    first_run = [by_number[n] for n in (0, 1) if n in by_number and by_number[n].get("measurements")]
    assert all(t["measurements"][0]["users"] == 4 for t in first_run)  # start_users of the tiny study
    # each load point keeps its own window: the first run's, and the resumed run's 45 s
    assert all(m["duration_s"] != 45 for t in first_run for m in t["measurements"])
    later = [m for n, t in by_number.items() if n >= 2 for m in t.get("measurements") or []]
    assert later and all(m["duration_s"] == 45 for m in later)


def test_resume_without_pruning_runs_every_search_to_its_end(tmp_path):
    pruned = {}
    for flag in ([], ["--no-pruning"]):
        name = "unpruned" if flag else "pruned"
        study = write_tiny_study(tmp_path, name=name, max_users=64, trials=1)
        storage = f"sqlite:///{tmp_path}/{name}.db"
        assert run_cli(["study", "start", str(study), "--storage", storage, "--no-ray", "--json"],
                       cwd=tmp_path).returncode == 0
        r = run_cli(["study", "resume", name, "--storage", storage, "--no-ray", "--trials", "6", "--json", *flag],
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        pruned[name] = json.loads(r.stdout)["trials_pruned"]
    assert pruned["pruned"] > 0 and pruned["unpruned"] == 0  # the same study prunes unless told not to
