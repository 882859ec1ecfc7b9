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

    Commands that write (study start, resume, db predict) upgrade an older one on their own.
    Readers (study status, list, export, report, the dashboard) never write: they read an older
    SQLite database through an upgraded temporary copy, and refuse an older PostgreSQL one with
    this command. A database of a newer tuner is refused.
    """
    from tuner.errors import StudyNotFoundError
    from tuner.storage import db as db_mod
    from tuner.storage.models import SCHEMA_VERSION

    db_mod.require_writable(storage)
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


@db.command()
@storage_option
@click.option("--study", "study_name", default=None, help="Only this study (default: every study).")
@click.option("--force", is_flag=True, help="Predict again load points that carry a prediction already.")
@json_option
def predict(storage, study_name, force, as_json):
    """Store the simulator's prediction beside every real load point that lacks one.

    Real trials store it as they measure; this fills it in for load points measured before
    that (same configuration, workload, users, window, seed and SGLang version), so `study
    report` and the dashboard show predicted against measured. Writes the database.
    """
    from tuner.errors import StudyNotFoundError
    from tuner.storage import db as db_mod
    from tuner.storage import repo
    from tuner.study.trust import backfill_predictions

    db_mod.require_writable(storage)
    engine = db_mod.get_engine(storage, create=False)
    if not db_mod.has_schema(engine):
        raise StudyNotFoundError(f"no tuner studies in {storage}")
    db_mod.require_current(engine, storage)
    if study_name is not None and repo.get_study(engine, study_name) is None:
        names = [s.name for s in repo.list_studies(engine)]
        raise StudyNotFoundError(f"no study {study_name!r} in {storage}; studies there: {', '.join(names) or 'none'}")
    counts = backfill_predictions(engine, study=study_name, force=force,
                                  progress=None if as_json else lambda s: click.echo(s, err=True))
    if as_json:
        emit_json({"storage": storage, **counts})
    else:
        click.echo(f"{counts['predicted']} load points predicted, {counts['unpredictable']} the simulator cannot "
                   f"predict (recorded with the reason), {counts['kept']} kept")
