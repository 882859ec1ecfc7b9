"""tuner.limits: bounded numbers and names, with the whole range in every message."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from tuner import limits


class M(BaseModel):
    users: limits.Users = 1
    seconds: limits.WindowSeconds = 1.0
    name: limits.Name = "x"


@pytest.mark.parametrize("field, value, message", [
    ("users", 0, "must be between 1 and 100000 users"),
    ("users", 10**12, "must be between 1 and 100000 users"),
    ("users", 2.5, "must be an integer between 1 and 100000 users"),
    ("users", True, "not bool"),
    ("users", "5", "not str"),
    ("seconds", 0, "must be greater than 0 and at most 86400 s"),
    ("seconds", math.inf, "must be a finite number greater than 0 and at most 86400 s"),
    ("seconds", math.nan, "must be a finite number"),
    ("name", "a/b", "contains a path separator"),
    ("name", "", "must not be empty"),
    ("name", "a" * 65, "at most 64"),
])
def test_refusals_state_the_rule(field, value, message):
    with pytest.raises(ValidationError) as info:
        M(**{field: value})
    (err,) = info.value.errors()
    assert err["loc"] == (field,) and message in err["msg"]


def test_edges_of_the_ranges_are_inside():
    assert M(users=1).users == 1 and M(users=limits.MAX_USERS).users == limits.MAX_USERS
    assert M(seconds=limits.MAX_WINDOW_S).seconds == limits.MAX_WINDOW_S
    assert M(users=4.0).users == 4  # a whole float is an integer
    assert M(name="a" * 64).name == "a" * 64


def test_the_json_schema_states_the_range():
    props = M.model_json_schema()["properties"]
    assert props["users"]["minimum"] == 1 and props["users"]["maximum"] == limits.MAX_USERS
    assert props["seconds"]["exclusiveMinimum"] == 0 and props["seconds"]["maximum"] == limits.MAX_WINDOW_S
    assert props["name"]["maxLength"] == limits.MAX_NAME_CHARS


def test_check_number_for_values_outside_fields():
    assert limits.check_number(5, 0, 10) is None
    assert "between 0 and 10" in limits.check_number(11, 0, 10)
    assert "an integer" in limits.check_number(1.5, 0, 10, integer=True)
