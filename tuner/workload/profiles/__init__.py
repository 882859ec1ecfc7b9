"""Workload profiles: YAML files holding the fields of :class:`WorkloadProfile`.

``load_profile("coding-agent")`` looks for ``NAME.yaml`` in ``workloads/`` of the current
directory, then of the repository, then among the profiles shipped with tuner (this package).
A path to a YAML file works too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from tuner import safeyaml
from tuner.errors import ConfigError
from tuner.workload.session import WorkloadProfile
from tuner import limits

BUILTIN_DIR = Path(__file__).resolve().parent
REPO_WORKLOADS_DIR = BUILTIN_DIR.parents[2] / "workloads"


def default_search_dirs() -> tuple[Path, ...]:
    return (Path.cwd() / "workloads", REPO_WORKLOADS_DIR, BUILTIN_DIR)


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def available_profiles(search_dirs=None) -> list[str]:
    dirs = default_search_dirs() if search_dirs is None else tuple(Path(d) for d in search_dirs)
    names = set()
    for d in dirs:
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def resolve_profile_path(name_or_path: str | os.PathLike, search_dirs=None) -> Path:
    s = str(name_or_path)
    p = Path(s)
    if p.suffix in (".yaml", ".yml") or os.sep in s or "/" in s:
        if not p.exists():  # a directory or device is refused with its kind when read
            raise ConfigError("workload profile file not found", file=s)
        return p
    dirs = default_search_dirs() if search_dirs is None else tuple(Path(d) for d in search_dirs)
    for d in dirs:
        for ext in (".yaml", ".yml"):
            cand = d / f"{s}{ext}"
            if cand.is_file():
                return cand
    names = available_profiles(dirs)
    raise ConfigError(
        f"unknown workload profile {s!r}; available: {', '.join(names) or '(none)'} "
        "(or give a path to a YAML file)",
        key="workload",
    )


def profile_from_dict(data, *, source: str = "<workload>") -> WorkloadProfile:
    """Validate a mapping as a WorkloadProfile; errors name the source and the key path."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of WorkloadProfile fields, got {type(data).__name__}", file=source)
    try:
        return WorkloadProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(part) for part in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if "input" in err and not isinstance(err["input"], (dict, list)):
            msg += f" (got {err['input']!r:.80})"
        if err["type"] == "extra_forbidden":
            valid = ", ".join(WorkloadProfile.model_fields)
            msg = f"unknown key; valid keys: {valid}"
        more = f" (and {exc.error_count() - 1} more error(s))" if exc.error_count() > 1 else ""
        raise ConfigError(f"{msg}{more}", file=source, key=key) from None


def load_profile(name_or_path: str | os.PathLike, search_dirs=None) -> WorkloadProfile:
    path = resolve_profile_path(name_or_path, search_dirs)
    data = safeyaml.load_file(path)  # size, nesting, aliases and duplicate keys bounded
    if data is None:
        raise ConfigError("file is empty", file=str(path))
    return profile_from_dict(data, source=str(path))


def profile_name(name: str | None, output: os.PathLike | None) -> str:
    """The name of a fitted profile: ``name`` (checked), else the output file's stem made into a
    name (other characters become '-'), else 'fitted'."""

    if name is not None:
        problem = limits.name_problem(name)
        if problem:
            raise ConfigError(f"invalid profile name {name!r:.80}: {problem}; a name has {limits.NAME_RULE}",
                              key="--name")
        return name
    if output is None:
        return "fitted"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(output).stem).strip("-._")
    stem = re.sub(r"\.{2,}", ".", stem)[: limits.MAX_NAME_CHARS].rstrip("-._")
    return stem if limits.name_problem(stem) is None else "fitted"


def dump_profile(profile: WorkloadProfile, header: str = "") -> str:
    """YAML text of ``profile`` (optionally after ``#`` comment lines), loadable by load_profile."""
    data = profile.model_dump(exclude_none=True)
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    lines = "".join(f"# {ln}\n" if ln else "#\n" for ln in header.splitlines())
    return lines + body
