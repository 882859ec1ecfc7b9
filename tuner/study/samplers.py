"""Sampler names -> Optuna samplers. Infeasible or failed trials carry a violated constraint so the
constrained samplers learn them as infeasible regions instead of ignoring them."""

from __future__ import annotations

from tuner.errors import ConfigError

CONSTRAINT_ATTR = "constraint"
SAMPLERS = ("default", "tpe", "random", "gp", "grid")


def constraints_func(frozen_trial) -> list[float]:
    return list(frozen_trial.user_attrs.get(CONSTRAINT_ATTR, [0.0]))


def make_sampler(name: str, seed: int, *, resumed: bool = False):
    import optuna

    if name in ("default", "tpe"):
        # default: multivariate TPE with constraints (learns infeasible regions), few startup trials
        multivariate = name == "default"
        return optuna.samplers.TPESampler(seed=seed, constraints_func=constraints_func, multivariate=multivariate,
                                          group=multivariate, n_startup_trials=6 if multivariate else 10,
                                          warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, constraints_func=constraints_func)
    if name == "grid":
        return optuna.samplers.RandomSampler(seed=seed)  # the grid is enqueued by the caller
    raise ConfigError(f"unknown sampler {name!r}; valid: {', '.join(SAMPLERS)}", key="sampler")
