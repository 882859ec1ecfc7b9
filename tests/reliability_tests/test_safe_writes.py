"""Output files are written safely: `tuner study export -o`, `tuner study report -o`, `tuner
workload fit -o`, `tuner workload export -o` and `tuner study verify-export -o` (refused before a
server starts), and the fitted calibration entries, accept only a regular file (or a new one) as the
target, never follow a link, never replace a device, and write through an exclusive temporary
file in the target's directory. A refused target gets exit code 2 and a message naming it; the
target, whatever it is, is left as it was; no temporary file is left behind; the study database
is unchanged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.reliability_tests._util import digest, tuner_main

TRACE = REPO / "tests/workload_tests/data/claude_code_requests_excerpt.csv"
# a given session-ending context limit: the fit skips its search over 8 candidate limits (most of
# its seconds); what these tests check is where and how the profile is written, not the fit
FIT_FAST = ["--max-context-tokens", "131072"]


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> tuple[Path, str]:
    """A 3-trial simulated study: (database file, storage URL). Its simulated windows are shorter
    than h200.yaml's (what is read here is a finished study with a best, not its capacities)."""
    tmp = tmp_path_factory.mktemp("safe-writes")
    spec = tmp / "sw.yaml"
    text = (REPO / "studies/h200.yaml").read_text()
    spec.write_text(text.replace("name: h200", "name: sw").replace("trials: 30", "trials: 3")
                    .replace("backend: auto", "backend: simulator")
                    .replace("measurement: {warmup_s: 120, duration_s: 600,", "measurement: {warmup_s: 30, duration_s: 120,"))
    db = tmp / "tuner.db"
    code, err = tuner_main(["study", "start", str(spec), "--storage", f"sqlite:///{db}", "--no-ray"], tmp)
    assert code == 0, err
    return db, f"sqlite:///{db}"


def _commands(storage: str) -> dict:
    return {
        "study export": lambda out: ["study", "export", "sw", "--storage", storage, "-o", out],
        "study report": lambda out: ["study", "report", "sw", "--storage", storage, "-o", out],
        "workload fit": lambda out: ["workload", "fit", str(TRACE), *FIT_FAST, "-o", out],
        "workload export": lambda out: ["workload", "export", "coding-agent", "--sessions", "3", "-o", out],
        # the target is checked before the study is read or a server started (no GPU needed here)
        "study verify-export": lambda out: ["study", "verify-export", "sw", str(REPO / "studies/h200.yaml"),
                                            "--storage", storage, "-o", out],
    }


def _victim(tmp: Path) -> Path:
    v = tmp / "victim.txt"
    v.write_text("precious\n")
    return v


# target name -> (make it in tmp and return the path to pass, text the refusal must hold)
def _directory(tmp):
    (tmp / "outdir").mkdir()
    return str(tmp / "outdir"), "directory"


def _trailing_slash(tmp):
    return str(tmp / "new") + "/", "directory"


def _device(tmp):
    return "/dev/null", "character device"


def _link(tmp):
    (tmp / "out.yaml").symlink_to(_victim(tmp))
    return str(tmp / "out.yaml"), "symbolic link"


def _dangling_link(tmp):
    (tmp / "out.yaml").symlink_to(tmp / "not-yet-there.txt")
    return str(tmp / "out.yaml"), "symbolic link"


def _fifo(tmp):
    os.mkfifo(tmp / "out.yaml")
    return str(tmp / "out.yaml"), "named pipe"


def _parent_is_a_file(tmp):
    (tmp / "plain.txt").write_text("x")
    return str(tmp / "plain.txt" / "out.yaml"), "not a directory"


def _unwritable_place(tmp):
    return "/proc/tuner-out.yaml", "cannot create a file in /proc"


TARGETS = {"directory": _directory, "trailing slash": _trailing_slash, "/dev/null": _device,
           "link to a file": _link, "dangling link": _dangling_link, "named pipe": _fifo,
           "parent is a file": _parent_is_a_file, "unwritable place": _unwritable_place}


def _snapshot(tmp: Path) -> dict:
    out = {}
    for p in sorted(tmp.rglob("*")):
        st = os.lstat(p)
        out[str(p)] = (stat.S_IFMT(st.st_mode), os.readlink(p) if p.is_symlink() else
                       (p.read_bytes() if stat.S_ISREG(st.st_mode) else None))
    return out


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("command", ["study export", "study report", "workload fit", "workload export",
                                     "study verify-export"])
def test_refused_target_is_left_alone(command, target, tmp_path, finished_study):
    db, storage = finished_study
    out, fragment = TARGETS[target](tmp_path)
    before, db_before = _snapshot(tmp_path), digest(db)
    code, err = tuner_main(_commands(storage)[command](out), tmp_path)
    assert code == 2, err
    assert "Internal error" not in err and "Traceback" not in err
    assert fragment in err and out.rstrip("/").split("/")[-1] in err, err
    assert _snapshot(tmp_path) == before, "the target or its directory changed"
    assert digest(db) == db_before
    if target == "dangling link":
        assert not (tmp_path / "not-yet-there.txt").exists()


@pytest.mark.parametrize("command", ["study export", "study report", "workload fit", "workload export"])
def test_planted_temporary_name_is_not_written_through(command, tmp_path, finished_study):
    """Links planted at the names a naive writer would use for its temporary file are never
    followed: the output is written, the files they point to are untouched."""
    _, storage = finished_study
    victim = _victim(tmp_path)
    out = tmp_path / "out.yaml"
    for planted in ("out.yaml.tmp", "out.tmp", ".out.yaml.tmp"):
        (tmp_path / planted).symlink_to(victim)
    code, err = tuner_main(_commands(storage)[command](str(out)), tmp_path)
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["victim.txt", "out.yaml", "out.yaml.tmp", "out.tmp", ".out.yaml.tmp"]), left


@pytest.mark.parametrize("command", ["study export", "study report", "workload fit", "workload export"])
def test_existing_file_is_replaced_whole_with_its_mode(command, tmp_path, finished_study):
    _, storage = finished_study
    out = tmp_path / "sub" / "out.yaml"
    out.parent.mkdir()
    out.write_text("old\n")
    out.chmod(0o640)
    code, err = tuner_main(_commands(storage)[command](str(out)), tmp_path)
    assert code == 0, err
    assert out.read_text() != "old\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert [p.name for p in out.parent.iterdir()] == ["out.yaml"], "a temporary file was left behind"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
@pytest.mark.parametrize("command", ["study export", "workload fit"])
def test_read_only_directory_is_refused(command, tmp_path, finished_study):
    _, storage = finished_study
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, err = tuner_main(_commands(storage)[command](str(ro / "out.yaml")), tmp_path)
        assert code == 2 and "permission denied" in err and "out.yaml" in err, err
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    """A write that fails half-way (the disk fills) leaves the old file and no temporary one."""
    from tuner import safewrite
    from tuner.errors import ConfigError

    out = tmp_path / "out.yaml"
    out.write_text("old\n")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ConfigError, match="the disk is full") as info:
        safewrite.write_text(out, "new\n" * 1000)
    assert info.value.exit_code == 2 and str(out) in str(info.value)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


@pytest.mark.parametrize("name", ["../evil", "a b", "", "x" * 65])
def test_workload_fit_refuses_a_hostile_profile_name(tmp_path, name):
    out = tmp_path / "fitted.yaml"
    code, err = tuner_main(["workload", "fit", str(TRACE), "-o", str(out), "--name", name], tmp_path)
    assert code == 2 and "--name: invalid profile name" in err, err
    assert not out.exists()


def test_workload_fit_makes_a_name_from_an_awkward_file_name(tmp_path):
    out = tmp_path / "my fitted (v2).yaml"
    code, err = tuner_main(["workload", "fit", str(TRACE), *FIT_FAST, "-o", str(out)], tmp_path)
    assert code == 0, err
    code, err = tuner_main(["validate", str(out)], tmp_path)
    assert code == 0, err
    assert "name: my-fitted-v2" in out.read_text()


@pytest.mark.parametrize("planted", ["link", "directory"])
def test_a_fitted_calibration_entry_is_never_written_through_a_link_or_over_a_directory(tmp_path, planted):
    from tuner.errors import ConfigError
    from tuner.sim.calibrate import write_fitted

    victim = _victim(tmp_path)
    target = tmp_path / "h200.yaml"
    if planted == "link":
        target.symlink_to(victim)
    else:
        target.mkdir()
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match="cannot write here") as info:
        write_fitted("h200", when={"sglang_version": "0.5.17"}, values={"hbm_efficiency": 0.8}, name="x",
                     source="test", directory=tmp_path)
    assert str(target) in str(info.value)
    assert _snapshot(tmp_path) == before


def test_a_fitted_calibration_entry_replaces_the_file_whole(tmp_path):
    import yaml

    from tuner.sim.calibrate import write_fitted

    target = tmp_path / "h200.yaml"
    target.write_text("# header kept\nhbm_efficiency: 0.7\n")
    write_fitted("h200", when={"sglang_version": "0.5.17"}, values={"hbm_efficiency": 0.8}, name="x",
                 source="test", directory=tmp_path)
    text = target.read_text()
    assert text.startswith("# header kept\n")
    doc = yaml.safe_load(text)
    assert doc["hbm_efficiency"] == 0.7 and doc["fitted"][0]["values"] == {"hbm_efficiency": 0.8}
    assert [p.name for p in tmp_path.iterdir()] == ["h200.yaml"], "no temporary file left"
