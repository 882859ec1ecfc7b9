"""The read-only data layer the dashboard and the report draw from."""

import os

import pytest

from tests.report_tests.fake_backend import HOSTILE_REASON
from tuner.errors import StudyNotFoundError, UserError
from tuner.report import data


def test_study_view_matches_the_trials_run(finished):
    _, storage, runs = finished
    s = data.study(storage, "rep", runs)
    assert sum(t["launched"] for t in s["trials"]) == 12 == s["trials_launched"]
    assert s["trials"][0]["is_baseline"]
    complete = [t for t in s["trials"] if t["status"] == "complete"]
    assert s["best"]["capacity_users"] == max(t["capacity_users"] for t in complete)
    # best so far never decreases and ends at the best capacity
    best = [p["best_users"] for p in s["best_so_far"] if p["best_users"] is not None]
    assert best == sorted(best) and best[-1] == s["best"]["capacity_users"]
    # every completed trial has one measurement per capacity-search step, with P90 TTFT/TPOT
    for t in complete:
        assert t["measurements"] and all(m["p90_ttft_s"] > 0 and m["p90_tpot_s"] > 0 for m in t["measurements"])
    assert "attn-dp-size" in s["varied_params"]
    assert s["spec"]["model"] == "glm-5.1" and s["spec"]["gpus_per_node"] == 8


def test_failures_are_grouped_by_class(finished):
    _, storage, runs = finished
    s = data.study(storage, "rep", runs)
    groups = {g["failure_class"]: g for g in s["failures"]}
    assert groups["oom"]["trials"][0]["number"] == 2
    assert groups["oom"]["trials"][0]["reason"] == HOSTILE_REASON
    assert sum(g["count"] for g in s["failures"]) == sum(1 for t in s["trials"] if t["status"] not in ("complete", "running"))


def test_logs_are_served_only_from_inside_the_study_run_directory(finished, tmp_path):
    _, storage, runs = finished
    text, truncated = data.trial_log(storage, "rep", 2, runs)
    assert "CUDA out of memory" in text and not truncated
    with pytest.raises(UserError, match="no log inside"):
        data.trial_log(storage, "rep", 2, tmp_path)  # another runs dir: the recorded log is outside it
    with pytest.raises(StudyNotFoundError):
        data.trial_log(storage, "rep", 999, runs)


def test_log_path_escapes_are_refused(tmp_path):
    run_dir = (tmp_path / "runs" / "s").resolve()
    (run_dir / "trial-0000").mkdir(parents=True)
    inside = run_dir / "trial-0000" / "server.log"
    inside.write_text("ok")
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    os.symlink(secret, run_dir / "trial-0000" / "link.log")
    assert data._log_inside(str(inside), run_dir) == inside
    assert data._log_inside(str(run_dir / "trial-0000" / ".." / ".." / ".." / "secret.txt"), run_dir) is None
    assert data._log_inside(str(run_dir / "trial-0000" / "link.log"), run_dir) is None
    assert data._log_inside(str(secret), run_dir) is None
    assert data._log_inside(str(run_dir / "trial-0000"), run_dir) is None  # a directory
    assert data._log_inside(None, run_dir) is None


def test_importance_ranks_parameters_and_handles_too_few_trials(finished, tmp_path):
    _, storage, _ = finished
    imp = data.param_importances(storage, "rep")
    assert imp["note"] is None
    values = [i["importance"] for i in imp["importances"]]
    assert values and abs(sum(values) - 1.0) < 1e-6 and values == sorted(values, reverse=True)

    from tests.report_tests.studydb import run_study

    small, _ = run_study(tmp_path, name="tiny", trials=1)  # the baseline only
    imp = data.param_importances(small, "tiny")
    assert imp["importances"] == [] and "at least 2" in imp["note"]


def test_the_database_is_opened_read_only(finished):
    from sqlalchemy import text

    from tuner.errors import StorageFaultError
    from tuner.storage import db

    _, storage, _ = finished
    data.studies(storage)
    engine = db.get_engine(storage, create=False, readonly=True)
    with pytest.raises(StorageFaultError, match="cannot be written \\(attempt to write a readonly database\\)"):
        with engine.begin() as conn:
            conn.execute(text("UPDATE tuner_trials SET status='x'"))


def test_unknown_study_names_the_ones_there(finished):
    _, storage, runs = finished
    with pytest.raises(StudyNotFoundError, match="studies there: rep"):
        data.study(storage, "nope", runs)
