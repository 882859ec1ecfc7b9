"""Helpers shared by CLI commands: JSON output, storage option."""

from __future__ import annotations

import json
import sys

import click

DEFAULT_STORAGE = "sqlite:///results/tuner.db"

storage_option = click.option(
    "--storage",
    default=DEFAULT_STORAGE,
    show_default=True,
    envvar="TUNER_STORAGE",
    help="SQLAlchemy URL of the study database (sqlite:///path or postgresql://...).",
)

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")


def emit_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _default(obj):
    import dataclasses

    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def profiles_option(fn):
    """``--profiles DIR`` (repeatable): more operator-profile folders for the simulator."""
    return click.option(
        "--profiles", "profile_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
        help="Also read measured operator profiles (tuner profile run) from this folder, e.g. "
             "results/profiles/h200/tables; repeatable. The simulator takes an operator's time from a "
             "profile wherever one covers its shape, else from its roofline.")(fn)


def use_profile_dirs(dirs) -> None:
    """Make ``--profiles`` folders visible to every simulation of this process."""
    import os

    from tuner.sim.optable import PROFILE_DIRS_ENV

    if dirs:
        old = [d for d in os.environ.get(PROFILE_DIRS_ENV, "").split(os.pathsep) if d]
        os.environ[PROFILE_DIRS_ENV] = os.pathsep.join([*old, *(str(d) for d in dirs)])
