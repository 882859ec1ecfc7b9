"""Run the tuner CLI with storage faults injected at SQLAlchemy's ``do_execute`` (every engine,
tuner's and Optuna's), as a process of its own, so that its death is real:

    python -m tests.reliability_tests.inject_run FAULT PATTERN ARM TIMES -- tuner arguments...

FAULT is ``enospc`` (an OSError(ENOSPC), what SQLite's file layer meets on a full disk) or
``pg-disk-full`` (psycopg's DiskFull, what a PostgreSQL server with a full disk answers).
Statements matching the regular expression PATTERN fail, from the first statement that matches
ARM on, TIMES of them in all (0: every one).
"""

from __future__ import annotations

import errno
import re
import sys


def make_fault(kind: str):
    if kind == "enospc":
        return lambda: OSError(errno.ENOSPC, "No space left on device")
    if kind == "pg-disk-full":
        import psycopg

        return lambda: psycopg.errors.DiskFull('could not extend file "base/16384/16500": No space left on device')
    raise SystemExit(f"unknown fault {kind!r}")


class Injector:
    def __init__(self, fault, pattern: str, arm: str, times: int):
        self.fault, self.pattern, self.arm, self.times = fault, re.compile(pattern, re.I), re.compile(arm, re.I), times
        self.armed = False
        self.raised = 0

    def __call__(self, cursor, statement, *rest):
        if not self.armed and self.arm.search(statement):
            self.armed = True
        if self.armed and self.pattern.search(statement) and (self.times == 0 or self.raised < self.times):
            self.raised += 1
            raise self.fault()

    def install(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "do_execute", self)
        event.listen(Engine, "do_execute_no_params", self)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    kind, pattern, arm, times = argv[:split]
    Injector(make_fault(kind), pattern, arm, int(times)).install()
    from tuner.cli import main as tuner_main

    tuner_main(argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
