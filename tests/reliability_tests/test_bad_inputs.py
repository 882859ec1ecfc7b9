"""Malformed study / search-space / workload files: every one is refused with exit code 2 and a
message naming the file and the key, by `tuner validate` and by `tuner study start`, and the
study database is left byte for byte as it was (or not created at all).

The corpus is ``bad_inputs/``: each file states what the message must contain in its first lines
(``# expect-key:`` and ``# expect-message:``; the binary file is listed here). On top of it,
hypothesis mutates the shipped files (wrong types, unknown keys, deleted keys, truncated or
garbage text): whatever it produces must validate (exit 0) or be refused cleanly (exit 2), never
an internal error.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, run_cli
from tests.reliability_tests._util import digest, tuner_main

CORPUS = Path(__file__).parent / "bad_inputs"
FILES = sorted(p for p in CORPUS.iterdir() if p.suffix == ".yaml")
BINARY = {"s43_binary_garbage.yaml": ("", "not a UTF-8 text file")}


def expectation(path: Path) -> tuple[str, str]:
    if path.name in BINARY:
        return BINARY[path.name]
    key = msg = ""
    for line in path.read_text().splitlines()[:2]:
        if line.startswith("# expect-key:"):
            key = line.split(":", 1)[1].strip()
        elif line.startswith("# expect-message:"):
            msg = line.split(":", 1)[1].strip()
    return key, msg


def test_corpus_is_big_enough():
    assert len(FILES) >= 140
    kinds = {p.name[0] for p in FILES}
    assert kinds == {"s", "p", "w"}, "studies, search spaces and workloads are all covered"


def test_validate_refuses_every_file_in_one_run():
    """One real `tuner validate` process over the whole corpus: exit 2, one error per file."""
    r = run_cli(["validate", "--json", *map(str, FILES)])
    assert r.returncode == 2, r.stderr[-2000:]
    results = {Path(f["path"]).name: f for f in json.loads(r.stdout)["files"]}
    assert len(results) == len(FILES)
    for path in FILES:
        res = results[path.name]
        assert not res["ok"], f"{path.name} was accepted"
        key, msg = expectation(path)
        assert str(path) in res["error"], res["error"]
        assert key in res["error"] and msg in res["error"], (path.name, res["error"])


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_study_start_refuses_and_leaves_the_database_alone(path, existing_db, tmp_path):
    key, msg = expectation(path)
    # a database that does not exist must still not exist
    missing = tmp_path / "new.db"
    code, err = tuner_main(["study", "start", str(path), "--storage", f"sqlite:///{missing}"], tmp_path)
    assert code == 2, (path.name, err)
    assert "Internal error" not in err
    assert str(path) in err, err
    if path.name[0] == "s":  # the file is read as a study: its own key is named
        assert key in err and msg in err, (path.name, err)
    assert not missing.exists() and not list(tmp_path.glob("new.db*"))
    # an existing database is byte-for-byte unchanged
    before = digest(existing_db)
    code, err = tuner_main(["study", "start", str(path), "--storage", f"sqlite:///{existing_db}"], tmp_path)
    assert code == 2, err
    assert digest(existing_db) == before


@pytest.mark.parametrize("name", ["s05_unknown_key_typo.yaml", "s43_binary_garbage.yaml", "s28_inline_space_unknown_knob.yaml"])
def test_study_start_as_a_process(name, existing_db, tmp_path):
    """The same through a real `python -m tuner` process (exit code and stderr as a user sees them)."""
    path = CORPUS / name
    key, msg = expectation(path)
    before = digest(existing_db)
    r = run_cli(["study", "start", str(path), "--storage", f"sqlite:///{existing_db}"], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"Error: {path}"), r.stderr
    assert key in r.stderr and msg in r.stderr
    assert digest(existing_db) == before


# ---- hypothesis: random mutations of the shipped files --------------------------------------

SHIPPED = sorted([*(REPO / "studies").glob("*.yaml"), *(REPO / "search_spaces").glob("*.yaml"),
                  *(REPO / "workloads").glob("*.yaml")])

garbage_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=6), st.integers(), max_size=2),
)


def _paths(data, prefix=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _mutate(text: str, op: str, pick: int, value, garbage: str) -> str:
    if op == "truncate":
        return text[: pick % max(1, len(text))]
    if op == "garbage":
        pos = pick % max(1, len(text))
        return text[:pos] + garbage + text[pos:]
    data = yaml.safe_load(text)
    paths = list(_paths(data))
    path = paths[pick % len(paths)]
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        if isinstance(parent, list):
            parent.pop(last)
        else:
            del parent[last]
    elif op == "retype":
        parent[last] = value
    elif op == "unknown_key":
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            target["x" + garbage.strip()[:8] + "_unknown"] = value
    return yaml.safe_dump(data, sort_keys=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=st.sampled_from(SHIPPED), op=st.sampled_from(["delete", "retype", "unknown_key", "truncate", "garbage"]),
       pick=st.integers(0, 10**6), value=garbage_values, garbage=st.text(min_size=1, max_size=20))
def test_mutated_shipped_files_never_crash_the_loader(source, op, pick, value, garbage):
    tmp = Path(tempfile.mkdtemp(prefix="tuner-mut-"))
    try:
        folder = tmp / source.parent.name  # studies/, search_spaces/ or workloads/: names still resolve
        folder.mkdir()
        path = folder / source.name
        path.write_text(_mutate(source.read_text(), op, pick, value, garbage))
        for other in ("search_spaces", "workloads"):  # a mutated study still finds the shipped files
            if other != source.parent.name and (REPO / other).is_dir():
                shutil.copytree(REPO / other, tmp / other)
        code, err = tuner_main(["validate", str(path)], tmp)
        assert code in (0, 2), (code, err, path.read_text()[:2000])
        assert "Internal error" not in err
        if code == 2:
            assert str(path) in err, err
            db_file = tmp / "t.db"
            code, err = tuner_main(["study", "start", str(path), "--storage", f"sqlite:///{db_file}"], tmp)
            assert code == 2, (code, err)
            assert not db_file.exists()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_mutation_helper_changes_the_file():
    text = (REPO / "studies/h200.yaml").read_text()
    rng = random.Random(0)
    changed = {_mutate(text, op, rng.randrange(10**6), 7, "@@") != text
               for op in ("delete", "retype", "unknown_key", "truncate", "garbage")}
    assert changed == {True}
