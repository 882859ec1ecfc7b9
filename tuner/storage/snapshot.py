"""Reading a study database without writing to it, whatever tuner schema it has.

Readers (`study status`, `list`, `export`, `report`, benchmarks over committed results) never
write: a database at the current schema is opened read-only; an older SQLite one is copied (with
its WAL) into a temporary directory and the copy is upgraded, so the same reader code sees the
current tables and the file itself stays byte-identical (committed results are evidence). Only
commands that write (`study start`, `resume`, `tuner db upgrade`, `tuner db predict`) upgrade a
database in place. An older database elsewhere than SQLite is refused with the command that
upgrades it; a newer one is always refused.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy.engine import Engine

from tuner.errors import StorageError
from tuner.storage.db import get_engine, has_schema, require_current, schema_version, sqlite_path, upgrade
from tuner.storage.models import SCHEMA_VERSION

SIDE_FILES = ("", "-wal", "-shm")  # an SQLite database in WAL mode is these three files


@contextmanager
def read_current(url: str) -> Iterator[Engine]:
    """An engine on the database of ``url`` at the current schema that never writes to it (a
    database without tuner's tables is yielded as it is: callers check ``has_schema``)."""
    engine = get_engine(url, create=False, readonly=True)
    version = schema_version(engine) if has_schema(engine) else None
    path = sqlite_path(url)
    older = version is not None and version < SCHEMA_VERSION
    if not older or path is None:
        require_current(engine, url, readonly=True)  # refuses a newer schema, or an older one off SQLite
        yield engine
        return
    with tempfile.TemporaryDirectory(prefix="tuner-snapshot-") as tmp:
        copy = Path(tmp) / path.name
        for suffix in SIDE_FILES:
            src = path.with_name(path.name + suffix)
            if src.exists():
                shutil.copyfile(src, copy.with_name(copy.name + suffix))
        # not through get_engine's cache: the temporary file is gone when the block ends
        writable = get_engine.__wrapped__(f"sqlite:///{copy}", create=False)
        try:
            upgrade(writable)
            yield writable
        finally:
            writable.dispose()


@contextmanager
def read_snapshot(path: str | Path) -> Iterator[Engine | None]:
    """An engine on the SQLite file ``path`` at the current schema (None: the file has no tuner
    tables), as ``read_current``."""
    path = Path(path)
    if not path.is_file():
        raise StorageError(f"no study database at {path}")
    with read_current(f"sqlite:///{path}") as engine:
        yield engine if has_schema(engine) else None
