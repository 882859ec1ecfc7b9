"""Causes attributed on simulated load points: an evicting configuration is KV-bound, a router that
concentrates sessions shows imbalance, round-robin over pools that would hold the working set is
routing-bound, HiCache load-back is seen, and a decode step's split adds up."""

import pytest

from tuner.config.load import load_study
from tuner.explain import Cause, Coverage, LoadPoint, StudyContext, TrialFacts, diagnose_point
from tuner.explain.diagnose import ROOT_THRESHOLDS
from tuner.lifecycle import TrialStatus
from tuner.sim import simulate_load_point

NVFP4_TP8 = {"tp-size": 8, "quantization": "modelopt_fp4"}
NVFP4_DP8 = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4"}


@pytest.fixture(scope="module")
def study():
    return load_study("h200")


def _point(study, flags, knobs, users, gpu="h200"):
    m = simulate_load_point(study.model, gpu, 8, flags, knobs, study.workload_profile(), users,
                            warmup_s=60, duration_s=240)
    point = LoadPoint.of({**m.to_dict(), "backend_kind": "simulator"})
    trial = TrialFacts(number=1, status=TrialStatus.COMPLETE, backend_kind="simulator", flags=flags, knobs=knobs,
                       hicache=bool(flags.get("enable-hierarchical-cache")))
    return point, trial


def test_an_evicting_configuration_is_kv_bound(study):
    # TP8 keeps one 0.72 M-token pool; 48 coding-agent users hold about 1.5 M tokens of context
    point, trial = _point(study, NVFP4_TP8, {}, 48)
    d = diagnose_point(point, trial, StudyContext.of_spec(study))
    assert d.missed and d.binding.cause is Cause.KV_CAPACITY
    kv = d.finding(Cause.KV_CAPACITY)
    assert kv.coverage is Coverage.SIMULATED and kv.share > 0.5
    assert kv.figures["working_set_tokens"] > kv.figures["kv_pool_tokens_total"] == 724_992
    assert kv.figures["hit_rate_lost"] > 0.2
    # the share is the simulator's own count of re-prefilled tokens over the window's prefill tokens
    s = point.extra["explain"]
    assert kv.share == pytest.approx(s["reprefill_tokens"] / s["prefill_tokens"])
    assert "re-compute evicted context (KV pool 0.72 M tokens, working set 1.5" in d.sentence
    assert d.sentence.startswith("misses P90 ")
    # the client does not exist in a simulation: not applicable, and not listed as unmeasured
    assert d.finding(Cause.CLIENT).coverage is Coverage.NOT_APPLICABLE
    assert d.not_observed() == []


def test_the_same_configuration_at_a_few_users_meets_the_targets_with_little_recomputed(study):
    point, trial = _point(study, NVFP4_TP8, {}, 8)
    d = diagnose_point(point, trial, StudyContext.of_spec(study))
    assert d.meets and d.binding is None and d.sentence.startswith("meets both targets at 8 users")
    assert d.finding(Cause.KV_CAPACITY).share < 0.05


def test_a_router_that_concentrates_sessions_shows_imbalance(study):
    # cache-aware routing over 8 attention-DP ranks keeps sessions where their prefix is: at 64
    # users a few ranks carry most of the work and the step waits for the slowest
    point, trial = _point(study, NVFP4_DP8, {"router-policy": "cache_aware"}, 64)
    d = diagnose_point(point, trial, StudyContext.of_spec(study))
    imb = d.finding(Cause.IMBALANCE)
    assert imb.coverage is Coverage.SIMULATED and imb.share > 0.4
    assert d.binding.cause is Cause.IMBALANCE
    work = imb.figures["rank_work"]
    assert len(work) == 8 and max(work) > 2 * sum(work) / len(work)
    assert "the busiest of 8 ranks decodes" in d.sentence
    # round robin over the same ranks is balanced
    rr, trial = _point(study, NVFP4_DP8, {"router-policy": "round_robin"}, 64)
    assert diagnose_point(rr, trial, StudyContext.of_spec(study)).finding(Cause.IMBALANCE).share < 0.3


def test_round_robin_over_pools_that_hold_the_working_set_is_routing_bound(study):
    ctx = StudyContext.of_spec(study).with_slo(0.8, 1.0)  # a TTFT question
    rr, trial = _point(study, NVFP4_DP8, {"router-policy": "round_robin"}, 96, gpu="b200")
    d = diagnose_point(rr, trial, ctx)
    assert d.binding.cause is Cause.ROUTING and d.finding(Cause.ROUTING).share > 0.5
    assert d.finding(Cause.KV_CAPACITY).share == 0.0  # 8 pools of 0.98 M hold 3 M tokens of working set
    assert "another KV pool holds (round_robin routing over 8 pools" in d.sentence
    aware, trial = _point(study, NVFP4_DP8, {"router-policy": "cache_aware"}, 96, gpu="b200")
    d2 = diagnose_point(aware, trial, ctx)
    assert d2.meets and d2.finding(Cause.ROUTING).share < 0.1


def test_hicache_load_back_is_seen_and_absent_without_hicache(study):
    flags = {**NVFP4_TP8, "enable-hierarchical-cache": True, "hicache-ratio": 4.0}
    point, trial = _point(study, flags, {}, 64)
    host = diagnose_point(point, trial, StudyContext.of_spec(study)).finding(Cause.HOST_LINK)
    assert host.coverage is Coverage.SIMULATED and host.figures["load_tokens"] > 1e6 and 0 < host.share < 1
    assert host.figures["load_s"] > 0
    plain, trial = _point(study, NVFP4_TP8, {}, 64)
    assert diagnose_point(plain, trial, StudyContext.of_spec(study)).finding(Cause.HOST_LINK).coverage \
        is Coverage.NOT_APPLICABLE


def test_a_decode_bound_point_splits_its_step_into_parts_that_add_up(study):
    ctx = StudyContext.of_spec(study).with_slo(30.0, 0.006)  # a TPOT the decode step itself misses
    point, trial = _point(study, NVFP4_TP8, {}, 16, gpu="b200")
    d = diagnose_point(point, trial, ctx)
    step = d.finding(Cause.DECODE_STEP)
    assert d.binding.cause is Cause.DECODE_STEP
    shares = step.figures["decode_parts_share"]
    assert set(shares) == {"attention", "moe", "dense", "communication", "overhead"}
    assert sum(shares.values()) == pytest.approx(1.0) and all(v >= 0 for v in shares.values())
    parts_s = point.extra["explain"]["decode_parts_s"]
    # scaled to the window's mean decode inter-token time
    assert sum(parts_s.values()) == pytest.approx(point.extra["explain"]["mean_decode_itl_s"], rel=1e-6)
    assert "MoE" in d.sentence and "requests per rank" in d.sentence


def test_a_request_cap_that_makes_arrivals_wait_is_prefill_queueing(study):
    # four running requests at a time for 16 users on one B200 pool the working set fits: TTFT is
    # mostly waiting for admission, not computing, not the pool
    ctx = StudyContext.of_spec(study).with_slo(0.5, 1.0)
    capped = {**NVFP4_TP8, "max-running-requests": 4}
    point, trial = _point(study, capped, {}, 16, gpu="b200")
    d = diagnose_point(point, trial, ctx)
    queue = d.finding(Cause.PREFILL_QUEUEING)
    assert d.binding.cause is Cause.PREFILL_QUEUEING and queue.coverage is Coverage.SIMULATED
    s = point.extra["explain"]
    assert queue.share == pytest.approx(s["mean_queue_s"] / s["mean_ttft_s"]) and queue.share > 0.7
    assert d.sentence.startswith("misses P90 TTFT at 16 users") and "of TTFT is waiting for admission" in d.sentence
    assert d.finding(Cause.KV_CAPACITY).share < ROOT_THRESHOLDS[Cause.KV_CAPACITY]
    # without the cap the same users wait far less
    free, trial = _point(study, NVFP4_TP8, {}, 16, gpu="b200")
    assert diagnose_point(free, trial, ctx).finding(Cause.PREFILL_QUEUEING).share < queue.share / 2
