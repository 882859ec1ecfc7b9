import json

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.planner import plan_memory
from tuner.planner.weights import param_counts
from tuner.catalog import get_model

FP4 = {"quantization": "modelopt_fp4"}


@pytest.mark.parametrize(
    "gpu,extra,expected",
    [("h200", {}, 0.886), ("h200", {"attn-dp-size": 8}, 0.758), ("b200", {}, 0.844), ("h100", {}, 0.799)],
)
def test_default_mem_fraction_static_matches_sglang_worked_values(gpu, extra, expected):
    p = plan_memory("glm-5.1", gpu, 8, {"tp-size": 8, **FP4, **extra})
    assert p.mem_fraction_static == expected


def test_reserved_mib_worked_values():
    assert plan_memory("deepseek-v3", "h200", 8, {"tp-size": 8, "quantization": "fp8"}).reserved_mib == 16384
    assert plan_memory("deepseek-v3", "b200", 8, {"tp-size": 8, "quantization": "fp8"}).reserved_mib == 28672
    dp = plan_memory("deepseek-v3", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "quantization": "fp8"})
    assert dp.reserved_mib == 34816
    deepep = plan_memory("deepseek-v3", "h200", 8,
                         {"tp-size": 8, "attn-dp-size": 8, "quantization": "fp8", "moe-a2a-backend": "deepep"})
    assert deepep.mem_fraction_static == 0.736


def test_parameter_totals_match_published_sizes():
    c = param_counts(get_model("glm-5.1"))
    total = sum(v for k, v in c.items() if k != "mtp")
    assert total / 1e9 == pytest.approx(743.9, abs=0.1)
    assert (total + c["mtp"]) / 1e9 == pytest.approx(753.9, abs=0.1)
    ds = param_counts(get_model("deepseek-v3"))
    assert sum(v for k, v in ds.items() if k != "mtp") / 1e9 == pytest.approx(671.0, abs=0.1)


def test_glm5_cell_sizes_per_platform():
    assert plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, **FP4}).bytes_per_token == 100152
    assert plan_memory("glm-5.1", "b200", 8, {"tp-size": 8, **FP4}).bytes_per_token == 55224
    fp8 = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "kv-cache-dtype": "fp8_e4m3", **FP4})
    assert fp8.bytes_per_token == 61464
    mtp = plan_memory("glm-5.1", "b200", 8, {"tp-size": 8, "speculative-algorithm": "EAGLE", **FP4})
    assert mtp.bytes_per_token == 55932
    assert mtp.weights_gb_by_kind["mtp"] > 0


def test_gqa_cell_splits_by_kv_head_and_deepseek_mla_does_not():
    q = lambda tp: plan_memory("qwen3-235b-a22b", "h200", 8, {"tp-size": tp}).bytes_per_token
    assert (q(1), q(2), q(4), q(8)) == (192512, 96256, 48128, 48128)
    ds = plan_memory("deepseek-v3", "h200", 8, {"tp-size": 8, "quantization": "fp8"})
    assert ds.bytes_per_token == 70272
    assert plan_memory("deepseek-v3", "h200", 8, {"tp-size": 8, "quantization": "fp8",
                                                   "kv-cache-dtype": "fp8_e4m3"}).bytes_per_token == 35136


def test_tp8_keeps_several_times_less_kv_than_attention_dp():
    tp = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, **FP4})
    dp = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, **FP4})
    assert dp.kv_pools == 8 and tp.kv_pools == 1
    assert dp.kv_capacity_tokens_total > 2.5 * tp.kv_capacity_tokens_total
    # attention and shared expert are replicated under attention DP
    attention_bf16_gb = param_counts(get_model("glm-5.1"))["attention"] * 2 / 1e9
    assert dp.weights_gb_by_kind["attention"] == pytest.approx(attention_bf16_gb, rel=1e-3)
    assert tp.weights_gb_by_kind["attention"] < attention_bf16_gb / 4
    assert dp.weights_gb_by_kind["routed_experts"] == tp.weights_gb_by_kind["routed_experts"]
    assert dp.chunked_prefill_size == 1024 and tp.chunked_prefill_size == 8192
    assert dp.kv_capacity_tokens_per_gpu % 64 == 0


def test_fp8_under_dp_attention_leaves_little_kv_on_h200():
    fp8 = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "fp8"})
    fp4 = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, **FP4})
    assert fp8.fits
    assert fp8.kv_capacity_tokens_total < fp4.kv_capacity_tokens_total / 5


def test_kv_tokens_follow_pre_model_load_rule():
    p = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, **FP4})
    rest = p.pre_model_load_gb * 1e9 * p.mem_fraction_static - p.weights_gb_per_gpu * 1e9
    assert p.kv_capacity_tokens_per_gpu == pytest.approx(rest / p.bytes_per_token, rel=1e-3)
    capped = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "max-total-tokens": "100k", **FP4})
    assert capped.kv_capacity_tokens_per_gpu == 99968  # 100000 rounded down to 64-token pages


def test_max_running_requests_default_and_user():
    p = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, **FP4})
    assert p.max_running_requests_per_dp_rank == 2048
    u = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8,
                                           "max-running-requests": 128, **FP4})
    assert u.max_running_requests_per_dp_rank == 16 and u.max_running_requests == 128
    assert u.cuda_graph_max_bs_decode == 128


def test_bf16_glm_does_not_fit_and_reports_reason():
    p = plan_memory("glm-5.1", "h200", 8, {"tp-size": 8})
    assert not p.fits and "out of memory" in p.reason
    assert p.kv_capacity_tokens_total == 0


def test_hicache_host_capacity_and_host_memory_check():
    flags = {"tp-size": 8, "enable-hierarchical-cache": True, "hicache-ratio": 2.0, **FP4}
    p = plan_memory("glm-5.1", "h200", 8, flags)
    assert p.hicache_host_tokens_per_pool == p.kv_capacity_tokens_per_gpu * 2
    small = plan_memory("glm-5.1", "h200", 8, flags, host_memory_gb=256)
    assert not small.fits and "host memory" in small.reason
    sized = plan_memory("glm-5.1", "h200", 8, {**flags, "hicache-size": 100})
    assert sized.hicache_host_tokens_per_pool == 100e9 // sized.bytes_per_token // 64 * 64


@pytest.mark.parametrize("flags,key", [
    ({"tp-size": 8, "attn-dp-size": 3}, "attn-dp-size"),
    ({"tp-size": 8, "ep-size": 3}, "ep-size"),
    ({"tp-size": 16}, "tp-size"),
    ({"tp-size": 8, "quantization": "awq"}, "quantization"),
    ({"tp-size": 8, "kv-cache-dtype": "fp8_e5m2", **FP4}, "kv-cache-dtype"),
])
def test_invalid_combinations_raise_config_error(flags, key):
    with pytest.raises(ConfigError) as exc:
        plan_memory("glm-5.1", "h200", 8, flags)
    assert exc.value.key == key


def test_cli_json_contract_and_exit_codes():
    runner = CliRunner()
    args = ["plan", "--model", "glm-5.1", "--quantization", "modelopt_fp4", "--hardware", "h200", "--gpus", "8",
            "--tp-size", "8", "--attn-dp-size", "8", "--ep-size", "8", "--json"]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("fits", "reason", "weights_gb_per_gpu", "mem_fraction_static", "kv_capacity_tokens_per_gpu",
                "kv_pools", "kv_capacity_tokens_total", "max_running_requests", "bytes_per_token"):
        assert key in doc
    assert doc["mem_fraction_static"] == 0.758 and doc["kv_pools"] == 8
    from tuner.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--model", "glm-5.1", "--hardware", "h200", "--gpus", "8", "--tp-size", "8",
              "--attn-dp-size", "3", "--quantization", "modelopt_fp4"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--model", "nope", "--hardware", "h200", "--gpus", "8", "--tp-size", "8"])
    assert exc.value.code == 2


def test_a_one_gpu_replica_starts_from_the_measured_free_memory_and_a_larger_one_from_the_prior():
    from tuner.catalog import get_gpu
    from tuner.planner.memory import GIB, PRE_LOAD_OVERHEAD_BYTES, pre_load_free_bytes

    h100 = get_gpu("h100")
    assert pre_load_free_bytes(h100, 1) == h100.sglang_pre_load_free_bytes
    assert pre_load_free_bytes(h100, 8) == h100.memory_bytes - PRE_LOAD_OVERHEAD_BYTES
    unmeasured = h100.model_copy(update={"sglang_pre_load_free_bytes": None})
    assert pre_load_free_bytes(unmeasured, 1) == h100.memory_bytes - PRE_LOAD_OVERHEAD_BYTES
    # SGLang's KV pool is pre_load * mfs - weights: 0.4 GiB more free memory moves the pool by 0.32 GiB at 0.8
    flags = {"tp-size": 1, "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.8}
    measured = plan_memory("qwen3-30b-a3b", h100, 1, flags)
    prior = plan_memory("qwen3-30b-a3b", unmeasured, 1, flags)
    gained = (measured.kv_capacity_tokens_per_gpu - prior.kv_capacity_tokens_per_gpu) * measured.bytes_per_token
    assert gained / GIB == pytest.approx(0.8 * (h100.sglang_pre_load_free_bytes - prior.pre_model_load_gb * 1e9) / GIB,
                                         abs=0.01)
    assert measured.pre_model_load_gb == pytest.approx(h100.sglang_pre_load_free_bytes / 1e9, abs=1e-3)
