"""Lifecycle of one server process: start, wait until ready, watch, classify failures, stop.

Shared by every process backend (SGLang server, sglang_router, ``transformers serve``).

* The server is started from an argv list (never a shell string) in its own session/process group
  (``start_new_session=True``), with stdout and stderr appended to a per-process log file.
* Readiness is an HTTP GET on one or more paths polled until each answers 200, while the process is
  watched: an exit before ready is ``exit_at_start`` (or ``oom`` / ``port_in_use`` from the log),
  no answer within the startup timeout is ``startup_timeout``.
* ``stop()`` sends SIGTERM to the process group and to every descendant seen, waits, then SIGKILL,
  and verifies that no PID is left. It is idempotent.
* ``reap_pids`` kills processes of an earlier, interrupted run **by recorded PID**, after checking
  that each PID still belongs to the process that was started (start time, command line and/or a
  token in its environment), so an unrelated process that reused the PID or shares the name is
  never touched.

Linux only (reads ``/proc``), like the servers it starts.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tuner.errors import TrialError

log = logging.getLogger(__name__)

#: environment variable carrying a per-launch token; reap_pids can match on it
TOKEN_ENV = "TUNER_PROCESS_TOKEN"
#: beside each server log: identities of the server's processes (written at start, for reaping)
PID_FILE_SUFFIX = ".pids.json"

# Log patterns, checked in this order: the first class that matches wins.
_OOM_PATTERNS = (
    r"CUDA out of memory",
    r"torch\.OutOfMemoryError",
    r"torch\.cuda\.OutOfMemoryError",
    r"OutOfMemoryError",
    r"Not enough memory",
    r"CUBLAS_STATUS_ALLOC_FAILED",
    r"cudaErrorMemoryAllocation",
    r"out of memory",
)
_PORT_PATTERNS = (
    r"Address already in use",
    r"address already in use",
    r"\[Errno 98\]",
    r"port \d+ is (?:already )?in use",
    r"Port \d+ is (?:already )?in use",
    r"is already in use",
)
_OOM_RE = re.compile("|".join(_OOM_PATTERNS))
_PORT_RE = re.compile("|".join(_PORT_PATTERNS))


def classify_log(text: str) -> str | None:
    """Failure class the log text proves (``oom``, ``port_in_use``), or None."""
    if _OOM_RE.search(text):
        return "oom"
    if _PORT_RE.search(text):
        return "port_in_use"
    return None


# --------------------------------------------------------------------------------------------
# ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a listening socket could bind ``host:port`` now (no SO_REUSEADDR games)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1", *, avoid: Iterable[int] = ()) -> int:
    """A port the kernel reports free on ``host`` (racy by nature: the caller binds it soon)."""
    avoid = set(avoid)
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port
    raise RuntimeError("could not find a free port")


# --------------------------------------------------------------------------------------------
# /proc helpers


@dataclass(frozen=True)
class ProcessIdentity:
    """Enough to recognise a PID later: start time (clock ticks since boot) and command line."""

    pid: int
    start_ticks: int
    cmdline: str

    def to_dict(self) -> dict:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "cmdline": self.cmdline}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ProcessIdentity":
        return cls(int(d["pid"]), int(d["start_ticks"]), str(d.get("cmdline", "")))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest  # rest[0] = state (field 3), rest[1] = ppid, rest[2] = pgrp, rest[19] = starttime


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def pid_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def pid_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _pid_environ_has(pid: int, key: str, value: str) -> bool:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{key}={value}".encode() in raw.split(b"\0")


def identify(pid: int) -> ProcessIdentity | None:
    ticks = pid_start_ticks(pid)
    cmd = pid_cmdline(pid)
    if ticks is None or cmd is None:
        return None
    return ProcessIdentity(pid, ticks, cmd)


def _all_stats() -> dict[int, list[str]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                out[int(entry)] = fields
    return out


def descendants(root: int, *, pgid: int | None = None) -> set[int]:
    """Live PIDs below ``root`` in the process tree, plus members of process group ``pgid``."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, f in stats.items():
        children.setdefault(int(f[1]), []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    if pgid is not None:
        found |= {pid for pid, f in stats.items() if int(f[2]) == pgid}
    found.discard(root)
    return {p for p in found if stats.get(p, ["Z"])[0] not in ("Z", "X")}


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group_and(leader: int, pids: Iterable[int], sig: int) -> None:
    """``sig`` to the leader's process group and to each of ``pids`` (some may have left the group)."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        _kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    pending = set(pids)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = {p for p in pending if pid_alive(p)}
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return pending


def boot_id() -> str:
    """This boot of this host (a process recorded under another boot id is gone)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """The PID namespace this process sees (PIDs of another namespace, e.g. another container on
    the same host, mean nothing here)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def reap_pids(
    pids: Iterable[int | ProcessIdentity | Mapping],
    expected_cmdline_substring: str | None = None,
    *,
    token: str | None = None,
    grace_s: float = 10.0,
    tree: bool = False,
) -> dict[int, str]:
    """Kill leftover processes of an interrupted run, each only if it is still ours.

    A PID counts as ours when every check given holds: the recorded start time (when ``pids`` holds
    ``ProcessIdentity`` records or their dicts) matches, the command line contains
    ``expected_cmdline_substring``, and the process environment holds ``TUNER_PROCESS_TOKEN=token``.
    With no check at all nothing is killed (a bare PID proves nothing). With ``tree``, the live
    descendants of a process proven ours (and its process group, if it leads one) go with it:
    children it started after the identities were recorded. Returns ``{pid: outcome}`` with
    outcome one of ``gone``, ``not_ours``, ``killed``, ``survived``.
    """
    outcome: dict[int, str] = {}
    targets: list[int] = []
    for item in pids:
        ident = ProcessIdentity.from_dict(item) if isinstance(item, Mapping) else item
        pid = ident.pid if isinstance(ident, ProcessIdentity) else int(ident)
        if not pid_alive(pid):
            outcome[pid] = "gone"
            continue
        checks = []
        if isinstance(ident, ProcessIdentity):
            checks.append(pid_start_ticks(pid) == ident.start_ticks)
        if expected_cmdline_substring is not None:
            checks.append(expected_cmdline_substring in (pid_cmdline(pid) or ""))
        if token is not None:
            checks.append(_pid_environ_has(pid, TOKEN_ENV, token))
        if not checks or not all(checks) or pid == os.getpid():
            outcome[pid] = "not_ours"
            continue
        targets.append(pid)
    if tree:
        me = os.getpid()
        below = set()
        for pid in targets:
            fields = _stat_fields(pid)
            below |= descendants(pid, pgid=pid if fields is not None and int(fields[2]) == pid else None)
        targets += sorted(below - set(targets) - {me})
    for pid in targets:
        _kill(pid, signal.SIGTERM)
    left = _wait_gone(targets, grace_s)
    for pid in left:
        _kill(pid, signal.SIGKILL)
    left = _wait_gone(left, 5.0)
    for pid in targets:
        outcome[pid] = "survived" if pid in left else "killed"
    if outcome:
        log.info("reaped recorded processes: %s", outcome)
    return outcome


# --------------------------------------------------------------------------------------------
# one server process


@dataclass
class ServerLaunch:
    """How to start one server and how to tell it is ready.

    ``env`` is merged over the current environment (``None`` values remove a variable).
    ``ready_paths`` are polled in order; each must answer HTTP 200.
    """

    name: str  # short role name: "sglang", "router", "transformers"
    argv: Sequence[str]
    port: int
    log_path: str
    host: str = "127.0.0.1"
    env: Mapping[str, str | None] = field(default_factory=dict)
    ready_paths: Sequence[str] = ("/health",)
    startup_timeout_s: float = 600.0
    ready_poll_interval_s: float = 0.5
    ready_request_timeout_s: float = 30.0
    cwd: str | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class ServerProcess:
    """One started server. Use ``start()``, ``wait_ready()``, ``check_alive()``, ``stop()``."""

    def __init__(self, spec: ServerLaunch):
        if isinstance(spec.argv, str) or not spec.argv:
            raise ValueError("argv must be a non-empty list of strings")
        self.spec = spec
        self.token = os.urandom(8).hex()
        self.proc: subprocess.Popen | None = None
        self.identities: dict[int, ProcessIdentity] = {}
        self.ready = False
        self.stopped = False
        self.ready_after_s: float | None = None
        self._started_at: float | None = None
        self._log_file = None

    # ---- identity ------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def log_path(self) -> str:
        return self.spec.log_path

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def pids(self) -> tuple[int, ...]:
        """Every PID seen for this server (leader first), for recording and reaping."""
        if self.proc is None:
            return ()
        rest = sorted(p for p in self.identities if p != self.proc.pid)
        return (self.proc.pid, *rest)

    def snapshot_pids(self) -> tuple[int, ...]:
        """Refresh the set of known PIDs from the live process tree; cheap (one /proc scan)."""
        if self.proc is None:
            return ()
        live = {self.proc.pid} | descendants(self.proc.pid, pgid=self.proc.pid)
        for pid in live:
            if pid not in self.identities:
                ident = identify(pid)
                if ident is not None:
                    self.identities[pid] = ident
        return self.pids

    # ---- start ---------------------------------------------------------------------------
    def start(self) -> "ServerProcess":
        if self.proc is not None:
            raise RuntimeError(f"{self.spec.name} already started")
        spec = self.spec
        if not port_is_free(spec.port, spec.host):
            raise TrialError(
                "port_in_use",
                f"{spec.name}: port {spec.host}:{spec.port} is already taken before start",
                log_path=spec.log_path,
            )
        env = dict(os.environ)
        for key, value in spec.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        env[TOKEN_ENV] = self.token
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(spec.log_path, "ab", buffering=0)
        self._log_file.write(f"# tuner: starting {spec.name}: {' '.join(map(str, spec.argv))}\n".encode())
        try:
            self.proc = subprocess.Popen(
                [str(a) for a in spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,  # own process group: stop() signals the whole tree
                close_fds=True,
            )
        except OSError as exc:
            self._close_log()
            raise TrialError("exit_at_start", f"{spec.name}: cannot execute {spec.argv[0]!r}: {exc}",
                             log_path=spec.log_path) from exc
        self._started_at = time.monotonic()
        self.snapshot_pids()
        self.write_pid_file()
        log.info("started %s pid=%d port=%d log=%s", spec.name, self.proc.pid, spec.port, spec.log_path)
        return self

    @property
    def pid_file(self) -> Path:
        return Path(self.spec.log_path).with_suffix(PID_FILE_SUFFIX)

    def write_pid_file(self) -> None:
        """Identities of this server's processes beside its log, from the moment it starts: a
        driver killed before the deployment is recorded leaves them for the resume to reap."""
        try:
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(json.dumps([i.to_dict() for i in self.identities.values()]))
            os.replace(tmp, self.pid_file)
        except OSError:
            log.warning("cannot write %s", self.pid_file)

    # ---- readiness -----------------------------------------------------------------------
    def _probe(self, path: str) -> tuple[bool, str]:
        url = self.base_url + path
        try:
            with urllib.request.urlopen(url, timeout=self.spec.ready_request_timeout_s) as resp:
                return resp.status == 200, f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return False, f"{type(reason).__name__}: {reason}"

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Poll the ready paths until each answers 200; return the seconds it took.

        Raises TrialError: ``exit_at_start`` / ``oom`` / ``port_in_use`` if the process exits
        first, ``startup_timeout`` (or ``oom`` if the log shows it) when the deadline passes.
        """
        if self.proc is None:
            raise RuntimeError("wait_ready() before start()")
        timeout_s = self.spec.startup_timeout_s if timeout_s is None else timeout_s
        deadline = self._started_at + timeout_s
        pending = list(self.spec.ready_paths)
        last = "no answer yet"
        scans = 0
        while True:
            self._raise_if_exited(phase="startup")
            while pending:
                ok, last = self._probe(pending[0])
                if not ok:
                    break
                pending.pop(0)
            if not pending:
                self._raise_if_exited(phase="startup")  # answered, then died: still a failure
                self.ready = True
                self.ready_after_s = time.monotonic() - self._started_at
                self.snapshot_pids()
                self.write_pid_file()
                log.info("%s ready after %.1f s", self.spec.name, self.ready_after_s)
                return self.ready_after_s
            if time.monotonic() >= deadline:
                tail = self.log_tail()
                cls = "oom" if classify_log(tail) == "oom" else "startup_timeout"
                raise TrialError(
                    cls,
                    f"{self.spec.name} not ready after {timeout_s:.0f} s "
                    f"(GET {pending[0]}: {last}){_last_line(tail)}",
                    log_path=self.log_path,
                )
            scans += 1
            if scans % 10 == 0:
                self.snapshot_pids()
            time.sleep(min(self.spec.ready_poll_interval_s, max(0.0, deadline - time.monotonic())))

    # ---- watching ------------------------------------------------------------------------
    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self, phase: str = "run") -> None:
        """Raise TrialError (``crash`` or ``oom``) if the process has exited."""
        self._raise_if_exited(phase=phase)

    def failure_for_exit(self, phase: str) -> TrialError:
        """The TrialError describing why the (exited) process died in ``phase``."""
        code = self.proc.poll() if self.proc else None
        tail = self.log_tail()
        from_log = classify_log(tail)
        if from_log == "oom":
            cls = "oom"
        elif from_log == "port_in_use" and phase == "startup":
            cls = "port_in_use"
        else:
            cls = "exit_at_start" if phase == "startup" else "crash"
        return TrialError(
            cls,
            f"{self.spec.name} exited with {_describe_code(code)} during {phase}{_last_line(tail)}",
            log_path=self.log_path,
        )

    def _raise_if_exited(self, phase: str) -> None:
        if self.proc is not None and self.proc.poll() is not None and not self.stopped:
            raise self.failure_for_exit(phase)

    def log_tail(self, max_bytes: int = 64_000) -> str:
        try:
            with open(self.spec.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # ---- stop ----------------------------------------------------------------------------
    def stop(self, grace_s: float = 15.0) -> set[int]:
        """SIGTERM the group and every known descendant, wait, SIGKILL, verify. Idempotent.

        Returns the PIDs that survived SIGKILL (normally empty; e.g. stuck in uninterruptible
        sleep in the driver), which the caller should report.
        """
        if self.proc is None or self.stopped:
            return set()
        self.stopped = True
        self.snapshot_pids()
        leader = self.proc.pid
        tracked = {p for p, ident in self.identities.items() if pid_start_ticks(p) == ident.start_ticks}
        tracked.add(leader)
        _signal_group_and(leader, tracked, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # descendants that outlived the leader (or left the group) get the same treatment
        tracked |= {p for p in descendants(leader, pgid=leader)}
        left = _wait_gone(tracked - {leader}, max(0.5, grace_s / 3))
        if self.proc.poll() is None:
            left.add(leader)
        if left:
            log.warning("%s: SIGKILL to %s after %.0f s", self.spec.name, sorted(left), grace_s)
            _signal_group_and(leader, left, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        survivors = _wait_gone(tracked | descendants(leader, pgid=leader), 5.0)
        if survivors:
            log.error("%s: processes %s survived SIGKILL", self.spec.name, sorted(survivors))
        self._close_log()
        return survivors

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            finally:
                self._log_file = None

    def __del__(self):  # last resort; normal teardown is explicit
        try:
            if self.proc is not None and not self.stopped and self.proc.poll() is None:
                self.stop(grace_s=2.0)
        except Exception:
            pass


class ProcessStack:
    """Several servers started in order (workers, then a router) and stopped in reverse order."""

    def __init__(self) -> None:
        self.servers: list[ServerProcess] = []
        self.closed = False

    def start(self, spec: ServerLaunch, *, wait: bool = True) -> ServerProcess:
        server = ServerProcess(spec)
        self.servers.append(server)
        server.start()
        if wait:
            server.wait_ready()
        return server

    def check_alive(self, phase: str = "run") -> None:
        for server in self.servers:
            server.check_alive(phase)

    def dead(self) -> list[ServerProcess]:
        return [s for s in self.servers if s.proc is not None and s.poll() is not None and not s.stopped]

    @property
    def pids(self) -> tuple[int, ...]:
        out: list[int] = []
        for server in self.servers:
            out.extend(p for p in server.snapshot_pids() if p not in out)
        return tuple(out)

    def identities(self) -> list[dict]:
        return [ident.to_dict() for s in self.servers for ident in s.identities.values()]

    def close(self, grace_s: float = 15.0) -> set[int]:
        """Stop every server, last started first. Safe to call twice."""
        if self.closed:
            return set()
        self.closed = True
        survivors: set[int] = set()
        for server in reversed(self.servers):
            try:
                survivors |= server.stop(grace_s=grace_s)
            except Exception:  # one failing stop must not leave the others running
                log.exception("stopping %s failed", server.spec.name)
        return survivors


def _describe_code(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _last_line(tail: str) -> str:
    """The most telling log line, for the one-line failure reason."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip() and not ln.startswith("# tuner:")]
    if not lines:
        return ""
    for ln in reversed(lines):
        if classify_log(ln) or "Error" in ln or "error" in ln:
            return f": {ln[:300]}"
    return f": {lines[-1][:300]}"
