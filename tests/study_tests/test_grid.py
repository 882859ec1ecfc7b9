"""`sampler: grid` through the real runner: every configuration once, or a clear refusal."""

from __future__ import annotations

import pytest

from tests.study_tests.fakes import tiny_study
from tuner.errors import ConfigError
from tuner.storage import db, repo
from tuner.study import space as space_mod
from tuner.study.proposer import config_key
from tuner.study.runner import StudyRunner


def test_a_grid_study_launches_the_baseline_and_every_grid_configuration(tmp_path):
    study = tiny_study(tmp_path, sampler="grid", trials=7)
    storage = f"sqlite:///{tmp_path}/grid.db"
    runner = StudyRunner(study, storage_url=storage, backend_kind="simulator", use_ray=False,
                         workdir=str(tmp_path / "runs"), prune=False)
    runner.create()
    outcome = runner.run()
    trials = repo.trials(db.get_engine(storage), study.name)
    grid = space_mod.enumerate_grid(study.space(), space_mod.env_for(study))
    launched = [t for t in trials if t.launched]
    assert {config_key(t.params) for t in launched[1:]} == {config_key(v) for v in grid}
    assert len(launched) == 1 + len(grid) == 7 and outcome.trials_run == 7
    assert outcome.enqueued == 6 and outcome.stop == "budget_spent" and outcome.stopped_reason is None
    assert repo.get_study(db.get_engine(storage), study.name).status == "finished"


def test_a_grid_larger_than_the_budget_is_refused_before_anything_is_written(tmp_path):
    study = tiny_study(tmp_path, sampler="grid", trials=5)
    runner = StudyRunner(study, storage_url=f"sqlite:///{tmp_path}/refused.db", backend_kind="simulator",
                         use_ray=False, workdir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="budget of 5 trials leaves 4 after the baseline; set trials to at least 7"):
        runner.create()
    assert not db.has_schema(runner.engine)


def test_tuner_validate_checks_the_grid_against_the_budget(tmp_path):
    from tests.conftest import run_cli
    from tests.study_tests._tiny import write_tiny_study

    ok = write_tiny_study(tmp_path, name="fits", sampler="grid", trials=7)
    small = write_tiny_study(tmp_path, name="small", sampler="grid", trials=6)
    r = run_cli(["validate", str(ok), str(small)], cwd=tmp_path)
    assert r.returncode == 2
    assert f"ok      {ok} (study)" in r.stdout
    assert "small.yaml: sampler: sampler 'grid': the space has 6 configurations but a budget of 6 trials" in r.stderr
