"""Disk space kept free for a driver's last writes.

When the disk holding an SQLite study database fills, every write fails, including the ones that
record a clean stop (the running trial interrupted, the study stopped, the lease released). So a
driver holds a small file of allocated blocks beside the database, ``<db>-reserve-<study>``, for
as long as it runs, and deletes it the moment a write fails for lack of space: its last writes
then have room. It is deleted when the driver ends; one a killed driver left is reused by the
next driver of the same study. PostgreSQL manages its own disk: no reserve there.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

RESERVE_BYTES = 2 * 1024 * 1024  # a few hundred WAL frames: far more than a clean stop writes


class SpaceReserve:
    def __init__(self, db_path: Path, study_name: str, size_bytes: int = RESERVE_BYTES):
        self.path = db_path.with_name(f"{db_path.name}-reserve-{study_name}")
        self.size_bytes = size_bytes
        self.held = False

    def keep(self) -> bool:
        """Allocate the reserve (reusing one left behind); False, with a warning, where the disk
        has no room for it or the directory cannot be written (the study runs without it)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        except OSError:
            return False
        if st is not None and not stat.S_ISREG(st.st_mode):
            log.warning("%s is not a regular file; running without a disk-space reserve", self.path)
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            log.warning("cannot create %s (%s); running without a disk-space reserve", self.path, exc.strerror)
            return False
        try:
            os.posix_fallocate(fd, 0, self.size_bytes)
        except OSError as exc:
            os.close(fd)
            self.free(force=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                log.warning("less than %d MiB free beside the study database; running without a disk-space "
                            "reserve", self.size_bytes // (1024 * 1024))
            return False
        os.close(fd)
        self.held = True
        return True

    def free(self, *, force: bool = False) -> bool:
        """Give the space back (the disk is full, or the driver ends); True if a file was removed."""
        if not (self.held or force):
            return False
        self.held = False
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot remove %s: %s", self.path, exc.strerror)
            return False
