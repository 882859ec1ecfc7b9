"""Evaluate a search space's conditions and constraints over the values it can take, before
anything runs: an expression that fails for some configuration (division by zero, None in
arithmetic) is a ConfigError naming the file, the key and the values that break it.

Each expression is evaluated over every combination of the values of the names it uses (a knob's
listed values or its discretised range, plus None where the knob has a condition and may not be
set); beyond ``MAX_COMBINATIONS`` combinations a fixed-seed sample of them is checked, and the
trial-time evaluation (``tuner.study.space``) turns what is left into an infeasible trial.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from tuner.errors import ConfigError
from tuner.config import expr
from tuner.config.schema import SearchSpaceSpec

MAX_COMBINATIONS = 5_000
#: knobs an unset value stands for when constraints are evaluated (SGLang's defaults)
EFFECTIVE_DEFAULTS = {"tp-size": 1, "dp-size": 1, "attn-dp-size": 1}


def expression_env(hardware) -> dict[str, int]:
    """The names a study gives every expression besides the knobs."""
    return {"gpus": hardware.total_gpus, "gpus_per_node": hardware.gpus_per_node, "nodes": hardware.nodes}


def _domain(space: SearchSpaceSpec, name: str, *, as_constraint: bool) -> list[Any]:
    p = space.params[name]
    values = list(p.grid())
    if p.condition is not None and None not in values:
        values.append(None)  # not sampled when its condition does not hold
    if as_constraint and name in EFFECTIVE_DEFAULTS:
        values = sorted({EFFECTIVE_DEFAULTS[name] if v is None else v for v in values}, key=repr)
    return values


def _combinations(domains: dict[str, list]) -> list[dict]:
    names = list(domains)
    total = 1
    for values in domains.values():
        total *= len(values)
    if total <= MAX_COMBINATIONS:
        return [dict(zip(names, combo)) for combo in itertools.product(*domains.values())]
    rng = random.Random(0)
    return [{n: rng.choice(domains[n]) for n in names} for _ in range(MAX_COMBINATIONS)]


def _describe(assignment: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(assignment.items())) or "(no variables)"


def check_expressions(space: SearchSpaceSpec, file: str, *, prefix: str = "", env: dict | None = None) -> None:
    """Raise ConfigError for the first condition or constraint that cannot be evaluated.

    ``env`` holds the study's values of ``gpus``, ``gpus_per_node`` and ``nodes``; without it
    (a search-space file checked alone) expressions that use them are left to the study check.
    """
    env = dict(env or {})
    by_var = {expr.var_name(k): k for k in space.params}
    names = list(space.params)
    jobs = []  # (key, source, variable -> knob for the names it may use)
    for i, name in enumerate(names):
        cond = space.params[name].condition
        if cond:
            earlier = {expr.var_name(k) for k in names[:i]}
            jobs.append((f"{prefix}params.{name}.condition", cond, earlier, False))
    for i, c in enumerate(space.constraints):
        jobs.append((f"{prefix}constraints[{i}]", c, set(by_var), True))
    for key, source, settable, as_constraint in jobs:
        used = expr.names(source) - {"None", "True", "False"}
        if (used - set(by_var)) - set(env):
            continue  # names the study supplies (or unknown names: reported by the name check)
        domains: dict[str, list] = {}
        fixed = {}
        for var in used:
            if var in by_var and var in settable:
                domains[var] = _domain(space, by_var[var], as_constraint=as_constraint)
            elif var in by_var:
                # a condition sees knobs listed after its own as unset (they are sampled later)
                fixed[var] = EFFECTIVE_DEFAULTS.get(by_var[var]) if as_constraint else None
            else:
                fixed[var] = env[var]
        for assignment in _combinations(domains):
            variables = {**fixed, **assignment}
            try:
                expr.evaluate(source, variables)
            except expr.ExpressionError as exc:
                hint = ""
                nones = sorted(k for k, v in variables.items() if v is None)
                if nones:
                    hint = (f"; {', '.join(nones)} is None when not set (its condition does not hold or it is "
                            f"listed later): guard it, e.g. '{nones[0]} is None or ...'")
                raise ConfigError(f"{exc} when {_describe(variables)}{hint}", file=file, key=key) from None
