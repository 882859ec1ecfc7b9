"""Property tests over the spec schema and the parsers under it (hypothesis).

- Every number in every spec model has a finite range stated in the JSON schema; every value in
  it passes that field's check, and every value outside it (below, above, NaN, infinities, bools,
  strings) is refused with an error on that field stating the whole range.
- A name is accepted exactly when it follows the identifier rule, and an accepted name always
  stays inside the directory it is joined to.
- Expressions of any shape parse or fail with ExpressionError, and evaluate or fail with
  ExpressionError, whatever the variables hold: never another exception.
- Bounded YAML reads what PyYAML reads for documents within the limits, refuses duplicate keys,
  and on any text raises nothing but ConfigError.
- A numeric range either is refused or has a grid of at most MAX_GRID_POINTS_PER_PARAM values.
"""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from tests.reliability_tests._util import TINY_WORKLOAD
from tuner import limits, paths, safeyaml
from tuner.errors import ConfigError
from tuner.config import expr
from tuner.config.schema import (
    CapacitySpec, HardwareSpec, MeasurementSpec, ParamSpec, SearchSpaceSpec, SLOSpec, StudySpec,
)
from tuner.workload.session import LogNormal, WorkloadProfile

STUDY = {"name": "p", "model": "glm-5.1", "hardware": {"gpu": "h200"}, "workload": "coding-agent",
         "search_space": "glm-5.1", "slo": {"p90_ttft_s": 30, "p90_tpot_s": 0.05}}
BASES: dict[type[BaseModel], dict] = {
    StudySpec: STUDY, HardwareSpec: {"gpu": "h200"}, SLOSpec: STUDY["slo"], CapacitySpec: {}, MeasurementSpec: {},
    LogNormal: {"mu": 1.0, "sigma": 0.5}, WorkloadProfile: TINY_WORKLOAD, ParamSpec: {"low": 1, "high": 2},
    SearchSpaceSpec: {"params": {"tp-size": {"values": [8]}}},
}


def _numeric_fields():
    """(model, field, lo, hi, lo_open, integer) for every number of every spec model."""
    out = []
    for model in BASES:
        for field, prop in model.model_json_schema()["properties"].items():
            branches = prop.get("anyOf", [prop])
            for b in branches:
                if b.get("type") in ("integer", "number"):
                    lo = b.get("minimum", b.get("exclusiveMinimum"))
                    out.append((model, field, lo, b.get("maximum"), "exclusiveMinimum" in b, b["type"] == "integer"))
    return out


NUMERIC = _numeric_fields()
IDS = [f"{m.__name__}.{f}" for m, f, *_ in NUMERIC]


def test_every_number_has_a_finite_range_in_the_schema():
    assert len(NUMERIC) >= 25
    unbounded = [i for i, (_, _, lo, hi, _, _) in zip(IDS, NUMERIC)
                 if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi))]
    assert not unbounded, f"numbers without a finite range: {unbounded}"


def _errors_at(exc: ValidationError, field: str) -> list[dict]:
    return [e for e in exc.errors() if e["loc"] and e["loc"][0] == field]


def _check(model, field, value) -> list[dict]:
    try:
        model.model_validate({**BASES[model], field: value})
    except ValidationError as exc:
        return _errors_at(exc, field)
    return []


@pytest.mark.parametrize("model, field, lo, hi, lo_open, integer", NUMERIC, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_values_inside_the_range_pass_and_outside_are_refused_with_the_range(model, field, lo, hi, lo_open,
                                                                             integer, data):
    inside = (st.integers(math.ceil(lo) + (1 if lo_open and float(lo).is_integer() else 0), math.floor(hi))
              if integer else st.floats(lo, hi, exclude_min=lo_open, allow_nan=False))
    v = data.draw(inside, label="inside")
    assert _check(model, field, v) == [], (field, v)  # cross-field rules may still refuse the model
    span = max(abs(hi), 1.0)
    outside = st.one_of(
        st.floats(hi + span * 1e-6 + 1e-9, hi * 10 + 10, allow_nan=False, allow_infinity=False),
        st.floats(-abs(hi) * 10 - 10, lo, exclude_max=not lo_open, allow_nan=False),
        st.sampled_from([math.inf, -math.inf, math.nan, True, False, "5", [1]]),
    )
    bad = data.draw(outside, label="outside")
    errors = _check(model, field, bad)
    assert errors, f"{model.__name__}.{field} accepted {bad!r}"
    msg = errors[0]["msg"]
    if not isinstance(bad, (bool, str, list)):
        rng = limits.range_text(lo, hi, lo_open=lo_open)  # the message adds the unit after it
        assert rng in msg, (msg, rng)


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(st.text(max_size=80), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,70}", fullmatch=True)))
def test_a_name_is_accepted_exactly_by_the_rule_and_stays_inside(name, tmp_path_factory):
    problem = limits.name_problem(name)
    ok = (0 < len(name) <= limits.MAX_NAME_CHARS and ".." not in name
          and all(c.isascii() and (c.isalnum() or c in "._-") for c in name) and name[0].isalnum())
    assert (problem is None) == ok, (name, problem)
    try:
        StudySpec.model_validate({**STUDY, "name": name})
        accepted = True
    except ValidationError as exc:
        accepted = False
        assert _errors_at(exc, "name"), exc
    assert accepted == ok
    if ok:
        root = tmp_path_factory.getbasetemp()
        assert paths.trial_dir(root, name, 1).is_relative_to(root.resolve())


_TOKENS = ["tp_size", "ep_size", "x", "None", "True", "False", "0", "1", "8", "2.5", "1e308", "'a'", "'fp8'",
           "+", "-", "*", "/", "//", "%", "==", "!=", "<", "<=", ">", ">=", "and", "or", "not", "in", "is",
           "(", ")", "[", "]", ",", "(", ")", "99999999999999999999999999"]


@settings(max_examples=500, deadline=None)
@given(tokens=st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=40),
       env=st.fixed_dictionaries({"tp_size": st.one_of(st.none(), st.integers(-3, 9)),
                                  "ep_size": st.one_of(st.none(), st.integers(0, 8), st.floats(allow_nan=True)),
                                  "x": st.one_of(st.none(), st.text(max_size=3), st.booleans(), st.integers())}))
def test_expressions_fail_only_with_expression_errors(tokens, env):
    source = " ".join(tokens)
    try:
        expr.parse(source)
    except expr.ExpressionError:
        return
    try:
        expr.evaluate(source, env)
    except expr.ExpressionError:
        pass


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(1, 400), op=st.sampled_from(["not ", "-", "(", "tp_size * "]))
def test_deep_expressions_are_refused_not_recursed(depth, op):
    source = op * depth + "1" + (")" * depth if op == "(" else "")
    try:
        expr.evaluate(source, {"tp_size": 2})
    except expr.ExpressionError:
        assert depth > 1 or op == "("


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
_documents = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                            st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                          max_leaves=40)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.text(min_size=1, max_size=8), _documents, min_size=1, max_size=6))
def test_bounded_yaml_reads_what_pyyaml_reads(doc):
    text = yaml.safe_dump(doc, sort_keys=False)
    assume(text.count("\n") < 5000)
    try:
        got = safeyaml.loads(text, file="t.yaml")
    except ConfigError as exc:
        assert "nests more than" in str(exc) or "expands to more than" in str(exc), exc
        return
    assert got == yaml.safe_load(text)


@settings(max_examples=100, deadline=None)
@given(doc=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _scalars, min_size=1, max_size=6),
       pick=st.integers(0, 100))
def test_a_duplicated_key_is_always_refused(doc, pick):
    key = sorted(doc)[pick % len(doc)]
    text = yaml.safe_dump(doc, sort_keys=False) + yaml.safe_dump({key: "again"})
    with pytest.raises(ConfigError, match=f"duplicate key '{key}'") as info:
        safeyaml.loads(text, file="t.yaml")
    assert info.value.file == "t.yaml"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_any_text_is_read_or_refused_with_a_config_error(text):
    try:
        safeyaml.loads(text, file="t.yaml")
    except ConfigError:
        pass


@settings(max_examples=300, deadline=None)
@given(low=st.floats(-1e6, 1e6), span=st.floats(0, 1e6), step=st.one_of(st.none(), st.floats(1e-15, 1e6)),
       log=st.booleans())
def test_a_range_is_refused_or_has_a_bounded_grid(low, span, step, log):
    try:
        p = ParamSpec(low=low, high=low + span, step=step, log=log)
    except ValidationError:
        return
    assert len(p.grid()) <= limits.MAX_GRID_POINTS_PER_PARAM + 1
