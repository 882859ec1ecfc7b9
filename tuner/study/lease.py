"""One driver per study, known for sure: the driver lease.

A driver (``study start`` or ``resume``) holds its study's row in ``tuner_driver_leases`` from
before its first write to after its last (tuner.storage.leases takes it atomically). The row says
which process holds it -- host, boot, PID namespace, PID, process start time, command line -- and
a heartbeat thread renews it every ``HEARTBEAT_INTERVAL_S``, recording the processes the driver
has started (its local Ray's raylet, GCS server, agents and workers, and trial servers).

A second driver for the same study finds the row and decides:

* **same host, holder alive** (its PID runs with the recorded start time): refused at once, with
  who holds it (``DriverBusyError``, exit 4);
* **same host, holder provably dead** (PID gone, the PID now another process, or the host booted
  since): taken over at once; the runner reaps what the dead driver left, by recorded identity;
* **another host**: its processes cannot be checked from here, so the lease is taken over only
  once its heartbeat has expired: not renewed for ``LEASE_TTL_S`` as seen from here, or older than
  that by the holder's clock and not renewed for a few heartbeats more. A heartbeat that moves
  while we watch means the holder is alive: refused.

A driver whose lease was taken over (its heartbeat stalled past the TTL and another host took the
study) learns it at its next heartbeat (``lost``) and stops without writing anything more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from sqlalchemy.engine import Engine

import tuner
from tuner.backends.process import boot_id, descendants, identify, pid_alive, pid_namespace, pid_start_ticks
from tuner.errors import DriverBusyError, StorageError
from tuner.storage import leases
from tuner.storage.models import DriverLeaseRow

log = logging.getLogger(__name__)

# A lease not renewed for this long belongs to a dead driver (another host may take it over).
# TUNER_LEASE_TTL_S changes it, e.g. for tests of a driver on another host.
LEASE_TTL_S = max(1.0, float(os.environ.get("TUNER_LEASE_TTL_S", "30")))
HEARTBEAT_INTERVAL_S = max(0.2, LEASE_TTL_S / 6)
CONFIRM_BEATS = 3  # a heartbeat already past the TTL by its holder's clock must stay still this many beats
# The driver's processes are looked at this often (one /proc scan) and written when they changed,
# so a process started a moment before a kill -9 is still known to the resume; while Ray starts
# (raylet, GCS server, agents appear within seconds) more often.
PROCESS_SCAN_S = 1.0
PROCESS_SCAN_CLOSELY_S = 0.1


@dataclass(frozen=True)
class DriverIdentity:
    """Which process a driver is, and where: enough to prove later that it is gone."""

    host: str
    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: int
    cmdline: str

    @classmethod
    def current(cls) -> "DriverIdentity":
        me = identify(os.getpid())
        return cls(socket.gethostname(), boot_id(), pid_namespace(), os.getpid(),
                   me.start_ticks if me else 0, me.cmdline if me else "")

    @classmethod
    def of(cls, row: DriverLeaseRow) -> "DriverIdentity":
        return cls(row.host, row.boot_id, row.pid_namespace, int(row.pid), int(row.pid_start_ticks), row.cmdline)

    def same_host(self, other: "DriverIdentity") -> bool:
        return self.host == other.host

    def checkable_from(self, here: "DriverIdentity") -> bool:
        """Its PID means something here: same host, same boot, same PID namespace."""
        return self.same_host(here) and self.boot_id == here.boot_id and self.pid_namespace == here.pid_namespace

    def death_here(self, here: "DriverIdentity") -> str | None:
        """Why this driver is provably dead, seen from ``here`` on the same host (None: it may live)."""
        if not self.same_host(here):
            return None
        if self.boot_id and here.boot_id and self.boot_id != here.boot_id:
            return f"host {self.host} has booted since"
        if not self.checkable_from(here):
            return None
        if not pid_alive(self.pid):
            return f"its process (PID {self.pid}) is gone"
        if pid_start_ticks(self.pid) != self.start_ticks:
            return f"PID {self.pid} is another process now"
        return None


@dataclass(frozen=True)
class Acquired:
    """How the lease was taken: ``previous`` is the dead driver's row it replaced (None: it was free)."""

    previous: DriverLeaseRow | None = None
    why: str = ""  # why the previous holder counts as dead


def _age(row: DriverLeaseRow) -> float:
    return max(0.0, time.time() - float(row.heartbeat_at))


def holder_text(row: DriverLeaseRow) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(row.acquired_at)))
    return (f"`tuner study {row.command}` PID {row.pid} on host {row.host} (since {started}, last heartbeat "
            f"{_age(row):.0f} s ago)")


class DriverLease:
    """This process's claim on one study. ``acquire`` (or a new study's creation, which inserts
    ``fields()`` with the study row) takes it; ``start_heartbeat`` renews it; ``release`` ends it."""

    def __init__(self, engine: Engine, study_name: str, *, command: str, ttl_s: float | None = None):
        self.engine = engine
        self.study_name = study_name
        self.command = command
        self.ttl_s = LEASE_TTL_S if ttl_s is None else ttl_s
        self.interval_s = max(0.2, self.ttl_s / 6)
        self.token = uuid.uuid4().hex
        self.identity = DriverIdentity.current()
        self.held = False
        self.lost = threading.Event()  # set when another driver took the study over
        self._last_beat = 0.0
        self._processes: dict[tuple[int, int], dict] = {}
        self._recorded: set[tuple[int, int]] = set()  # the process set last written
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closely = 0
        self._failing = False
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- taking it
    def fields(self) -> dict:
        """The row's values for this holding."""
        me, now = self.identity, time.time()
        return {"token": self.token, "command": self.command, "host": me.host, "boot_id": me.boot_id,
                "pid_namespace": me.pid_namespace, "pid": me.pid, "pid_start_ticks": me.start_ticks,
                "cmdline": me.cmdline[:4000], "tuner_version": tuner.__version__, "acquired_at": now,
                "heartbeat_at": now, "heartbeat_count": 0, "processes": []}

    def created(self) -> None:
        """The lease went in with the study's own row (tuner.storage.repo.create_study)."""
        self.held = True

    def acquire(self, *, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Acquired:
        """Take the study's lease: free, or left by a dead driver. Raises DriverBusyError while a
        live driver holds it (for a holder on another host: after waiting for its heartbeat to
        expire, unless ``wait`` is false)."""
        watched: tuple[str, int] | None = None  # (token, beats) first seen of a holder on another host
        watched_since = 0.0
        told = False
        while True:
            row = leases.get(self.engine, self.study_name)
            if row is None:
                if leases.try_insert(self.engine, self.study_name, self.fields()):
                    self.held = True
                    return Acquired()
                continue  # another driver inserted it between our read and our write
            holder = DriverIdentity.of(row)
            if row.token == self.token:
                self.held = True
                return Acquired()
            why = holder.death_here(self.identity)
            if why is not None:
                if leases.take_over(self.engine, self.study_name, row.token, self.fields()):
                    self.held = True
                    return Acquired(row, why)
                continue  # someone else took it over first: look again (it is alive now)
            if holder.checkable_from(self.identity):
                raise DriverBusyError(f"study {self.study_name!r} is being run by {holder_text(row)}; stop it "
                                      f"first (`kill -TERM {row.pid}` stops its servers and records its running "
                                      f"trials as interrupted) or wait for it to finish")
            # another host (or container): only its heartbeat can tell
            now = time.monotonic()
            seen = (row.token, int(row.heartbeat_count))
            if watched is None:
                watched, watched_since = seen, now
            elif seen != watched:
                raise DriverBusyError(f"study {self.study_name!r} is being run by {holder_text(row)}, and its "
                                      f"heartbeat is live; stop it on {row.host} first or wait for it to finish")
            observed = now - watched_since
            if observed >= self.ttl_s or (_age(row) >= self.ttl_s and observed >= CONFIRM_BEATS * self.interval_s):
                if leases.take_over(self.engine, self.study_name, row.token, self.fields()):
                    self.held = True
                    return Acquired(row, f"its heartbeat stopped {_age(row):.0f} s ago (more than the lease's "
                                         f"{self.ttl_s:g} s)")
                watched = None
                continue
            if not wait:
                raise DriverBusyError(f"study {self.study_name!r} is held by {holder_text(row)}; a driver on "
                                      f"another host is taken over once its heartbeat is {self.ttl_s:g} s old")
            if not told and on_wait is not None:
                left = max(self.ttl_s - observed, CONFIRM_BEATS * self.interval_s - observed)
                on_wait(f"study {self.study_name!r} is held by {holder_text(row)}; that host cannot be checked "
                        f"from here, so waiting up to {left:.0f} s for its heartbeat to expire")
                told = True
            time.sleep(self.interval_s / 2)

    # ---------------------------------------------------------------- holding it
    def processes(self) -> list[dict]:
        """Identities of the processes this driver started that still live: its descendants now,
        and those recorded earlier that left its tree (a re-parented daemon)."""
        live = {}
        for key, ident in self._processes.items():
            if pid_start_ticks(key[0]) == key[1]:
                live[key] = ident
        for pid in descendants(os.getpid()):
            ident = identify(pid)
            if ident is not None:
                live[(ident.pid, ident.start_ticks)] = ident.to_dict()
        self._processes = live
        return sorted(live.values(), key=lambda d: d["pid"])

    def beat(self) -> bool:
        """Renew the lease now, with the processes the driver started; False (and ``lost`` set)
        when it is not ours any more."""
        if not self.held:
            return False
        processes = self.processes()
        if not leases.beat(self.engine, self.study_name, self.token, processes):
            self.held = False
            self.lost.set()
            log.error("the lease of study %s was taken over by another driver", self.study_name)
            return False
        self._recorded = {(p["pid"], p["start_ticks"]) for p in processes}
        self._last_beat = time.monotonic()
        return True

    def start_heartbeat(self) -> None:
        if self._thread is not None or not self.held:
            return
        self._stop.clear()
        self._last_beat = time.monotonic()
        self._thread = threading.Thread(target=self._beat_loop, name=f"lease-{self.study_name}", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching_closely(self):
        """Within the block (Ray starting), new processes are recorded within a tenth of a second."""
        self._closely += 1
        self._wake.set()
        try:
            yield
        finally:
            self._closely -= 1

    def _beat_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(PROCESS_SCAN_CLOSELY_S if self._closely else min(PROCESS_SCAN_S, self.interval_s))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                due = time.monotonic() - self._last_beat >= self.interval_s
                if due or {(p["pid"], p["start_ticks"]) for p in self.processes()} != self._recorded:
                    if not self.beat():
                        return
                self._failing = False
            except Exception as exc:  # the database is unreachable or full: try again next beat
                if not self._failing:  # said once per run of failures, not every beat
                    log.warning("lease heartbeat of study %s failed: %s", self.study_name, exc)
                self._failing = True

    def stop_heartbeat(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def release(self) -> None:
        """Give the study up (idempotent). A failure leaves the row for the next driver to take
        over: its holder (this process) will be dead by then."""
        self.stop_heartbeat()
        if not self.held:
            return
        self.held = False
        try:
            leases.release(self.engine, self.study_name, self.token)
        except StorageError as exc:
            log.warning("could not release the lease of study %s (%s); the next driver takes it over",
                        self.study_name, exc)
