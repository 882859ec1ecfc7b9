"""Build study databases for the report tests by running the real study driver."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.report_tests import fake_backend


def small_spec(tmp: Path, name: str = "rep", trials: int = 8) -> Path:
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data.update(name=name, trials=trials, seed=3)
    data["capacity"] = {"start_users": 8, "max_users": 256, "resolution_users": 4}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def make_runner(tmp: Path, storage: str, name: str = "rep", trials: int = 8):
    from tuner.config.load import load_study
    from tuner.study.runner import StudyRunner

    fake_backend.register()
    spec = load_study(str(small_spec(tmp, name, trials)))
    return StudyRunner(spec, storage_url=storage, backend_kind=fake_backend.KIND, backend_reason="test",
                       use_ray=False, workdir=str(tmp / "runs"))


def run_study(tmp: Path, name: str = "rep", trials: int = 8, first: int | None = None):
    """Run study ``name`` to ``first`` trials (or all); returns (storage URL, runner)."""
    storage = f"sqlite:///{tmp}/tuner.db"
    runner = make_runner(tmp, storage, name, trials)
    runner.create()
    runner.run(first or trials)
    return storage, runner
