"""The evaluator interface: what the study pipeline asks of a backend.

An ``Evaluator`` turns one trial (a study plus a candidate configuration) into a ``Deployment``:
a running server (or a simulated one) that can be measured at any number of closed-loop users.
The capacity search (``tuner.evaluation.capacity``) drives ``Deployment.measure`` and never sees
which backend is behind it; the backend kind is recorded with every measurement.

Evaluators run inside Ray workers: everything here must be picklable, and they never touch the
study database (workers return results; only the driver writes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tuner.workload.metrics import LoadPointMetrics


@dataclass(frozen=True)
class TrialRequest:
    """Everything a worker needs to evaluate one configuration.

    ``flags`` are SGLang 0.5.23 server flags by their CLI names without dashes in front
    (``{"tp-size": 8, "attn-dp-size": 8, "quantization": "modelopt_fp4"}``); a missing key means
    SGLang's default. ``knobs`` are tuner-level choices that are not SGLang server flags:
    ``router-policy`` (None, or a sglang_router policy) and ``moe-tile-configs``
    ("default" or "tuned"). ``study`` is the validated StudySpec (tuner.config.schema).
    """

    study: Any  # tuner.config.schema.StudySpec (kept Any to avoid an import cycle)
    trial_number: int
    flags: dict[str, Any]
    knobs: dict[str, Any] = field(default_factory=dict)
    workdir: str = "."
    seed: int = 0
    gpu_ids: tuple[int, ...] = ()  # GPUs Ray assigned to this trial (empty for the simulator)


class Deployment(ABC):
    """A started configuration. ``measure`` may be called many times, then ``close`` once."""

    #: KV tokens the planner predicted for the whole node/cluster (None if not computed)
    predicted_kv_capacity_tokens_total: int | None = None
    #: KV tokens the server reported (real backends), or the simulated pool size
    measured_kv_capacity_tokens_total: int | None = None
    #: process ids this deployment started (recorded so a resumed study can reap orphans)
    pids: tuple[int, ...] = ()
    log_path: str | None = None

    @abstractmethod
    def measure(self, users: int) -> LoadPointMetrics:
        """Replay the workload with ``users`` closed-loop users; raise TrialError on a crash."""

    def close(self) -> None:
        """Stop everything this deployment started. Idempotent."""

    def telemetry(self) -> dict:
        """Backend-specific facts to record with the trial (GPU memory, server_info, ...)."""
        return {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Evaluator(ABC):
    """A backend kind: ``simulator``, ``sglang``, ``transformers``."""

    kind: str = "base"
    # whether a load point's warm-up and window take that long on the clock (a replay against a
    # server), or are simulated in moments; a run's time limit plans by it
    windows_take_wall_time: bool = True

    def gpus_needed(self, request: TrialRequest) -> int:
        """GPUs the trial asks Ray for (0 for the simulator)."""
        return 0

    @abstractmethod
    def deploy(self, request: TrialRequest) -> Deployment:
        """Start the configuration; raise TrialError(failure_class, reason) if it cannot start."""
