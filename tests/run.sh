#!/usr/bin/env bash
# Install tuner with its test dependencies and run the test suite (everything except GPU tests).
# Also starts a throw-away PostgreSQL server on loopback for the storage tests
# (TUNER_TEST_POSTGRES_URL); without PostgreSQL (and not root to install it) those tests skip.
# The tests run in parallel worker processes (pytest-xdist), TUNER_TEST_WORKERS of them (default 2);
# each test file stays in one worker (--dist loadfile), so a module's shared fixture (a Ray cluster,
# a finished study) is built once. TUNER_TEST_WORKERS=0 (or the argument -n 0) runs them in this process.
# Usage: bash tests/run.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q --disable-pip-version-check -e '.[test]'
# Many tests start `python -m tuner` processes: compile tuner (and the tests' helper modules) once
# here, so that none of them compiles it again where PYTHONDONTWRITEBYTECODE is set
python -m compileall -q tuner tests

PG_DIR=""
PG_AS=""
PG_BIN=""
stop_postgres() {
    if [ -n "$PG_DIR" ] && [ -f "$PG_DIR/data/postmaster.pid" ]; then
        $PG_AS "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "$PG_DIR" ]; then rm -rf "$PG_DIR"; fi
}

start_postgres() {
    if [ -n "${TUNER_TEST_POSTGRES_URL:-}" ]; then
        echo "PostgreSQL: using TUNER_TEST_POSTGRES_URL=$TUNER_TEST_POSTGRES_URL"
        return 0
    fi
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$PG_BIN" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "PostgreSQL: installing (apt-get install postgresql)"
            (apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 ||
             (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1)) || true
            PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
        fi
        if [ -z "$PG_BIN" ]; then
            echo "PostgreSQL: not installed and cannot install it here; PostgreSQL storage tests will skip"
            return 0
        fi
    fi
    # initdb refuses to run as root: run the server as the postgres user then
    PG_AS=""
    if [ "$(id -u)" = 0 ]; then
        if ! id postgres >/dev/null 2>&1; then
            echo "PostgreSQL: running as root without a postgres user; PostgreSQL storage tests will skip"
            return 0
        fi
        PG_AS="runuser -u postgres --"
    fi
    PG_DIR=$(mktemp -d /tmp/tuner-pg.XXXXXX)
    if [ -n "$PG_AS" ]; then chown postgres "$PG_DIR"; fi
    local port
    port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if $PG_AS "$PG_BIN/initdb" -D "$PG_DIR/data" -U tuner --auth=trust -E UTF8 >"$PG_DIR/initdb.log" 2>&1 &&
       $PG_AS "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
           -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null &&
       "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U tuner tuner_test; then
        export TUNER_TEST_POSTGRES_URL="postgresql://tuner@127.0.0.1:$port/tuner_test"
        echo "PostgreSQL: started on 127.0.0.1:$port ($TUNER_TEST_POSTGRES_URL)"
    else
        echo "PostgreSQL: could not start a server (see below); PostgreSQL storage tests will skip"
        cat "$PG_DIR"/*.log 2>/dev/null | tail -n 20 || true
        stop_postgres
        PG_DIR=""
    fi
}

trap stop_postgres EXIT
start_postgres

rc=0
python -m pytest -m "not gpu" -q -n "${TUNER_TEST_WORKERS:-2}" --dist loadfile "$@" || rc=$?
exit $rc
