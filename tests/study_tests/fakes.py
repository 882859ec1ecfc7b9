"""In-memory stand-ins for the study driver's surroundings: records instead of a database, a
scripted executor instead of Ray, load points without a server. The driver's own parts
(proposer, ledger, loop) run unchanged against them, on an in-memory Optuna study."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.errors import TrialError
from tuner.lifecycle import Operation, Outcome, TrialStatus
from tuner.study.executor import OpResult
from tuner.workload.metrics import LoadPointMetrics, RequestRecord, aggregate

from tests.study_tests._tiny import write_tiny_study


def tiny_study(tmp_path: Path, **kw):
    from tuner.config.load import load_study

    return load_study(str(write_tiny_study(tmp_path, **kw)))


@dataclass
class MemoryRecords:
    """What the ledger wrote, by trial number."""

    study: dict = field(default_factory=dict)
    status: object = None
    trials: dict[int, dict] = field(default_factory=dict)
    measurements: list[dict] = field(default_factory=list)

    def create_study(self, **fields):
        self.study = fields

    def start_trial(self, **fields):
        self.trials[fields["trial_number"]] = dict(fields, status=TrialStatus.RUNNING)

    def update_trial(self, trial_number, **fields):
        self.trials[trial_number].update(fields)

    def finish_trial(self, trial_number, outcome: Outcome, **fields):
        self.trials[trial_number].update(fields, status=outcome.status, outcome=outcome)

    def add_measurement(self, **fields):
        self.measurements.append(fields)

    def set_status(self, status):
        self.status = status


def load_point(users: int, ttft_s: float, tpot_s: float = 0.02) -> LoadPointMetrics:
    """A real aggregate of ``users`` requests with the given latencies."""
    out = 11
    records = [RequestRecord(session_id=i, turn=0, start_s=0.0, input_tokens=1000, output_tokens=out,
                             ttft_s=ttft_s, end_s=ttft_s + tpot_s * (out - 1)) for i in range(users)]
    return aggregate(records, users=users, duration_s=10.0)


class ScriptedExecutor:
    """Runs operations at once, in submission order, from a script: ``capacity(number)`` is the
    largest user count a trial's configuration serves within the SLO; ``fail(number, op)`` may
    return a TrialError for that operation."""

    def __init__(self, capacity: Callable[[int], int], fail: Callable[[int, Operation], TrialError | None] = None,
                 interrupt_after: int | None = None):
        self.capacity = capacity
        self.fail = fail or (lambda number, op: None)
        self.interrupt_after = interrupt_after  # raise KeyboardInterrupt on this many-th wait
        self.queue: list[tuple[int, Operation, tuple]] = []
        self.submitted: list[tuple[int, Operation]] = []
        self.calls: list[tuple] = []  # (key, op, *args) of every submit
        self.max_in_flight = 0
        self.in_flight: set[int] = set()
        self.waits = 0
        self.shut_down = False

    def submit(self, key, op, *args, num_gpus=0):
        self.queue.append((key, Operation(op), args))
        self.submitted.append((key, Operation(op)))
        self.calls.append((key, Operation(op), *args))
        self.in_flight.add(key)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))

    def wait(self, timeout_s=0.5):
        self.waits += 1
        if self.interrupt_after is not None and self.waits >= self.interrupt_after:
            raise KeyboardInterrupt
        if not self.queue:
            return []
        key, op, args = self.queue.pop(0)
        err = self.fail(key, op)
        if op is Operation.CLOSE:
            self.in_flight.discard(key)
        if err is not None:
            self.in_flight.discard(key)
            return [OpResult(key, op, False, None, err)]
        if op is Operation.DEPLOY:
            return [OpResult(key, op, True, {"pids": [], "node": "test"})]
        if op is Operation.MEASURE:
            users = args[0]
            ttft = 1.0 if users <= self.capacity(key) else 100.0
            return [OpResult(key, op, True, (load_point(users, ttft), 0.01))]
        return [OpResult(key, op, True, {"teardown": "ok"})]

    def shutdown(self):
        self.shut_down = True
