"""Writing a user-named output file (exports, fitted workloads, reports, session logs) safely.

- The target must be a regular file or not exist yet: a directory, a device (``/dev/null``), a
  FIFO or a socket is refused, and so is a symbolic link (it is never followed).
- The text goes to a temporary file created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``) in
  the target's directory, so a file or link planted at a guessable temporary name is never
  written through; it is flushed to disk and renamed over the target in one step. A reader sees
  the old file or the new one, never half of one; on any error the target is left as it was and
  the temporary file is removed.
- Every problem (no permission, a read-only or full disk, a missing directory that cannot be
  created) is a ConfigError, exit 2, naming the file.

:func:`check_target` runs the same checks without writing the target (it creates and removes one
temporary file beside it, to be sure the directory takes new files), so a command can refuse a
bad path before it does any work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator

from tuner.errors import ConfigError

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError(f"cannot write here: {why}", file=str(path))


def check_target(target: str | os.PathLike, *, probe: bool = True) -> Path:
    """The target as a Path, after checking it can be replaced by a regular file; ConfigError if not.
    ``probe`` also creates (and removes) a temporary file beside it: permissions alone do not show a
    place that refuses new files (``/proc``, a read-only mount seen by root)."""
    path = Path(target)
    if not path.name or str(target).endswith(os.sep):
        raise _refuse(path, "the output must name a file, not a directory")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # a parent is a file: named below
    except OSError as exc:
        raise _refuse(path, exc.strerror or str(exc)) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        extra = " (links are not followed; name the file it points to)" if stat.S_ISLNK(st.st_mode) else ""
        raise _refuse(path, f"it is {kind}{extra}; the output must be a regular file")
    # the nearest existing directory above it must be a directory we may write in
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent  # directories that do not exist yet are created
    if probe.is_symlink() and not probe.exists():
        raise _refuse(path, f"{probe} is a dangling symbolic link")
    if not probe.is_dir():
        raise _refuse(path, f"{probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _refuse(path, f"permission denied: cannot create files in {probe}")
    if st is not None and not os.access(path, os.W_OK) and os.geteuid() != 0:
        raise _refuse(path, "permission denied: the file is read-only")
    if probe and os.path.isdir(parent):  # (a directory still to be made is probed by the write)
        _probe_create(path, parent)
    return path


def _probe_create(path: Path, parent: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    candidate = parent / f".{path.name}.{secrets.token_hex(6)}.probe"
    try:
        fd = os.open(candidate, flags, 0o600)
    except FileExistsError:
        return  # a planted name; the write picks its own
    except OSError as exc:
        raise _refuse(path, f"cannot create a file in {parent}: {exc.strerror or exc}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(candidate)


@contextlib.contextmanager
def atomic_open(target: str | os.PathLike, *, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """``with atomic_open(path) as f: f.write(...)``: the target appears, whole, when the block
    ends without an error; otherwise nothing changes."""
    path = check_target(target)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(path, f"cannot create {parent}: {exc.strerror or exc}") from None
    old = None
    with contextlib.suppress(FileNotFoundError):
        old = os.lstat(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    tmp = fd = None
    for _ in range(16):
        candidate = parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(candidate, flags, 0o666)
            tmp = candidate
            break
        except FileExistsError:
            continue  # someone holds that name (or planted it): pick another, never reuse it
        except OSError as exc:
            raise _refuse(path, f"cannot create a file in {parent}: {exc.strerror or exc}") from None
    if tmp is None:
        raise _refuse(path, f"cannot create a temporary file in {parent}")
    try:
        if old is not None:
            os.fchmod(fd, stat.S_IMODE(old.st_mode))  # keep the permissions of the file replaced
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            fd = None
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_target(path, probe=False)  # still a regular file (or absent) just before the rename
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(parent)
    except OSError as exc:
        why = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise _refuse(path, why) from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_text(target: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``target`` atomically (see the module docstring); returns the path."""
    with atomic_open(target, encoding=encoding) as f:
        f.write(text)
    return Path(target)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
