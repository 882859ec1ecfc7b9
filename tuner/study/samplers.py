"""Sampler names -> Optuna samplers, the grid sampler's grid, and the planner-ranked first trials.

Infeasible or failed trials carry a violated constraint so the constrained samplers learn them as
infeasible regions instead of ignoring them.
"""

from __future__ import annotations

import warnings
from typing import Callable

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError, UserError
from tuner.planner import plan_memory
from tuner.config.schema import ParamSpec, StudySpec
from tuner.study import space as space_mod
from tuner.vocabulary import Engine, Sampler, names

CONSTRAINT_KEY = "infeasible"  # trial.set_constraint(CONSTRAINT_KEY, 1.0) marks a trial infeasible
SAMPLERS = names(Sampler)


def mark_feasible(trial, feasible: bool) -> None:
    """Constrained samplers read this (Optuna >= 5: values <= 0 are feasible)."""
    trial.set_constraint(CONSTRAINT_KEY, 0.0 if feasible else 1.0)


def _tpe(multivariate: bool) -> Callable[[int], object]:
    def make(seed: int):
        import optuna

        # default: multivariate TPE with constraints (learns infeasible regions), few startup trials
        with warnings.catch_warnings():  # multivariate/group are stable in use, flagged experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=multivariate, group=multivariate,
                                              n_startup_trials=6 if multivariate else 10)
    return make


def _random(seed: int):
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _gp(seed: int):
    import optuna

    return optuna.samplers.GPSampler(seed=seed)


# every name of tuner.vocabulary.Sampler -> its Optuna sampler. The grid is enqueued by the
# proposer (grid_configs); whatever Optuna asks after it is a duplicate the proposer settles.
_FACTORIES: dict[Sampler, Callable[[int], object]] = {
    Sampler.DEFAULT: _tpe(multivariate=True),
    Sampler.TPE: _tpe(multivariate=False),
    Sampler.RANDOM: _random,
    Sampler.GP: _gp,
    Sampler.GRID: _random,
}


def make_sampler(name: str, seed: int):
    try:
        factory = _FACTORIES[Sampler(name)]
    except ValueError:
        raise ConfigError(f"unknown sampler {name!r}; valid: {', '.join(SAMPLERS)}", key="sampler") from None
    return factory(seed)


# ---------------------------------------------------------------- the grid sampler
def grid_configs(study: StudySpec, budget: int) -> list[dict]:
    """Every configuration of the space that meets its conditions and constraints, in the order of
    the YAML's values. Refused (ConfigError, naming the study file) when a parameter is a
    continuous range or when the grid does not fit in ``budget`` launched trials after the baseline."""
    space = study.space()
    continuous = [n for n, p in space.params.items() if p.values is None and not p.step]
    if continuous:
        raise ConfigError(f"sampler 'grid' needs every parameter as a list of values or a range with a step; "
                          f"{', '.join(repr(n) for n in continuous)} "
                          f"{'is a continuous range' if len(continuous) == 1 else 'are continuous ranges'} "
                          f"(give 'values' or a 'step', or choose another sampler)",
                          file=study.source_path, key="sampler")
    env = space_mod.env_for(study)
    grid = [{n: v for n, v in values.items() if space_mod.condition_holds(space, n, values, env)}
            for values in space_mod.enumerate_grid(space, env)]
    if not grid:
        raise ConfigError("sampler 'grid': the search space has no configuration that meets its constraints",
                          file=study.source_path, key="sampler")
    if len(grid) > budget - 1:
        raise ConfigError(f"sampler 'grid': the space has {len(grid)} configurations but a budget of {budget} "
                          f"trials leaves {budget - 1} after the baseline; set trials to at least "
                          f"{len(grid) + 1}, narrow the space, or choose another sampler",
                          file=study.source_path, key="sampler")
    return grid


# ---------------------------------------------------------------- planner-ranked first trials
# The default sampler does not start from random points: right after the baseline it tries, for
# each parallelism family (TP/DP/attention-DP/EP split) in the space, the memory settings that the
# planner says leave the most KV cache (quantization, KV dtype, memory fraction, hierarchical
# cache). KV room is what decides capacity on multi-turn workloads (see docs/search.md), but it
# grows with the number of KV pools (attention-DP ranks) while the step time it cannot see grows
# too, so the families are taken in rounds: each round the best family of every pool count, by
# room, before a second family of any count. TPE then refines the other knobs from these points.
PARALLEL_KNOBS = ("tp-size", "dp-size", "attn-dp-size", "ep-size", "pp-size")
MEMORY_KNOBS = ("quantization", "kv-cache-dtype", "mem-fraction-static", "enable-hierarchical-cache", "hicache-ratio")
# Other knobs in the seeds: the value the serving guides recommend where the space offers it,
# else SGLang's default (None) where offered, else the first listed value.
PRIOR_VALUES = {"router-policy": "cache_aware", "moe-tile-configs": "tuned"}
HOST_KV_WEIGHT = 0.5  # a token kept in host memory (HiCache) counts half: loading it back costs time
MAX_SEED_CONFIGS = 6
MAX_SEED_PLANS = 5000


def seed_configs(study, max_configs: int = MAX_SEED_CONFIGS) -> list[dict]:
    """Planner-ranked first configurations (one per parallelism family, largest KV room first)."""
    if study.space().engine != Engine.SGLANG:
        return []
    space, env = study.space(), space_mod.env_for(study)
    reduced = {}
    for name, p in space.params.items():
        if name in PARALLEL_KNOBS or name in MEMORY_KNOBS:
            reduced[name] = p
            continue
        choices = p.values if p.values is not None else p.grid()
        prior = PRIOR_VALUES.get(name)
        value = prior if prior in choices else (None if None in choices else choices[0])
        reduced[name] = ParamSpec(values=[value], condition=p.condition)
    small = space.model_copy(update={"params": reduced})
    if space_mod.grid_size_upper_bound(small) > MAX_SEED_PLANS:
        return []
    model, gpu, hw = get_model(study.model), get_gpu(study.hardware.gpu), study.hardware
    best: dict[tuple, tuple[float, int, dict]] = {}
    for values in space_mod.enumerate_grid(small, env):
        flags, _ = space_mod.split(values, space.engine, space_mod.pinned_flags(study))
        try:
            plan = plan_memory(model, gpu, hw.gpus_per_node, flags, nodes=hw.nodes, host_memory_gb=hw.host_memory_gb,
                               sglang_version=(study.backend_options or {}).get("sglang_version"))
        except (TrialError, UserError):
            continue
        if not plan.fits:
            continue
        room = plan.kv_capacity_tokens_total + HOST_KV_WEIGHT * plan.hicache_host_tokens_per_pool * plan.kv_pools
        family = tuple(values.get(k) for k in PARALLEL_KNOBS)
        if family not in best or room > best[family][0]:
            best[family] = (room, plan.kv_pools, values)
    ranked = _rounds_by_pool_count(list(best.values()))[:max_configs]
    return [{k: v for k, v in values.items() if space_mod.condition_holds(space, k, values, env)}
            for _, _, values in ranked]


def _rounds_by_pool_count(families: list[tuple[float, int, dict]]) -> list[tuple[float, int, dict]]:
    """(room, kv_pools, values) per family -> round r holds the r-th roomiest family of every pool
    count, roomiest first; rounds in order. Room alone would rank every family with more pools above
    the single-pool ones and leave plain TP, SGLang's own layout, outside the seeds."""
    by_pools: dict[int, list] = {}
    for family in sorted(families, key=_seed_rank):
        by_pools.setdefault(family[1], []).append(family)
    rounds: list[list] = []
    for members in by_pools.values():
        for r, family in enumerate(members):
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(family)
    return [family for members in rounds for family in sorted(members, key=_seed_rank)]


def _seed_rank(family: tuple[float, int, dict]) -> tuple[float, int]:
    """Roomiest first; between equal rooms, experts split by EP before experts sliced by moe-TP:
    a slice's down GEMM is 1/moe-TP as deep in K, and SGLang's fused MoE runs a 256-deep one at
    about a third of a 2,048-deep one's rate (results/profiles/h100/tables, DeepSeek-V3 at TP 8 and 1)."""
    values = family[2]
    return -family[0], -int(values.get("ep-size") or 1)
