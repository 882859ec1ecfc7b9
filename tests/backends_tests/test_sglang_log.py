"""Start-up reports and failure reasons from real SGLang 0.5.17 server logs (excerpts of the H200
runs under results/h200-sglang/, cut to their start-up lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.backends.process import classify_log
from tuner.backends.sglang import SGLangBackend
from tuner.backends.sglang_log import describe_death, startup_report
from tuner.catalog import ModelRef
from tuner.planner import plan_memory

DATA = Path(__file__).with_name("data")


def test_decode_graph_oom_after_the_kv_pool_is_read_from_the_real_log():
    text = (DATA / "sglang-0.5.17-decode-graph-oom.log").read_text()
    assert classify_log(text) == "oom"
    report = startup_report(text, exited=True)
    assert report.kv_tokens == 7805681 and report.kv_memory_gb == 67.0
    assert report.weight_memory_gb == 59.2
    assert report.died_during == "capture_decode" and not report.ready
    assert describe_death(report) == ("while capturing decode CUDA graphs after the KV pool (7,805,681 tokens) "
                                      "was allocated")
    assert SGLangBackend().startup_failure_detail(text) == describe_death(report)


def test_the_planner_predicts_that_failure_before_launch():
    # the study's baseline: DeepSeek-V3 shapes with 8 layers, fp8, SGLang 0.5.17's defaults on one H200
    model = ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})
    flags = {"tp-size": 1, "quantization": "fp8", "attention-backend": "triton", "sampling-backend": "pytorch",
             "disable-prefill-cuda-graph": True, "enable-metrics": True}
    plan = plan_memory(model, "h200", 1, flags, sglang_version="0.5.17")
    assert not plan.fits and plan.failure_class == "oom"
    assert "CUDA-graph state" in plan.reason
    assert abs(plan.kv_capacity_tokens_total - 7805681) / 7805681 < 0.01  # the pool it allocated first
    served = plan_memory(model, "h200", 1, {**flags, "mem-fraction-static": 0.85, "kv-cache-dtype": "fp8_e4m3",
                                            "max-running-requests": 64}, sglang_version="0.5.17")
    assert served.fits  # the configuration that served, trial 2 (13,762,597 tokens measured)
    assert abs(served.kv_capacity_tokens_total - 13762597) / 13762597 < 0.01


def test_out_of_memory_on_the_first_long_prefill_is_read_from_the_real_log():
    # trial 4 of h200-sglang-dsv3: it started, then died on its first prompts of the replay
    text = (DATA / "sglang-0.5.17-prefill-oom.log").read_text()
    assert classify_log(text) == "oom"
    report = startup_report(text, exited=True)
    assert report.ready and report.died_during == "serving"
    assert report.max_running_requests == 4096 and report.chunked_prefill_size == 8192
    assert report.capture_memory_gb == {"decode": 16.76} and report.available_after_startup_gb == 0.92
    assert describe_death(report) == "while serving"


def test_the_planner_predicts_the_prefill_out_of_memory_and_what_served_beside_it():
    model = ModelRef(name="deepseek-v3", overrides={"num_hidden_layers": 8})
    flags = {"tp-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.85,
             "attention-backend": "triton", "sampling-backend": "pytorch", "disable-prefill-cuda-graph": True}
    died = plan_memory(model, "h200", 1, flags, sglang_version="0.5.17")
    # start-up itself fits (it did start): the graph state for max bs 256 leaves too little for a chunk
    assert not died.fits and died.failure_class == "oom" and "first long prefill" in died.reason
    assert "8192-token prefill chunk" in died.reason and "max bs 256" in died.reason
    left_gib = (died.startup_free_gb_per_gpu - died.startup_gb_per_gpu) * 1e9 / 2**30
    assert left_gib == pytest.approx(0.92, abs=0.15)  # SGLang left 0.92 GiB
    assert left_gib < died.prefill_activation_gb_per_gpu * 1e9 / 2**30
    # trial 2: the same with max-running-requests 64 (graphs to 64, 15.96 GiB left) served 8 users
    assert plan_memory(model, "h200", 1, {**flags, "max-running-requests": 64}, sglang_version="0.5.17").fits
    # a small chunk is the other way out: 512 tokens need a sixteenth of the activations
    small_chunk = plan_memory(model, "h200", 1, {**flags, "chunked-prefill-size": 512}, sglang_version="0.5.17")
    assert small_chunk.prefill_activation_gb_per_gpu < died.prefill_activation_gb_per_gpu / 8
    assert small_chunk.fits


def test_hicache_start_up_is_timed_from_the_real_log():
    report = startup_report((DATA / "sglang-0.5.17-hicache-start.log").read_text())
    assert report.ready and report.kv_tokens == 1339864 and report.max_total_num_tokens == 1339864
    assert report.capture_s == {"decode": 60.18}
    assert report.hicache_host_tokens == 2009797 and report.hicache_host_gb == 98.79
    # pinning ~99 GB of host memory took longer than capturing the decode graphs
    assert report.timeline_s["host_pool_allocation_s"] > report.capture_s["decode"]
    assert report.timeline_s["ready"] >= report.timeline_s["decode_graphs_captured"]
