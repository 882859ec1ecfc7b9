"""A dry run: the server command lines of the trials a study would launch, without launching or
writing anything.

The proposer runs alone on an in-memory Optuna study: the baseline, the enqueued configurations
(warm start, the default sampler's planner-ranked seeds, the grid), then the sampler's own picks.
Configurations a constraint rejects or the planner screens out are listed with their reason; they
are settled by a ledger whose records go nowhere, so the sampler learns them exactly as in a real
run. No capacity is measured, so after the enqueued configurations the sampler is where a real
study is before its first result comes back (TPE: its random start-up trials).

Each launched configuration is planned by its backend's own ``build_plan`` (the call a real trial
makes) in a temporary directory that is removed afterwards; paths in the plan are shown as the
trial directory a real run would use.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.backends.base import LaunchPlan, ProcessBackend
from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.live import trial_dir_for
from tuner.lifecycle import FailureClass, Outcome
from tuner.config.schema import StudySpec
from tuner.study.ledger import Ledger
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Decision, Proposer, max_asks
from tuner.study.samplers import make_sampler
from tuner.vocabulary import StrEnum


class Planned(StrEnum):
    LAUNCH = "launch"  # its servers' command lines are below
    CONSTRAINT = "constraint"  # a constraint of the space rejects it
    SCREENED = "screened"  # the planner says it cannot fit
    DUPLICATE = "duplicate"  # the same configuration as an earlier trial
    PLAN_FAILED = "plan_failed"  # the backend refuses to plan it (the trial would fail at once)


@dataclass
class PlannedTrial:
    number: int
    is_baseline: bool
    planned: Planned
    config: dict[str, Any]  # knob -> value (None: SGLang's default)
    reason: str | None = None
    argv: list[str] | None = None  # the (first) server's command line
    env: dict[str, str | None] | None = None  # its environment over the current one
    config_yaml: str | None = None  # the --config file it would be given
    moe_config_files: list[str] | None = None  # tuned MoE tile files its config directory would hold
    servers: list[dict] = field(default_factory=list)  # every server process: name, argv, env
    router: dict | None = None  # the router in front, if any

    def to_dict(self) -> dict:
        return asdict(self)


class _Discard:
    """Records that go nowhere: a dry run writes nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def dry_run(study: StudySpec, backend: ProcessBackend, budget: int, *, seed: int | None = None,
            workdir: str = "results/runs", initial_configs: list[dict] | None = None) -> list[PlannedTrial]:
    """The first ``budget`` trials a study would launch (and what it would settle on the way)."""
    seed = study.seed if seed is None else seed
    optuna = OptunaStudy.in_memory(make_sampler(study.sampler, seed))
    proposer = Proposer(study, optuna, budget, initial_configs=list(initial_configs or []))
    ledger = Ledger(_Discard(), optuna, backend_kind=backend.kind)
    real_root = os.path.abspath(workdir)
    out: list[PlannedTrial] = []
    with tempfile.TemporaryDirectory(prefix="tuner-dry-run-") as tmp:
        while ledger.counters.launched < budget and proposer.asks < max_asks(budget):
            p = proposer.propose()
            if not p.launch:
                ledger.settle(p)
                if p.decision is not Decision.DUPLICATE_RUNNING:  # asked again: not a trial of its own
                    out.append(PlannedTrial(p.number, p.is_baseline, Planned(p.decision.value), p.values,
                                            reason=p.reason or _duplicate_reason(p)))
                continue
            ledger.started(p)
            request = TrialRequest(study=study, trial_number=p.number, flags=p.flags, knobs=p.knobs,
                                   workdir=f"{tmp}/{study.name}", seed=seed + p.number)
            entry = PlannedTrial(p.number, p.is_baseline, Planned.LAUNCH, p.values)
            try:
                plan = backend.build_plan(request, trial_dir_for(request))
            except (TrialError, ConfigError) as exc:
                failure_class = exc.failure_class if isinstance(exc, TrialError) else FailureClass.INTERNAL
                entry.planned = Planned.PLAN_FAILED
                entry.reason = f"{failure_class}: {exc.reason if isinstance(exc, TrialError) else exc}"
                # counted as launched (a real trial would start and fail at once), learnt as no capacity
                proposer.learn(p, Outcome.failure(failure_class, entry.reason))
            else:
                _describe(entry, plan, tmp, real_root)
            out.append(entry)
    return out


def _duplicate_reason(p) -> str | None:
    if p.decision is Decision.DUPLICATE:
        return "the same configuration as an earlier trial"
    return None


def _describe(entry: PlannedTrial, plan: LaunchPlan, tmp: str, real_root: str) -> None:
    def real(text: str) -> str:  # the trial directory a real run would use
        return text.replace(tmp, real_root)

    def process(spec) -> dict:
        return {"name": spec.name, "argv": [real(str(a)) for a in spec.argv],
                "env": {k: None if v is None else real(str(v)) for k, v in dict(spec.env).items()}}

    entry.servers = [process(s) for s in plan.servers]
    entry.router = process(plan.router) if plan.router is not None else None
    entry.argv = entry.servers[0]["argv"] if entry.servers else None
    entry.env = entry.servers[0]["env"] if entry.servers else None
    config = plan.files.get("config")
    entry.config_yaml = Path(config).read_text() if config else None
    files = plan.facts.get("moe_config_files")
    entry.moe_config_files = None if files is None else [Path(str(f)).name for f in files]


def summary_lines(study: StudySpec, backend_kind: str, trials: list[PlannedTrial]) -> list[str]:
    """A readable account of a dry run: one block per trial, then the counts."""
    lines = [f"dry run of study {study.name} on {backend_kind}: nothing is launched or written"]
    base = next((t.config for t in trials if t.is_baseline), {})
    for t in trials:
        diff = {k: v for k, v in t.config.items() if v is not None and base.get(k) != v}
        what = "baseline" if t.is_baseline else ("baseline + " + " ".join(f"{k}={v}" for k, v in diff.items())
                                                 if diff else "baseline")
        lines.append(f"trial {t.number} ({what}): {t.planned}" + (f": {t.reason}" if t.reason else ""))
        for s in t.servers + ([t.router] if t.router else []):
            env = " ".join(f"{k}={v}" for k, v in (s["env"] or {}).items() if v is not None)
            lines.append(f"    {s['name']}: " + (f"{env} " if env else "") + shlex.join(s["argv"]))
        if t.moe_config_files:
            lines.append(f"    tuned MoE tile files: {', '.join(t.moe_config_files)}")
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.planned] = counts.get(t.planned, 0) + 1
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return lines
