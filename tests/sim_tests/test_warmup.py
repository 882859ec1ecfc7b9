"""Fresh-server stalls: their schedule from the measured statistics, where the engine puts them,
and that only a deployment's first load point whose window overlaps them is changed."""

import json
import contextlib
import copy
import math

import pytest

from tests.conftest import REPO
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory
from tuner.sim import simulate_load_point
from tuner.sim.cache import SessionPrefixCache
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.engine import Rank, ReplicaEngine, Req, Stats
from tuner.sim.simulate import build_step_model, scheduler_rules
from tuner.sim.warmup import (JIT_FIRST_PREFILL_TOKENS, JIT_MODULE_BUILD_S, LAUNCH_WARMUP_PROMPT_TOKENS,
                               MOE_CONFIG_KEYS, CachedKernels, KernelWarmup, ServerLinear, StallModel,
                               block_fp8_linear_shapes, default_split_m, fit_decay_s, kernel_warmup, linear_variant,
                               moe_config_key, moe_variant, server_linears, shipped_groups, shipped_linear_configs,
                               shipped_linear_groups, stall_schedule, triton_moe_shape)
from tuner.workload.profiles import load_profile

QWEN = "qwen3-30b-a3b"
TRITON_EAGER = {"attention-backend": "triton", "disable-prefill-cuda-graph": True}
STALLS = {"per_start": 4.0, "stall_s": 0.8, "decay_s": 15.0}
BF16_KEY = "E=128,N=768"
# the groups the H200 fit read from its servers' logs (the configs they logged using)
H200_LOGGED_GROUPS = load_calibration("h200", context=calibration_context(
    get_model(QWEN), get_gpu("h200"), TRITON_EAGER, "0.5.17"))["fresh_server_stalls"]["moe_config_groups"]
BF16_GROUPS = H200_LOGGED_GROUPS[BF16_KEY]
QWEN_BF16_SHAPE = triton_moe_shape(get_model(QWEN), "bf16", 1, 1)


def test_the_schedule_places_round_per_start_stalls_at_the_quantiles_of_the_decaying_rate():
    m = StallModel(per_start=3.6, stall_s=0.9, decay_s=10.0)
    sched = m.schedule()
    assert len(sched) == 4  # round(3.6)
    # the expected stall time is kept: 3.6 x 0.9 s shared by the four
    assert sum(d for _, d in sched) == pytest.approx(3.6 * 0.9)
    times = [t for t, _ in sched]
    assert times == sorted(times)
    for i, t in enumerate(times):  # quantile (i + 1/2) / n of exp(-t / 10)
        assert 1 - math.exp(-t / 10.0) == pytest.approx((i + 0.5) / 4)
    assert m.expected_after(20.0) == pytest.approx(3.6 * math.exp(-2.0))
    assert StallModel(0.4, 1.0, 10.0).schedule() == []  # fewer than half a stall: none


def test_the_calibration_key_is_read_and_checked():
    assert StallModel.from_calibration({}) is None
    assert StallModel.from_calibration({"fresh_server_stalls": {"per_start": 0, "stall_s": 1, "decay_s": 5}}) is None
    assert StallModel.from_calibration({"fresh_server_stalls": STALLS}) == StallModel(4.0, 0.8, 15.0)
    with pytest.raises(ConfigError, match="decay_s"):
        StallModel.from_calibration({"fresh_server_stalls": {"per_start": 1, "stall_s": 1, "decay_s": 0}})
    with pytest.raises(ConfigError, match="numbers"):
        StallModel.from_calibration({"fresh_server_stalls": {"per_start": 1}})
    # a load point that is not its server's first goes through none of them
    assert stall_schedule({"fresh_server_stalls": STALLS}, fresh_server=False) == []
    assert len(stall_schedule({"fresh_server_stalls": STALLS}, fresh_server=True)) == 4
    # the shipped default measures none
    assert stall_schedule(load_calibration("h200"), fresh_server=True) == []


def test_the_decay_constant_comes_back_from_event_times():
    tau, horizon = 12.0, 60.0
    # event times at the quantiles of an exponential truncated at the horizon
    cut = 1 - math.exp(-horizon / tau)
    times = [-tau * math.log(1 - cut * (i + 0.5) / 200) for i in range(200)]
    assert fit_decay_s(times, horizon) == pytest.approx(tau, rel=0.03)
    assert fit_decay_s([10.0, 30.0, 50.0], horizon) == horizon  # no decay seen
    assert fit_decay_s([], horizon) == horizon


def _engine(stalls=None, kernels=None, **more_flags):
    """One Qwen3 bf16 rank on an H200 under SGLang 0.5.17's rules, with the given stall model."""
    m, g = get_model(QWEN), get_gpu("h200")
    flags = {**TRITON_EAGER, "max-total-tokens": 100_000, **more_flags}
    plan = plan_memory(m, g, 1, flags, sglang_version="0.5.17")
    layout = parse_layout(m, flags, 1)
    rules = scheduler_rules(plan, layout, flags, "0.5.17")
    sm = build_step_model(m, g, plan, layout, flags, {}, load_calibration(g.name), 1, "0.5.17")
    rank = Rank(SessionPrefixCache(plan.kv_capacity_tokens_per_gpu, plan.page_size, 0), rules)
    eng = ReplicaEngine([rank], sm, rules, stats=Stats(), on_finish=lambda r, t: None, max_jump=1, stalls=stalls,
                        kernels=kernels)
    return eng, rank


def _first_tokens(stalls, arrivals):
    eng, rank = _engine(stalls)
    reqs = []
    for i, t in enumerate(arrivals):
        while eng.clock < t and eng.has_work():
            eng.step()
        eng.clock = max(eng.clock, t)
        q = Req(i, i, 0, t, 1500, 50)
        rank.waiting.append(q)
        reqs.append(q)
    while eng.has_work():
        eng.step()
    return [q.first_t for q in reqs], eng.stats


def test_a_stall_lands_on_the_first_prefill_step_that_starts_at_or_after_its_time():
    base, _ = _first_tokens([], [0.0, 2.0])
    # due at 1 s: nothing prefills between 1 s and the second request, whose prefill takes it
    stalled, stats = _first_tokens([(1.0, 0.7)], [0.0, 2.0])
    assert stalled[0] == pytest.approx(base[0])  # the first prefill started before the stall was due
    assert stalled[1] == pytest.approx(base[1] + 0.7)
    assert stats.stalls == 1 and stats.stall_s == pytest.approx(0.7)
    # due at once: the very first prefill carries it, and the second request, arriving while the
    # server still catches up, is delayed too
    early, _ = _first_tokens([(0.0, 0.7)], [0.0, 0.1])
    later, _ = _first_tokens([], [0.0, 0.1])
    assert early[0] == pytest.approx(later[0] + 0.7)
    assert early[1] > later[1] + 0.5


def _point(cal, *, fresh, warmup_s, users=24):
    return simulate_load_point(QWEN, "h200", 1, TRITON_EAGER, {}, load_profile("coding-agent-40k"), users,
                               warmup_s=warmup_s, duration_s=40, seed=5, host_memory_gb=256, calibration=cal,
                               sglang_version="0.5.17", fresh_server=fresh)


def _cal(stalls):
    m, g = get_model(QWEN), get_gpu("h200")
    cal = copy.deepcopy(load_calibration("h200", context=calibration_context(m, g, TRITON_EAGER, "0.5.17")))
    cal["fresh_server_stalls"] = stalls
    return cal


def test_only_a_fresh_servers_window_that_overlaps_the_stalls_is_slower():
    cal = _cal({"per_start": 4.0, "stall_s": 2.5, "decay_s": 15.0})  # stalls at 2.0, 6.9, 14.7, 31.2 s
    warm = _point(cal, fresh=False, warmup_s=20)
    fresh = _point(cal, fresh=True, warmup_s=20)
    assert fresh.extra["fresh_server"] == {"fresh": True, "stalls": 4, "stall_s": 10.0, "in_window": 1,
                                           "cached_prefill_sizes": 0}
    assert warm.extra["fresh_server"]["stalls"] == 0
    # a 2.5 s stall inside the window: every request in flight waits (the slowest of them take it
    # in their TPOT: 2.5 s over a few hundred tokens), and those arriving meanwhile get their first
    # token later (without the stall the two points are the same simulation)
    assert fresh.p99_tpot_s > warm.p99_tpot_s * 1.05
    # (about 6 of the window's 95 requests arrive during the stall: its tail, not always its P90)
    assert fresh.p99_ttft_s > warm.p99_ttft_s * 2 and fresh.p90_ttft_s >= warm.p90_ttft_s
    # a first load point that warms up past the stalls measures what a warm server does
    long_fresh = _point(cal, fresh=True, warmup_s=45)
    long_warm = _point(cal, fresh=False, warmup_s=45)
    assert long_fresh.extra["fresh_server"]["in_window"] == 0
    # (the stalls shift the closed-loop sessions' phases, so the two runs are not the same simulation)
    assert long_fresh.p90_tpot_s == pytest.approx(long_warm.p90_tpot_s, rel=0.05)
    # where no stall was measured a fresh server is a warm one
    none = _cal({"per_start": 0.0, "stall_s": 0.0, "decay_s": 15.0})
    assert _point(none, fresh=True, warmup_s=20).p90_tpot_s == _point(none, fresh=False, warmup_s=20).p90_tpot_s


def test_the_committed_h200_fit_carries_the_measured_kernel_variant_stalls():
    from tuner.catalog import ModelRef, resolve_ref

    m, g = get_model(QWEN), get_gpu("h200")
    cal = load_calibration("h200", context=calibration_context(m, g, TRITON_EAGER, "0.5.17"))
    kernels = KernelWarmup.from_calibration(cal, QWEN_BF16_SHAPE)
    assert StallModel.from_calibration(cal) is None  # the time schedule is replaced
    assert kernels is not None and 0.1 <= kernels.per_new_kernel_s <= 2.0 and kernels.groups == BF16_GROUPS
    # the 8-layer DeepSeek-V3 of the H200 study finds its file's groups by its shape
    small = get_model(resolve_ref(ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})))
    ds = KernelWarmup.from_calibration(cal, triton_moe_shape(small, "fp8_block", 1, 1))
    assert ds is not None and ds.groups == [list(MOE_CONFIG_KEYS)] and ds.topk == 9  # one default config
    # elsewhere nothing was measured
    other = load_calibration("h200", context=calibration_context(m, g, {}, "0.5.23"))
    assert StallModel.from_calibration(other) is None and KernelWarmup.from_calibration(other, QWEN_BF16_SHAPE) is None


# ---- the kernel-variant model ------------------------------------------------------------------

def test_a_variant_is_the_nearest_config_keys_tile_group_and_the_divisibility_of_m_times_topk():
    # 40 is nearest 32 and 48 (ties to the smaller key, as SGLang's min over the file's keys)
    assert moe_variant(40, BF16_GROUPS, 8) == moe_variant(32, BF16_GROUPS, 8)
    # 32 shares its tile config with 4: one compiled kernel
    assert moe_variant(4, BF16_GROUPS, 8) == moe_variant(32, BF16_GROUPS, 8)
    # 1800 and 2500 map to 2048 and 3072, whose configs are equal
    assert moe_variant(1800, BF16_GROUPS, 8) == moe_variant(2500, BF16_GROUPS, 8)
    # an odd M: 8 x M is not divisible by 16, a second specialisation of the same config
    assert moe_variant(1801, BF16_GROUPS, 8) != moe_variant(1800, BF16_GROUPS, 8)
    assert moe_variant(1801, BF16_GROUPS, 8)[0] == moe_variant(1800, BF16_GROUPS, 8)[0]
    # without groups every key is its own config
    assert moe_variant(4, None, 8) != moe_variant(32, None, 8)


def test_the_config_groups_are_found_by_the_expert_shape_not_the_model_name():
    from tuner.catalog import ModelRef, resolve_ref

    # an 8-layer DeepSeek-V3 (a study's override) has another name but the same config file
    small = get_model(resolve_ref(ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})))
    assert small.name != "deepseek-v3" and small.num_layers == 8
    shape = triton_moe_shape(small, "fp8_block", 1, 1)
    key = moe_config_key(shape)
    assert key == "E=257,N=2048,dtype=fp8_w8a8,block_shape=[128, 128]"  # the shared expert fused in
    assert key == moe_config_key(triton_moe_shape(get_model("deepseek-v3"), "fp8_block", 1, 1))
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS}}
    k = kernel_warmup(cal, True, small, "fp8_block", 1, 1, {})
    assert k.groups == H200_LOGGED_GROUPS[key] and len(k.groups) == 1  # one default config
    # M x top-k counts the fused shared expert: 9 per token, so only M divisible by 16 is "divisible"
    assert k.topk == 9
    # SGLang's own warm-up request (M = 3: 27) built the non-divisible variant; 32 (288) builds the
    # other, two kernels
    assert [k.prefill_stall(n) for n in (100, 3000, 32, 4000)] == [0.0, 0.0, 1.0, 0.0]
    # without the fusion the file is another (E=256) and so are the groups: none known
    assert moe_config_key(triton_moe_shape(small, "fp8_block", 1, 1, {"disable-shared-experts-fusion": True})) \
        == "E=256,N=2048,dtype=fp8_w8a8,block_shape=[128, 128]"
    assert kernel_warmup(cal, True, small, "fp8_block", 1, 1, {"disable-shared-experts-fusion": True}).groups is None
    # Qwen3's files: bf16 has no dtype part; TP2 halves N
    qwen = get_model(QWEN)
    assert moe_config_key(triton_moe_shape(qwen, "bf16", 1, 1)) == BF16_KEY
    assert moe_config_key(triton_moe_shape(qwen, "fp8_block", 1, 1)) in H200_LOGGED_GROUPS
    assert moe_config_key(triton_moe_shape(qwen, "bf16", 2, 1)) == "E=128,N=384"
    # no Triton fused MoE: a dense model, an nvfp4 checkpoint, a warm server
    assert triton_moe_shape(get_model("llama-3.1-70b"), "bf16", 1, 1) is None
    assert triton_moe_shape(qwen, "nvfp4", 1, 1) is None
    assert kernel_warmup(cal, False, small, "fp8_block", 1, 1, {}) is None


def test_only_the_first_step_of_each_variant_pays_the_compile():
    k = KernelWarmup(0.5, BF16_GROUPS, 8)  # a fused-MoE variant builds two kernels, its up and down GEMMs
    assert [k.prefill_stall(n) for n in (1800, 2500, 1801, 300, 1802)] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert KernelWarmup.from_calibration({"fresh_server_stalls": {"per_new_kernel_s": 0.0}}, QWEN_BF16_SHAPE) is None
    with pytest.raises(ConfigError):
        KernelWarmup.from_calibration({"fresh_server_stalls": {"per_new_kernel_s": "slow"}}, QWEN_BF16_SHAPE)
    with pytest.raises(ConfigError):
        KernelWarmup.from_calibration({"fresh_server_stalls": {"per_new_kernel_s": 1, "moe_config_groups":
                                                               {BF16_KEY: [[5]]}}}, QWEN_BF16_SHAPE)
    # the time schedule is not used beside it
    assert stall_schedule({"fresh_server_stalls": {"per_new_kernel_s": 0.5}}, fresh_server=True) == []


def test_the_engine_stalls_a_prefill_step_that_runs_a_new_variant():
    def first_tokens(kernels, prompts):
        eng, rank = _engine(kernels=kernels)
        out = []
        for i, n in enumerate(prompts):  # one after the other, each on an idle server
            q = Req(i, i, 0, eng.clock, n, 5)
            rank.waiting.append(q)
            while eng.has_work():
                eng.step()
            out.append(q.first_t - q.arrival)
        return out, eng.stats

    base, _ = first_tokens(None, [1500, 1500, 1501, 300])
    cold, stats = first_tokens(KernelWarmup(0.7, BF16_GROUPS, 8), [1500, 1500, 1501, 300])
    # 1500 (new), 1500 (seen), 1501 (odd: new), 300 (key 256: new)
    # (two kernels each: the variant's up and down GEMMs)
    assert [c - b for c, b in zip(cold, base)] == pytest.approx([1.4, 0.0, 1.4, 1.4], abs=1e-6)
    assert stats.stalls == 3 and stats.stall_s == pytest.approx(4.2)


def test_a_fresh_load_point_under_the_kernel_model_is_slower_in_prefill_and_a_warm_one_is_not():
    cal = _cal({"per_new_kernel_s": 0.8, "moe_config_groups": {BF16_KEY: BF16_GROUPS}})
    warm = _point(cal, fresh=False, warmup_s=45, users=16)
    fresh = _point(cal, fresh=True, warmup_s=45, users=16)
    assert warm.extra["fresh_server"]["stalls"] == 0
    assert fresh.extra["fresh_server"]["stalls"] >= 5  # a handful of variants, most in the first seconds
    assert fresh.extra["server_stage_means"]["prefill_forward_s"] > warm.extra["server_stage_means"][
        "prefill_forward_s"] * 1.1


def test_a_chunked_request_marks_where_its_chunks_before_the_last_ended():
    """SGLang counts a chunked request's prefill twice in per_stage_req_latency: prefill_forward from
    its first chunk's batch to the end, and the chunks before the last as chunked_prefill. The
    engine keeps when the last of those ended, so the simulated stage can be summed the same way."""
    eng, rank = _engine(**{"chunked-prefill-size": 2048})
    ends = []
    long, short = Req(0, 0, 0, 0.0, 5000, 3), Req(1, 1, 0, 0.0, 1000, 3)
    rank.waiting.extend([long, short])
    while eng.has_work():
        eng.step()
        ends.append(eng.clock)
    assert short.chunk_end_t is None  # one chunk: counted once
    assert long.chunk_end_t is not None and long.sched_t < long.chunk_end_t < long.first_t
    assert long.chunk_end_t in ends  # the end of a step: its second chunk (2048 + 2048 of 5000)
    assert long.first_t == pytest.approx(ends[ends.index(long.chunk_end_t) + 1])


def _variant_partition(groups, topk, split=None) -> set[frozenset]:
    """The batch sizes 1-4999 that run one fused-MoE variant, as sets."""
    blocks: dict = {}
    for m in range(1, 5000):
        blocks.setdefault(moe_variant(m, groups, topk, split), set()).add(m)
    return {frozenset(b) for b in blocks.values()}


def test_sglangs_shipped_files_give_the_groups_the_h200_servers_logged():
    """The committed table (SGLang 0.5.17's own files, Triton 3.6.0) against the groups the fit read
    from the H200 servers' logs: the same variant for every batch size, on each shape measured."""
    qwen, dsv3 = get_model(QWEN), get_model("deepseek-v3")
    for shape in (triton_moe_shape(qwen, "bf16", 1, 1), triton_moe_shape(qwen, "fp8_block", 1, 1),
                  triton_moe_shape(dsv3, "fp8_block", 1, 1)):
        key = moe_config_key(shape)
        logged, shipped = H200_LOGGED_GROUPS[key], shipped_groups("NVIDIA H200", "0.5.17", key)
        assert _variant_partition(logged, shape.topk) == \
            _variant_partition(shipped, shape.topk, default_split_m(shape, shipped)), key
    assert shipped_groups("NVIDIA H200", "0.5.17", BF16_KEY) == BF16_GROUPS
    # DeepSeek-V3 at TP1 has no file: SGLang's default block-fp8 config, one for every M
    assert shipped_groups("NVIDIA H200", "0.5.17", "E=257,N=2048,dtype=fp8_w8a8,block_shape=[128, 128]") == []


def test_an_h100_server_compiles_the_variants_of_its_own_file():
    # Qwen3 bf16 on the H100: SGLang 0.5.17 has no Triton 3.6.0 file for it and falls back to 3.2.0's,
    # whose groups differ from the H200's (8 and 16 share a config there; 4 and 32 do not)
    h100 = shipped_groups("NVIDIA H100 80GB HBM3", "0.5.17", BF16_KEY)
    assert h100 != BF16_GROUPS and [8, 16] in h100 and [4] in h100
    cal = load_calibration("h100", context=calibration_context(get_model(QWEN), get_gpu("h100"), TRITON_EAGER,
                                                               "0.5.17"))
    k = kernel_warmup(cal, True, get_model(QWEN), "bf16", 1, 1, TRITON_EAGER, "NVIDIA H100 80GB HBM3", "0.5.17")
    assert k.groups == h100 and k.per_new_kernel_s == cal["fresh_server_stalls"]["per_new_kernel_s"] > 0
    two = 2 * k.per_new_kernel_s  # a variant's up and down GEMMs
    assert [k.prefill_stall(n) for n in (8, 16, 4, 32)] == [two, 0.0, two, two]
    # fp8 block weights: no H100 file at all, so the default config (one variant per divisibility)
    fp8 = kernel_warmup(cal, True, get_model(QWEN), "fp8_block", 1, 1, TRITON_EAGER, "NVIDIA H100 80GB HBM3",
                        "0.5.17")
    assert fp8.groups == [] and fp8.default_split_m is None
    # (SGLang's own warm-up request, M = 3, built the non-divisible one)
    assert [fp8.prefill_stall(n) for n in (2, 4000, 3, 4001)] == [two, 0.0, 0.0, 0.0]
    # a version or device the table does not cover: every key its own config, as before
    assert shipped_groups("NVIDIA H100 80GB HBM3", "0.5.23", BF16_KEY) is None
    assert shipped_groups("NVIDIA A100", "0.5.17", BF16_KEY) is None
    assert shipped_groups("NVIDIA H200", "0.5.17.post1", BF16_KEY) == BF16_GROUPS


def test_a_block_fp8_servers_linears_add_variants_from_sglangs_files():
    dsv3, qwen = get_model("deepseek-v3"), get_model(QWEN)
    fp8 = {"quantization": "fp8"}
    shapes = block_fp8_linear_shapes(dsv3, "fp8_block", 1, 1, fp8)
    # the MLA projections, the dense layers' MLP (the shared expert is fused into the MoE)
    assert shapes == ["N=2112,K=7168", "N=24576,K=1536", "N=32768,K=512", "N=7168,K=16384", "N=36864,K=7168",
                      "N=7168,K=18432"]
    groups = {k: shipped_linear_groups("NVIDIA H200", "0.5.17", k) for k in shapes}
    assert groups["N=2112,K=7168"] == [] and len(groups["N=7168,K=16384"]) == 11  # no file / a file
    assert shipped_linear_groups("NVIDIA A100", "0.5.17", shapes[0]) is None  # not in the table
    assert block_fp8_linear_shapes(dsv3, "bf16", 1, 1, fp8) == [] and \
        all(shipped_linear_groups("NVIDIA H200", "0.5.17", k) == [] for k in block_fp8_linear_shapes(qwen, "fp8_block",
                                                                                                    1, 1, fp8))
    # a linear variant: the nearest key's group, M divisible by 16, M = 1
    g = groups["N=7168,K=16384"]
    assert linear_variant(40, g)[0] == linear_variant(32, g)[0]  # 40: between 32 and 48, ties to the smaller
    assert linear_variant(48, g) == linear_variant(64, g) or linear_variant(48, g)[0] != linear_variant(64, g)[0]
    assert linear_variant(33, g) != linear_variant(32, g)  # the same config, M no longer divisible by 16
    assert linear_variant(1, []) == (-1, False, True) and linear_variant(4096, []) == (-1, True, False)
    # DeepSeek's MoE runs one config, so after its two parities only new linear groups stall; the
    # batch sizes the decode graphs captured at start-up are compiled already
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS}}
    k = kernel_warmup(cal, True, dsv3, "fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17", precompiled_tokens=(1, 2, 4, 8))
    assert k.linears and k.topk == 9
    # 8: kv_b_proj's GEMM (the absorbed decode does not run it; 8's config is not that of 3, which SGLang's
    # own warm-up request ran, as the MoE's non-divisible variant); 1024: new GEMM configs and the MoE's
    # divisible variant; 1024 again: nothing new; 3000 (key 3072): new configs; 1000 (key 1024, not
    # divisible by 16): new specialisations. A step waits for each kernel.
    stalls = [k.prefill_stall(n) for n in (8, 1024, 1024, 3000, 1000)]
    assert stalls[0] == 0.5 and stalls[2] == 0.0 and all(s >= 0.5 and s % 0.5 == 0 for s in stalls[1:2] + stalls[3:])
    # without the linears (no device given) DeepSeek's single MoE config has only its two parities, and
    # the warm-up request ran the non-divisible one
    lone = kernel_warmup(cal, True, dsv3, "fp8_block", 1, 1, fp8)
    assert [lone.prefill_stall(n) for n in (8, 1024, 1024, 3000, 1000)] == [0.0, 1.0, 0.0, 0.0, 0.0]
    # Qwen3 fp8: no file for its linears, and the captured sizes cover their default config's variants
    q = kernel_warmup(cal, True, qwen, "fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17",
                      precompiled_tokens=(1, 2, 4, 8, 16, 24, 32))
    moe_only = kernel_warmup(cal, True, qwen, "fp8_block", 1, 1, fp8)  # no device: the MoE's variants alone
    assert [q.prefill_stall(n) for n in (100, 3000, 100, 48)] == [moe_only.prefill_stall(n) for n in (100, 3000, 100, 48)]


def test_sglangs_default_config_changes_at_m_equal_to_the_experts_without_block_quantization():
    # get_default_config: BLOCK_SIZE_M 16 up to M <= E, 64 above, for bf16 weights
    assert moe_variant(128, [], 8, 128)[0] == moe_variant(1, [], 8, 128)[0]
    assert moe_variant(129, [], 8, 128)[0] != moe_variant(128, [], 8, 128)[0]
    assert moe_variant(129, [], 8, None)[0] == moe_variant(1, [], 8, None)[0]  # block fp8: one config


@contextlib.contextmanager
def _groups_table(tmp_path, monkeypatch, text: str):
    """The simulator reading ``text`` as its table of SGLang's config groups."""
    import tuner.sim.warmup as warmup

    path = tmp_path / "groups.yaml"
    path.write_text(text)
    monkeypatch.setattr(warmup, "SHIPPED_GROUPS_FILE", path)
    warmup._shipped_table.cache_clear()
    try:
        yield path
    finally:
        warmup._shipped_table.cache_clear()


def test_a_broken_groups_table_is_named(tmp_path, monkeypatch):
    with _groups_table(tmp_path, monkeypatch,
                       "0.5.17:\n  devices:\n    NVIDIA_H200:\n      E=128,N=768: {groups: [[1], two]}\n"):
        with pytest.raises(ConfigError, match="groups") as exc:
            shipped_groups("NVIDIA H200", "0.5.17", BF16_KEY)
        assert "groups.yaml" in str(exc.value) and "E=128,N=768" in str(exc.value)


def test_one_gemm_kernel_serves_every_weight_shape_with_its_config_and_specialisations():
    # SGLang launches _w8a8_block_fp8_matmul with the tile config as constexprs; Triton specialises M
    # and the scale tensors' row stride K/128 on divisibility by 16
    a = ServerLinear("N=7168,K=16384", [[1, 2], [4]], ("cfgA", "cfgB"), True)
    b = ServerLinear("N=36864,K=18432", [[1], [2, 4]], ("cfgA", "cfgB"), True)  # K/128 = 144: divisible
    c = ServerLinear("N=2112,K=7168", [[1, 2], [4]], ("cfgA", "cfgB"), True)  # K/128 = 56: not
    assert a.variant(1) == b.variant(1)  # one config in both files: one kernel for both shapes
    assert a.variant(3) != b.variant(3)  # 3: key 2, config A in a's file, B in b's
    assert a.variant(5) != c.variant(5)  # the same config, the scale stride specialised otherwise
    assert a.variant(16) != a.variant(17) and a.variant(1) != a.variant(2)  # M: by 16, and M = 1
    unknown = ServerLinear("N=7168,K=16384", [[1, 2], [4]], None, True)  # an older table: its own variants
    assert unknown.variant(3)[0] == "N=7168,K=16384"
    # the table's ids for DeepSeek-V3's H100 linears; no file: SGLang's default config
    dsv3, fp8 = get_model("deepseek-v3"), {"quantization": "fp8"}
    lins = {lin.key: lin for lin in server_linears(dsv3, "fp8_block", 1, 1, fp8, "NVIDIA H100 80GB HBM3", "0.5.17")}
    assert lins["N=2112,K=7168"].configs == lins["N=24576,K=1536"].configs and len(lins["N=2112,K=7168"].configs) == 1
    assert len(lins["N=7168,K=16384"].configs) == len(lins["N=7168,K=16384"].groups) > 1
    # MLA's kv_b_proj runs only in prefill: the decode capture does not build its variants
    assert [k for k, lin in lins.items() if not lin.runs_in_decode] == ["N=32768,K=512"]
    k = KernelWarmup(0.5, None, 0, linears=tuple(lins.values()), precompiled_tokens=(1, 2, 4, 8, 12, 16, 24, 32))
    assert k.prefill_stall(4) == 0.5 and k.prefill_stall(4) == 0.0  # kv_b_proj's variant at 4, then built
    assert shipped_linear_configs("NVIDIA H100 80GB HBM3", "0.5.17", "N=7168,K=16384",
                                  lins["N=7168,K=16384"].groups) == lins["N=7168,K=16384"].configs


def test_a_groups_table_whose_config_ids_do_not_match_its_groups_is_named(tmp_path, monkeypatch):
    with _groups_table(tmp_path, monkeypatch,
                       "0.5.17:\n  block_fp8_linear_configs:\n    NVIDIA_H200:\n      N=1,K=128: [a]\n"):
        with pytest.raises(ConfigError, match="one config id per key group") as exc:
            shipped_linear_configs("NVIDIA H200", "0.5.17", "N=1,K=128", [[1], [2]])
        assert "groups.yaml" in str(exc.value) and "N=1,K=128" in str(exc.value)
        assert shipped_linear_configs("NVIDIA H200", "0.5.17", "N=2,K=128", [[1]]) is None  # not listed


def test_sglangs_own_warm_up_request_builds_its_kernels_before_any_traffic():
    # _execute_server_warmup prefills input_ids [10, 11, 12]: M = 3 runs every linear (kv_b_proj
    # too) and the fused MoE before the first request, so a first prefill of 3 builds nothing
    dsv3, fp8 = get_model("deepseek-v3"), {"quantization": "fp8"}
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS}}
    launched = kernel_warmup(cal, True, dsv3, "fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17",
                             precompiled_tokens=(1, 2, 4, 8))
    assert LAUNCH_WARMUP_PROMPT_TOKENS == 3 and launched.prefilled_tokens == (3,)

    def bare():  # the same server without the warm-up request
        return KernelWarmup.from_calibration(cal, triton_moe_shape(dsv3, "fp8_block", 1, 1, fp8), "NVIDIA H200",
                                             "0.5.17", launched.linears, (1, 2, 4, 8))

    assert bare().prefill_stall(3) > 0 and launched.prefill_stall(3) == 0.0
    # 2 runs M = 3's kernels (3's nearest key is 2; neither is 1 or divisible by 16): the fused MoE's
    # and kv_b_proj's, which the decode capture at 2 did not build; 1024 runs others
    assert bare().prefill_stall(2) > 0 and launched.prefill_stall(2) == 0.0
    assert launched.prefill_stall(1024) == bare().prefill_stall(1024) > 0


def test_kernels_earlier_servers_left_in_the_cache_build_nothing_and_the_rest_still_do():
    # what servers of the same kernel set ran on a pinned cache (tuner.evaluation.kernel_ledger): their
    # prefill sizes' variants are built, their graph sizes' decode linears are too
    dsv3, fp8 = get_model("deepseek-v3"), {"quantization": "fp8"}
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS}}
    args = (cal, True, dsv3, "fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17")
    cold = kernel_warmup(*args, precompiled_tokens=(1, 2, 4, 8))
    cached = kernel_warmup(*args, precompiled_tokens=(1, 2, 4, 8), cached=CachedKernels((1024, 3000), (16, 24)))
    assert cached.prefilled_tokens == (3, 1024, 3000) and cached.precompiled_tokens == (1, 2, 4, 8, 16, 24)
    assert cold.prefill_stall(1024) > 0 and cached.prefill_stall(1024) == 0.0
    assert cold.prefill_stall(3000) > 0 and cached.prefill_stall(3000) == 0.0
    # 1000 (key 1024, not divisible by 16) is a specialisation no earlier server ran
    assert cached.prefill_stall(1000) == cold.prefill_stall(1000) > 0
    # a warm server has no first-use stalls, cached or not
    assert kernel_warmup(cal, False, dsv3, "fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17",
                         cached=CachedKernels((1024,))) is None


def test_cached_kernels_are_checked_and_read_back():
    assert CachedKernels((2048, 3, 3), (2, 1)) == CachedKernels((3, 2048), (1, 2))  # sorted, once each
    assert not CachedKernels() and CachedKernels((3,))
    assert CachedKernels.from_dict(CachedKernels((3, 9), (1,)).to_dict()) == CachedKernels((3, 9), (1,))
    with pytest.raises(ConfigError, match="prefill_tokens"):
        CachedKernels((0,))
    with pytest.raises(ConfigError, match="graph_tokens"):
        CachedKernels.from_dict({"graph_tokens": "1,2"})
    with pytest.raises(ConfigError, match="valid: prefill_tokens, graph_tokens"):
        CachedKernels.from_dict({"prefill": [3]})


def test_a_fresh_server_on_a_cache_that_holds_its_batch_sizes_stalls_as_a_warm_one():
    cal = _cal({"per_new_kernel_s": 0.8, "moe_config_groups": {BF16_KEY: BF16_GROUPS}})
    cold = _point(cal, fresh=True, warmup_s=10, users=16)
    every_size = CachedKernels(tuple(range(1, 16385)))  # every prefill size a server can run
    filled = simulate_load_point(QWEN, "h200", 1, TRITON_EAGER, {}, load_profile("coding-agent-40k"), 16,
                                 warmup_s=10, duration_s=40, seed=5, host_memory_gb=256, calibration=cal,
                                 sglang_version="0.5.17", fresh_server=True, cached_kernels=every_size)
    warm = _point(cal, fresh=False, warmup_s=10, users=16)
    assert cold.extra["fresh_server"]["stalls"] >= 5 and cold.extra["fresh_server"]["in_window"] >= 1
    assert filled.extra["fresh_server"]["stalls"] == 0
    assert filled.extra["fresh_server"]["cached_prefill_sizes"] == 16384
    assert filled.p90_ttft_s == pytest.approx(warm.p90_ttft_s) and filled.p90_tpot_s == pytest.approx(warm.p90_tpot_s)
    assert cold.p90_ttft_s > warm.p90_ttft_s


def test_a_cold_machines_first_long_prefill_waits_once_for_sglangs_jit_modules():
    dsv3, qwen, fp8 = get_model("deepseek-v3"), get_model(QWEN), {"quantization": "fp8"}
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS}}
    args = ("fp8_block", 1, 1, fp8, "NVIDIA H200", "0.5.17")

    def stalls(model, cached, sizes):
        k = kernel_warmup(cal, True, model, *args, precompiled_tokens=(1, 2, 4, 8), cached=cached)
        return [k.prefill_stall(n) for n in sizes]

    sizes = (513, 2048, 2048, 4096)
    warm_machine, cold_machine = stalls(dsv3, None, sizes), stalls(dsv3, CachedKernels(jit_cold=True), sizes)
    # 513 is below the first size that waited; 2048 waits for the modules once, on top of its Triton builds
    assert cold_machine[0] == warm_machine[0]
    assert cold_machine[1] == pytest.approx(warm_machine[1] + JIT_MODULE_BUILD_S)
    assert cold_machine[2:] == warm_machine[2:]
    assert JIT_FIRST_PREFILL_TOKENS == 1024
    assert stalls(dsv3, CachedKernels(jit_cold=True), (1024,))[0] >= JIT_MODULE_BUILD_S
    # measured on MLA servers only: a GQA model's first long prefill is not given the wait
    assert stalls(qwen, CachedKernels(jit_cold=True), sizes) == stalls(qwen, None, sizes)
    # recorded with the cache's contents, and read back
    doc = CachedKernels((3,), jit_cold=True).to_dict()
    assert doc == {"prefill_tokens": [3], "graph_tokens": [], "jit_cold": True}
    assert CachedKernels.from_dict(doc).jit_cold and CachedKernels(jit_cold=True)
    assert "jit_cold" not in CachedKernels((3,)).to_dict()
    with pytest.raises(ConfigError, match="jit_cold"):
        CachedKernels.from_dict({"jit_cold": "yes"})


def test_a_server_on_tuned_tiles_builds_the_variants_of_the_tuned_files_groups():
    from tuner.catalog import ModelRef, resolve_ref

    small = get_model(resolve_ref(ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})))
    key = moe_config_key(triton_moe_shape(small, "fp8_block", 1, 1))
    tuned = [[1], [4], [16], [32, 128], [64], [512], [2048], [4096]]
    cal = {"fresh_server_stalls": {"per_new_kernel_s": 0.5, "moe_config_groups": H200_LOGGED_GROUPS},
           "moe_tuned_config_groups": {key: tuned}}
    default = kernel_warmup(cal, True, small, "fp8_block", 1, 1, {})
    on_tuned = kernel_warmup(cal, True, small, "fp8_block", 1, 1, {}, moe_tiles="tuned")
    assert default.groups == H200_LOGGED_GROUPS[key] and on_tuned.groups == tuned
    # prefills of 48, 96 and 608 tokens: one fused-MoE config on SGLang's file, three on the tuned one,
    # so the tuned server builds two variants more, each its up and its down GEMM
    sizes = (48, 96, 608)
    assert len({moe_variant(n, default.groups, 9) for n in sizes}) == 1
    assert len({moe_variant(n, on_tuned.groups, 9) for n in sizes}) == 3
    assert sum(on_tuned.new_kernels(n) for n in sizes) == sum(default.new_kernels(n) for n in sizes) + 2 * 2
    # a shape no tuning covered keeps SGLang's groups on tuned tiles
    qwen = get_model(QWEN)
    assert kernel_warmup(cal, True, qwen, "bf16", 1, 1, {}, moe_tiles="tuned").groups == \
        kernel_warmup(cal, True, qwen, "bf16", 1, 1, {}).groups
    # a malformed table is named
    with pytest.raises(ConfigError) as err:
        kernel_warmup({**cal, "moe_tuned_config_groups": {key: [[1, "x"]]}}, True, small, "fp8_block", 1, 1, {},
                      moe_tiles="tuned")
    assert err.value.key == "moe_tuned_config_groups"


def test_the_committed_h200_calibration_has_the_tuned_files_groups():
    from tuner.kernels.config_groups import tuned_groups

    summary = REPO / "results" / "kernels" / "h200" / "sglang" / "summary.json"
    cal = load_calibration("h200")
    assert cal["moe_tuned_config_groups"] == tuned_groups(json.loads(summary.read_text()), summary.parent)
    assert len(cal["moe_tuned_config_groups"]["E=257,N=2048,dtype=fp8_w8a8,block_shape=[128, 128]"]) == 8


def test_the_simulator_builds_a_trials_fresh_kernels_from_the_tile_files_it_runs(monkeypatch):
    import tuner.sim.simulate as sim

    seen = []
    real = sim.kernel_warmup
    def spy(*args, **kwargs):  # the tile files each replica's kernels are built from
        import inspect

        seen.append(inspect.signature(real).bind(*args, **kwargs).arguments.get("moe_tiles", "default"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "kernel_warmup", spy)
    for tiles in ("default", "tuned"):
        simulate_load_point(QWEN, "h200", 1, TRITON_EAGER, {"moe-tile-configs": tiles}, load_profile("coding-agent-40k"),
                            8, warmup_s=10, duration_s=20, seed=5, host_memory_gb=256, sglang_version="0.5.17",
                            fresh_server=True)
    assert seen == ["default", "tuned"]
