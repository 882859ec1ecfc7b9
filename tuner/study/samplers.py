"""Sampler names -> Optuna samplers. Infeasible or failed trials carry a violated constraint so the
constrained samplers learn them as infeasible regions instead of ignoring them."""

from __future__ import annotations

from tuner.errors import ConfigError

CONSTRAINT_KEY = "infeasible"  # trial.set_constraint(CONSTRAINT_KEY, 1.0) marks a trial infeasible
SAMPLERS = ("default", "tpe", "random", "gp", "grid")


def mark_feasible(trial, feasible: bool) -> None:
    """Constrained samplers read this (Optuna >= 5: values <= 0 are feasible)."""
    trial.set_constraint(CONSTRAINT_KEY, 0.0 if feasible else 1.0)


def make_sampler(name: str, seed: int, *, resumed: bool = False):
    import optuna

    if name in ("default", "tpe"):
        # default: multivariate TPE with constraints (learns infeasible regions), few startup trials
        multivariate = name == "default"
        return optuna.samplers.TPESampler(seed=seed, multivariate=multivariate, group=multivariate,
                                          n_startup_trials=6 if multivariate else 10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.RandomSampler(seed=seed)  # the grid is enqueued by the caller
    raise ConfigError(f"unknown sampler {name!r}; valid: {', '.join(SAMPLERS)}", key="sampler")
