"""Fixtures shared by the reliability tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def existing_db(tmp_path_factory) -> Path:
    """A study database with one study in it (tuner's and Optuna's tables)."""
    tmp = tmp_path_factory.mktemp("db")
    from tuner.storage import db, repo

    url = f"sqlite:///{tmp}/tuner.db"
    engine = db.get_engine(url)
    db.ensure_schema(engine)
    repo.create_study(engine, name="kept", spec_yaml="name: kept\n", spec_hash="0" * 16, source_path=None,
                      backend_kind="simulator", target_users=50, p90_ttft_slo_s=30, p90_tpot_slo_s=0.05,
                      trials_budget=3, tuner_version="0.1.0")
    engine.dispose()
    return tmp / "tuner.db"
