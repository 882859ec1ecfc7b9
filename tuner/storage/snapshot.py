"""Reading a committed study database without writing to it, whatever tuner schema it has.

Committed results (``results/*/*.db``) are evidence: benchmarks read them and must not change
them. A database at the current schema is opened read-only; an older one is copied (with its
WAL) into a temporary directory and the copy is upgraded, so the same reader code sees the
current tables and the committed file stays byte-identical.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy.engine import Engine

from tuner.errors import StorageError
from tuner.storage.db import get_engine, has_schema, schema_version, upgrade
from tuner.storage.models import SCHEMA_VERSION


@contextmanager
def read_snapshot(path: str | Path) -> Iterator[Engine | None]:
    """An engine on ``path`` at the current schema (None: the file has no tuner tables)."""
    path = Path(path)
    if not path.is_file():
        raise StorageError(f"no study database at {path}")
    engine = get_engine(f"sqlite:///{path}", create=False, readonly=True)
    if not has_schema(engine):
        yield None
        return
    version = schema_version(engine)
    if version is None or version >= SCHEMA_VERSION:
        yield engine  # a newer schema is refused by the readers' own queries, as elsewhere
        return
    with tempfile.TemporaryDirectory(prefix="tuner-snapshot-") as tmp:
        copy = Path(tmp) / path.name
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if src.exists():
                shutil.copyfile(src, copy.with_name(copy.name + suffix))
        writable = get_engine(f"sqlite:///{copy}", create=False)
        try:
            upgrade(writable)
            yield writable
        finally:
            writable.dispose()
            get_engine.cache_clear()  # the engine of a deleted temporary file must not be reused
