"""Storage faults in words: what a failed read or write of the study database means for the user.

Every engine tuner opens (ours and Optuna's) passes its database errors through ``translate``
(SQLAlchemy's ``handle_error`` event), so a full disk, damaged pages, a read-only or unreadable
file and a lock held too long each become a ``StorageFaultError`` (exit code 3) that names the
database and what to do, wherever in tuner the query ran. Errors that are not faults of the
storage (a bad statement, a constraint) pass through unchanged.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

from tuner.errors import StorageFault, StorageFaultError

# SQLite's primary result codes (https://sqlite.org/rescode.html)
_SQLITE = {
    13: StorageFault.DISK_FULL,  # SQLITE_FULL
    11: StorageFault.CORRUPT,  # SQLITE_CORRUPT
    26: StorageFault.NOT_A_DATABASE,  # SQLITE_NOTADB
    8: StorageFault.READ_ONLY,  # SQLITE_READONLY
    3: StorageFault.PERMISSION,  # SQLITE_PERM
    23: StorageFault.PERMISSION,  # SQLITE_AUTH
    14: StorageFault.PERMISSION,  # SQLITE_CANTOPEN (refined below: a missing directory, a read-only one)
    5: StorageFault.LOCKED,  # SQLITE_BUSY
    6: StorageFault.LOCKED,  # SQLITE_LOCKED
    10: StorageFault.IO,  # SQLITE_IOERR (refined below: a full disk shows as one too)
}
# PostgreSQL SQLSTATEs
_SQLSTATE = {
    "53100": StorageFault.DISK_FULL,  # disk_full
    "XX001": StorageFault.CORRUPT,  # data_corrupted
    "XX002": StorageFault.CORRUPT,  # index_corrupted
    "25006": StorageFault.READ_ONLY,  # read_only_sql_transaction
    "42501": StorageFault.PERMISSION,  # insufficient_privilege
    "55P03": StorageFault.LOCKED,  # lock_not_available
    "58030": StorageFault.IO,  # io_error
}
_ERRNO = {
    errno.ENOSPC: StorageFault.DISK_FULL,
    errno.EDQUOT: StorageFault.DISK_FULL,
    errno.EROFS: StorageFault.READ_ONLY,
    errno.EACCES: StorageFault.PERMISSION,
    errno.EPERM: StorageFault.PERMISSION,
    errno.EIO: StorageFault.IO,
}


def fault_of(exc: BaseException, path: Path | None = None) -> StorageFault | None:
    """The storage fault ``exc`` (a DBAPI exception, or an OSError raised under one) shows, or None."""
    if isinstance(exc, OSError) and exc.errno in _ERRNO:
        return _ERRNO[exc.errno]
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str):
        if sqlstate in _SQLSTATE:
            return _SQLSTATE[sqlstate]
        if sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"):
            return StorageFault.IO  # the connection was lost, or the server is shutting down or restarting
        return None
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        fault = _SQLITE.get(code & 0xFF) if isinstance(code, int) else _from_sqlite_text(str(exc))
        if fault in (StorageFault.IO, StorageFault.PERMISSION) and path is not None:
            fault = _refine(fault, path)
        return fault
    return None


def _from_sqlite_text(text: str) -> StorageFault | None:
    """Older Pythons carry no result code: the messages SQLite gives for them."""
    text = text.lower()
    for needle, fault in (("disk is full", StorageFault.DISK_FULL), ("malformed", StorageFault.CORRUPT),
                          ("not a database", StorageFault.NOT_A_DATABASE), ("readonly database", StorageFault.READ_ONLY),
                          ("unable to open", StorageFault.PERMISSION), ("database is locked", StorageFault.LOCKED),
                          ("disk i/o error", StorageFault.IO)):
        if needle in text:
            return fault
    return None


def _refine(fault: StorageFault, path: Path) -> StorageFault:
    """An I/O error on a file system with no space left is a full disk; a file that cannot be
    opened on a read-only file system is read-only, not forbidden."""
    try:
        vfs = os.statvfs(path.parent if path.parent.exists() else ".")
    except OSError:
        return fault
    if vfs.f_flag & os.ST_RDONLY:
        return StorageFault.READ_ONLY
    if fault is StorageFault.IO and vfs.f_bavail == 0:
        return StorageFault.DISK_FULL
    return fault


def describe_access(path: Path) -> str:
    """Owner and mode of ``path`` and its directory, for a permission message."""
    parts = []
    for p in (path, path.parent):
        try:
            st = p.stat()
        except OSError:
            continue
        parts.append(f"{p}: {stat.filemode(st.st_mode)}, owner uid {st.st_uid}")
    return "; ".join(parts) + f"; tuner runs as uid {os.geteuid()}"


def message(fault: StorageFault, where: str, detail: str, path: Path | None = None) -> str:
    """What the user reads: the database, what happened, what to do."""
    if fault is StorageFault.DISK_FULL:
        return (f"the disk holding the study database {where} is full ({detail}); free some space, then run the "
                f"command again (a stopped study continues with `tuner study resume NAME`)")
    if fault is StorageFault.NOT_A_DATABASE:
        return (f"{where} is not a study database ({detail}): it is not an SQLite file, or its first page is "
                f"damaged; the storage must name an SQLite study database, e.g. sqlite:///results/tuner.db")
    if fault is StorageFault.CORRUPT:
        salvage = f"; salvage what is readable with `sqlite3 {path} .recover | sqlite3 recovered.db`" if path else ""
        return f"the study database {where} is damaged ({detail}); restore it from a copy{salvage}"
    if fault is StorageFault.READ_ONLY:
        return (f"the study database {where} cannot be written ({detail}); `tuner study status`, `list`, "
                f"`export` and the dashboard read it as it is, `start` and `resume` need a writable copy")
    if fault is StorageFault.PERMISSION:
        access = f" ({describe_access(path)})" if path is not None else ""
        return f"cannot open the study database {where}: {detail}{access}"
    if fault is StorageFault.LOCKED:
        return (f"the study database {where} stayed locked by another process ({detail}); run the command again "
                f"when that process is done")
    return f"the study database {where} could not be read or written ({detail})"


def fault_error(fault: StorageFault, where: str, exc: BaseException, path: Path | None = None) -> StorageFaultError:
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    return StorageFaultError(fault, message(fault, where, detail, path))


def translator(where: str, path: Path | None):
    """A ``handle_error`` listener for one engine: raises a ``StorageFaultError`` for a fault."""

    def translate(context) -> None:
        exc = context.original_exception
        fault = fault_of(exc, path)
        if fault is not None:
            raise fault_error(fault, where, exc, path) from exc

    return translate
