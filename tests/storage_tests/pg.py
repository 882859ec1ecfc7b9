"""A PostgreSQL database of its own for a test, on the server tests/run.sh starts
(``TUNER_TEST_POSTGRES_URL``); tests that need one skip without it."""

from __future__ import annotations

import os
import uuid

import pytest

from tuner.storage import db

PG_URL = os.environ.get("TUNER_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="TUNER_TEST_POSTGRES_URL is not set (tests/run.sh starts a "
                                                 "PostgreSQL server on loopback and sets it)")


def fresh_pg_database():
    """(url of a new empty database, drop function)."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(PG_URL)
    name = f"tuner_{uuid.uuid4().hex[:12]}"
    conninfo = dict(host=admin.host, port=admin.port or 5432, user=admin.username, password=admin.password,
                    dbname=admin.database)
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        db.get_engine.cache_clear()
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return admin.set(database=name).render_as_string(hide_password=False), drop
