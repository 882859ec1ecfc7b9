"""`tuner db upgrade`: bring a study database's tuner tables to this tuner's schema."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option, storage_option


@click.group()
def db():
    """The study database."""


@db.command()
@storage_option
@json_option
def upgrade(storage, as_json):
    """Upgrade the tuner tables of the study database to this tuner's schema, in one transaction.

    Commands that open the database read-write (study start, resume, status, list, export)
    upgrade an older one on their own; the read-only ones (dashboard, study report) refuse it and
    name this command. A database of a newer tuner is refused.
    """
    from tuner.errors import StudyNotFoundError
    from tuner.storage import db as db_mod
    from tuner.storage.models import SCHEMA_VERSION

    engine = db_mod.get_engine(storage, create=False)
    before = db_mod.schema_version(engine)
    if before is None:
        raise StudyNotFoundError(f"no tuner studies in {storage}")
    reached = db_mod.upgrade(engine) if before != SCHEMA_VERSION else []  # refuses a newer schema
    if as_json:
        emit_json({"storage": storage, "from_version": before, "to_version": SCHEMA_VERSION, "steps": reached})
    elif reached:
        click.echo(f"upgraded {storage} from schema {before} to {SCHEMA_VERSION}")
    else:
        click.echo(f"{storage} is at schema {SCHEMA_VERSION} already")
