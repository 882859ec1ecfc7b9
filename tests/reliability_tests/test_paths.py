"""Every file a study writes lies inside its run directory: the study's directory and each trial's
directory are resolved (links included) and checked before anything is written. A study whose
directory is a link to elsewhere is refused before it starts; a trial whose directory was
replaced by such a link fails with the reason (and the study goes on); nothing is written
outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.reliability_tests._util import (
    kill_marked, new_mark, run_tuner, trial_rows, tuner_env, tuner_main, write_study,
)
from tuner import paths

SPACE = {"engine": "sglang", "params": {"tp-size": {"values": [8]}, "quantization": {"values": ["modelopt_fp4"]},
                                        "mem-fraction-static": {"low": 0.80, "high": 0.90}}}


@pytest.mark.parametrize("part", ["..", "../x", "a/../../b", "/etc", "", "a\x00b"])
def test_parts_that_climb_out_are_refused(tmp_path, part):
    with pytest.raises(paths.PathOutsideError) as info:
        paths.inside(tmp_path, part)
    assert info.value.exit_code == 2 and str(tmp_path) in str(info.value)


def test_a_link_below_the_root_that_points_out_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "runs"
    root.mkdir()
    (root / "study").symlink_to(outside)
    with pytest.raises(paths.PathOutsideError, match="lies outside"):
        paths.trial_dir(root, "study", 3)
    assert paths.trial_dir(root, "other", 3) == (root / "other" / "trial-0003").resolve()


def test_the_root_itself_may_be_a_link(tmp_path):
    """A runs directory on a larger disk, linked into place, is fine."""
    disk = tmp_path / "big-disk"
    disk.mkdir()
    (tmp_path / "runs").symlink_to(disk)
    assert paths.trial_dir(tmp_path / "runs", "s", 1) == disk / "s" / "trial-0001"


def test_a_study_directory_linked_elsewhere_is_refused_before_it_starts(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    (runs / "linked").symlink_to(outside)
    study = write_study(tmp_path, "linked", trials=2, search_space=SPACE)
    db = tmp_path / "t.db"
    code, err = tuner_main(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--no-ray"], tmp_path)
    assert code == 2 and "lies outside" in err and str(outside) in err, err
    assert list(outside.iterdir()) == []
    assert not db.exists()


def test_a_trial_directory_replaced_by_a_link_fails_that_trial_only(tmp_path):
    """serve-sim servers (real processes): trial 1's directory is a planted link to elsewhere;
    trial 1 fails with the reason, nothing lands outside, the other trials run."""
    mark = new_mark()
    outside = tmp_path / "outside"
    outside.mkdir()
    study_dir = tmp_path / "results" / "runs" / "planted"
    study_dir.mkdir(parents=True)
    (study_dir / "trial-0001").symlink_to(outside)
    study = write_study(tmp_path, "planted", trials=3, search_space=SPACE)
    db = tmp_path / "t.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--no-ray"], cwd=tmp_path,
                      env=tuner_env(mark), timeout=600)
    finally:
        kill_marked(mark)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = trial_rows(db, "planted")
    assert rows[1]["status"] == "failed" and "lies outside" in rows[1]["failure_reason"], rows[1]
    assert rows[0]["status"] == "complete" and rows[2]["status"] in ("complete", "pruned"), rows
    assert list(outside.iterdir()) == [], "a file was written outside the run directory"
    assert os.path.islink(study_dir / "trial-0001")
    for n in (0, 2):
        assert any((study_dir / f"trial-{n:04d}").iterdir())
    assert all(Path(p).resolve().is_relative_to(study_dir.resolve())
               for p in (study_dir / "trial-0000", study_dir / "trial-0002"))
