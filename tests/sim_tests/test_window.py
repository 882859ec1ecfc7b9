"""Which requests a simulated load point measures: those started in the window, and the warm-up's
still waiting for their first token when it opens (tuner.workload.metrics.counted_in_window)."""

from __future__ import annotations

import math

from tuner.config.load import load_study
from tuner.sim import simulate_load_point
from tuner.workload.session import LogNormal, WorkloadProfile


def _fixed(v):
    return LogNormal(mu=math.log(v), sigma=0.0, min=v, max=v)


def test_requests_queued_since_the_warm_up_are_measured():
    # 32 users, 4 running at a time, ~4 s a request: at the window's start (5 s) at most three waves
    # of 4 have had their first token; the rest of the first turns are still queued
    profile = WorkloadProfile(name="queue", system_prefix_tokens=0, first_turn_context_tokens=_fixed(2000),
                              new_tokens_per_turn=_fixed(100), output_tokens_per_turn=_fixed(200),
                              turns_per_session=_fixed(2), think_time_s=_fixed(1))
    flags = {"tp-size": 8, "quantization": "modelopt_fp4", "max-running-requests": 4}
    m = simulate_load_point("glm-5.1", "h200", 8, flags, {}, profile, 32, warmup_s=5, duration_s=20,
                            host_memory_gb=2048)
    carried = m.extra["carried_in_requests"]
    assert 32 - 12 <= carried < 32
    assert m.requests > carried and m.errors == 0
    assert m.p50_ttft_s > 5  # every counted request queued behind the warm-up's


def test_lpm_starvation_is_a_miss_not_a_fast_window():
    # SGLang's lpm serves the longest cached prefixes first; with 32 running requests and 256 users the
    # sessions whose turns are cached keep winning and the rest wait from the warm-up on. Counting only
    # the requests started in the window read this as 17 s P90 TTFT (capacity 256 users in a study)
    study = load_study("h200")
    hw = study.hardware
    flags = {"tp-size": 8, "quantization": "modelopt_fp4", "attn-dp-size": 2, "ep-size": 1,
             "max-running-requests": 32, "chunked-prefill-size": 4096, "mem-fraction-static": 0.85,
             "schedule-policy": "lpm", "enable-hierarchical-cache": True, "hicache-ratio": 2.0}
    knobs = {"router-policy": "cache_aware", "moe-tile-configs": "tuned"}
    m = simulate_load_point(study.model, hw.gpu, hw.gpus_per_node, flags, knobs, study.workload_profile(), 256,
                            warmup_s=study.measurement.warmup_s, duration_s=study.measurement.duration_s,
                            seed=study.seed, host_memory_gb=hw.host_memory_gb)
    assert m.extra["carried_in_requests"] > 100
    assert m.p90_ttft_s > study.slo.p90_ttft_s
    assert not m.meets(study.slo.p90_ttft_s, study.slo.p90_tpot_s)
