"""The router's expert pool under random weights (tuner.sim.routing) and what it does to MoE time."""

import json

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.catalog.hf import hf_config_of
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.sim.calibrate import load_calibration
from tuner.sim.routing import (COLLAPSED_GATE_EXTRA_EXPERTS, has_biased_gate, random_weight_flags,
                               routed_expert_pool)
from tuner.sim.steptime import StepTimeModel

DUMMY = {"load-format": "dummy"}


def _step_model(name, flags):
    m, g = get_model(name), get_gpu("h200")
    flags = {"quantization": "fp8", **flags}
    plan = plan_memory(m, g, 8, {"tp-size": 8, **flags})
    return StepTimeModel(m, g, resolve_checkpoint(m, "fp8"), parse_layout(m, {"tp-size": 8, **flags}, 8),
                         plan.bytes_per_token, load_calibration("h200"), gpus_per_node=8, flags=flags)


def test_only_a_biased_gate_under_random_weights_collapses():
    dsv3, qwen3 = get_model("deepseek-v3"), get_model("qwen3-30b-a3b")
    assert has_biased_gate(dsv3) and not has_biased_gate(qwen3)
    # measured on the H200: 9-10 routed experts of 256 for top-8, whatever the batch
    assert routed_expert_pool(dsv3, DUMMY) == dsv3.experts_per_token + COLLAPSED_GATE_EXTRA_EXPERTS == 10
    assert routed_expert_pool(dsv3, {}) is None  # a trained router spreads its tokens
    assert routed_expert_pool(dsv3, {"load-format": "auto"}) is None
    assert routed_expert_pool(qwen3, DUMMY) is None  # softmax gate: random logits still pick apart
    assert routed_expert_pool(get_model("llama-3.1-70b"), DUMMY) is None  # dense: no router
    assert has_biased_gate(get_model("glm-5.1"))  # the same gate (not measured under random weights)


def test_a_config_json_decides_the_gate(tmp_path):
    cfg = hf_config_of(get_model("deepseek-v3"))
    cfg.update(topk_method="greedy", scoring_func="softmax", n_group=1, topk_group=1)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    greedy = get_model(str(tmp_path))
    assert not has_biased_gate(greedy) and routed_expert_pool(greedy, DUMMY) is None


def test_study_options_name_the_flag():
    assert random_weight_flags({"load_format": "dummy"}) == DUMMY
    assert random_weight_flags({"load_format": "auto"}) == {} == random_weight_flags(None)


def test_a_collapsed_router_reads_few_experts_in_decode_and_computes_the_same_in_prefill():
    uniform, collapsed = _step_model("deepseek-v3", {}), _step_model("deepseek-v3", DUMMY)
    # decode: 64 uniformly routed tokens touch ~222 of the 256 experts, the collapsed router 10; the
    # step is bound by the expert weights read
    assert collapsed.moe_time(64) < 0.5 * uniform.moe_time(64)
    assert collapsed.moe_time(1) == pytest.approx(uniform.moe_time(1), rel=0.35)
    # prefill: the same tokens x top-k of compute either way
    assert collapsed.moe_time(16384) == pytest.approx(uniform.moe_time(16384), rel=0.15)
    # and the pool does not grow with the batch, as measured (10-11 experts at 64 and 16,384 tokens)
    assert collapsed.moe_time(64) < 3 * collapsed.moe_time(8)
