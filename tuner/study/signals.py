"""SIGTERM and SIGHUP stop a driver the way Ctrl-C does.

``stopping_on_signals()`` makes SIGINT, SIGTERM and SIGHUP raise ``StopSignal`` (a
``KeyboardInterrupt``) in the main thread, so every signal takes the one clean-up path Ctrl-C
takes: the servers stop, the running trials are recorded as interrupted, the study as stopped,
the lease is released, and the command exits with 128 + the signal's number (130 for Ctrl-C,
143 for SIGTERM, 129 for SIGHUP). The first signal starts that clean-up; later ones while it runs
are noted and ignored, so a second Ctrl-C or a service manager's repeated SIGTERM cannot leave a
trial half-recorded, and the first waits for a database write in progress to end (``deferred()``,
around the ledger's writes). ``kill -9`` still ends the process at once, and resume recovers from it.

Ray sets a SIGTERM handler of its own when it starts: ``install()`` puts ours back afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from typing import Iterator

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """The driver was asked to stop by a signal."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def reason(self) -> str:
        return "interrupted by the user (Ctrl-C)" if self.signum == signal.SIGINT else f"stopped by {self.name}"


def stop_signal(exc: BaseException) -> StopSignal:
    """A KeyboardInterrupt as the StopSignal it stands for: itself, the signal our handler
    received (a library may re-raise it as a bare KeyboardInterrupt: Ray's ``wait`` does), or Ctrl-C."""
    if isinstance(exc, StopSignal):
        return exc
    for handler in reversed(_active):
        if handler.received is not None:
            return handler.received
    return _last_received[0] if _last_received else StopSignal(signal.SIGINT)


class _Handler:
    def __init__(self):
        self.received: StopSignal | None = None
        self.deferring = 0  # nesting depth of ``deferred()`` blocks
        self.pending = False  # the first signal came inside one: raised when it ends

    def __call__(self, signum, _frame):
        if self.received is None:
            self.received = StopSignal(signum)
            _last_received[:] = [self.received]
            if self.deferring:
                self.pending = True
                return
            raise self.received
        sys.stderr.write(f"\n{signal.Signals(signum).name} received: already stopping (stopping the trial servers "
                         f"and recording the running trials); kill -9 ends tuner at once, resume recovers\n")
        sys.stderr.flush()


_active: list[_Handler] = []
_last_received: list[StopSignal] = []  # the last signal handled (for the CLI's message after the block)


def install() -> None:
    """(Re)install the active handler for every stop signal (after a library replaced one)."""
    if not _active or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _active[-1])


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, a stop signal raises StopSignal once; previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _active.append(_Handler())
    _last_received.clear()
    try:
        install()
        yield
    finally:
        handler = _active.pop()
        for sig, before in previous.items():
            if handler.received is not None:
                # stopping: the process exits soon, with our exit code; SIG_IGN, not a Python
                # handler, because the interpreter puts back SIG_DFL for those while it shuts down
                before = signal.SIG_IGN
            try:
                signal.signal(sig, before)
            except (TypeError, ValueError):
                signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A database write the first stop signal must not cut in two: within the block a signal is
    recorded, and raised once the block has ended. One raised between a write's statement and the
    release of its connection can leave that connection holding SQLite's write lock, and the
    clean-up's own writes (the running trials recorded as interrupted) then wait out the busy
    timeout and fail."""
    handler = _active[-1] if _active and threading.current_thread() is threading.main_thread() else None
    if handler is None:
        yield
        return
    handler.deferring += 1
    try:
        yield
    finally:
        handler.deferring -= 1
    if handler.deferring == 0 and handler.pending:
        handler.pending = False
        raise handler.received


def already_stopping() -> bool:
    return bool(_active) and _active[-1].received is not None


def signals_received() -> bool:
    """A stop signal was handled in the active block (a bare KeyboardInterrupt then stands for it)."""
    return any(h.received is not None for h in _active)
