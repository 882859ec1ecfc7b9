"""A study stored by an earlier tuner with a value this tuner's stricter schema refuses: resume
refuses it with the key and the bound (exit 2, nothing written), readers (status, export) read it
with the field's default and a note, and a stored study that cannot be read at all is a clear error.
"""

from __future__ import annotations

import sqlite3

import pytest
import yaml

from tests.reliability_tests._util import check_case, run_tuner, table_rows, tuner_env, write_study

# key path -> a value earlier tuners stored and this one bounds
OUT_OF_RANGE = {
    ("seed",): 2**40,
    ("measurement", "duration_s"): float("inf"),
    ("measurement", "warmup_s"): 10**9,
    ("capacity", "growth_factor"): 1e9,
    ("slo", "p90_ttft_s"): 1e12,
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stored")
    study = write_study(tmp, "old", trials=1, backend="simulator")
    r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{tmp}/tuner.db", "--no-ray"], cwd=tmp,
                  env=tuner_env())
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp / "tuner.db"


def _store(src, tmp_path, path: tuple, value) -> str:
    db = tmp_path / "tuner.db"
    db.write_bytes(src.read_bytes())
    con = sqlite3.connect(db)
    spec = yaml.safe_load(con.execute("SELECT spec_yaml FROM tuner_studies").fetchone()[0])
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    con.execute("UPDATE tuner_studies SET spec_yaml = ?", (yaml.safe_dump(spec, sort_keys=False),))
    con.commit()
    con.close()
    return f"sqlite:///{db}"


@pytest.mark.parametrize("path", list(OUT_OF_RANGE), ids=[".".join(p) for p in OUT_OF_RANGE])
def test_resume_refuses_a_stored_value_out_of_todays_range(path, stored, tmp_path):
    storage = _store(stored, tmp_path, path, OUT_OF_RANGE[path])
    before = table_rows(tmp_path / "tuner.db")
    r = run_tuner(["study", "resume", "old", "--storage", storage, "--no-ray", "--trials", "2"], cwd=tmp_path,
                  env=tuner_env())
    key = ".".join(path)
    check_case(r, code=2, db=tmp_path / "tuner.db", before=before,
               message=rf"\(study 'old' as stored by tuner [\d.]+\): {key}: .*this tuner does not accept the value\(s\) "
                       rf"above any more, so it cannot resume the study as stored; `status` and `export` still read it")


@pytest.mark.parametrize("command", ["status", "export"])
@pytest.mark.parametrize("path", [("seed",), ("measurement", "duration_s")], ids=["seed", "measurement.duration_s"])
def test_readers_read_it_with_the_default_and_a_note(command, path, stored, tmp_path):
    storage = _store(stored, tmp_path, path, OUT_OF_RANGE[path])
    before = table_rows(tmp_path / "tuner.db")
    r = run_tuner(["study", command, "old", "--storage", storage], cwd=tmp_path, env=tuner_env())
    key = ".".join(path)
    if command == "export":
        check_case(r, code=0, db=tmp_path / "tuner.db", before=before,
                   message=rf"{key}: the stored value .* is not valid any more \(.*\); read as the default")
        assert "tp-size: 8" in r.stdout
    else:
        check_case(r, code=0, db=tmp_path / "tuner.db", before=before,
                   message=rf"note: .*{key}: the stored value .* is not valid any more")
        assert "study old" in r.stdout and "estimated real cost" in r.stdout


def test_a_stored_study_that_is_not_yaml_is_a_clear_error(stored, tmp_path):
    db = tmp_path / "tuner.db"
    db.write_bytes(stored.read_bytes())
    con = sqlite3.connect(db)
    con.execute("UPDATE tuner_studies SET spec_yaml = ?", ("name: [unclosed",))
    con.commit()
    con.close()
    before = table_rows(db)
    r = run_tuner(["study", "resume", "old", "--storage", f"sqlite:///{db}", "--no-ray"], cwd=tmp_path, env=tuner_env())
    check_case(r, code=2, db=db, before=before, message=r"\(study 'old' as stored by tuner [\d.]+\): the stored study "
                                                        r"cannot be read")
