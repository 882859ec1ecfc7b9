"""``study resume --repeat-trial N``: an earlier trial's configuration measured again as a new
trial, first; bad numbers refused before anything is written (real CLI, SQLite)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna

from tests.conftest import run_cli
from tests.study_tests._tiny import write_tiny_study


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_repeated_trial_runs_its_configuration_again_and_bad_numbers_write_nothing(tmp_path):
    study = write_tiny_study(tmp_path, name="again", max_users=64, trials=2)
    db_path = tmp_path / "a.db"
    storage = f"sqlite:///{db_path}"
    assert run_cli(["study", "start", str(study), "--storage", storage, "--no-ray", "--json"],
                   cwd=tmp_path).returncode == 0
    before = _digest(db_path)
    for args, says in ((["--repeat-trial", "7", "--trials", "5"], "has no trial 7 (its trials: 0, 1)"),
                       (["--repeat-trial", "0", "--trials", "5"], "trial 0 is the baseline"),
                       (["--repeat-trial", "1:kv-cache-dtype=fp4", "--trials", "5"], "is not one of its values"),
                       (["--repeat-trial", "1"], "no room for 1 repeat(s); give --trials 3 or more")):
        r = run_cli(["study", "resume", "again", "--storage", storage, "--no-ray", *args], cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr[-1500:])
        assert "--repeat-trial" in r.stderr and says in r.stderr, r.stderr[-1500:]
        assert _digest(db_path) == before, f"{args} changed the database"

    r = run_cli(["study", "resume", "again", "--storage", storage, "--no-ray", "--trials", "3",
                 "--repeat-trial", "1"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = {t.number: t for t in optuna.load_study(study_name="again", storage=storage).trials}
    assert trials[2].user_attrs.get("repeat_of") == 1
    assert trials[2].params == trials[1].params
    assert trials[2].state == optuna.trial.TrialState.COMPLETE, "measured, not answered as a duplicate"
    assert "duplicate" not in trials[2].user_attrs

    # a varied repeat: trial 1 again with the KV dtype set otherwise (an A/B of that knob)
    other = None if trials[1].params.get("kv-cache-dtype") == "fp8_e4m3" else "fp8_e4m3"
    r = run_cli(["study", "resume", "again", "--storage", storage, "--no-ray", "--trials", "4",
                 "--repeat-trial", f"1:kv-cache-dtype={'null' if other is None else other}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = {t.number: t for t in optuna.load_study(study_name="again", storage=storage).trials}
    assert trials[3].user_attrs.get("repeat_of") == 1
    assert trials[3].user_attrs.get("repeat_changes") == {"kv-cache-dtype": other}
    assert trials[3].params.get("kv-cache-dtype") == other
    assert {k: v for k, v in trials[3].params.items() if k != "kv-cache-dtype"} == \
        {k: v for k, v in trials[1].params.items() if k != "kv-cache-dtype"}
    assert trials[3].state == optuna.trial.TrialState.COMPLETE
