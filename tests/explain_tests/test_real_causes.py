"""Causes attributed on real (non-simulated) load points: what SGLang's metrics, the replay
client's records and NVML say. A capped replay client is client-bound (a real replay against the
load-generation server while the client's event loop only gets part of its time); the other cases
are small constructed load points with the fields a real trial stores."""

import asyncio
import time

import pytest

from tuner.config.load import load_study
from tuner.explain import Bound, Cause, Coverage, LoadPoint, StudyContext, TrialFacts, diagnose_point, diagnose_trial
from tuner.lifecycle import TrialStatus
from tuner.workload.loadgen_server import LoadgenProcess, ServerConfig
from tuner.workload.profiles import load_profile
from tuner.workload.replay import replay_closed_loop, run_sync

CTX = StudyContext(p90_ttft_slo_s=1.0, p90_tpot_slo_s=0.020, resolution_users=4, max_users=128,
                   workload=load_profile("coding-agent-40k"), gpu="h200", gpus=1)


def _trial(**kw):
    base = dict(number=3, status=TrialStatus.COMPLETE, backend_kind="sglang", pools=1)
    base.update(kw)
    return TrialFacts(**base)


def _point(users=16, **kw):
    base = dict(users=users, valid=True, requests=100, errors=0, duration_s=40.0, wall_time_s=62.0,
                p50_ttft_s=0.3, p90_ttft_s=0.6, p50_tpot_s=0.012, p90_tpot_s=0.015, p50_itl_s=0.010,
                throughput_tokens_per_s=500.0, prefix_cache_hit_rate=0.88, kv_capacity_tokens_total=756_593,
                backend_kind="sglang", extra={"backend": "sglang", "client_bound": False,
                                              "event_loop_lag_p99_s": 0.001, "client_cpu_fraction": 0.02})
    base.update(kw)
    return LoadPoint(**base)


def _sm(**kw):
    sm = {"sglang:queue_time_seconds_sum": 5.0, "sglang:queue_time_seconds_count": 100.0,
          "sglang:time_to_first_token_seconds_sum": 60.0, "sglang:time_to_first_token_seconds_count": 100.0,
          "sglang:inter_token_latency_seconds_sum": 300.0, "sglang:inter_token_latency_seconds_count": 25000.0,
          "sglang:uncached_prompt_tokens_histogram_sum": 120_000.0,
          "sglang:uncached_prompt_tokens_histogram_count": 100.0,
          "sglang:kv_cache_memory_usage_gb": 69.3, "sglang:max_total_num_tokens": 756_593.0}
    sm.update(kw)
    return sm


# ---------------------------------------------------------------------------------- client
@pytest.fixture(scope="module")
def capped_run():
    """A real replay whose event loop loses 40 ms of every 60: the client's own ceiling."""
    profile = load_profile("coding-agent").model_copy(update={"scale": 0.02})

    async def capped(url):
        async def hog():
            while True:
                time.sleep(0.04)  # the loop is blocked: every timestamp the client takes is late
                await asyncio.sleep(0.02)

        h = asyncio.ensure_future(hog())
        try:
            return await replay_closed_loop(url, profile, 4, warmup_s=0.3, duration_s=2.0, time_scale=0.02)
        finally:
            h.cancel()

    with LoadgenProcess(ServerConfig(token_rate_per_s=400.0, ttft_s=0.02)) as url:
        return run_sync(capped(url)).metrics


def test_a_capped_client_run_is_client_bound(capped_run):
    m = capped_run
    assert m.extra["client_bound"] is True and m.extra["event_loop_lag_p99_s"] > 0.01
    point = LoadPoint.of({**m.to_dict(), "backend_kind": "sglang"})
    ctx = StudyContext(p90_ttft_slo_s=0.01, p90_tpot_slo_s=0.001, workload=None)  # both missed
    d = diagnose_point(point, _trial(), ctx)
    assert d.binding.cause is Cause.CLIENT and d.binding.coverage is Coverage.MEASURED
    assert "the replay client is at its own ceiling (event-loop lag P99" in d.sentence
    # the replay client recorded which prefixes it had sent before: prefix reuse is measured
    assert m.extra["prefix_reuse"]["reusable_tokens"] >= m.extra["prefix_reuse"]["cached_tokens"] > 0


def test_a_client_below_its_ceiling_is_not_blamed():
    d = diagnose_point(_point(p90_ttft_s=3.0, extra={"backend": "sglang", "client_bound": False,
                                                     "event_loop_lag_p99_s": 0.001, "client_cpu_fraction": 0.05,
                                                     "server_metrics": _sm()}), _trial(), CTX)
    assert d.binding.cause is not Cause.CLIENT
    assert d.finding(Cause.CLIENT).share == 0.0


# ---------------------------------------------------------------------------- TTFT causes
def test_ttft_mostly_waiting_for_admission_is_queueing():
    sm = _sm(**{"sglang:queue_time_seconds_sum": 48.0})  # 0.48 s of a 0.6 s mean TTFT
    d = diagnose_point(_point(p90_ttft_s=1.4, extra={"backend": "sglang", "server_metrics": sm}), _trial(), CTX)
    assert d.binding.cause is Cause.PREFILL_QUEUEING and d.binding.share == pytest.approx(0.8)
    assert "80% of TTFT is waiting for admission" in d.sentence


def test_ttft_mostly_computing_is_prefill_compute():
    d = diagnose_point(_point(p90_ttft_s=1.4, extra={"backend": "sglang", "server_metrics": _sm()}), _trial(), CTX)
    assert d.binding.cause is Cause.PREFILL_COMPUTE and d.binding.share == pytest.approx(1 - 5 / 60)
    assert "1.2 k uncached tokens per request" in d.sentence


def test_recomputed_reusable_prefixes_with_a_working_set_beyond_the_pool_are_kv_bound():
    # 128 users x ~11 k tokens of conversation against a 0.76 M-token pool; the client says 60% of
    # what the server computed it had sent before
    reuse = {"requests": 100, "input_tokens": 1_000_000, "cached_tokens": 500_000, "reusable_tokens": 900_000,
             "computed_tokens": 500_000, "recomputed_reusable_tokens": 300_000}
    point = _point(users=128, p90_ttft_s=4.0, prefix_cache_hit_rate=0.5,
                   extra={"backend": "sglang", "server_metrics": _sm(), "prefix_reuse": reuse})
    d = diagnose_point(point, _trial(), CTX)
    kv = d.finding(Cause.KV_CAPACITY)
    assert d.binding.cause is Cause.KV_CAPACITY and kv.coverage is Coverage.MEASURED
    assert kv.share == pytest.approx(0.6) and kv.figures["hit_rate_lost"] == pytest.approx(0.4)
    assert kv.figures["working_set_tokens"] > 1.5 * kv.figures["kv_pool_tokens_total"]
    # the proximate cause follows the root cause in the sentence
    assert "60% of prefill tokens re-compute" in d.sentence and "; " in d.sentence


def test_an_estimated_hit_rate_gap_does_not_blame_a_pool_the_working_set_fits():
    # no client records of reuse: the gap to this workload's re-sent share is only an estimate,
    # and 16 users' ~0.18 M tokens fit a 0.76 M pool
    point = _point(p90_ttft_s=1.4, prefix_cache_hit_rate=0.80, extra={"backend": "sglang", "server_metrics": _sm()})
    d = diagnose_point(point, _trial(), CTX)
    kv = d.finding(Cause.KV_CAPACITY)
    assert kv.coverage is Coverage.ESTIMATED and kv.share == 0.0 and d.binding.cause is not Cause.KV_CAPACITY
    assert "estimated" in kv.missing


def test_host_link_from_the_host_cache_tier():
    sm = _sm(**{"sglang:cached_tokens_total{cache_source=host}": 400_000.0,
                "sglang:cached_tokens_total{cache_source=device}": 100_000.0})
    trial = _trial(hicache=True, flags={"enable-hierarchical-cache": True})
    d = diagnose_point(_point(p90_ttft_s=1.4, extra={"backend": "sglang", "server_metrics": sm}), trial, CTX)
    host = d.finding(Cause.HOST_LINK)
    # 0.4 M tokens x 91.6 kB over an H200's 55 GB/s host link: about 0.67 s of 60 s summed TTFT
    assert host.coverage is Coverage.ESTIMATED and host.figures["load_tokens"] == 400_000
    assert host.figures["load_s"] == pytest.approx(400_000 * 69.3e9 / 756_593 / 55e9, rel=1e-6)
    # without the tier breakdown it is unmeasured, and said so
    d2 = diagnose_point(_point(p90_ttft_s=1.4, extra={"backend": "sglang", "server_metrics": _sm()}), trial, CTX)
    assert d2.finding(Cause.HOST_LINK).coverage is Coverage.NOT_MEASURED
    assert any(f.cause is Cause.HOST_LINK for f in d2.not_observed())


def test_imbalance_across_attention_dp_ranks_from_per_rank_tokens():
    per_rank = {f"sglang:realtime_tokens_total{{dp_rank={i}}}": v for i, v in enumerate([900, 100, 100, 100])}
    trial = _trial(pools=4, flags={"attn-dp-size": 4})
    d = diagnose_point(_point(p90_ttft_s=1.4, extra={"backend": "sglang", "server_metrics": _sm(**per_rank)}),
                       trial, CTX)
    imb = d.finding(Cause.IMBALANCE)
    assert imb.coverage is Coverage.MEASURED and imb.share == pytest.approx(1 - 300 / 900)
    assert d.binding.cause is Cause.IMBALANCE and "the busiest of 4 ranks processes 3x the mean" in d.sentence
    # one pool: not applicable; several pools without per-rank metrics: not measured
    assert diagnose_point(_point(), _trial(), CTX).finding(Cause.IMBALANCE).coverage is Coverage.NOT_APPLICABLE
    assert diagnose_point(_point(extra={"server_metrics": _sm()}), trial, CTX).finding(Cause.IMBALANCE).coverage \
        is Coverage.NOT_MEASURED


# ---------------------------------------------------------------------------- TPOT causes
def test_tpot_from_waiting_behind_prefill_batches():
    point = _point(p90_tpot_s=0.030, p50_itl_s=0.006, extra={"backend": "sglang", "server_metrics": _sm()})
    d = diagnose_point(point, _trial(), CTX)
    assert d.binding.cause is Cause.PREFILL_INTERFERENCE and d.binding.share == pytest.approx(0.8)
    assert d.binding.coverage is Coverage.ESTIMATED


def test_tpot_from_the_decode_step_says_its_split_was_not_measured():
    point = _point(p90_tpot_s=0.024, p50_itl_s=0.021, extra={"backend": "sglang", "server_metrics": _sm()})
    d = diagnose_point(point, _trial(), CTX)
    assert d.binding.cause is Cause.DECODE_STEP
    assert "P50 inter-token time 21 ms at a mean of 5 decoding requests" in d.sentence  # 300 s / 62 s
    assert "split into attention, MoE" in d.binding.missing


def test_gpus_idle_while_throughput_plateaus():
    trial = _trial(gpu_mean_utilization=0.35)
    low = _point(users=32, throughput_tokens_per_s=1000.0)
    high = _point(users=64, throughput_tokens_per_s=1050.0, p90_tpot_s=0.030, p50_itl_s=0.025,
                  extra={"backend": "sglang", "server_metrics": _sm()})
    d = diagnose_point(high, trial, CTX, prev=low)
    assert d.binding.cause is Cause.GPU_IDLE and d.binding.share == pytest.approx(0.65)
    assert "throughput grew 1.05x from 32 to 64 users while the GPUs were busy 35%" in d.sentence
    # busy GPUs and the same plateau: not this cause
    busy = diagnose_point(high, _trial(gpu_mean_utilization=0.95), CTX, prev=low)
    assert busy.binding.cause is not Cause.GPU_IDLE


def _clocks(busy_mhz, limits=None, ceiling=1980):
    return {"samples": 60, "interval_s": 1.0,
            "per_gpu": {"0": {"mean_sm_clock_mhz": busy_mhz - 5, "mean_busy_sm_clock_mhz": busy_mhz,
                              "min_sm_clock_mhz": busy_mhz - 200, "max_sm_clock_mhz": ceiling,
                              "mean_power_w": 690.0, "max_temperature_c": 84, "clock_limit_share": limits or {}}}}


def test_a_gpu_held_below_its_clock_ceiling_is_said_first():
    # a TPOT miss the decode step would explain ...
    extra = {"backend": "sglang", "server_metrics": _sm(), "client_bound": False,
             "gpu_clocks": _clocks(1650, {"sw_power_cap": 0.64, "sw_thermal_slowdown": 0.1})}
    slowed = _point(p90_tpot_s=0.030, p50_itl_s=0.025, extra=extra)
    d = diagnose_point(slowed, _trial(), CTX)
    # ... but the card ran 17% below its ceiling: the measurement is in doubt, said first
    assert d.binding.cause is Cause.GPU_SLOWDOWN and d.binding.share == pytest.approx(1 - 1650 / 1980)
    assert ("GPU 0 ran at 1,650 MHz, 83% of its 1,980 MHz ceiling (sw power cap in 64% of samples, "
            "sw thermal slowdown in 10% of samples): every step ran on a slowed card") in d.sentence
    # at its ceiling: observed, and not blamed
    full = diagnose_point(_point(p90_tpot_s=0.030, p50_itl_s=0.025,
                                 extra={**extra, "gpu_clocks": _clocks(1980)}), _trial(), CTX)
    f = full.finding(Cause.GPU_SLOWDOWN)
    assert f.coverage is Coverage.MEASURED and f.share == 0.0 and full.binding.cause is not Cause.GPU_SLOWDOWN
    # recorded before clocks were: not measured, and listed so
    old = diagnose_point(_point(p90_tpot_s=0.030, extra={"backend": "sglang", "server_metrics": _sm()}), _trial(), CTX)
    assert old.finding(Cause.GPU_SLOWDOWN).coverage is Coverage.NOT_MEASURED


def test_gpu_utilisation_of_the_load_point_itself_is_preferred_over_the_trials_mean():
    # the trial's mean is high (its smaller load points kept the GPUs busy); this load point's own is low
    trial = _trial(gpu_mean_utilization=0.9)
    low = _point(users=32, throughput_tokens_per_s=1000.0)
    high = _point(users=64, throughput_tokens_per_s=1050.0, p90_tpot_s=0.030, p50_itl_s=0.025,
                  extra={"backend": "sglang", "server_metrics": _sm(),
                         "gpu_utilization": {"samples": 60, "mean_utilization_pct": 40.0}})
    d = diagnose_point(high, trial, CTX, prev=low)
    idle = d.finding(Cause.GPU_IDLE)
    assert d.binding.cause is Cause.GPU_IDLE and idle.share == pytest.approx(0.6) and idle.missing == ""
    assert "busy 40% of the time (NVML over the load point, warm-up included)" in d.sentence
    # without it, the trial's mean stands in and the gap is said
    d2 = diagnose_point(_point(users=64, throughput_tokens_per_s=1050.0, p90_tpot_s=0.030, p50_itl_s=0.025,
                               extra={"backend": "sglang", "server_metrics": _sm()}), trial, CTX, prev=low)
    assert d2.finding(Cause.GPU_IDLE).share == 0.0 and "per load point" in d2.finding(Cause.GPU_IDLE).missing


def test_the_decode_split_of_a_real_point_comes_from_the_stored_prediction():
    pred = {"p90_tpot_s": 0.02, "decode_step_s": 0.018,
            "decode_step_split": {"moe": 0.5, "attention": 0.2, "dense": 0.2, "communication": 0.05, "overhead": 0.05}}
    point = _point(p90_tpot_s=0.024, p50_itl_s=0.021,
                   extra={"backend": "sglang", "server_metrics": _sm(), "simulator_prediction": pred})
    d = diagnose_point(point, _trial(), CTX)
    assert d.binding.cause is Cause.DECODE_STEP and d.binding.coverage is Coverage.MEASURED
    assert "by the calibrated step-time model at this configuration: MoE 50%, attention 20%, dense 20%" in d.sentence
    assert d.binding.figures["decode_parts_share"]["moe"] == pytest.approx(0.5)
    assert "not a measurement" in d.binding.missing
    # a prediction that failed says nothing about the split
    failed = _point(p90_tpot_s=0.024, p50_itl_s=0.021,
                    extra={"backend": "sglang", "server_metrics": _sm(), "simulator_prediction": {"error": "x"}})
    assert "step-time model" not in diagnose_point(failed, _trial(), CTX).sentence


def test_a_failed_load_point_is_bound_by_its_errors():
    point = _point(valid=False, invalid_reason="error rate 12.0% above 5%", errors=12, requests=100)
    d = diagnose_point(point, _trial(), CTX)
    assert d.missed[0].value == "errors" and d.binding.cause is Cause.FAILED_REQUESTS
    assert d.sentence == "fails at 16 users: error rate 12.0% above 5%"


# ---------------------------------------------------------------------------- trials
def test_a_trial_is_bound_by_its_first_failing_point_above_its_capacity():
    pts = [_point(users=16, extra={"server_metrics": _sm()}),
           _point(users=32, p90_ttft_s=1.5, extra={"server_metrics": _sm(**{"sglang:queue_time_seconds_sum": 50.0})}),
           _point(users=24, p90_ttft_s=1.2, extra={"server_metrics": _sm()})]
    t = diagnose_trial(_trial(capacity_users=16), pts, CTX)
    assert t.bound is Bound.MISSED_TARGET and t.point.users == 24 and t.binding is Cause.PREFILL_COMPUTE
    assert t.sentence.startswith("misses P90 TTFT at 24 users (1.2 s, target 1 s)")
    assert [p.users for p in t.points] == [16, 24, 32]
    # what this trial could not observe is listed with the reason
    causes = {m["cause"] for m in t.not_measured}
    assert {"decode_step", "gpu_idle"} <= causes


def test_trials_that_did_not_serve_or_were_not_launched():
    oom = _trial(status=TrialStatus.FAILED, capacity_users=None, failure_class="oom",
                 failure_reason="CUDA out of memory. " + "x" * 400 + " (while capturing decode CUDA graphs)")
    t = diagnose_trial(oom, [], CTX)
    assert t.bound is Bound.DID_NOT_SERVE and t.sentence.startswith("did not serve (oom): CUDA out of memory")
    assert t.sentence.endswith("(while capturing decode CUDA graphs)") and len(t.sentence) < 280
    screened = _trial(status=TrialStatus.INFEASIBLE, launched=False, screened_by_planner=True,
                      failure_reason="planner: HiCache needs 3586 GB of host memory")
    assert diagnose_trial(screened, [], CTX).sentence.startswith("screened out by the planner: planner: HiCache")


def test_a_trial_that_meets_the_targets_at_the_search_limit_is_not_bound():
    t = diagnose_trial(_trial(capacity_users=128), [_point(users=64), _point(users=128)], CTX)
    assert t.bound is Bound.SEARCH_LIMIT and t.binding is None and "128 users" in t.sentence


def test_every_cause_has_a_finding_at_every_point():
    d = diagnose_point(_point(extra={}), _trial(), CTX)
    assert {f.cause for f in d.findings} == set(Cause)


def test_study_context_reads_the_stored_spec():
    spec = load_study("h200-sglang-qwen3")
    ctx = StudyContext.of_spec(spec)
    assert ctx.workload.name == "coding-agent-40k" and ctx.resolution_users == 8 and ctx.gpu == "h200"
