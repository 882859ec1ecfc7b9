"""Run what a comparison needs through the normal study runner: studies not in storage are
created and run (on the simulator where the GPUs or SGLang are absent, as ``--backend auto``
decides), unfinished ones are continued, finished ones are read as they are."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from tuner.compare.plan import Action, ComparePlan, Entry
from tuner.evaluation.registry import get_evaluator, resolve_auto
from tuner.storage import db, repo
from tuner.study.runner import StudyRunner
from tuner.vocabulary import AUTO_BACKEND

log = logging.getLogger(__name__)


@dataclass
class Ran:
    name: str
    action: Action
    backend_kind: str
    backend_reason: str
    wall_time_s: float
    stopped_reason: str | None = None


def _backend(entry: Entry, requested: str | None) -> tuple[str, str]:
    kind = requested or entry.spec.backend
    if kind == AUTO_BACKEND:
        kind, reason = resolve_auto(entry.spec)
    else:
        reason = "chosen explicitly"
    get_evaluator(kind)  # exit 2 now if it cannot be used here
    return str(kind), reason


def run_plan(plan: ComparePlan, storage: str, *, backend: str | None = None, use_ray: bool = True,
             ray_address: str | None = None, parallel: int = 1, workdir: str = "results/runs",
             wrap: Callable | None = None, say: Callable[[str], None] = lambda s: None) -> list[Ran]:
    """Run or continue each entry that needs it. ``wrap(runner, spec, budget)`` runs one study
    (e.g. under a progress display); by default ``runner.run(budget)``."""
    engine = db.get_engine(storage)
    out = []
    for e in plan.entries:
        t0 = time.time()
        if e.action is Action.REUSE:
            row = repo.get_study(engine, e.spec.name)
            say(f"{e.spec.name}: reused from storage ({row.backend_kind}, {row.status})")
            out.append(Ran(e.spec.name, e.action, row.backend_kind, "as stored", 0.0))
            continue
        if e.action is Action.RESUME:
            row = repo.get_study(engine, e.spec.name)
            kind, reason = row.backend_kind, "as started"
            budget = row.trials_budget
        else:
            kind, reason = _backend(e, backend)
            budget = e.spec.trials
        runner = StudyRunner(e.spec, storage_url=storage, backend_kind=kind, backend_reason=reason, parallel=parallel,
                             ray_address=ray_address, use_ray=use_ray, workdir=workdir)
        if e.action is Action.RUN:
            runner.create(budget)
            say(f"{e.spec.name}: running {budget} trial(s) on the {kind} backend ({reason})")
        else:
            recovered = runner.recover_interrupted()
            say(f"{e.spec.name}: continuing to {budget} trial(s) on the {kind} backend"
                + (f" (marked {len(recovered)} interrupted trial(s))" if recovered else ""))
        outcome = wrap(runner, e.spec, budget) if wrap else runner.run(budget)
        out.append(Ran(e.spec.name, e.action, kind, reason, time.time() - t0, outcome.stopped_reason))
    return out
