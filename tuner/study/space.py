"""Search space -> Optuna suggestions, constraint checks and grid enumeration.

Parameters are suggested in the order the YAML lists them; a parameter whose ``condition`` does
not hold (given those before it) is not suggested and takes the value None (SGLang's default).
"""

from __future__ import annotations

from typing import Any

from tuner.config import expr
from tuner.config.exprcheck import EFFECTIVE_DEFAULTS, expression_env
from tuner.config.knobs import SGLANG_KNOBS
from tuner.config.schema import SearchSpaceSpec, StudySpec


def env_for(study: StudySpec) -> dict[str, Any]:
    return expression_env(study.hardware)


def _variables(space: SearchSpaceSpec, values: dict[str, Any], env: dict) -> dict:
    out = dict(env)
    for name in space.params:
        out[expr.var_name(name)] = values.get(name)
    return out


def condition_holds(space: SearchSpaceSpec, name: str, values: dict, env: dict) -> bool:
    """Whether knob ``name`` is sampled given the knobs before it. A condition that cannot be
    evaluated does not hold here; ``violated_constraints`` then reports it, so the trial is
    settled as infeasible with the reason instead of failing the study."""
    cond = space.params[name].condition
    if cond is None:
        return True
    try:
        return bool(expr.evaluate(cond, _variables(space, values, env)))
    except expr.ExpressionError:
        return False


def violated_constraints(space: SearchSpaceSpec, values: dict, env: dict) -> list[str]:
    """Constraints that do not hold for ``values`` (unset knobs take their effective default), and
    conditions or constraints that cannot be evaluated for them (with the reason)."""
    broken = []
    for name, p in space.params.items():
        if p.condition is None:
            continue
        earlier = {k: values.get(k) for k in list(space.params)[:list(space.params).index(name)]}
        try:
            expr.evaluate(p.condition, _variables(space, earlier, env))
        except expr.ExpressionError as exc:
            broken.append(f"condition of {name} cannot be evaluated: {exc}")
    filled = dict(values)
    for name, default in EFFECTIVE_DEFAULTS.items():
        if filled.get(name) is None:
            filled[name] = default
    variables = _variables(space, filled, env)
    for c in space.constraints:
        try:
            if not expr.evaluate(c, variables):
                broken.append(c)
        except expr.ExpressionError as exc:
            broken.append(f"{c} cannot be evaluated: {exc}")
    return broken


def suggest(trial, space: SearchSpaceSpec, env: dict) -> dict[str, Any]:
    """Sample one configuration with an Optuna trial (define-by-run)."""
    values: dict[str, Any] = {}
    for name, p in space.params.items():
        if not condition_holds(space, name, values, env):
            values[name] = None
            continue
        if p.values is not None:
            # Optuna's categorical needs hashable primitives: None is allowed.
            values[name] = trial.suggest_categorical(name, p.values)
        elif p.is_int_range:
            values[name] = trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log and not p.step)
        else:
            values[name] = trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log and not p.step)
    return values


def pinned_flags(study: StudySpec) -> dict[str, Any]:
    """``backend_options.server_flags``: server flags every trial runs with, the baseline too."""
    pinned = (study.backend_options or {}).get("server_flags") or {}
    return {str(k): v for k, v in pinned.items()} if isinstance(pinned, dict) else {}


def split(values: dict[str, Any], engine: str = "sglang", pinned: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """Knob values -> (server flags, tuner knobs); None entries are dropped (= default).

    ``pinned`` flags (the study's ``backend_options.server_flags``) are in every trial's flags,
    so the planner, the simulator and the export see what the server ran with."""
    flags, knobs = dict(pinned or {}), {}
    for name, v in values.items():
        if v is None:
            continue
        knob = SGLANG_KNOBS.get(name)
        if engine == "sglang" and knob is not None and knob.scope == "tuner":
            knobs[name] = v
        else:
            flags[name] = v
    return flags, knobs


def enumerate_grid(space: SearchSpaceSpec, env: dict, max_points: int = 1_000_000) -> list[dict]:
    """Every configuration of the (discretised) space that satisfies conditions and constraints."""
    names = list(space.params)
    grids = {n: space.params[n].grid() for n in names}
    out: list[dict] = []

    def rec(i: int, values: dict):
        if len(out) >= max_points:
            return
        if i == len(names):
            if not violated_constraints(space, values, env):
                out.append(dict(values))
            return
        name = names[i]
        if not condition_holds(space, name, values, env):
            values[name] = None
            rec(i + 1, values)
            return
        for v in grids[name]:
            values[name] = v
            rec(i + 1, values)
        values.pop(name, None)

    rec(0, {})
    return out


def grid_size_upper_bound(space: SearchSpaceSpec) -> int:
    n = 1
    for p in space.params.values():
        n *= len(p.grid())
    return n


__all__ = ["env_for", "suggest", "split", "violated_constraints", "enumerate_grid", "condition_holds"]
