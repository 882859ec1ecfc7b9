"""Conditions and constraints evaluated over the space's values when a file is loaded."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.config.exprcheck import MAX_COMBINATIONS, check_expressions
from tuner.config.schema import SearchSpaceSpec


def _space(params, constraints=()):
    return SearchSpaceSpec.model_validate({"engine": "transformers", "params": params,
                                           "constraints": list(constraints)})


def test_a_sound_space_passes():
    check_expressions(_space({"a": {"values": [1, 2]}, "b": {"values": [0, 4], "condition": "a > 1"}},
                             ["b is None or a % (b + 1) >= 0"]), "f.yaml")


def test_a_condition_sees_later_knobs_as_unset():
    space = _space({"a": {"values": [1, 2], "condition": "b + 1 > 0"}, "b": {"values": [1]}})
    with pytest.raises(ConfigError) as info:
        check_expressions(space, "f.yaml")
    assert info.value.key == "params.a.condition" and "b=None" in str(info.value)
    assert "guard it" in str(info.value)


def test_unset_parallel_knobs_take_their_default_in_constraints():
    space = SearchSpaceSpec.model_validate({"params": {"tp-size": {"values": [2, 4], "condition": "gpus > 1"}},
                                            "constraints": ["8 % tp_size == 0"]})
    check_expressions(space, "f.yaml", env={"gpus": 1, "gpus_per_node": 1, "nodes": 1})  # tp_size None -> 1


def test_expressions_with_study_names_wait_for_the_study():
    space = _space({"a": {"values": [1]}}, ["a % (gpus - 8) == 0"])
    check_expressions(space, "f.yaml")  # alone: the GPU count is not known
    with pytest.raises(ConfigError, match=r"modulo by zero when a=1, gpus=8"):
        check_expressions(space, "f.yaml", env={"gpus": 8, "gpus_per_node": 8, "nodes": 1})


def test_large_spaces_are_sampled_deterministically():
    params = {f"k{i}": {"values": list(range(10))} for i in range(5)}  # 100,000 combinations
    space = _space(params, ["k0 + k1 + k2 + k3 + k4 >= 0"])
    assert 10**5 > MAX_COMBINATIONS
    check_expressions(space, "f.yaml")
    broken = _space(params, ["1 / (k0 + k1 + k2 + k3 + k4 - 45 + 45) >= 0"])  # fails only at all zeros
    try:
        check_expressions(broken, "f.yaml")
    except ConfigError:
        pytest.fail("the all-zero combination is not in a 5,000 sample of 100,000 (or the sample changed)")
