"""A real study in CI: `tuner study start tiny-cpu --backend transformers` on 2 CPU cores.

Real `transformers serve` processes on a tiny random-weight Qwen3-MoE, the replay client streaming
from them, capacity searched, history in SQLite, best configuration exported as YAML.
"""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
import yaml

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def test_tiny_cpu_study_end_to_end(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from tuner.backends.transformers import TransformersBackend

    ok, why = TransformersBackend().availability()
    if not ok:
        pytest.skip(why)
    for folder in ("studies", "search_spaces"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    db = tmp_path / "t.db"
    storage = f"sqlite:///{db}"
    res = run_cli(["study", "start", "tiny-cpu", "--backend", "transformers", "--trials", "3",
                   "--storage", storage], cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]

    con = sqlite3.connect(db)
    trials = con.execute("select trial_number, status, capacity_users, is_baseline, flags, telemetry "
                         "from tuner_trials where study_name='tiny-cpu'").fetchall()
    assert len(trials) == 3
    complete = [t for t in trials if t[1] == "complete"]
    assert complete, trials
    for number, _, _, _, _, telemetry in complete:
        rows = con.execute("select users, valid, requests, p90_ttft_s, backend_kind from tuner_measurements "
                           "where study_name='tiny-cpu' and trial_number=?", (number,)).fetchall()
        assert rows, f"trial {number} has no measurements"
        assert all(r[4] == "transformers" for r in rows)
        measured = [r for r in rows if r[1] and r[2] > 0]
        assert measured and all(r[3] > 0 for r in measured), rows  # real TTFT from the real server
        tel = json.loads(telemetry)
        assert tel["server"]["warmup"]["tokens_exact"] is True
    baseline = next(t for t in trials if t[3])
    best = max(complete, key=lambda t: t[2])
    assert best[2] >= baseline[2]

    out = tmp_path / "best.yaml"
    exp = run_cli(["study", "export", "tiny-cpu", "-o", str(out), "--storage", storage], cwd=tmp_path)
    assert exp.returncode == 0, exp.stderr
    exported = yaml.safe_load(out.read_text())
    best_flags = {k: v for k, v in json.loads(best[4]).items() if v is not None}
    for key, value in best_flags.items():
        assert exported.get(key) == value, (key, exported)
