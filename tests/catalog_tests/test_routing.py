"""The router's expert pool under random weights (tuner.catalog.routing)."""

import json

from tuner.catalog import get_model
from tuner.catalog.hf import hf_config_of
from tuner.catalog.routing import (COLLAPSED_GATE_EXTRA_EXPERTS, has_biased_gate, random_weight_flags,
                                   routed_expert_pool)

DUMMY = {"load-format": "dummy"}


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
