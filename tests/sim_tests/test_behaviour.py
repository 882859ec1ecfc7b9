"""GLM-5.1 on 8 GPUs with a coding-agent workload: the effects the simulator must reproduce."""

import pytest

from tuner.errors import TrialError
from tuner.sim import simulate_load_point
from tuner.bench.simulator_cost import CODING_AGENT

# the coding-agent shape of the brief (5k prefix, 8k first turn, ~1.2k new tokens per turn up to
# 20k, 300 output, 15 turns up to 40, 10 s think time), shared with the CPU-cost benchmark
AGENT = CODING_AGENT
FP4 = {"quantization": "modelopt_fp4"}
TP8 = {"tp-size": 8, **FP4}
DP8 = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "kv-cache-dtype": "fp8_e4m3", "enable-hierarchical-cache": True,
       **FP4}
CACHE_AWARE = {"router-policy": "cache_aware", "moe-tile-configs": "tuned"}
SLO_TTFT, SLO_TPOT = 30.0, 0.050


def sim(gpu, flags, knobs, users=50, duration_s=600, seed=0):
    return simulate_load_point("glm-5.1", gpu, 8, flags, knobs, AGENT, users,
                               warmup_s=120, duration_s=duration_s, seed=seed)


@pytest.fixture(scope="module")
def tp8():
    return sim("h200", TP8, {})


@pytest.fixture(scope="module")
def dp8():
    return sim("h200", DP8, CACHE_AWARE)


def test_tp8_misses_ttft_through_reprefill_while_dp_attention_meets_ttft(tp8, dp8):
    assert dp8.kv_capacity_tokens_total > 3 * tp8.kv_capacity_tokens_total
    assert tp8.p90_ttft_s > SLO_TTFT
    assert tp8.extra["reprefill_tokens"] > 20 * dp8.extra["reprefill_tokens"]
    assert tp8.prefix_cache_hit_rate < 0.5 < dp8.prefix_cache_hit_rate
    assert dp8.p90_ttft_s < SLO_TTFT / 10, dp8.p90_ttft_s
    # TPOT sits at the 50 ms target (50-56 ms over seeds 0-2 with the tile speedups SGLang's own
    # kernels measured; 47-52 ms with the 1.3-1.6x of the earlier look-alike kernel): every rank's
    # prefill chunk stalls the decode of all attention-DP ranks; TP8 is far beyond it
    assert dp8.p90_tpot_s < 1.15 * SLO_TPOT < 2 * SLO_TPOT < tp8.p90_tpot_s, (dp8.p90_tpot_s, tp8.p90_tpot_s)


def test_b200_dp_attention_serves_more_users_than_h200():
    users = 100
    h200 = sim("h200", DP8, CACHE_AWARE, users=users, duration_s=300)
    b200 = sim("b200", DP8, CACHE_AWARE, users=users, duration_s=300)
    assert not h200.meets(SLO_TTFT, SLO_TPOT)
    assert b200.meets(SLO_TTFT, SLO_TPOT)


def test_cache_aware_routing_beats_round_robin_under_dp_attention(dp8):
    rr = sim("h200", DP8, {"router-policy": "round_robin", "moe-tile-configs": "tuned"})
    assert dp8.prefix_cache_hit_rate > rr.prefix_cache_hit_rate + 0.3
    assert dp8.p90_ttft_s < rr.p90_ttft_s
    assert dp8.p90_tpot_s < rr.p90_tpot_s
    assert rr.extra["reprefill_tokens"] > 10 * dp8.extra["reprefill_tokens"]


def test_hicache_lowers_ttft_when_the_gpu_cache_overflows(tp8):
    hi = sim("h200", {**TP8, "enable-hierarchical-cache": True, "hicache-ratio": 4.0}, {})
    assert tp8.extra["evicted_tokens"] > 0
    assert hi.extra["hicache_load_tokens"] > 0
    assert hi.p90_ttft_s < tp8.p90_ttft_s / 2
    assert hi.p50_ttft_s < tp8.p50_ttft_s / 2


def test_fp8_checkpoint_under_dp_attention_leaves_little_kv_on_h200():
    fp8 = sim("h200", {**DP8, "quantization": "fp8"}, CACHE_AWARE, users=20, duration_s=120)
    fp4 = sim("h200", DP8, CACHE_AWARE, users=20, duration_s=120)
    assert fp8.kv_capacity_tokens_total < fp4.kv_capacity_tokens_total / 4


def test_tuned_moe_tiles_gain_on_h200_only_what_sglangs_own_kernels_measured():
    """A decode step of 64 requests per attention-DP rank, tuned tiles against the defaults. (At a
    load point the few percent move the batches the scheduler forms, and P50 TPOT by +-3% either way.)"""
    from tuner.catalog import get_gpu, get_model
    from tuner.sim.simulate import _prepare
    from tuner.sim.steptime import RankWork

    def step_s(gpu, tiles):
        sm = _prepare(get_model("glm-5.1"), get_gpu(gpu), 8, DP8, {"router-policy": "cache_aware",
                                                                    "moe-tile-configs": tiles},
                      1, None, None, "0.5.23")[3]
        ranks = [RankWork(decode_reqs=64, decode_ctx_tokens=64 * 20000, decode_max_ctx_tokens=40000,
                          decode_min_ctx_tokens=5000) for _ in range(8)]
        return sm.gpu_time(ranks)

    # H200's speedups are SGLang's own fused-MoE kernels tuned against what it runs itself
    # (results/kernels/h200/sglang/: 1.00-1.24x a call); GLM-5.1's shape was not tuned, so it gets
    # their median (1.01-1.08x): a few percent of a step at most, where the earlier look-alike
    # kernel's 1.3-1.6x made it ~10%
    h200_tuned, h200_default = step_s("h200", "tuned"), step_s("h200", "default")
    assert 0.93 * h200_default < h200_tuned < h200_default
    assert step_s("b200", "tuned") > 0.9 * step_s("b200", "default")


def test_not_fitting_configuration_raises_trial_error():
    with pytest.raises(TrialError) as exc:
        sim("h200", {"tp-size": 8}, {}, users=4, duration_s=10)
    assert exc.value.failure_class == "oom"
    with pytest.raises(TrialError) as exc:
        sim("h200", {"tp-size": 8, "attn-dp-size": 3, **FP4}, {}, users=4, duration_s=10)
    assert exc.value.failure_class == "infeasible"


def test_same_seed_same_result_and_window_accounting():
    a = sim("h200", DP8, CACHE_AWARE, users=10, duration_s=60)
    b = sim("h200", DP8, CACHE_AWARE, users=10, duration_s=60)
    assert a.to_dict() == b.to_dict()
    assert a.requests > 0 and a.errors == 0 and a.valid
    assert a.p50_itl_s is not None and a.p50_itl_s <= a.p90_itl_s
