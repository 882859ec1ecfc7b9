"""What a collapsed router (random weights, biased gate: tuner.catalog.routing) does to MoE time."""

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.sim.calibrate import load_calibration
from tuner.sim.steptime import StepTimeModel

DUMMY = {"load-format": "dummy"}


def _step_model(name, flags):
    m, g = get_model(name), get_gpu("h200")
    flags = {"quantization": "fp8", **flags}
    plan = plan_memory(m, g, 8, {"tp-size": 8, **flags})
    return StepTimeModel(m, g, resolve_checkpoint(m, "fp8"), parse_layout(m, {"tp-size": 8, **flags}, 8),
                         plan.bytes_per_token, load_calibration("h200"), gpus_per_node=8, flags=flags)


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
