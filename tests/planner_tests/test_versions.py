"""Version-aware planner: SGLang 0.5.17's and 0.5.23's defaults, worked values for both, and the
start-up out-of-memory seen on the H200 (Triton attention's CUDA-graph state)."""

import json

import pytest
from click.testing import CliRunner

from tuner.catalog import get_gpu, get_model
from tuner.cli import cli
from tuner.planner import parse_layout, plan_memory
from tuner.planner.memory import captured_token_counts, default_mem_fraction_static, prefill_capture_sizes
from tuner.planner.startup import startup_memory, triton_max_kv_splits

GIB = 2**30
DS5 = {"tp-size": 1, "attention-backend": "triton"}


@pytest.mark.parametrize("model,gpus,flags,v17,v23", [
    # DSA (GLM-5.1): breakable prefill graphs in both versions -> the same
    ("glm-5.1", 8, {"tp-size": 8, "quantization": "modelopt_fp4"}, (0.886, 16384), (0.886, 16384)),
    ("glm-5.1", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4"},
     (0.758, 34816), (0.758, 34816)),
    # MLA (DeepSeek-V3): 0.5.17 disables the breakable prefill graph for non-DSA MLA, so no 1.5 GiB
    # prefill-graph reserve: 512 + 1.5 x 8192 + 8/8 x 1024 + 2 x 512 = 14848 MiB -> 0.897
    ("deepseek-v3", 8, {"tp-size": 8, "quantization": "fp8"}, (0.897, 14848), (0.886, 16384)),
    ("deepseek-v3", 8, {"tp-size": 8, "attn-dp-size": 8, "quantization": "fp8"}, (0.769, 33280), (0.758, 34816)),
    # one H200, TP 1: 512 + 12288 + 128 + 2 x 256 (+ 1536 in 0.5.23) -> 0.907 vs 0.896
    ("deepseek-v3-5l", 1, DS5, (0.907, 13440), (0.896, 14976)),
    # GQA: 58 breakable prefill capture sizes up to 8192 tokens x 8 MiB = 464 MiB in both
    ("qwen3-30b-a3b", 1, DS5, (0.903, 13904), (0.903, 13904)),
])
def test_default_mem_fraction_static_by_version(model, gpus, flags, v17, v23):
    for version, (mfs, reserved) in (("0.5.17", v17), ("0.5.23", v23)):
        p = plan_memory(model, "h200", gpus, flags, sglang_version=version)
        assert (p.mem_fraction_static, p.reserved_mib, p.sglang_version) == (mfs, reserved, version)


def test_the_default_version_is_0523_and_patch_releases_follow_their_minor():
    p = plan_memory("deepseek-v3-5l", "h200", 1, DS5)
    assert p.sglang_version == "0.5.23" and p.mem_fraction_static == 0.896
    assert plan_memory("deepseek-v3-5l", "h200", 1, DS5, sglang_version="0.5.17.post1").mem_fraction_static == 0.907


def test_kv_capacity_at_the_default_fraction_differs_by_version_for_mla_only():
    # the H200 finding: at the default mem-fraction-static the 0.5.23 rules were low for an MLA
    # model against 0.5.17; with mem-fraction-static given both agree
    k17 = plan_memory("deepseek-v3-5l", "h200", 1, DS5, sglang_version="0.5.17").kv_capacity_tokens_per_gpu
    k23 = plan_memory("deepseek-v3-5l", "h200", 1, DS5, sglang_version="0.5.23").kv_capacity_tokens_per_gpu
    assert (k17, k23) == (14277813, 13992561) and k17 / k23 == pytest.approx(1.0204, abs=1e-4)
    given = {**DS5, "mem-fraction-static": 0.8}
    assert plan_memory("deepseek-v3-5l", "h200", 1, given, sglang_version="0.5.17").kv_capacity_tokens_per_gpu == \
        plan_memory("deepseek-v3-5l", "h200", 1, given, sglang_version="0.5.23").kv_capacity_tokens_per_gpu
    q = [plan_memory("qwen3-30b-a3b", "h200", 1, DS5, sglang_version=v).kv_capacity_tokens_per_gpu
         for v in ("0.5.17", "0.5.23")]
    assert q[0] == q[1] == 750887  # SGLang 0.5.17 reported 750,511 for this server (prefill-graphs trial 0)


def test_the_24_gib_bucket_differs_between_versions():
    m = get_model("qwen3-30b-a3b")
    g = get_gpu("h100").model_copy(update={"name": "g24", "memory_mib": 24576, "torch_total_memory_bytes": None})
    lay = parse_layout(m, {"tp-size": 1}, 1)
    # 0.5.17: chunk 2048, decode max bs 24; 0.5.23: 4096 and 48
    assert default_mem_fraction_static(m, g, lay, {"tp-size": 1}, "0.5.17") == (0.833, 4096.0, 2048, 24)
    assert default_mem_fraction_static(m, g, lay, {"tp-size": 1}, "0.5.23") == (0.704, 7280.0, 4096, 48)


def test_the_batch_sizes_a_server_runs_while_it_starts():
    qwen, h200 = get_model("qwen3-30b-a3b"), get_gpu("h200")
    eager = {"disable-prefill-cuda-graph": True, "cuda-graph-max-bs-decode": 64}
    plan = plan_memory(qwen, h200, 1, eager, sglang_version="0.5.17")
    # the decode graphs' batch sizes only, up to 64
    assert captured_token_counts(qwen, eager, plan) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    # no decode graphs: nothing runs before traffic
    off = {**eager, "disable-cuda-graph": True}
    assert captured_token_counts(qwen, off, plan_memory(qwen, h200, 1, off, sglang_version="0.5.17")) == []
    # prefill graphs (0.5.17's default here) add their token counts up to the chunk
    graphs = {"cuda-graph-max-bs-decode": 64, "chunked-prefill-size": 2048}
    with_prefill = captured_token_counts(qwen, graphs, plan_memory(qwen, h200, 1, graphs, sglang_version="0.5.17"))
    assert with_prefill[-1] == 2048 and 1280 in with_prefill and 64 in with_prefill


def test_prefill_capture_sizes_are_sglangs_list():
    sizes = prefill_capture_sizes(8192)
    assert len(sizes) == 58 and sizes[:3] == [4, 8, 12] and sizes[-2:] == [7680, 8192]
    assert prefill_capture_sizes(2048)[-1] == 2048 and len(prefill_capture_sizes(2048)) == 42


def test_triton_graph_state_of_deepseek_v3_on_one_h200_is_16_gib():
    m, g = get_model("deepseek-v3-5l"), get_gpu("h200")
    assert triton_max_kv_splits(m, g, 163840, None) == 256  # min(next_pow2(132 SMs), next_pow2(163840/32))
    assert triton_max_kv_splits(get_model("qwen3-30b-a3b"), g, 40960, None) == 8
    s = startup_memory(m, g, parse_layout(m, DS5, 1), attention_backend="triton", context_len=163840,
                       max_running_per_rank=4096, decode_graph=True, graph_max_bs=256, prefill_graph_mib=0,
                       page_size=1)
    logits_and_lse = 256 * 128 * 256 * (512 + 1) * 4
    assert s.attention_graph_state_bytes == logits_and_lse + 256 * 163840 * 8
    assert logits_and_lse / GIB == pytest.approx(16.03, abs=0.01)
    assert s.req_to_token_bytes == 4097 * (163840 + 4) * 4


def test_start_up_out_of_memory_in_the_triton_graph_state_is_predicted():
    # seen on the H200 with SGLang 0.5.17: default mem-fraction-static, --attention-backend triton ->
    # OOM capturing decode graphs (16 GiB asked, 10 GiB free); --mem-fraction-static 0.8 served
    oom = plan_memory("deepseek-v3-5l", "h200", 1, DS5, sglang_version="0.5.17")
    assert not oom.fits and "CUDA out of memory at start-up" in oom.reason
    assert "triton attention CUDA-graph state 16.3 GiB" in oom.reason
    free_for_graphs = oom.startup_free_gb_per_gpu * 1e9 - 4097 * (163840 + 4) * 4
    assert free_for_graphs / GIB == pytest.approx(10.4, abs=0.2)
    assert plan_memory("deepseek-v3-5l", "h200", 1, {**DS5, "mem-fraction-static": 0.8}, sglang_version="0.5.17").fits
    # the same model with a small decode graph, or with a backend without the split-KV buffers, starts
    assert plan_memory("deepseek-v3-5l", "h200", 1, {**DS5, "cuda-graph-max-bs-decode": 64},
                       sglang_version="0.5.17").fits
    assert plan_memory("deepseek-v3-5l", "h200", 1, {"tp-size": 1}, sglang_version="0.5.17").fits  # fa3
    assert plan_memory("deepseek-v3-5l", "h200", 1, {**DS5, "disable-cuda-graph": True},
                       sglang_version="0.5.17").fits


def test_simulator_reports_the_start_up_oom_as_an_oom_trial():
    from tuner.errors import TrialError
    from tuner.sim import simulate_load_point
    from tuner.bench.simulator_cost import CODING_AGENT

    with pytest.raises(TrialError) as exc:
        simulate_load_point("deepseek-v3-5l", "h200", 1, DS5, {}, CODING_AGENT, 2, warmup_s=5, duration_s=5,
                            sglang_version="0.5.17")
    assert exc.value.failure_class == "oom"


def test_plan_cli_takes_the_version():
    args = ["plan", "--model", "deepseek-v3-5l", "--hardware", "h200", "--gpus", "1", "--tp-size", "1",
            "--attention-backend", "triton", "--json"]
    for version, fits in (("0.5.17", False), ("0.5.23", False)):
        res = CliRunner().invoke(cli, args + ["--sglang-version", version])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert doc["sglang_version"] == version and doc["fits"] is fits
    res = CliRunner().invoke(cli, args + ["--mem-fraction-static", "0.8", "--sglang-version", "0.5.17"])
    assert json.loads(res.output)["fits"] is True
