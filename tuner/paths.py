"""Paths tuner writes to, checked to lie inside the directory they belong to. No tuner imports
beyond tuner.errors.

Study names are identifiers (tuner.limits), so ``<runs>/<study>/trial-NNNN`` cannot climb out of
the run directory by its text; this check also covers what text cannot show: a trial directory,
or one of its parents below the root, that is a symbolic link to somewhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner.errors import UserError


def user_path(name: str | os.PathLike) -> Path:
    """``name`` as a path, a leading ``~`` or ``~user`` expanded where that home exists; as written
    where it does not (``Path.expanduser`` raises for an unknown user, ``~0``): it then names no
    directory, and the caller's own check says so."""
    try:
        return Path(name).expanduser()
    except RuntimeError:
        return Path(name)


class PathOutsideError(UserError):
    """A path tuner was about to write lies outside the directory it must stay in."""

    exit_code = 2


def inside(root: str | os.PathLike, *parts: str) -> Path:
    """``root/parts...`` as an absolute, resolved path, after checking that it lies inside
    ``root`` (itself resolved: the run directory may be a link to a larger disk)."""
    base = Path(os.path.abspath(root)).resolve()
    for part in parts:
        text = str(part)
        if not text or "\x00" in text or os.path.isabs(text) or any(p == ".." for p in Path(text).parts):
            raise PathOutsideError(f"refusing to use {text!r} as a path below {base}: it is empty, absolute, "
                                   "or climbs out with '..'")
    target = base.joinpath(*map(str, parts)).resolve()
    if target != base and not target.is_relative_to(base):
        raise PathOutsideError(f"refusing to write to {target}: it lies outside {base} "
                               f"(a symbolic link under {base} points elsewhere)")
    return target


def trial_dir(runs_dir: str | os.PathLike, study: str, trial_number: int) -> Path:
    """``<runs_dir>/<study>/trial-NNNN``: a trial's config files, server logs and PID files."""
    return inside(runs_dir, study, f"trial-{trial_number:04d}")
