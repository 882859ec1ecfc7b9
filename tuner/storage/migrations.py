"""Upgrades of tuner's own tables, one step per schema version, applied in order by
``tuner.storage.db.ensure_schema`` inside one transaction (Optuna upgrades its own tables).

Each step works on SQLite and PostgreSQL: columns are added with plain ``ALTER TABLE`` and rows
are rewritten through SQLAlchemy Core, so no dialect-specific JSON functions are needed.
"""

from __future__ import annotations

from typing import Callable

from sqlalchemy import Connection, inspect, text

from tuner.storage.models import DriverLeaseRow, TrialRow

PLANNER_REASON_PREFIX_V1 = "planner: "  # how schema 1 marked a configuration the planner screened out


def _v1_to_v2(conn: Connection) -> None:
    """``launched`` and ``screened_by_planner`` become columns (schema 1 had them in the telemetry
    and as a prefix of the reason); the telemetry key goes, the readable reason stays."""
    present = {c["name"] for c in inspect(conn).get_columns("tuner_trials")}  # a step cut short is redone
    for column, default in (("launched", "TRUE"), ("screened_by_planner", "FALSE")):
        if column not in present:
            conn.execute(text(f"ALTER TABLE tuner_trials ADD COLUMN {column} BOOLEAN NOT NULL DEFAULT {default}"))
    table = TrialRow.__table__
    rows = conn.execute(table.select().with_only_columns(table.c.id, table.c.telemetry, table.c.failure_reason))
    for row_id, telemetry, reason in rows.all():
        telemetry = dict(telemetry or {})
        if not telemetry.pop("not_launched", False):
            continue
        conn.execute(table.update().where(table.c.id == row_id).values(
            launched=False, telemetry=telemetry,
            screened_by_planner=(reason or "").startswith(PLANNER_REASON_PREFIX_V1)))


def _v2_to_v3(conn: Connection) -> None:
    """The driver lease table. Schema 2 had none: a study without a row has no driver (a driver of
    an older tuner still running is found by its trials' heartbeats, tuner.study.runner)."""
    DriverLeaseRow.__table__.create(conn, checkfirst=True)


# from-version -> the step that upgrades it to from-version + 1
STEPS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3}


def upgrade(conn: Connection, from_version: int, to_version: int) -> list[int]:
    """Apply every step from ``from_version`` to ``to_version``; returns the versions reached."""
    reached = []
    for version in range(from_version, to_version):
        STEPS[version](conn)
        reached.append(version + 1)
    return reached
