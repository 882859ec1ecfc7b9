"""At trial time a condition or constraint that cannot be evaluated makes the trial infeasible
with the reason; it never fails the study."""

from __future__ import annotations

from tuner.config.schema import SearchSpaceSpec
from tuner.study import space as space_mod

ENV = {"gpus": 8, "gpus_per_node": 8, "nodes": 1}


def _space(params, constraints=()):
    return SearchSpaceSpec.model_validate({"engine": "transformers", "params": params,
                                           "constraints": list(constraints)})


def test_a_constraint_that_cannot_be_evaluated_is_a_violation_with_the_reason():
    space = _space({"f": {"low": 0.8, "high": 0.9}}, ["1 / (f - 0.85) > -1e9"])
    assert space_mod.violated_constraints(space, {"f": 0.86}, ENV) == []
    (reason,) = space_mod.violated_constraints(space, {"f": 0.85}, ENV)
    assert "cannot be evaluated" in reason and "division by zero" in reason


def test_a_condition_that_cannot_be_evaluated_does_not_hold_and_is_reported():
    space = _space({"f": {"low": 0.8, "high": 0.9}, "g": {"values": [1, 2], "condition": "1 / (f - 0.85) > 0"}})
    assert space_mod.condition_holds(space, "g", {"f": 0.85}, ENV) is False
    (reason,) = space_mod.violated_constraints(space, {"f": 0.85, "g": None}, ENV)
    assert reason.startswith("condition of g cannot be evaluated")
    assert space_mod.violated_constraints(space, {"f": 0.9, "g": 1}, ENV) == []
