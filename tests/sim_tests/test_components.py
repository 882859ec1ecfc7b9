import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.catalog import get_gpu, get_model
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.sim.cache import SessionPrefixCache
from tuner.sim.calibrate import load_calibration, refit, tuned_speedup
from tuner.sim.router import Router, SessionIndex
from tuner.sim.steptime import RankWork, StepTimeModel


def model_for(gpu_name, flags, tiles="default", cal=None):
    m, gpu = get_model("glm-5.1"), get_gpu(gpu_name)
    plan = plan_memory(m, gpu, 8, flags)
    return StepTimeModel(m, gpu, resolve_checkpoint(m, flags.get("quantization")), parse_layout(m, flags, 8),
                         plan.bytes_per_token, cal or load_calibration(gpu_name), gpus_per_node=8, moe_tiles=tiles)


FP4_TP8 = {"tp-size": 8, "quantization": "modelopt_fp4"}
FP4_DP8 = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4"}


class _R:
    """A request as the caches see it: a session and the tokens it needs in KV."""

    def __init__(self, session, prefill_len=0, input_len=None):
        self.session, self.prefill_len = session, prefill_len
        self.input_len = prefill_len if input_len is None else input_len


def test_cache_lru_evicts_tail_of_least_recent_unlocked_session():
    c = SessionPrefixCache(capacity_tokens=1000, page_size=10, system_prefix_tokens=100)
    for s, n in ((1, 400), (2, 400)):
        c.lock(_R(s))
        assert c.insert(_R(s), n) == n
        c.unlock(_R(s))
    assert c.tree_tokens == 100 + 300 + 300 and c.free() == 300
    assert c.match(_R(2, 500)) == (400, 0)
    c.lock(_R(2))  # in flight: not evictable
    assert c.ensure_free(500)
    assert c.branch.get(1, 0) == 100 and c.branch[2] == 300  # session 1 lost its tail
    assert not c.ensure_free(10_000)
    assert c.match(_R(1, 1000)) == (200, 0)


def test_hicache_keeps_evicted_tokens_on_host():
    c = SessionPrefixCache(capacity_tokens=1000, page_size=1, system_prefix_tokens=100, host_capacity_tokens=2000)
    c.lock(_R(1))
    c.insert(_R(1), 600)
    c.unlock(_R(1))
    c.evict(500)
    assert c.match(_R(1, 700)) == (100, 500)  # 100 on the GPU (system prefix), 500 to load back
    c.lock(_R(1))
    assert c.load_back(_R(1), 500)
    assert c.match(_R(1, 700)) == (600, 0)


def test_decode_step_reads_distinct_experts_and_grows_with_batch():
    st = model_for("h200", FP4_TP8)
    t1 = st.moe_time(1)
    t64 = st.moe_time(64)
    t4096 = st.moe_time(4096)
    assert t1 < t64 < t4096
    # one token touches 8 of 256 experts: far less than 8x cheaper than all experts
    assert t64 / t1 > 5


def test_dsa_decode_attention_reads_topk_latents_only():
    st = model_for("h200", FP4_TP8)
    short = st.rank_time(RankWork(decode_reqs=1, decode_ctx_tokens=2048))
    long_ = st.rank_time(RankWork(decode_reqs=1, decode_ctx_tokens=100_000))
    # only the 132 B/layer index keys scale with context, not the 1152 B/layer latents
    extra_per_token = (long_ - short) / (100_000 - 2048)
    assert extra_per_token < 0.2 * st.cell / st.bw


def test_fp4_is_native_on_b200_and_dequantized_on_h200():
    h = model_for("h200", FP4_DP8)
    b = model_for("b200", FP4_DP8)
    assert h.moe_dequant_rate is not None and b.moe_dequant_rate is None
    assert b.moe_time(2048) < h.moe_time(2048) / 2


def test_cuda_graph_limit_makes_large_decode_batches_slower():
    st = model_for("h200", {**FP4_TP8})
    st.graph_bs = 64
    within = st.step_time([RankWork(decode_reqs=64, decode_ctx_tokens=64 * 4000)])
    beyond = st.step_time([RankWork(decode_reqs=65, decode_ctx_tokens=65 * 4000)])
    assert beyond - within > 0.5 * st.eager_s


def test_refit_from_kernel_summary_changes_tuned_speedups():
    cal = load_calibration("h200")
    summary = {"batch_sizes": {"1": {"default_us": 100.0, "found_us": 80.0},
                               "64": {"default_us": 400.0, "found_us": 100.0},
                               "bad": {"default_us": 1}}}
    fitted = refit(summary, cal, predicted_default_us=lambda m: {1: 50.0, 64: 200.0}[m])
    assert fitted["moe_tuned_speedup"] == {1: 1.25, 64: 4.0}
    assert fitted["compute_efficiency"]["moe"] == pytest.approx(cal["compute_efficiency"]["moe"] * 0.5)
    assert tuned_speedup(fitted, 8) == pytest.approx(1.25 + 0.5 * (4.0 - 1.25))
    tuned = model_for("h200", FP4_DP8, tiles="tuned", cal=fitted)
    default = model_for("h200", FP4_DP8, tiles="default", cal=fitted)
    assert tuned.moe_time(64) < default.moe_time(64)


def test_refit_cli_writes_calibration(tmp_path, monkeypatch):
    import tuner.sim.calibrate as calmod

    src = tmp_path / "cal"
    src.mkdir()
    (src / "default.yaml").write_text((calmod.CALIBRATION_DIR / "default.yaml").read_text())
    monkeypatch.setattr(calmod, "CALIBRATION_DIR", src)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"16": {"default_us": 30, "found_us": 20}}))
    from click.testing import CliRunner

    from tuner.cli import cli

    r = CliRunner().invoke(cli, ["calibration", "refit", "--summary", str(summary), "--gpu", "h200"])
    assert r.exit_code == 0, r.output
    assert load_calibration("h200")["moe_tuned_speedup"] == {16: 1.5}


SGLANG_KERNELS = Path(__file__).resolve().parents[2] / "results/kernels/h200/sglang/summary.json"


def test_refit_from_sglang_kernel_reports_writes_each_shapes_table_and_their_median(tmp_path, monkeypatch):
    import tuner.sim.calibrate as calmod

    src = tmp_path / "cal"
    src.mkdir()
    (src / "default.yaml").write_text((calmod.CALIBRATION_DIR / "default.yaml").read_text())
    monkeypatch.setattr(calmod, "CALIBRATION_DIR", src)
    from tuner.cli import cli

    r = CliRunner().invoke(cli, ["calibration", "refit", "--summary", str(SGLANG_KERNELS), "--gpu", "h200"])
    assert r.exit_code == 0, r.output
    cal = load_calibration("h200")
    reports = {x["tag"]: x for x in json.loads(SGLANG_KERNELS.read_text())["reports"] if x["kind"] == "moe"}
    assert set(cal["moe_tuned_speedup_by_shape"]) == set(reports)  # the GEMM reports are not MoE tables
    for tag, report in reports.items():  # tuned over what SGLang itself runs (shipped file, else default)
        assert cal["moe_tuned_speedup_by_shape"][tag] == {
            row["batch_size"]: pytest.approx(row["speedup_vs_baseline"], abs=1e-4) for row in report["rows"]}
    m1 = sorted(t.get(1) for t in cal["moe_tuned_speedup_by_shape"].values())
    assert cal["moe_tuned_speedup"][1] == m1[1]  # unmeasured shapes: the median of the measured ones


def _h200_model(model, flags, tiles, cal):
    m, gpu, n = get_model(model), get_gpu("h200"), flags["tp-size"]
    plan = plan_memory(m, gpu, n, flags)
    return StepTimeModel(m, gpu, resolve_checkpoint(m, flags.get("quantization")), parse_layout(m, flags, n),
                         plan.bytes_per_token, cal, gpus_per_node=n, moe_tiles=tiles)


def test_a_tuned_shape_runs_its_own_measured_speedup_and_an_unmeasured_one_the_median():
    cal = load_calibration("h200")
    cal["moe_tuned_speedup_by_shape"] = {"E128_N768_K2048_bf16": {1: 1.01, 64: 1.01},
                                         "E257_N2048_K7168_fp8_w8a8_b128x128": {1: 1.5, 64: 1.25}}
    cal["moe_tuned_speedup"] = {1: 1.2, 64: 1.2}
    cases = [("qwen3-30b-a3b", {"tp-size": 1}, "E128_N768_K2048_bf16", 1.01),
             ("deepseek-v3", {"tp-size": 8, "quantization": "fp8"}, None, 1.2),  # moe-TP 8: a shape not tuned
             ("qwen3-30b-a3b", {"tp-size": 1, "quantization": "fp8"}, "E128_N768_K2048_fp8_w8a8_b128x128", 1.2)]
    for model, flags, tag, speedup in cases:
        tuned, default = (_h200_model(model, flags, t, cal) for t in ("tuned", "default"))
        assert tuned.moe_kernel_tag == (tag or tuned.moe_kernel_tag)
        roof = lambda sm: sm.moe_time(64) - sm.moe_fixed_s
        assert roof(default) / roof(tuned) == pytest.approx(speedup, rel=1e-6), (model, flags)
    assert _h200_model("deepseek-v3", {"tp-size": 8, "quantization": "fp8"}, "tuned", cal).moe_kernel_tag \
        == "E257_N256_K7168_fp8_w8a8_b128x128"  # moe-TP 8 slices N; the fused shared expert is the 257th
    assert model_for("h200", FP4_DP8, tiles="tuned").moe_kernel_tag is None  # NVFP4 runs no Triton fused MoE


def test_cache_aware_router_keeps_sessions_and_balances_new_ones():
    r = Router("cache_aware", 4, SessionIndex(4, system_prefix_tokens=5000))
    loads = [0, 0, 0, 0]

    def route(session, prompt):
        rank = r.route(_R(session, prompt), loads, loads)
        loads[rank] += 1
        return rank

    assert route(0, 13000) == 0
    # only rank 0 holds the system prefix: 5000/13000 > cache_threshold 0.3 -> rank 0 again
    assert route(1, 13000) == 0
    # a long first prompt matches less than 30% -> least-loaded rank
    assert [route(s, 30000) for s in (2, 3, 4)] == [1, 2, 3]
    # every rank now holds the system prefix: equal matches go to the least loaded
    loads[:] = [5, 1, 3, 3]
    assert route(5, 13000) == 1
    assert route(2, 40000) == 1  # a returning session sticks to the rank holding its conversation
    loads[:] = [200, 0, 0, 0]  # imbalanced (abs > 64 and rel > 1.5): least loaded wins
    assert route(0, 20000) == 1
    rr = Router("round_robin", 4, SessionIndex(4, 5000))
    assert [rr.route(_R(0, 10), loads, loads) for _ in range(5)] == [0, 1, 2, 3, 0]


def test_sim_evaluator_deploys_and_measures():
    from types import SimpleNamespace

    from tuner.errors import TrialError
    from tuner.evaluation.base import TrialRequest
    from tuner.evaluation.sim import SimEvaluator
    from tests.sim_tests.test_behaviour import AGENT

    from tuner.config.schema import MeasurementSpec

    study = SimpleNamespace(
        model="glm-5.1", hardware=SimpleNamespace(gpu="h200", gpus_per_node=8, nodes=1, host_memory_gb=2048),
        workload_profile=lambda: AGENT, measurement=MeasurementSpec(warmup_s=30, duration_s=50))
    ev = SimEvaluator()
    req = TrialRequest(study=study, trial_number=0, flags=FP4_DP8, knobs={"router-policy": "cache_aware"})
    assert ev.kind == "simulator" and ev.gpus_needed(req) == 0
    with ev.deploy(req) as dep:
        assert dep.predicted_kv_capacity_tokens_total == plan_memory("glm-5.1", "h200", 8, FP4_DP8).kv_capacity_tokens_total
        m = dep.measure(8)
        assert m.duration_s == 50 and m.requests > 0
    with pytest.raises(TrialError):
        ev.deploy(TrialRequest(study=study, trial_number=1, flags={"tp-size": 8}))


def test_simulate_cli_json_contract(tmp_path):
    from tuner.cli import cli

    study = tmp_path / "s.yaml"
    study.write_text("""
name: s
model: glm-5.1
hardware: {gpu: h200, gpus_per_node: 8, nodes: 1}
workload: coding-agent
search_space: glm-5.1
slo: {p90_ttft_s: 30.0, p90_tpot_s: 0.050}
measurement: {warmup_s: 30, duration_s: 60}
baseline: {tp-size: 8, quantization: modelopt_fp4}
backend: simulator
""")
    res = CliRunner().invoke(cli, ["simulate", "--study", str(study), "--users", "8", "--json",
                                   "--config", '{"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, '
                                               '"quantization": "modelopt_fp4", "router-policy": "cache_aware"}'])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("users", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "p50_tpot_s", "p90_tpot_s", "p99_tpot_s",
                "throughput_tokens_per_s", "prefix_cache_hit_rate", "kv_capacity_tokens_total", "meets_slo",
                "requests"):
        assert key in doc
    assert doc["users"] == 8 and doc["knobs"] == {"router-policy": "cache_aware"} and doc["requests"] > 0


def test_tuned_tiles_speed_up_the_block_fp8_linears_by_the_fitted_table():
    m, gpu = get_model("qwen3-30b-a3b"), get_gpu("h200")
    flags = {"tp-size": 1, "quantization": "fp8"}
    ckpt = resolve_checkpoint(m, "fp8")
    plan = plan_memory(m, gpu, 1, flags)
    cal = {**load_calibration("h200"), "gemm_tuned_speedup": {1: 1.5, 64: 1.5, 4096: 1.0}}

    def model(tiles, c=cal, mm=m, ck=ckpt):
        return StepTimeModel(mm, gpu, ck, parse_layout(mm, flags, 1), plan.bytes_per_token, c, gpus_per_node=8,
                             moe_tiles=tiles)

    default, tuned = model("default"), model("tuned")
    assert tuned.tile_tuned_gemms == {"qkv_proj", "o_proj"}
    lm = default.linear_time(16, 16) - default.linear_time(16, 0)  # the lm_head reads no tile file
    assert tuned.linear_time(16, 16) - tuned.linear_time(16, 0) == pytest.approx(lm)
    # decode-sized: the block-fp8 linears' time divided by 1.5 (the bf16 router gate unchanged), so a
    # 3x table saves twice what 1.5x does; a large prefill: the table says no gain
    tuned3 = model("tuned", {**cal, "gemm_tuned_speedup": {1: 3.0, 64: 3.0, 4096: 1.0}})
    saved15 = default.linear_time(16, 0) - tuned.linear_time(16, 0)
    saved3 = default.linear_time(16, 0) - tuned3.linear_time(16, 0)
    assert saved15 > 0 and saved3 / saved15 == pytest.approx(2.0)
    assert tuned.linear_time(4096, 0) == pytest.approx(default.linear_time(4096, 0))
    # bf16 linears read no block-fp8 tile file: nothing changes
    bf16 = resolve_checkpoint(m, None)
    b_def = StepTimeModel(m, gpu, bf16, parse_layout(m, {"tp-size": 1}, 1), plan.bytes_per_token, cal,
                          gpus_per_node=8, moe_tiles="default")
    b_tun = StepTimeModel(m, gpu, bf16, parse_layout(m, {"tp-size": 1}, 1), plan.bytes_per_token, cal,
                          gpus_per_node=8, moe_tiles="tuned")
    assert not b_tun.tile_tuned_gemms and b_tun.linear_time(16, 0) == pytest.approx(b_def.linear_time(16, 0))


COLLAPSED_COMPARE = Path(__file__).resolve().parents[2] / "results/kernels/h200/sglang/compare/dsv3-collapsed.json"


def test_refit_with_a_collapsed_compare_writes_that_shapes_collapsed_table_and_refuses_another_routing(
        tmp_path, monkeypatch):
    import tuner.sim.calibrate as calmod

    src = tmp_path / "cal"
    src.mkdir()
    (src / "default.yaml").write_text((calmod.CALIBRATION_DIR / "default.yaml").read_text())
    monkeypatch.setattr(calmod, "CALIBRATION_DIR", src)
    from tuner.cli import cli

    base = ["calibration", "refit", "--summary", str(SGLANG_KERNELS), "--gpu", "h200"]
    serving = tmp_path / "serving.json"
    serving.write_text(COLLAPSED_COMPARE.read_text().replace('"routing": "collapsed"', '"routing": "serving"'))
    r = CliRunner().invoke(cli, base + ["--compare", str(serving)])
    assert r.exit_code != 0 and not (src / "h200.yaml").exists()  # nothing written
    r = CliRunner().invoke(cli, base + ["--compare", str(COLLAPSED_COMPARE)])
    assert r.exit_code == 0, r.output
    doc = json.loads(COLLAPSED_COMPARE.read_text())
    table = load_calibration("h200")[calmod.COLLAPSED_SPEEDUPS_KEY][doc["tag"]]
    assert table == {row["batch_size"]: pytest.approx(row["default_us"] / row["files_us"], abs=1e-4)
                     for row in doc["rows"]}


def test_a_collapsed_router_takes_tuned_tiles_only_from_a_table_timed_under_that_routing():
    dummy = {"tp-size": 8, "quantization": "fp8", "load-format": "dummy"}
    cal = load_calibration("h200")
    tag = "E33_N2048_K7168_fp8_w8a8_b128x128"  # DeepSeek-V3 at EP8, fused shared expert: 256/8 + 1
    cal["moe_tuned_speedup_by_shape"] = {tag: {1: 1.5, 4096: 1.5}}
    cal.pop("moe_tuned_speedup_collapsed_by_shape", None)

    def model(tiles, flags=dummy):
        m, gpu = get_model("deepseek-v3"), get_gpu("h200")
        plan = plan_memory(m, gpu, 8, flags)
        layout = parse_layout(m, {**flags, "ep-size": 8}, 8)
        return StepTimeModel(m, gpu, resolve_checkpoint(m, "fp8"), layout, plan.bytes_per_token, cal,
                             gpus_per_node=8, moe_tiles=tiles, flags=flags)

    assert model("tuned").moe_kernel_tag == tag
    # real weights route apart: the uniform table applies
    real = {k: v for k, v in dummy.items() if k != "load-format"}
    assert model("tuned", real).moe_time(512) == pytest.approx(model("default", real).moe_time(512) / 1.5, rel=0.02)
    # collapsed and no table timed under it: tuned tiles are claimed no gain
    assert model("tuned").moe_time(512) == pytest.approx(model("default").moe_time(512), rel=1e-9)
    cal["moe_tuned_speedup_collapsed_by_shape"] = {tag: {16: 1.1, 512: 0.5}}
    assert model("tuned").moe_time(512) > 1.5 * model("default").moe_time(512)


def test_hicache_write_cpu_time_counts_sglangs_runtime_calls_per_page():
    # Qwen3-30B-A3B, fp8 KV on one GPU: 48 layers x 4 KV heads x 128 x 1 byte = 24 KiB of K (and of V)
    # per token, under the 128 KiB from which SGLang batches its copies: page size 1 issues one copy
    # per token per tensor plus one gather launch per 64 pages
    m, gpu = get_model("qwen3-30b-a3b"), get_gpu("h200")
    cal = {**load_calibration("h200")}
    cal["overhead"] = {**cal["overhead"], "hicache_write_call_s": 1e-6}

    def model(**flags):
        f = {"tp-size": 1, "kv-cache-dtype": "fp8_e4m3", **flags}
        plan = plan_memory(m, gpu, 1, f)
        return StepTimeModel(m, gpu, resolve_checkpoint(m, None), parse_layout(m, f, 1), plan.bytes_per_token, cal,
                             gpus_per_node=8, flags=f)

    sm = model()
    assert sm.cell == 2 * 48 * 4 * 128
    assert sm.host_write_cpu_s(640) == pytest.approx((640 * 2 + 10) * 1e-6)
    assert sm.host_write_cpu_s(0) == 0.0
    # page size 16: 40 pages of 384 KiB per tensor, batched: one copy call per gather launch
    assert model(**{"page-size": 16}).host_write_cpu_s(640) == pytest.approx(2 * 1e-6)
    # the layer-first layout runs one transfer kernel; write-back writes nothing on insert
    assert model(**{"hicache-mem-layout": "layer_first"}).host_write_cpu_s(640) == pytest.approx(1e-6)
    assert model(**{"hicache-write-policy": "write_back"}).host_write_cpu_s(640) == 0.0
    # the shipped calibration charges what the H100's hicache_write tables measured
    assert load_calibration("h200")["overhead"]["hicache_write_call_s"] > 0
    assert load_calibration("h200")["overhead"]["hicache_copy_latency_s"] > 0


def test_a_backup_past_the_copy_queue_waits_for_copies_and_for_an_extend_launched_before_it():
    # 3,000 tokens: 6,000 page copies + 47 gather launches, past the 1,000 the driver queues. Each
    # copy takes 2 us + 24 KiB over the 55 GB/s host link; the thread issues at 1 us a call
    m, gpu = get_model("qwen3-30b-a3b"), get_gpu("h200")
    cal = {**load_calibration("h200")}
    cal["overhead"] = {**cal["overhead"], "hicache_write_call_s": 1e-6, "hicache_copy_latency_s": 2e-6}
    f = {"tp-size": 1, "kv-cache-dtype": "fp8_e4m3"}
    plan = plan_memory(m, gpu, 1, f)
    sm = StepTimeModel(m, gpu, resolve_checkpoint(m, None), parse_layout(m, f, 1), plan.bytes_per_token, cal,
                       gpus_per_node=8, flags=f, cuda_graph_max_bs=64, kv_cache_dtype=plan.kv_cache_dtype)
    calls, copy_s = 6047, 2e-6 + 24576 / 55e9
    assert sm.host_write_calls(3000) == calls
    assert sm.host_write_cpu_s(3000) == pytest.approx((calls - 1000) * copy_s)  # the copies, not the issue
    assert sm.host_write_cpu_s(3000, 0.08) == pytest.approx(0.08 + (calls - 1000) * copy_s)
    assert sm.host_write_cpu_s(400, 0.08) == pytest.approx(807e-6)  # the queue holds 807 calls
    # what gates the write stream: all of an extend, all of an eager decode, nothing of a graph replay
    prefill, decode, eager = RankWork(), RankWork(), RankWork()
    prefill.prefill_tokens, decode.decode_reqs, eager.decode_reqs = 2000, 64, 65
    assert sm.write_gate_s([prefill], 0.08) == 0.08
    assert sm.write_gate_s([decode], 0.02) == 0.0
    assert sm.write_gate_s([eager], 0.02) == 0.02
