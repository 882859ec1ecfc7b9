"""Run what a comparison needs through the normal study runner: studies not in storage are
created and run (on the simulator where the GPUs or SGLang are absent, as ``--backend auto``
decides), unfinished ones are continued, finished ones are read as they are. With cross-seeding,
each study then also runs the other studies' best configurations it has not tried."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from tuner.compare.plan import Action, ComparePlan, Entry
from tuner.evaluation.registry import get_evaluator, resolve_auto
from tuner.lifecycle import TrialStatus
from tuner.storage import db, repo
from tuner.study import space as space_mod
from tuner.study.proposer import config_key, planner_verdict
from tuner.study.runner import StudyRunner
from tuner.study.summary import study_summary
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


# ---- cross-seeding: each study's best configuration tried on the other studies ------------------
@dataclass(frozen=True)
class Adapted:
    """Another study's configuration as one of this study's: ``config`` (None when it cannot be
    run here), ``changed`` (the knobs that had to differ: the checkpoint, host memory) and, when
    it cannot, ``reason``."""

    config: dict | None
    changed: tuple[str, ...] = ()
    reason: str | None = None


def adapt(params: dict, spec) -> Adapted:
    """``params`` (another study's best) as a configuration of ``spec``'s search space: a knob
    the space fixes to one value (its checkpoint) takes that value, a knob it lacks is dropped; a
    HiCache ratio the node's host memory cannot hold is lowered (or HiCache turned off). Not
    runnable when a value is outside the space, a constraint fails or the planner says it cannot
    fit."""
    space = spec.space()
    env = space_mod.env_for(spec)
    out: dict = {}
    for name, p in space.params.items():
        if not space_mod.condition_holds(space, name, out, env):
            out[name] = None  # inactive here (ep-size without attention DP, a ratio without HiCache)
            continue
        grid = p.grid()
        value = params.get(name)
        if value not in grid:
            if len(grid) != 1:
                return Adapted(None, reason=f"{name}={value} is not in its search space")
            value = grid[0]
        out[name] = value
    broken = space_mod.violated_constraints(space, out, env)
    if broken:
        return Adapted(None, reason=f"breaks its constraint: {broken[0]}")
    why = None
    for candidate in _host_cache_variants(out, space):
        flags, _ = space_mod.split(candidate, space.engine, space_mod.pinned_flags(spec))
        fits, reason, _ = planner_verdict(spec, flags)
        if fits:
            changed = tuple(sorted(k for k in set(candidate) | set(params) if candidate.get(k) != params.get(k)))
            return Adapted(candidate, changed)
        why = why or reason
    return Adapted(None, reason=f"the planner says it does not fit: {why}")


def adapt_config(params: dict, spec) -> dict | None:
    """The runnable configuration of :func:`adapt`, or None."""
    return adapt(params, spec).config


def _host_cache_variants(cfg: dict, space) -> list[dict]:
    """The configuration, then (HiCache's host pool is a ratio of the device KV pool, so a GPU with
    a bigger pool may lack the host memory for the same ratio) smaller ratios, then HiCache off."""
    out = [cfg]
    if not cfg.get("enable-hierarchical-cache"):
        return out
    ratio = cfg.get("hicache-ratio")
    if "hicache-ratio" in space.params and ratio is not None:
        smaller = sorted((r for r in space.params["hicache-ratio"].grid() if r is not None and r < ratio), reverse=True)
        out += [{**cfg, "hicache-ratio": r} for r in smaller]
    if False in space.params.get("enable-hierarchical-cache").grid():
        out.append({**cfg, "enable-hierarchical-cache": False, "hicache-ratio": None})
    return out


MAX_CROSS_SEED_PASSES = 4  # a pass can only add what a study's new best brings; the bests settle fast


def cross_seed(plan: ComparePlan, storage: str, ran: list[Ran], *, use_ray: bool = True,
               ray_address: str | None = None, parallel: int = 1, workdir: str = "results/runs",
               wrap: Callable | None = None, say: Callable[[str], None] = lambda s: None) -> dict[str, list[dict]]:
    """Try every study's best configuration on each other study that can run it and has not run
    it to the end (hardware compared at the same configuration, not only at what each search
    found): a configuration never tried there is launched, one whose search was pruned there is
    repeated unpruned (``repeat_trials``). A seeded configuration can become its study's new best,
    which the studies seeded before it have not run: passes repeat until no study has anything left
    to try (at most ``MAX_CROSS_SEED_PASSES``). Returns study -> [{from, params}] of those added."""
    added: dict[str, list[dict]] = {}
    for _ in range(MAX_CROSS_SEED_PASSES):
        new = _cross_seed_pass(plan, storage, ran, use_ray=use_ray, ray_address=ray_address, parallel=parallel,
                               workdir=workdir, wrap=wrap, say=say)
        for name, sources in new.items():
            added.setdefault(name, []).extend(sources)
        if not new:
            break
    return added


def _cross_seed_pass(plan: ComparePlan, storage: str, ran: list[Ran], *, use_ray: bool, ray_address: str | None,
                     parallel: int, workdir: str, wrap: Callable | None,
                     say: Callable[[str], None]) -> dict[str, list[dict]]:
    """One pass of ``cross_seed`` over the bests as they are when it starts."""
    summaries = {e.spec.name: study_summary(storage, e.spec.name) for e in plan.entries}
    bests = {n: s["best"] for n, s in summaries.items() if s["best"] and not s["best"]["is_baseline"]}
    kinds = {r.name: r.backend_kind for r in ran}
    added: dict[str, list[dict]] = {}
    for e in plan.entries:
        s = summaries[e.spec.name]
        tried: dict[str, list[dict]] = {}
        for t in s["trials"]:
            tried.setdefault(config_key(t["params"]), []).append(t)
        configs, repeats, sources, planned = [], [], [], set()
        for other, best in bests.items():
            if other == e.spec.name:
                continue
            cfg = adapt_config(best["params"], e.spec)
            if cfg is None or config_key(cfg) in planned:
                continue
            same = tried.get(config_key(cfg), [])
            ran = [t for t in same if t["launched"]]
            if not same:
                configs.append(cfg)
            elif ran and all(t["status"] == TrialStatus.PRUNED for t in ran):
                # its search was stopped below the study's best: run it again to its end
                repeats.append(max(t["number"] for t in ran))
            else:  # measured to the end, failed or infeasible there already
                continue
            planned.add(config_key(cfg))
            sources.append({"from": other, "trial": best["number"], "params": cfg})
        if not sources:
            continue
        kind = kinds.get(e.spec.name) or s["backend_kind"]
        # not pruned: a configuration run for the comparison needs its capacity, not only "below the best"
        runner = StudyRunner(e.spec, storage_url=storage, backend_kind=kind, backend_reason="cross-seeding",
                             parallel=parallel, ray_address=ray_address, use_ray=use_ray, workdir=workdir,
                             initial_configs=configs, repeat_trials=repeats, prune=False)
        budget = s["trials_launched"] + len(configs) + len(repeats)
        say(f"{e.spec.name}: trying the best configuration of {', '.join(x['from'] for x in sources)}")
        if wrap:
            wrap(runner, e.spec, budget)
        else:
            runner.run(budget)
        added[e.spec.name] = sources
    return added
