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
