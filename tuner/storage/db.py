"""Engines for the study database: SQLite in WAL mode (readers never block the writer) or any
SQLAlchemy URL (PostgreSQL).

Every engine passes its database errors through ``tuner.storage.faults`` (a full disk, damaged
pages, a read-only or unreadable file become one clear ``StorageFaultError``). Readers never
write (``tuner.storage.snapshot.read_current``); writers check first that they can write
(``require_writable``) and that the file is sound (``require_sound``), so they refuse before
writing anything. Creating the schema is safe when several processes do it at once on a fresh
database.
"""

from __future__ import annotations

import atexit
import os
import random
import sqlite3
import time
import weakref
from functools import lru_cache
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import Session

from tuner.errors import StorageError, StorageFault, StorageFaultError
from tuner.storage import faults, migrations
from tuner.storage.models import SCHEMA_VERSION, Base, SchemaInfo

SQLITE_BUSY_TIMEOUT_MS = 30_000
SCHEMA_CREATE_ATTEMPTS = 8  # concurrent first starts: each retry finds more of the tables made


def _sqlite_pragmas(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    _use_wal(cur)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _use_wal(cur, *, timeout_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000, sleep=time.sleep) -> None:
    """Put the database in WAL mode (it stays so in the file). Switching takes a lock that SQLite
    may refuse at once, without its busy handler, while another process switches or creates the
    same new database (two first starts on one fresh file), so a refusal is retried until the
    busy timeout."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.005
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() >= deadline:
                raise
        sleep(delay_s + random.uniform(0, delay_s))
        delay_s = min(2 * delay_s, 0.2)


def _readonly_pragmas(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def parse_url(url: str):
    try:
        u = make_url(url)
    except ArgumentError:
        raise StorageError(f"invalid storage URL {url!r}; expected e.g. sqlite:///results/tuner.db "
                           "or postgresql://user@host/db") from None
    if u.get_backend_name() == "sqlite" and _in_memory(u):
        raise StorageError(f"storage {url!r} is an in-memory SQLite database: it would vanish when this command "
                           "ends, and Optuna's connections would each see an empty one of their own; give a file, "
                           "e.g. sqlite:///results/tuner.db")
    return u


def _in_memory(u) -> bool:
    database = u.database or ""
    return (not database or database == ":memory:" or database.startswith("file::memory:")
            or u.query.get("mode") == "memory")


def sqlalchemy_url(url: str) -> str:
    """``url`` with a driver SQLAlchemy can load here: plain ``postgresql://`` means psycopg 3
    (a dependency), not SQLAlchemy's default psycopg2. Used for our engine and Optuna's."""
    u = parse_url(url)
    if u.drivername in ("postgresql", "postgres"):
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (``sqlite:///PATH`` or the URI form
    ``sqlite:///file:PATH?mode=ro&uri=true``); None for other databases."""
    u = parse_url(url)
    if u.get_backend_name() != "sqlite":
        return None
    database = u.database
    if database.startswith("file:"):
        database = database[len("file:"):].split("?", 1)[0]
    return Path(database)


def readonly_requested(url: str) -> bool:
    """The URL itself asks for read-only access (SQLite ``?mode=ro``)."""
    u = parse_url(url)
    return u.get_backend_name() == "sqlite" and u.query.get("mode") == "ro"


def describe(url: str) -> str:
    """How messages name the database: its file, or its URL without the password."""
    path = sqlite_path(url)
    return str(path) if path is not None else parse_url(url).render_as_string(hide_password=True)


_WATCHED: "weakref.WeakSet[Engine]" = weakref.WeakSet()  # every engine on a study database
_SQLITE_FILES: set[Path] = set()  # the SQLite study databases this process committed to


def watch(engine: Engine, url: str, *, readonly: bool = False) -> Engine:
    """Translate ``engine``'s storage faults (also used for Optuna's engine on the same database);
    a writable SQLite engine's first commit also marks its file for the checkpoint at exit (a reader,
    the dashboard, never writes the file, not even then)."""
    path = sqlite_path(url)
    event.listen(engine, "handle_error", faults.translator(describe(url), path))
    _WATCHED.add(engine)
    if path is not None and not (readonly or readonly_requested(url)):
        event.listen(engine, "commit", lambda _conn: _SQLITE_FILES.add(path))
    return engine


@atexit.register
def dispose_engines() -> None:
    """Close every pooled connection before the interpreter goes, then fold each SQLite database's
    WAL into its file (``wal_checkpoint(TRUNCATE)``). SQLite does that itself only when the last
    connection closes, and a connection the interpreter never finalises leaves the end of the run in
    the ``-wal`` file alone: a copy of the ``.db`` (a backup, a committed result) would lack it."""
    for engine in list(_WATCHED):
        try:
            engine.dispose()
        except Exception:  # noqa: BLE001 - at exit nothing is left to report to
            pass
    for path in sorted(_SQLITE_FILES):
        try:
            if path.with_name(path.name + "-wal").exists():
                con = sqlite3.connect(path, timeout=1.0)
                try:
                    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    con.close()
        except Exception:  # noqa: BLE001 - a busy or vanished database keeps its WAL, which is still valid
            pass


@lru_cache(maxsize=16)
def get_engine(url: str, *, create: bool = True, readonly: bool = False) -> Engine:
    """An engine for ``url``. ``create=False`` refuses to create a missing SQLite file;
    ``readonly`` opens an SQLite file read-only (also when it lies on a read-only file system)."""
    u = parse_url(url)
    backend = u.get_backend_name()
    path = sqlite_path(url)
    readonly = readonly or readonly_requested(url)
    connect_url = url
    if path is not None:
        if not path.exists():
            if not create or readonly:
                raise StorageError(f"no study database at {path} (storage {url})")
            if not path.parent.exists():
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise faults.fault_error(faults.fault_of(exc) or StorageFault.IO, str(path), exc, path) from None
        elif not path.is_file():
            raise StorageError(f"{path} is not a file; the storage must name an SQLite study database")
        elif not os.access(path, os.R_OK):
            raise StorageFaultError(StorageFault.PERMISSION, faults.message(
                StorageFault.PERMISSION, str(path), "permission denied", path))
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
        if readonly:
            connect_url = _readonly_url(path)
    else:
        kwargs = {"pool_pre_ping": True}
        connect_url = sqlalchemy_url(url)
    try:
        engine = create_engine(connect_url, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StorageError(f"cannot use storage {describe(url)!r}: {exc}") from None
    watch(engine, url, readonly=readonly)
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas if not readonly else _readonly_pragmas)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except StorageFaultError:
        raise
    except (OperationalError, SQLAlchemyError) as exc:
        raise StorageError(f"cannot reach storage {describe(url)!r}: "
                           f"{str(exc.orig if hasattr(exc, 'orig') else exc).strip()}") from None
    return engine


def _readonly_url(path: Path) -> str:
    """Read-only SQLite. A WAL database needs its shared-memory file: where that cannot be made
    (a read-only directory or file system) and no writer has one open, the file cannot change
    under us, so SQLite may treat it as immutable."""
    resolved = path.resolve()
    shm = Path(f"{resolved}-shm")
    if not shm.exists() and not os.access(resolved.parent, os.W_OK):
        return f"sqlite:///file:{resolved}?mode=ro&immutable=1&uri=true"
    return f"sqlite:///file:{resolved}?mode=ro&uri=true"


def writable_problem(url: str) -> str | None:
    """Why a writer could not write the SQLite database of ``url`` (None: it can, or not SQLite)."""
    path = sqlite_path(url)
    if path is None:
        return None
    if readonly_requested(url):
        return "the storage URL opens it read-only (mode=ro)"
    target = path if path.exists() else path.parent
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return f"{target} is on a read-only file system"
    except OSError:
        pass
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file is not writable here: {faults.describe_access(path)}"
    directory = path.parent if path.parent.exists() else target
    if not os.access(directory, os.W_OK | os.X_OK):
        # SQLite writes its journal (-wal, -shm) beside the database
        return f"its directory is not writable here: {faults.describe_access(directory / path.name)}"
    return None


def require_writable(url: str) -> None:
    """Refuse, before writing anything, a database this process cannot write (StorageFaultError)."""
    path = sqlite_path(url)
    if path is not None and path.is_file() and not os.access(path, os.R_OK):
        raise StorageFaultError(StorageFault.PERMISSION, faults.message(
            StorageFault.PERMISSION, str(path), "permission denied", path))
    problem = writable_problem(url)
    if problem is not None:
        raise StorageFaultError(StorageFault.READ_ONLY, faults.message(
            StorageFault.READ_ONLY, describe(url), problem, sqlite_path(url)))


def reader_engine(url: str) -> Engine:
    """An engine for a driver's first reads, before it writes: read-write where this process may
    write (an older schema is then upgraded in place by ``require_current``), read-only where it
    may not (a read-only file, directory or file system, or ``mode=ro`` in the URL), so that the
    driver's own check refuses it with the reason (``require_writable``)."""
    path = sqlite_path(url)
    if path is not None and path.exists() and writable_problem(url) is not None:
        return get_engine(url, create=False, readonly=True)
    return get_engine(url, create=False)


def is_readonly(engine: Engine) -> bool:
    return "mode=ro" in str(engine.url)


def require_sound(engine: Engine) -> None:
    """SQLite's quick check before a driver writes: damaged pages are refused before any write
    (PostgreSQL checks its own pages)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        problems = [r[0] for r in conn.execute(text("PRAGMA quick_check(5)"))]
    if problems != ["ok"]:
        where = str(engine.url.database).removeprefix("file:").split("?")[0]
        lines = [ln.strip() for p in problems for ln in str(p).splitlines()
                 if ln.strip() and not ln.startswith("*** in database")]
        raise StorageFaultError(StorageFault.CORRUPT, faults.message(
            StorageFault.CORRUPT, where, "quick check: " + "; ".join(lines)[:500], Path(where)))


def ensure_schema(engine: Engine) -> None:
    """Create tuner's tables if absent and upgrade an older schema; refuse a newer one before
    touching anything. Several processes may do this at once on a fresh database."""
    version = schema_version(engine)
    if version is not None:
        _check_not_newer(version)
    for attempt in range(SCHEMA_CREATE_ATTEMPTS):
        try:
            # the version row first, the study tables after it: a reader that finds the study
            # tables (has_schema) also finds the version, even while another process creates them
            SchemaInfo.__table__.create(engine, checkfirst=True)
            with Session(engine) as s, s.begin():
                if s.get(SchemaInfo, 1) is None:
                    s.add(SchemaInfo(id=1, version=SCHEMA_VERSION if version is None else version))
            Base.metadata.create_all(engine)
            break
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            # another process created a table, an index or the version row between our check and
            # our write; the next attempt finds it
            if attempt == SCHEMA_CREATE_ATTEMPTS - 1 or not _created_meanwhile(exc):
                raise
            time.sleep(random.uniform(0.02, 0.2))
    version = schema_version(engine)
    _check_not_newer(version)
    if version < SCHEMA_VERSION:
        upgrade(engine)


def _created_meanwhile(exc: SQLAlchemyError) -> bool:
    text_ = str(getattr(exc, "orig", exc)).lower()
    return isinstance(exc, IntegrityError) or "already exists" in text_ or "duplicate" in text_


def schema_version(engine: Engine) -> int | None:
    """The version of tuner's tables (None: there are none)."""
    if not has_schema(engine):
        return None
    with engine.connect() as conn:
        version = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
    return 1 if version is None else int(version)


def upgrade(engine: Engine) -> list[int]:
    """Bring tuner's tables to SCHEMA_VERSION, in one transaction; returns the versions reached."""
    table = SchemaInfo.__table__
    with engine.begin() as conn:
        # a write first: it takes the database's write lock (SQLite) or the row's (PostgreSQL), so
        # two processes upgrading at once take turns and the second finds nothing left to do
        conn.execute(table.update().where(table.c.id == 1).values(version=table.c.version))
        current = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1).with_for_update()).scalar()
        if current is None:
            raise StorageError("the study database has no tuner schema version; it was not written by tuner")
        _check_not_newer(current)
        reached = migrations.upgrade(conn, int(current), SCHEMA_VERSION)
        conn.execute(table.update().where(table.c.id == 1).values(version=SCHEMA_VERSION))
    return reached


def require_current(engine: Engine, url: str, *, readonly: bool = False) -> None:
    """Upgrade an older schema in place, or (``readonly``, or an engine opened read-only) refuse
    it with the command that upgrades it; refuse a newer one."""
    version = schema_version(engine)
    if version is None or version == SCHEMA_VERSION:
        return
    _check_not_newer(version)
    if readonly or is_readonly(engine):
        raise StorageError(f"the study database {url} has tuner schema {version}; this tuner reads schema "
                           f"{SCHEMA_VERSION}. Upgrade it once with `tuner db upgrade --storage {url}`")
    upgrade(engine)


def _check_not_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StorageError(f"the study database was written by a newer tuner (schema {version} > "
                           f"{SCHEMA_VERSION}); upgrade tuner. Nothing was written to it")


CORE_TABLES = frozenset({"tuner_studies", "tuner_trials", "tuner_measurements"})  # in every schema version


def has_schema(engine: Engine) -> bool:
    """tuner's study tables are all there (a database another process is creating them in has none yet)."""
    return CORE_TABLES <= set(inspect(engine).get_table_names())
