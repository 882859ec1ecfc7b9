"""Optuna search over the tile space for one batch size (no torch: the caller supplies the timer).

Trials are asked in small batches, so new kernels compile in parallel before they are timed. Order:
1. warm start: the neighbouring batch size's best configs (``enqueue_trial``) and SGLang's default;
2. TPE (multivariate, over the six categorical tile parameters) on most of the budget;
3. refinement: the incumbent's one-parameter neighbours, hill-climbing until the budget is spent.
Configs outside the feasible set (shared-memory limit, block-shape rule) are told a penalty without
being timed; repeats are answered from the cache. Only timed configs count as evaluations.

A ``deadline`` (``time.monotonic()``) ends the search early, at a round's end: the first round (the
warm start) always runs, TPE stops asking at its share of the time and refinement at the deadline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import optuna

from tuner.kernels.space import PARAM_VALUES, TileConfig, neighbours

Evaluate = Callable[[list], list[float]]  # us per config; math.inf = failed


@dataclass
class SearchResult:
    best: TileConfig
    best_us: float
    evaluations: int
    wall_s: float
    history: list[tuple[TileConfig, float]] = field(default_factory=list)
    stopped_by_deadline: bool = False  # the time ran out before the evaluation budget

    def top(self, n: int) -> list[TileConfig]:
        ok = sorted((t, c) for c, t in self.history if math.isfinite(t))
        return [c for _, c in ok[:n]]


def _params(cfg, param_values: dict) -> dict:
    return {k: getattr(cfg, k) for k in param_values}


def search_batch_size(evaluate: Evaluate, feasible: Iterable, budget: int, *,
                      warm_start: Iterable = (), seed: int = 0, batch: int = 8,
                      refine_fraction: float = 0.3, on_eval: Callable[[int], None] | None = None,
                      param_values: dict[str, tuple] = PARAM_VALUES,
                      make: Callable[[dict], object] | None = None,
                      deadline: float | None = None) -> SearchResult:
    """Find a fast config with at most ``budget`` timed evaluations (and, with ``deadline``, by then).

    ``param_values`` names the searched parameters and their choices; ``make`` builds a config from
    them (default: a TileConfig of the six fused-MoE parameters). Configs are hashable values.
    """
    make = make or (lambda p: TileConfig(**p))
    feasible = set(feasible)
    if not feasible:
        raise ValueError("the feasible tile space is empty")
    budget = max(1, min(budget, len(feasible)))
    t0 = time.perf_counter()
    start = time.monotonic()
    # TPE gets the time the evaluation budget gives it; refinement the rest
    tpe_deadline = None if deadline is None else start + (deadline - start) * (1 - refine_fraction)
    ran_out_of_time = False

    def past(limit: float | None) -> bool:
        nonlocal ran_out_of_time
        if limit is None or not measured or time.monotonic() < limit:
            return False
        ran_out_of_time = True
        return True

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=False, constant_liar=True,
                                         n_startup_trials=max(8, budget // 8), n_ei_candidates=48)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in param_values.items()}

    measured: dict[TileConfig, float] = {}
    history: list[tuple[TileConfig, float]] = []

    def worst() -> float:
        finite = [v for v in measured.values() if math.isfinite(v)]
        return 4 * max(finite) if finite else 1e9

    def run_round(trials: list[tuple[optuna.trial.Trial, TileConfig]]):
        new = sorted({c for _, c in trials if c not in measured})
        if new:
            for cfg, us in zip(new, evaluate(new)):
                measured[cfg] = us
                history.append((cfg, us))
            if on_eval:
                on_eval(len(new))
        for trial, cfg in trials:
            us = measured[cfg]
            study.tell(trial, us if math.isfinite(us) else worst())

    def ask_round(limit: int) -> list[tuple[optuna.trial.Trial, TileConfig]]:
        """Up to ``limit`` trials naming configs not timed yet (infeasible ones are told a penalty)."""
        out, fresh, asks = [], set(), 0
        while len(fresh) < limit and asks < 40 * limit:
            asks += 1
            trial = study.ask(distributions)
            cfg = make(trial.params)
            if cfg not in feasible:
                study.tell(trial, worst())
                continue
            if cfg in measured:
                study.tell(trial, measured[cfg] if math.isfinite(measured[cfg]) else worst())
                continue
            out.append((trial, cfg))
            fresh.add(cfg)
        return out

    for cfg in dict.fromkeys(warm_start):
        if cfg in feasible:
            study.enqueue_trial(_params(cfg, param_values), skip_if_exists=True)

    tpe_budget = budget - int(budget * refine_fraction)
    while len(measured) < tpe_budget and not past(tpe_deadline):
        trials = ask_round(min(batch, tpe_budget - len(measured)))
        if not trials:
            break
        run_round(trials)

    # Refinement: walk to better one-parameter neighbours of the incumbent.
    while len(measured) < budget and not past(deadline):
        finite = [(t, c) for c, t in measured.items() if math.isfinite(t)]
        if not finite:
            break
        ranked = [c for _, c in sorted(finite)]
        todo = []
        for inc in ranked:  # the incumbent first, then the runners-up
            todo += [c for c in neighbours(inc, feasible, param_values, make) if c not in measured and c not in todo]
            if len(todo) >= budget - len(measured):
                break
        todo = todo[: min(batch, budget - len(measured))]
        if not todo:
            break
        for cfg in todo:
            study.enqueue_trial(_params(cfg, param_values))
        trials = []
        for _ in todo:
            trial = study.ask(distributions)
            cfg = make(trial.params)
            if cfg in measured or cfg not in feasible:
                study.tell(trial, measured.get(cfg, worst()) if math.isfinite(measured.get(cfg, math.inf))
                           else worst())
            else:
                trials.append((trial, cfg))
        if trials:
            run_round(trials)

    finite = [(t, c) for c, t in measured.items() if math.isfinite(t)]
    if not finite:
        raise RuntimeError("no tile config could be timed")
    best_us, best = min(finite, key=lambda tc: (tc[0], str(tc[1])))
    return SearchResult(best=best, best_us=best_us, evaluations=len(measured),
                        wall_s=time.perf_counter() - t0, history=history,
                        stopped_by_deadline=ran_out_of_time and len(measured) < budget)
