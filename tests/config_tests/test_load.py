"""Study / search-space loading: shipped files load; bad input names the file and the key."""

from pathlib import Path

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.config import expr
from tuner.config.load import load_search_space, load_study, spec_hash, validate_file

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((REPO / "studies").glob("*.yaml")) + sorted((REPO / "search_spaces").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_shipped_file_validates(path):
    assert validate_file(str(path)) in ("study", "search space", "comparison")


def test_h200_study_resolves_profile_and_space():
    study = load_study("h200")
    assert study.model == "glm-5.1" and study.hardware.gpu == "h200" and study.hardware.total_gpus == 8
    assert study.slo.p90_ttft_s == 30 and study.slo.p90_tpot_s == 0.05 and study.target_users == 50
    assert "attn-dp-size" in study.space().params
    assert study.workload_profile().max_context_tokens <= 202752
    assert study.baseline["tp-size"] == 8


def test_spec_hash_ignores_budget_but_not_slo():
    a = load_study("h200")
    assert spec_hash(a) == spec_hash(a.model_copy(update={"trials": 99}))
    assert spec_hash(a) != spec_hash(a.model_copy(update={"target_users": 51}))
    # how the search steps inside a bracket does not change the capacity it concludes
    midpoint = a.model_copy(update={"capacity": a.capacity.model_copy(update={"bisect": "midpoint"})})
    assert a.capacity.bisect == "interpolate" and spec_hash(a) == spec_hash(midpoint)


def _study_variant(tmp_path, mutate, name="s.yaml"):
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    mutate(data)
    (tmp_path / "studies").mkdir(exist_ok=True)
    (tmp_path / "search_spaces").mkdir(exist_ok=True)
    (tmp_path / "search_spaces/glm-5.1.yaml").write_text((REPO / "search_spaces/glm-5.1.yaml").read_text())
    p = tmp_path / "studies" / name
    p.write_text(yaml.safe_dump(data))
    return p


def _space(data):
    return data


BAD_STUDIES = [
    ("unknown top key", lambda d: d.update(trails=3), "trails: unknown key (did you mean 'trials'?)"),
    ("misspelt slo key", lambda d: d["slo"].update(p90_ttf_s=1), "did you mean 'p90_ttft_s'"),
    ("unknown model", lambda d: d.update(model="glm-9"), "model: unknown model 'glm-9'"),
    ("unknown gpu", lambda d: d["hardware"].update(gpu="a100"), "hardware.gpu: unknown GPU 'a100'"),
    ("too few gpus", lambda d: d["hardware"].update(gpus_per_node=4), "tp-size 8 needs more GPUs"),
    ("negative slo", lambda d: d["slo"].update(p90_ttft_s=-1), "slo.p90_ttft_s"),
    ("missing slo", lambda d: d.pop("slo"), "slo: required key is missing"),
    ("bad sampler", lambda d: d.update(sampler="bayes"), "sampler"),
    ("start above max", lambda d: d.update(capacity={"start_users": 500, "max_users": 100}), "start_users (500) > max_users (100)"),
    ("max below target", lambda d: d.update(capacity={"max_users": 10}), "max_users (10) is below target_users"),
    ("bad bisection", lambda d: d.update(capacity={"bisect": "halfway"}), "capacity.bisect"),
    ("unknown workload", lambda d: d.update(workload="chatbot"), "unknown workload profile 'chatbot'"),
    ("unknown search space", lambda d: d.update(search_space="glm-6"), "unknown search space 'glm-6'"),
    ("baseline unknown flag", lambda d: d["baseline"].update({"tp": 8}), "baseline.tp: unknown knob"),
    ("baseline no checkpoint", lambda d: d["baseline"].update({"quantization": "mxfp4"}), "baseline.quantization"),
    ("inline space unknown knob", lambda d: d.update(search_space={"params": {"tp-sze": {"values": [8]}}}),
     "search_space.params.tp-sze: unknown knob (did you mean 'tp-size'?)"),
    ("inline space empty values", lambda d: d.update(search_space={"params": {"tp-size": {"values": []}}}), "'values' is empty"),
    ("inline space empty range", lambda d: d.update(search_space={"params": {"mem-fraction-static": {"low": 0.9, "high": 0.8}}}), "empty range"),
    ("inline space bad choice", lambda d: d.update(search_space={"params": {"schedule-policy": {"values": ["fifo"]}}}), "invalid value 'fifo'"),
    ("inline space bad quant", lambda d: d.update(search_space={"params": {"quantization": {"values": ["awq"]}}}), "invalid value 'awq'"),
    ("quant without checkpoint", lambda d: d.update(search_space={"params": {"quantization": {"values": ["mxfp4"]}}}), "no checkpoint for quantization 'mxfp4'"),
    ("bad condition name", lambda d: d.update(search_space={"params": {"ep-size": {"values": [1, 8], "condition": "attn_dp > 1"}}}), "names unknown ['attn_dp']"),
    ("bad constraint syntax", lambda d: d.update(search_space={"params": {"tp-size": {"values": [8]}}, "constraints": ["tp_size %% 2"]}), "invalid expression"),
    ("constraint call", lambda d: d.update(search_space={"params": {"tp-size": {"values": [8]}}, "constraints": ["__import__('os')"]}), "not allowed"),
    ("int knob float", lambda d: d.update(search_space={"params": {"tp-size": {"values": [2.5]}}}), "must be an integer"),
    ("fraction above one", lambda d: d.update(search_space={"params": {"mem-fraction-static": {"values": [1.5]}}}), "between 0 and 1"),
]


@pytest.mark.parametrize("label,mutate,expected", BAD_STUDIES, ids=[b[0] for b in BAD_STUDIES])
def test_bad_study_names_file_and_key(tmp_path, monkeypatch, label, mutate, expected):
    monkeypatch.chdir(tmp_path)
    path = _study_variant(tmp_path, mutate)
    with pytest.raises(ConfigError) as info:
        load_study(str(path))
    assert info.value.exit_code == 2
    msg = str(info.value)
    assert expected in msg
    assert "s.yaml" in msg or "glm" in msg  # the file is named


def test_malformed_yaml_reports_line(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("name: x\nslo: {p90_ttft_s: 3\n")
    with pytest.raises(ConfigError, match=r"x.yaml: malformed YAML at line \d+"):
        load_study(str(p))


def test_top_level_must_be_mapping(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_search_space(str(p))


def test_expression_sandbox():
    assert expr.evaluate("tp_size % attn_dp_size == 0", {"tp_size": 8, "attn_dp_size": 4}) is True
    assert expr.evaluate("ep_size is None or ep_size > 1", {"ep_size": None}) is True
    assert expr.evaluate("x > 1", {"x": None}) is False  # None compares as "does not hold"
    for bad in ("open('f')", "a.b", "x[0]", "lambda: 1"):
        with pytest.raises(expr.ExpressionError):
            expr.parse(bad)
