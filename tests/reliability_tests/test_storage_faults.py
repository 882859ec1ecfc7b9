"""Broken storage, each with a clear message and exit code, the database unchanged (or consistent:
nothing running, no lease held) and no orphan process:

* **disk full**: a real full file system (a small tmpfs, when this runs as root and may mount),
  else, and for PostgreSQL always, an OSError(ENOSPC) / DiskFull injected at SQLAlchemy's
  ``do_execute``; mid-study, at start, at resume, and readers on a full disk;
* **damaged pages**: bytes of a copy overwritten (header, a table's root page, an index page,
  the file cut in half);
* **a newer schema**: every command refuses it and writes nothing;
* **permissions**: an unreadable file, a read-only file, a read-only directory (for root, run
  without the capabilities that bypass file permissions);
* **read-only**: ``mode=ro`` in the URL and a read-only bind mount: readers (status, list,
  export, dashboard) work, writers refuse;
* **in-memory SQLite** (``sqlite://``): a clear error for every command;
* **transactions**: a write that fails midway leaves the database as it was.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability_tests._util import (
    check_case, drop_dac_prefix, kill_marked, new_mark, query, run_tuner, run_tuner_as, spawn_tuner, table_rows,
    trial_rows, tuner_env, tuner_run, wait_until, write_study,
)
from tests.reliability_tests.test_kill9_moments import _measuring
from tests.storage_tests.pg import fresh_pg_database, needs_pg


class _Done:
    def __init__(self, returncode, stderr, stdout=""):
        self.returncode, self.stderr, self.stdout = returncode, stderr, stdout


def _in_process(args, cwd) -> _Done:
    code, out, err = tuner_run(args, cwd)
    return _Done(code, err, out)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-trial simulated study `done` and its study file, to copy per case."""
    tmp = tmp_path_factory.mktemp("finished")
    study = write_study(tmp, "done", trials=2, backend="simulator")
    write_study(tmp, "other", trials=1, backend="simulator")
    r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{tmp}/tuner.db", "--no-ray"], cwd=tmp,
                  env=tuner_env())
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp


def _copy(finished: Path, to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    for name in ("tuner.db", "done.yaml", "other.yaml"):
        shutil.copy(finished / name, to / name)
    return to / "tuner.db"


def _commands(storage: str, tmp: Path) -> dict[str, list[str]]:
    return {
        "study list": ["study", "list", "--storage", storage],
        "study status": ["study", "status", "done", "--storage", storage],
        "study export": ["study", "export", "done", "--storage", storage],
        "study resume": ["study", "resume", "done", "--storage", storage, "--no-ray", "--trials", "3"],
        "study start": ["study", "start", str(tmp / "other.yaml"), "--storage", storage, "--no-ray"],
    }


READERS = ("study list", "study status", "study export")
WRITERS = ("study resume", "study start")
QUICK = {"capacity": {"start_users": 2, "max_users": 4, "resolution_users": 2}}  # two load points a trial


def _dashboard(storage: str, cwd: Path, env: dict, prefix: list[str] = ()) -> _Done:
    """Start the dashboard: a refusal's (exit code, stderr), or, when it serves, exit 0 after one
    successful GET of the study list (then it is stopped)."""
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "tuner", "dashboard", "--storage", storage, "--port", "0"],
                            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
    if not m:
        proc.wait(timeout=60)
        return _Done(proc.returncode, first + proc.stderr.read())
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/api/studies", timeout=30) as resp:
            body = json.loads(resp.read())
        ok = resp.status == 200 and [s["name"] for s in body["studies"]] == ["done"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return _Done(0 if ok else 99, first + proc.stderr.read())


# ---------------------------------------------------------------------------------------------
# damaged pages


def _root_page(db: Path, name: str) -> tuple[int, int]:
    con = sqlite3.connect(db)
    try:
        page = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
        return page, con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()


def _overwrite_page(db: Path, name: str) -> None:
    page, size = _root_page(db, name)
    with open(db, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(bytes([0xA5]) * size)


def _corrupt(db: Path, kind: str) -> None:
    if kind == "header":
        with open(db, "r+b") as f:
            f.write(b"this is no longer SQLite")
    elif kind == "trials table page":
        _overwrite_page(db, "tuner_trials")
    elif kind == "studies table page":
        _overwrite_page(db, "tuner_studies")
    elif kind == "index page":
        _overwrite_page(db, "sqlite_autoindex_tuner_trials_1")
    elif kind == "cut in half":
        with open(db, "r+b") as f:
            f.truncate(db.stat().st_size // 2)


# (kind, command) -> (exit code, message); readers that never touch the damaged page are not asked
DAMAGED = (r"is damaged \((database disk image is malformed|quick check: .+)\); restore it from a copy; salvage what is "
           r"readable with `sqlite3 .*tuner.db .recover")
NOT_DB = r"is not a study database \(file is not a database\): it is not an SQLite file, or its first page is damaged"
CORRUPT_CASES = {
    **{("header", c): (2, NOT_DB) for c in READERS + WRITERS + ("dashboard",)},
    **{("trials table page", c): (3, DAMAGED) for c in READERS + WRITERS + ("dashboard",)},
    **{("studies table page", c): (3, DAMAGED) for c in READERS + WRITERS + ("dashboard",)},
    **{("index page", c): (3, DAMAGED) for c in WRITERS + ("dashboard",)},
    **{("cut in half", c): (3, DAMAGED) for c in ("study status", "study resume", "study start", "dashboard")},
}


@pytest.mark.parametrize("kind,command", list(CORRUPT_CASES), ids=[f"{k}-{c}" for k, c in CORRUPT_CASES])
def test_damaged_pages_are_refused_clearly_and_the_file_is_left_alone(kind, command, finished, tmp_path):
    db = _copy(finished, tmp_path)
    _corrupt(db, kind)
    before = db.read_bytes()
    storage = f"sqlite:///{db}"
    mark = new_mark()
    env = tuner_env(mark)
    code, message = CORRUPT_CASES[(kind, command)]
    if command == "dashboard":
        r = _dashboard(storage, tmp_path, env)
    else:
        r = run_tuner(_commands(storage, tmp_path)[command], cwd=tmp_path, env=env, timeout=120)
    check_case(r, code=code, message=message, mark=mark)
    assert str(db) in r.stderr
    assert db.read_bytes() == before, "nothing was written to the damaged file"
    assert not list(tmp_path.glob("tuner.db-reserve-*"))


# ---------------------------------------------------------------------------------------------
# a newer schema


@pytest.mark.parametrize("command", READERS + WRITERS + ("dashboard", "db upgrade"))
def test_a_newer_schema_is_refused_by_every_command_and_nothing_is_written(command, finished, tmp_path):
    db = _copy(finished, tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE tuner_schema SET version = 99")
    con.commit()
    con.close()
    before = table_rows(db)
    storage = f"sqlite:///{db}"
    env = tuner_env()
    if command == "dashboard":
        r = _dashboard(storage, tmp_path, env)
    elif command == "db upgrade":
        r = run_tuner(["db", "upgrade", "--storage", storage], cwd=tmp_path, env=env)
    else:
        r = run_tuner(_commands(storage, tmp_path)[command], cwd=tmp_path, env=env, timeout=120)
    check_case(r, code=2, message=r"written by a newer tuner \(schema 99 > 3\); upgrade tuner", db=db, before=before)
    assert query(db, "SELECT version FROM tuner_schema") == [(99,)]


# ---------------------------------------------------------------------------------------------
# permissions and read-only files

WRITE_REFUSED = r"the study database .* cannot be written \({why}\); `tuner study status`, `list`, `export` and the " \
                r"dashboard read it as it is, `start` and `resume` need a writable copy"
PERMISSION_CASES = {
    # (file mode, directory mode) -> what writers are told; None: the file cannot be read at all
    "unreadable file": (0o000, 0o755, None),
    "read-only file": (0o444, 0o755, "the file is not writable here: .*-r--r--r--.*"),
    "read-only directory": (0o644, 0o555, "its directory is not writable here: .*dr-xr-xr-x.*"),
}


@pytest.mark.parametrize("case,command", [(c, cmd) for c in PERMISSION_CASES for cmd in READERS + WRITERS + ("dashboard",)],
                         ids=lambda v: v.replace(" ", "-"))
def test_permission_problems(case, command, finished, tmp_path):
    prefix = drop_dac_prefix()
    if prefix is None:
        pytest.skip("running as root without setpriv: file permissions cannot apply here")
    where = tmp_path / "ro"
    db = _copy(finished, where)
    file_mode, dir_mode, why = PERMISSION_CASES[case]
    tmp_path.chmod(0o755)
    before = table_rows(db)
    db.chmod(file_mode)
    where.chmod(dir_mode)
    storage = f"sqlite:///{db}"
    mark = new_mark()
    env = tuner_env(mark, HOME=str(tmp_path))
    try:
        if command == "dashboard":
            r = _dashboard(storage, tmp_path, env, prefix)
        else:
            r = run_tuner_as(prefix, _commands(storage, where)[command], cwd=tmp_path, env=env, timeout=120)
    finally:
        where.chmod(0o755)
        db.chmod(0o644)
    if why is None:
        check_case(r, code=3, mark=mark, message=r"cannot open the study database .*tuner.db: permission denied "
                                                 r"\(.*tuner.db: ----------, owner uid \d+")
    elif command in WRITERS:
        check_case(r, code=3, mark=mark, message=WRITE_REFUSED.format(why=why))
    else:
        check_case(r, code=0, mark=mark, message=r"")
        if command == "study export":
            assert "tp-size: 8" in r.stdout
    assert table_rows(db) == before, "the database changed"
    assert not list(where.glob("tuner.db-reserve-*"))


@pytest.mark.parametrize("command", READERS + WRITERS + ("dashboard",))
@pytest.mark.parametrize("url_form", ["sqlite:///{db}?mode=ro", "sqlite:///file:{db}?mode=ro&uri=true"],
                         ids=["mode=ro", "uri mode=ro"])
def test_mode_ro_in_the_url_reads_and_never_writes(command, url_form, finished, tmp_path):
    db = _copy(finished, tmp_path)
    before = table_rows(db)
    storage = url_form.format(db=db)
    mark = new_mark()
    env = tuner_env(mark)
    if command == "dashboard":
        r = _dashboard(storage, tmp_path, env)
    else:
        r = run_tuner(_commands(storage, tmp_path)[command], cwd=tmp_path, env=env, timeout=120)
    if command in WRITERS:
        check_case(r, code=3, mark=mark, db=db, before=before,
                   message=WRITE_REFUSED.format(why=r"the storage URL opens it read-only \(mode=ro\)"))
    else:
        check_case(r, code=0, message=r"", mark=mark, db=db, before=before)


@pytest.fixture
def readonly_mount(tmp_path):
    """A read-only bind mount of a directory (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    src, dst = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    dst.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not allowed here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(dst)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield src, dst
    finally:
        subprocess.run(["umount", "-l", str(dst)], capture_output=True)


@pytest.mark.parametrize("command", READERS + WRITERS + ("dashboard",))
def test_a_read_only_file_system(command, finished, readonly_mount, tmp_path):
    src, ro = readonly_mount
    _copy(finished, src)
    db = ro / "tuner.db"
    before = table_rows(src / "tuner.db")  # the same file, read where it may be (the test reads it as tuner does not)
    storage = f"sqlite:///{db}"
    mark = new_mark()
    env = tuner_env(mark)
    if command == "dashboard":
        r = _dashboard(storage, tmp_path, env)
    else:
        r = run_tuner(_commands(storage, ro)[command], cwd=tmp_path, env=env, timeout=120)
    if command in WRITERS:
        check_case(r, code=3, mark=mark, message=WRITE_REFUSED.format(why=r".* is on a read-only file system"))
    else:
        check_case(r, code=0, message=r"", mark=mark)
    assert table_rows(src / "tuner.db") == before


# ---------------------------------------------------------------------------------------------
# in-memory SQLite


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared&uri=true"])
@pytest.mark.parametrize("command", READERS + WRITERS + ("dashboard",))
def test_in_memory_sqlite_is_a_clear_error(url, command, finished, tmp_path):
    db = _copy(finished, tmp_path)
    env = tuner_env()
    if command == "dashboard":
        r = _dashboard(url, tmp_path, env)
    else:
        r = run_tuner(_commands(url, tmp_path)[command], cwd=tmp_path, env=env, timeout=60)
    check_case(r, code=2, message=r"is an in-memory SQLite database: it would vanish when this command ends.*"
                                  r"give a file, e.g. sqlite:///results/tuner.db")
    assert not list(tmp_path.glob(":memory:*")) and not (tmp_path / "file").exists()
    assert db.exists()


# ---------------------------------------------------------------------------------------------
# disk full


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs (root only): (its directory, fill(), free())."""
    if os.geteuid() != 0:
        pytest.skip("a small file system needs root to mount; the injected ENOSPC cases cover the rest")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not allowed here")
    filler = disk / "filler"

    def fill():
        with open(filler, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def free():
        filler.unlink(missing_ok=True)

    try:
        yield disk, fill, free
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


FULL = r"the disk holding the study database .*tuner.db is full \((database or disk is full|No space left on device)\)"


def test_the_disk_fills_mid_study(small_disk, tmp_path):
    """The driver stops at once (exit 3), its servers stopped; the disk-space reserve it held makes
    room to record the running trial as interrupted and the study as stopped; after the disk has
    room again, resume finishes the study."""
    disk, fill, free = small_disk
    mark = new_mark()
    env = tuner_env(mark)
    study = write_study(tmp_path, "full", trials=2, **QUICK)
    db = disk / "tuner.db"
    storage = f"sqlite:///{db}"
    driver, err = spawn_tuner(["study", "start", str(study), "--storage", storage, "--no-ray", "--no-pruning"],
                              cwd=tmp_path, env=env, log_name="start")
    try:
        assert wait_until(lambda: _measuring(db, "full") or driver.poll() is not None, 120, 0.05)
        assert (disk / "tuner.db-reserve-full").stat().st_size >= 1024 * 1024, "the driver holds its reserve"
        running = [n for n, t in trial_rows(db, "full").items() if t["status"] == "running"]
        fill()
        driver.wait(timeout=120)
        check_case(_Done(driver.returncode, err.read_text()), code=3, db=db, mark=mark,
                   message=FULL + r"; free some space, then run the command again \(a stopped study continues with "
                                  r"`tuner study resume full`\)")
        rows = trial_rows(db, "full")
        assert rows[running[0]]["status"] == "interrupted" and "disk_full" in rows[running[0]]["failure_reason"]
        assert query(db, "SELECT status FROM tuner_studies") == [("stopped",)]
        # readers work on the full disk
        r = run_tuner(["study", "status", "full", "--storage", storage, "--json"], cwd=tmp_path, env=env)
        check_case(r, code=0, message=r"", db=db)
        # a resume while it is still full (the driver's journal, gone with it, had freed some room):
        # refused before it writes anything
        before = table_rows(db)
        fill()
        r = run_tuner(["study", "resume", "full", "--storage", storage, "--no-ray"], cwd=tmp_path, env=env)
        check_case(r, code=3, message=FULL, db=db, before=before, mark=mark)
        free()
        r = run_tuner(["study", "resume", "full", "--storage", storage, "--no-ray", "--json"], cwd=tmp_path, env=env,
                      timeout=240)
        check_case(r, code=0, message=r"", db=db, mark=mark)
        assert json.loads(r.stdout)["trials_run"] == 2
        assert not list(disk.glob("tuner.db-reserve-*")), "the reserve goes with the driver"
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_marked(mark)


@pytest.mark.parametrize("existing", [False, True], ids=["new database", "existing database"])
def test_start_on_a_full_disk(existing, small_disk, finished, tmp_path):
    disk, fill, free = small_disk
    db = disk / "tuner.db"
    if existing:
        _copy(finished, disk)
    before = table_rows(db) if existing else None
    fill()
    mark = new_mark()
    r = run_tuner(["study", "start", str(finished / "other.yaml"), "--storage", f"sqlite:///{db}", "--no-ray"],
                  cwd=tmp_path, env=tuner_env(mark), timeout=120)
    check_case(r, code=3, message=FULL, mark=mark)
    if existing:
        assert table_rows(db) == before
    else:
        assert not db.exists() or query(db, "SELECT name FROM tuner_studies") == []
    free()


def _injected(fault: str, pattern: str, args: list[str], cwd: Path, env: dict, *, arm: str = "", times: int = 1):
    """``tuner ARGS`` in a process of its own with storage faults injected (inject_run.py)."""
    return subprocess.run([sys.executable, "-m", "tests.reliability_tests.inject_run", fault, pattern, arm or pattern,
                           str(times), "--", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _storage(kind, tmp_path):
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/tuner.db", lambda: None
    return fresh_pg_database()


def _consistent(storage) -> tuple[int, int, int, str]:
    from sqlalchemy import text

    from tuner.storage import db

    with db.get_engine(storage, create=False).connect() as conn:
        return (conn.execute(text("SELECT count(*) FROM tuner_trials WHERE status = 'running'")).scalar(),
                conn.execute(text("SELECT count(*) FROM trials WHERE state = 'RUNNING'")).scalar(),
                conn.execute(text("SELECT count(*) FROM tuner_driver_leases")).scalar(),
                conn.execute(text("SELECT status FROM tuner_studies WHERE name = 'inj'")).scalar())


FAULT = {"sqlite": "enospc", "postgresql": "pg-disk-full"}


MID_STUDY = [("sqlite", s) for s in ("INSERT INTO tuner_measurements", "UPDATE tuner_trials",
                                     "INSERT INTO trial_intermediate_values", "INSERT INTO trials ")] + [
    pytest.param("postgresql", s, marks=needs_pg) for s in ("INSERT INTO tuner_measurements", "UPDATE tuner_trials")]


@pytest.mark.parametrize("kind,statement", MID_STUDY)
def test_an_injected_disk_full_mid_study_stops_it_cleanly(kind, statement, tmp_path):
    """One write fails as a full disk would (the OSError under SQLite, DiskFull under PostgreSQL),
    after the first measurement; space comes back for the driver's last writes, as the reserve
    makes it on SQLite."""
    storage, drop = _storage(kind, tmp_path)
    mark = new_mark()
    env = tuner_env(mark)
    try:
        study = write_study(tmp_path, "inj", trials=2, backend="simulator", **QUICK)
        r = _injected(FAULT[kind], statement, ["study", "start", str(study), "--storage", storage, "--no-ray",
                                               "--no-pruning"], tmp_path, env, arm="INSERT INTO tuner_measurements")
        check_case(r, code=3, mark=mark, message=r"the disk holding the study database .* is full \(.*No space left")
        assert _consistent(storage) == (0, 0, 0, "stopped")
        r = run_tuner(["study", "resume", "inj", "--storage", storage, "--no-ray", "--json"], cwd=tmp_path, env=env,
                      timeout=240)
        check_case(r, code=0, message=r"", mark=mark)
        assert json.loads(r.stdout)["trials_run"] == 2 and _consistent(storage) == (0, 0, 0, "finished")
    finally:
        kill_marked(mark)
        drop()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=needs_pg)])
def test_a_disk_that_stays_full_leaves_a_study_the_next_resume_records(kind, tmp_path):
    """Every write fails from the first measurement on: nothing more can be recorded, the message
    says which trial the resume will record, the servers are stopped all the same; the driver's
    lease stays behind naming a dead process, so the resume takes over at once."""
    storage, drop = _storage(kind, tmp_path)
    mark = new_mark()
    env = tuner_env(mark)
    try:
        study = write_study(tmp_path, "inj", trials=2, backend="simulator", **QUICK)
        r = _injected(FAULT[kind], r"^\s*(INSERT|UPDATE|DELETE)", ["study", "start", str(study), "--storage", storage,
                                                                "--no-ray", "--no-pruning"], tmp_path, env,
                      arm="INSERT INTO tuner_measurements", times=0)
        check_case(r, code=3, mark=mark, message=r"is full .*; trial\(s\) 0 could not be recorded as interrupted: "
                                                 r"`tuner study resume inj` records them")
        ours, theirs, held, status = _consistent(storage)
        assert (ours, theirs, held) == (1, 1, 1), "what the driver could not record: the next resume's to record"
        r = run_tuner(["study", "resume", "inj", "--storage", storage, "--no-ray", "--json"], cwd=tmp_path, env=env,
                      timeout=240)
        check_case(r, code=0, message=r"", mark=mark)
        assert _consistent(storage) == (0, 0, 0, "finished")
    finally:
        kill_marked(mark)
        drop()


# ---------------------------------------------------------------------------------------------
# transactions


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=needs_pg)])
def test_a_start_whose_lease_write_fails_leaves_no_study_behind(kind, tmp_path):
    storage, drop = _storage(kind, tmp_path)
    try:
        study = write_study(tmp_path, "inj", trials=2, backend="simulator")
        r = _injected(FAULT[kind], r"INSERT INTO tuner_driver_leases", ["study", "start", str(study), "--storage",
                                                                         storage, "--no-ray"], tmp_path, tuner_env())
        check_case(r, code=3, message=r"is full")
        from sqlalchemy import text

        from tuner.storage import db

        with db.get_engine(storage, create=False).connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tuner_studies")).scalar() == 0, "rolled back with the lease"
        r = run_tuner(["study", "start", str(study), "--storage", storage, "--no-ray"], cwd=tmp_path, env=tuner_env())
        check_case(r, code=0, message=r"")
    finally:
        drop()


def test_a_start_whose_optuna_study_fails_takes_its_own_rows_back(tmp_path):
    storage = f"sqlite:///{tmp_path}/tuner.db"
    study = write_study(tmp_path, "inj", trials=2, backend="simulator")
    r = _injected("enospc", r"INSERT INTO studies", ["study", "start", str(study), "--storage", storage, "--no-ray"],
                  tmp_path, tuner_env())
    check_case(r, code=3, message=r"is full", db=tmp_path / "tuner.db")
    assert query(tmp_path / "tuner.db", "SELECT count(*) FROM tuner_studies") == [(0,)]
    r = run_tuner(["study", "start", str(study), "--storage", storage, "--no-ray"], cwd=tmp_path, env=tuner_env())
    check_case(r, code=0, message=r"", db=tmp_path / "tuner.db")


def test_a_migration_that_fails_midway_leaves_the_old_schema(tmp_path):
    from tests.storage_tests.test_migration import V1, unpack

    db = tmp_path / "tuner.db"
    unpack(V1, db)
    before = table_rows(db)
    # the 2 -> 3 step fails, after the 1 -> 2 step altered the trials table in the same transaction
    r = _injected("enospc", r"CREATE TABLE tuner_driver_leases", ["db", "upgrade", "--storage", f"sqlite:///{db}"],
                  tmp_path, tuner_env())
    check_case(r, code=3, message=r"is full")
    assert table_rows(db) == before and query(db, "SELECT version FROM tuner_schema") == [(1,)]
    cols = {r[1] for r in query(db, "PRAGMA table_info(tuner_trials)")}
    assert "launched" not in cols, "the first step's columns went with the failed transaction"


# ---------------------------------------------------------------------------------------------
# locked


def test_a_database_locked_past_the_busy_timeout_is_a_clear_error(finished, tmp_path, monkeypatch):
    db = _copy(finished, tmp_path)
    before = table_rows(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        from tuner.storage import db as db_mod

        monkeypatch.setattr(db_mod, "SQLITE_BUSY_TIMEOUT_MS", 300)
        db_mod.get_engine.cache_clear()
        t0 = time.monotonic()
        r = _in_process(_commands(f"sqlite:///{db}", tmp_path)["study resume"], tmp_path)
        assert time.monotonic() - t0 < 60
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        from tuner.storage import db as db_mod

        db_mod.get_engine.cache_clear()
    check_case(r, code=3, message=r"stayed locked by another process \(database is locked\)", db=db, before=before)
