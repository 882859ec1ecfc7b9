"""Each vocabulary is listed once (tuner.vocabulary); the schema, the CLI and the registries are
built from it and cover every name."""

from __future__ import annotations

import typing

import pytest

from tuner.backends.router import ROUTER_POLICIES
from tuner.cli.study import start
from tuner.evaluation import registry
from tuner.sim.router import POLICIES
from tuner.config.knobs import ENGINES, SGLANG_KNOBS
from tuner.config.schema import SearchSpaceSpec, StudySpec
from tuner.study import samplers
from tuner.vocabulary import AUTO_BACKEND, BackendKind, Engine, RouterPolicy, Sampler, names


def _literal(model, field) -> tuple:
    return typing.get_args(model.model_fields[field].annotation)


def test_the_schema_accepts_exactly_the_vocabularies():
    assert _literal(StudySpec, "backend") == names(BackendKind, AUTO_BACKEND)
    assert _literal(StudySpec, "sampler") == names(Sampler)
    assert _literal(SearchSpaceSpec, "engine") == names(Engine) == ENGINES


def test_the_cli_offers_exactly_the_backend_kinds():
    (backend,) = [p for p in start.params if p.name == "backend"]
    assert tuple(backend.type.choices) == names(BackendKind, AUTO_BACKEND)


@pytest.mark.parametrize("kind", list(BackendKind))
def test_every_backend_kind_has_its_evaluator(kind):
    assert kind in registry._KINDS
    assert registry.get_evaluator(kind).kind == kind


@pytest.mark.parametrize("name", list(Sampler))
def test_every_sampler_has_its_factory(name):
    assert set(samplers._FACTORIES) == set(Sampler)
    assert samplers.make_sampler(name, seed=0) is not None


def test_router_policies_agree_everywhere():
    assert ROUTER_POLICIES == names(RouterPolicy)
    assert POLICIES[:len(RouterPolicy)] == names(RouterPolicy), "the simulator routes every router policy"
    assert SGLANG_KNOBS["router-policy"].choices == names(RouterPolicy), "the knob offers every policy"


def test_load_formats_agree_between_the_backend_and_the_simulator():
    from tuner.backends.sglang import LOAD_FORMATS
    from tuner.catalog.routing import LOAD_FORMAT_FLAG, random_weight_flags
    from tuner.vocabulary import LoadFormat

    assert LOAD_FORMATS == names(LoadFormat)
    assert random_weight_flags({"load_format": LoadFormat.DUMMY.value}) == {LOAD_FORMAT_FLAG: "dummy"}
    assert random_weight_flags({"load_format": LoadFormat.AUTO.value}) == {}
