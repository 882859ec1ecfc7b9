"""The driver lease on SQLite and PostgreSQL: taken atomically, refused while its holder lives,
taken over at once from a holder provably dead on this host, after heartbeat expiry from another
host, and never by two drivers at once. Holders are real processes (a live ``sleep``, a finished
one, this test process) or rows written as a driver on another host would write them."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.storage_tests.pg import fresh_pg_database, needs_pg
from tuner.backends.process import identify
from tuner.errors import DriverBusyError
from tuner.storage import db, leases
from tuner.study.lease import DriverIdentity, DriverLease

TTL_S = 1.0  # interval 0.2 s: a beat every 0.2 s, expiry after 1 s


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def engine(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/tuner.db"
        e = db.get_engine(url)
        db.ensure_schema(e)
        yield e
        return
    url, drop = fresh_pg_database()
    try:
        e = db.get_engine(url)
        db.ensure_schema(e)
        yield e
    finally:
        e.dispose()
        drop()


def _lease(engine, name="s"):
    return DriverLease(engine, name, command="resume", ttl_s=TTL_S)


def _row_as(engine, name: str, *, pid: int, ticks: int, host: str | None = None, boot: str | None = None,
            age_s: float = 0.0, count: int = 0) -> None:
    """A lease row as another driver would have written it."""
    me = DriverIdentity.current()
    now = time.time()
    leases.try_insert(engine, name, {
        "token": f"other-{pid}-{ticks}", "command": "start", "host": host or me.host, "boot_id": boot or me.boot_id,
        "pid_namespace": me.pid_namespace, "pid": pid, "pid_start_ticks": ticks, "cmdline": "python -m tuner study start",
        "tuner_version": "0.1.0", "acquired_at": now - age_s, "heartbeat_at": now - age_s, "heartbeat_count": count,
        "processes": []})


def _snapshot(engine, name="s"):
    row = leases.get(engine, name)
    return None if row is None else (row.token, row.pid, row.heartbeat_count, row.heartbeat_at)


def test_a_free_lease_is_taken_and_records_who_holds_it(engine):
    lease = _lease(engine)
    got = lease.acquire(wait=False)
    assert got.previous is None and lease.held
    row = leases.get(engine, "s")
    me = identify(os.getpid())
    assert (row.pid, row.pid_start_ticks, row.host) == (os.getpid(), me.start_ticks, DriverIdentity.current().host)
    assert row.boot_id and row.pid_namespace and "python" in row.cmdline and row.token == lease.token
    assert lease.beat() and leases.get(engine, "s").heartbeat_count == 1
    lease.release()
    assert leases.get(engine, "s") is None and not lease.held


def test_a_live_driver_on_this_host_is_refused_with_who_holds_it(engine):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        ident = identify(sleeper.pid)
        _row_as(engine, "s", pid=sleeper.pid, ticks=ident.start_ticks)
        before = _snapshot(engine)
        t0 = time.monotonic()
        with pytest.raises(DriverBusyError) as info:
            _lease(engine).acquire(wait=True)
        assert time.monotonic() - t0 < 1.0, "refused at once, not after waiting"
        assert info.value.exit_code == 4
        msg = str(info.value)
        assert f"PID {sleeper.pid} on host {DriverIdentity.current().host}" in msg and "kill -TERM" in msg
        assert _snapshot(engine) == before, "the refused driver wrote nothing"
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("how", ["pid gone", "pid reused", "host rebooted"])
def test_a_dead_driver_on_this_host_is_taken_over_at_once(engine, how):
    if how == "pid gone":
        done = subprocess.Popen(["true"])
        done.wait()
        pid, ticks, boot = done.pid, 12345, None
    elif how == "pid reused":  # a live process with that PID, started at another time: not the driver
        pid, ticks, boot = os.getpid(), identify(os.getpid()).start_ticks - 1, None
    else:
        pid, ticks, boot = os.getpid(), identify(os.getpid()).start_ticks, "another-boot"
    _row_as(engine, "s", pid=pid, ticks=ticks, boot=boot, age_s=0.0)  # a fresh heartbeat: no waiting anyway
    lease = _lease(engine)
    t0 = time.monotonic()
    got = lease.acquire(wait=True)
    assert time.monotonic() - t0 < 1.0
    assert got.previous is not None and got.previous.pid == pid
    assert {"pid gone": "is gone", "pid reused": "another process now", "host rebooted": "booted since"}[how] in got.why
    assert leases.get(engine, "s").token == lease.token
    lease.release()


def test_another_host_with_an_old_heartbeat_is_taken_over_after_watching_it_stand_still(engine):
    _row_as(engine, "s", pid=1, ticks=1, host="elsewhere", age_s=60)
    lease = _lease(engine)
    t0 = time.monotonic()
    got = lease.acquire(wait=True)
    waited = time.monotonic() - t0
    assert 0.5 <= waited < TTL_S + 1.0, waited  # a few beats of watching, not the whole TTL
    assert got.previous.host == "elsewhere" and "heartbeat stopped" in got.why
    lease.release()


def test_another_host_with_a_fresh_heartbeat_that_stopped_is_waited_for_then_taken_over(engine):
    _row_as(engine, "s", pid=1, ticks=1, host="elsewhere", age_s=0)
    told = []
    lease = _lease(engine)
    t0 = time.monotonic()
    got = lease.acquire(wait=True, on_wait=told.append)
    waited = time.monotonic() - t0
    assert TTL_S <= waited < TTL_S + 1.5, waited
    assert got.previous.host == "elsewhere"
    assert len(told) == 1 and "waiting up to" in told[0] and "elsewhere" in told[0]
    lease.release()


def test_another_host_without_waiting_is_refused_and_nothing_changes(engine):
    _row_as(engine, "s", pid=1, ticks=1, host="elsewhere", age_s=0)
    before = _snapshot(engine)
    with pytest.raises(DriverBusyError, match="held by `tuner study start` PID 1 on host elsewhere"):
        _lease(engine).acquire(wait=False)
    assert _snapshot(engine) == before


def test_another_host_whose_heartbeat_moves_is_refused(engine):
    _row_as(engine, "s", pid=1, ticks=1, host="elsewhere", age_s=0)
    token = leases.get(engine, "s").token
    stop = threading.Event()

    def beating():  # the other host's driver, alive
        while not stop.wait(0.1):
            leases.beat(engine, "s", token)

    t = threading.Thread(target=beating)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(DriverBusyError, match="its heartbeat is live"):
            _lease(engine).acquire(wait=True)
        assert time.monotonic() - t0 < TTL_S
    finally:
        stop.set()
        t.join()
    assert leases.get(engine, "s").token == token


def test_many_drivers_racing_for_a_free_lease_one_wins(engine):
    """Eight acquirers at once (threads of this process: each sees the winner alive)."""
    barrier = threading.Barrier(8)

    def race(_):
        lease = _lease(engine)
        barrier.wait()
        try:
            lease.acquire(wait=False)
            return lease
        except DriverBusyError:
            return None

    with ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(race, range(8)) if w is not None]
    assert len(winners) == 1
    assert leases.get(engine, "s").token == winners[0].token
    winners[0].release()


def test_many_drivers_racing_to_take_over_a_dead_one_one_wins(engine):
    done = subprocess.Popen(["true"])
    done.wait()
    _row_as(engine, "s", pid=done.pid, ticks=1)
    barrier = threading.Barrier(6)

    def race(_):
        lease = _lease(engine)
        barrier.wait()
        try:
            got = lease.acquire(wait=False)
            return lease, got
        except DriverBusyError:
            return None

    with ThreadPoolExecutor(6) as pool:
        winners = [w for w in pool.map(race, range(6)) if w is not None]
    assert len(winners) == 1 and winners[0][1].previous.pid == done.pid
    winners[0][0].release()


def test_a_driver_whose_lease_was_taken_over_learns_it_at_its_next_beat(engine):
    mine = _lease(engine)
    mine.acquire(wait=False)
    row = leases.get(engine, "s")
    assert leases.take_over(engine, "s", row.token, {**_lease(engine).fields(), "host": "elsewhere"})
    assert not mine.beat() and mine.lost.is_set() and not mine.held
    mine.release()  # releases nothing: the lease is the other driver's
    assert leases.get(engine, "s").host == "elsewhere"


def test_the_heartbeat_thread_renews_the_lease_and_records_child_processes(engine):
    lease = _lease(engine)
    lease.acquire(wait=False)
    child = subprocess.Popen(["sleep", "30"])
    try:
        lease.start_heartbeat()
        time.sleep(4 * lease.interval_s)
        row = leases.get(engine, "s")
        assert row.heartbeat_count >= 2
        recorded = {(p["pid"], p["start_ticks"]) for p in row.processes}
        assert (child.pid, identify(child.pid).start_ticks) in recorded
    finally:
        lease.release()
        child.kill()
        child.wait()
    assert leases.get(engine, "s") is None


def test_release_removes_only_its_own_holding(engine):
    a = _lease(engine)
    a.acquire(wait=False)
    assert not leases.release(engine, "s", "someone-else") and leases.get(engine, "s") is not None
    a.release()
    assert leases.get(engine, "s") is None


class _PgError(Exception):
    def __init__(self, sqlstate):
        self.sqlstate = sqlstate


@pytest.mark.parametrize("exc,fault", [
    (_PgError("53100"), "disk_full"), (_PgError("XX001"), "corrupt"), (_PgError("25006"), "read_only"),
    (_PgError("42501"), "permission"), (_PgError("55P03"), "locked"), (_PgError("08006"), "io"),
    (_PgError("57P01"), "io"), (_PgError("23505"), None), (OSError(28, "No space left on device"), "disk_full"),
    (OSError(30, "Read-only file system"), "read_only"), (OSError(13, "Permission denied"), "permission"),
    (OSError(2, "No such file"), None), (ValueError("not a database error"), None),
])
def test_database_errors_are_named_as_the_storage_faults_they_are(exc, fault):
    """PostgreSQL SQLSTATEs and the OSErrors under SQLite, as tuner.storage.faults reads them
    (SQLite's own result codes are met for real in test_storage_faults)."""
    from tuner.storage.faults import fault_of

    assert fault_of(exc) == fault
