"""Files that are hostile by their size or kind (made at test time, not kept in the corpus): a
50 MB study, a device, a named pipe, a directory, links to them, and studies that point their
workload or search space at such files. Each is refused by `tuner validate` and by `tuner study
start` with exit code 2 and a message naming the file, without reading it whole, and no database
is created or changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.reliability_tests._util import digest, tuner_main

H200 = (REPO / "studies/h200.yaml").read_text()


def _big(tmp: Path, size: int) -> Path:
    p = tmp / "big.yaml"
    with open(p, "w") as f:
        f.write(H200)
        f.write("description: '")
        f.write("x" * (size - len(H200) - 20))
        f.write("'\n")
    return p


def _fifo(tmp: Path) -> Path:
    p = tmp / "pipe.yaml"
    os.mkfifo(p)
    return p


def _dir(tmp: Path) -> Path:
    p = tmp / "folder.yaml"
    p.mkdir()
    return p


def _link_to_zero(tmp: Path) -> Path:
    p = tmp / "zero.yaml"
    p.symlink_to("/dev/zero")
    return p


def _study_pointing_to(target_key: str, target: str):
    def make(tmp: Path) -> Path:
        p = tmp / "pointer.yaml"
        p.write_text(H200.replace("workload: coding-agent", f"workload: {target}" if target_key == "workload"
                                  else "workload: coding-agent")
                     .replace("search_space: glm-5.1", f"search_space: {target}" if target_key == "search_space"
                              else "search_space: glm-5.1"))
        return p
    return make


def _study_with_big_workload(tmp: Path) -> Path:
    big = tmp / "wl.yaml"
    with open(big, "w") as f:
        f.write("name: big\n# " + "x" * (3 * 1024 * 1024) + "\n")
    p = tmp / "pointer.yaml"
    p.write_text(H200.replace("workload: coding-agent", f"workload: {big}"))
    return p


CASES = {
    # name: (make the file, text the message must hold, file the message must name (None: the one given))
    "50 MB study": (lambda t: _big(t, 50 * 1024 * 1024), "at most 1,048,576 are read", None),
    "just over the limit": (lambda t: _big(t, 1024 * 1024 + 10), "at most 1,048,576 are read", None),
    "character device": (lambda t: Path("/dev/zero"), "a character device, not a regular file", None),
    "link to a device": (_link_to_zero, "a character device, not a regular file", None),
    "named pipe": (_fifo, "a named pipe, not a regular file", None),
    "directory": (_dir, "a directory, not a regular file", None),
    "workload is a device": (_study_pointing_to("workload", "/dev/zero"), "a character device", "/dev/zero"),
    "search space is a device": (_study_pointing_to("search_space", "/dev/zero"), "a character device", "/dev/zero"),
    "search space is a pipe": (_study_pointing_to("search_space", "/dev/stdin"), "not a regular file", "/dev/stdin"),
    "workload of 3 MB": (_study_with_big_workload, "at most 1,048,576 are read", "wl.yaml"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_is_refused(case, tmp_path, existing_db):
    make, fragment, named = CASES[case]
    path = make(tmp_path)
    code, err = tuner_main(["validate", str(path)], tmp_path)
    assert code == 2, err
    assert "Internal error" not in err and fragment in err, err
    assert (named or str(path)) in err, err
    new_db = tmp_path / "new.db"
    code, err = tuner_main(["study", "start", str(path), "--storage", f"sqlite:///{new_db}"], tmp_path)
    assert code == 2 and fragment in err, err
    assert not list(tmp_path.glob("new.db*"))
    before = digest(existing_db)
    code, err = tuner_main(["study", "start", str(path), "--storage", f"sqlite:///{existing_db}"], tmp_path)
    assert code == 2 and fragment in err, err
    assert digest(existing_db) == before


def test_a_large_file_is_not_read(tmp_path, monkeypatch):
    """The size is checked before reading: not one byte of a file over the limit is read."""
    import builtins

    from tuner import safeyaml
    from tuner.errors import ConfigError

    path = _big(tmp_path, 2 * 1024 * 1024)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    with pytest.raises(ConfigError, match="at most 1,048,576"):
        safeyaml.load_file(path)
    assert str(path) not in opened
