"""Engines for the study database: SQLite in WAL mode (readers never block the writer) or any
SQLAlchemy URL (PostgreSQL)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from tuner.errors import StorageError
from tuner.storage import migrations
from tuner.storage.models import SCHEMA_VERSION, Base, SchemaInfo

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def parse_url(url: str):
    try:
        return make_url(url)
    except ArgumentError:
        raise StorageError(f"invalid storage URL {url!r}; expected e.g. sqlite:///results/tuner.db "
                           "or postgresql://user@host/db") from None


def sqlalchemy_url(url: str) -> str:
    """``url`` with a driver SQLAlchemy can load here: plain ``postgresql://`` means psycopg 3
    (a dependency), not SQLAlchemy's default psycopg2. Used for our engine and Optuna's."""
    u = parse_url(url)
    if u.drivername in ("postgresql", "postgres"):
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def sqlite_path(url: str) -> Path | None:
    u = parse_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


@lru_cache(maxsize=16)
def get_engine(url: str, *, create: bool = True, readonly: bool = False) -> Engine:
    """An engine for ``url``. ``create=False`` refuses to create a missing SQLite file."""
    u = parse_url(url)
    backend = u.get_backend_name()
    path = sqlite_path(url)
    if path is not None:
        if not path.exists():
            if not create:
                raise StorageError(f"no study database at {path} (storage {url})")
            if not path.parent.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
        if readonly:
            url = f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"
    else:
        kwargs = {"pool_pre_ping": True}
        url = sqlalchemy_url(url)
    try:
        engine = create_engine(url, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StorageError(f"cannot use storage {url!r}: {exc}") from None
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas if not readonly else _readonly_pragmas)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, SQLAlchemyError) as exc:
        raise StorageError(f"cannot reach storage {url!r}: {str(exc.orig if hasattr(exc, 'orig') else exc).strip()}") from None
    return engine


def _readonly_pragmas(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def ensure_schema(engine: Engine) -> None:
    """Create tuner's tables if absent and upgrade an older schema; refuse a newer one."""
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        row = s.get(SchemaInfo, 1)
        if row is None:
            s.add(SchemaInfo(id=1, version=SCHEMA_VERSION))
            s.commit()
            return
    _check_not_newer(row.version)
    if row.version < SCHEMA_VERSION:
        upgrade(engine)


def schema_version(engine: Engine) -> int | None:
    """The version of tuner's tables (None: there are none)."""
    if not has_schema(engine):
        return None
    with engine.connect() as conn:
        version = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
    return 1 if version is None else int(version)


def upgrade(engine: Engine) -> list[int]:
    """Bring tuner's tables to SCHEMA_VERSION, in one transaction; returns the versions reached."""
    with engine.begin() as conn:
        current = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1).with_for_update()).scalar()
        if current is None:
            raise StorageError("the study database has no tuner schema version; it was not written by tuner")
        _check_not_newer(current)
        reached = migrations.upgrade(conn, int(current), SCHEMA_VERSION)
        conn.execute(SchemaInfo.__table__.update().where(SchemaInfo.id == 1).values(version=SCHEMA_VERSION))
    return reached


def require_current(engine: Engine, url: str, *, readonly: bool = False) -> None:
    """For readers of an existing database: upgrade an older schema in place, or (read-only)
    refuse it with the command that upgrades it; refuse a newer one."""
    version = schema_version(engine)
    if version is None or version == SCHEMA_VERSION:
        return
    _check_not_newer(version)
    if readonly:
        raise StorageError(f"the study database {url} has tuner schema {version}; this tuner reads schema "
                           f"{SCHEMA_VERSION}. Upgrade it once with `tuner db upgrade --storage {url}`")
    upgrade(engine)


def _check_not_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StorageError(f"the study database was written by a newer tuner (schema {version} > "
                           f"{SCHEMA_VERSION}); upgrade tuner")


def has_schema(engine: Engine) -> bool:
    return inspect(engine).has_table("tuner_studies")
