"""The driver lease rows (``tuner_driver_leases``), read and written only here.

Each write is one statement whose effect says whether it won: an insert fails on the study's
primary key when a lease exists, and a take-over, a heartbeat or a release changes the row only
while it still carries the token the writer read (compare and swap). So two drivers racing for
one study cannot both hold it, on SQLite and PostgreSQL alike, without locks held across calls.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuner.storage.models import DriverLeaseRow

TABLE = DriverLeaseRow.__table__


def get(engine: Engine, study_name: str) -> DriverLeaseRow | None:
    with Session(engine, expire_on_commit=False) as s:
        return s.get(DriverLeaseRow, study_name)


def insert_in(conn: Connection | Session, study_name: str, fields: dict[str, Any]) -> None:
    """Insert the lease inside the caller's transaction (a new study takes it with its row)."""
    conn.execute(insert(TABLE).values(study_name=study_name, **fields))


def try_insert(engine: Engine, study_name: str, fields: dict[str, Any]) -> bool:
    """Take a free lease; False when a row exists (someone holds it, or a dead driver left it)."""
    try:
        with engine.begin() as conn:
            insert_in(conn, study_name, fields)
    except IntegrityError:
        return False
    return True


def take_over(engine: Engine, study_name: str, expected_token: str, fields: dict[str, Any]) -> bool:
    """Replace the holding ``expected_token`` by ours; False if it changed since it was read."""
    with engine.begin() as conn:
        result = conn.execute(update(TABLE).where(TABLE.c.study_name == study_name, TABLE.c.token == expected_token)
                              .values(**fields))
    return result.rowcount == 1


def beat(engine: Engine, study_name: str, token: str, processes: list[dict] | None = None) -> bool:
    """Renew our lease (and record the processes the driver started); False: it is not ours any more."""
    values: dict[str, Any] = {"heartbeat_at": time.time(), "heartbeat_count": TABLE.c.heartbeat_count + 1}
    if processes is not None:
        values["processes"] = processes
    with engine.begin() as conn:
        result = conn.execute(update(TABLE).where(TABLE.c.study_name == study_name, TABLE.c.token == token)
                              .values(**values))
    return result.rowcount == 1


def release(engine: Engine, study_name: str, token: str) -> bool:
    with engine.begin() as conn:
        result = conn.execute(delete(TABLE).where(TABLE.c.study_name == study_name, TABLE.c.token == token))
    return result.rowcount == 1


def all_leases(engine: Engine) -> list[DriverLeaseRow]:
    with Session(engine, expire_on_commit=False) as s:
        return list(s.scalars(select(DriverLeaseRow).order_by(DriverLeaseRow.study_name)))
