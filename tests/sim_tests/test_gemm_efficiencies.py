"""The linears' efficiencies at prefill sizes against SGLang's kernels timed alone (operator tables,
``results/profiles/<gpu>/tables``): the dense linears' share is measured per weight format, and the
fused MoE's depends on its GEMMs' depth in K (``moe_tile_k_overhead``)."""

import json
import math
import statistics
from pathlib import Path

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.sim.simulate import _prepare

from tests.sim_tests.stepmodels import server_step_model

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "results" / "profiles"
QWEN_FP8 = ("qwen3-30b-a3b-tp1-fp8-fp8kv-triton-0.5.17.json", {"quantization": "fp8", "kv-cache-dtype": "fp8_e4m3"})
QWEN_BF16 = ("qwen3-30b-a3b-tp1-bf16-triton-0.5.17.json", {})
# graphs to 64 (the studies' servers): with the default 256 the H100 cannot hold an 8192-token chunk
DSV3 = {"kv-cache-dtype": "fp8_e4m3", "quantization": "fp8", "mem-fraction-static": 0.7, "max-running-requests": 64}


def _model(name: str, gpu: str, flags: dict, layers: int = 8):
    # DeepSeek-V3 cut to a few layers (its first 3 dense) fits one GPU, as on the profiled servers
    spec = name if name != "deepseek-v3" else {"name": name, "overrides": {"num_hidden_layers": layers}}
    return server_step_model(spec, gpu, flags)


def _op(path: Path, op: str) -> list[dict]:
    return [o for o in json.loads(path.read_text())["ops"] if o["op"] == op]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("name,table,flags", [
    ("qwen3-30b-a3b", *QWEN_FP8), ("qwen3-30b-a3b", *QWEN_BF16),
    ("deepseek-v3", "deepseek-v3-tp1-fp8-fp8kv-triton-0.5.17.json", DSV3)])
def test_the_dense_linears_at_prefill_sizes_take_their_tables_time(gpu, name, table, flags):
    path = TABLES / gpu / "tables" / table
    if not path.exists():
        pytest.skip(f"no {gpu} table of this model")
    sm = _model(name, gpu, flags, layers=4)
    by_name = {g[6]: g for g in sm.gemms}  # (layers, flops/token, read_s, rate, table, per_logit, name, fixed)
    errors = []
    for op in _op(path, "gemm"):
        g = by_name.get(op["name"])
        if g is None or op["shape"]["n"] < 1024:  # the router's gate: a few columns, launch-bound
            continue
        for tokens, us in zip(op["grid"][op["axes"][0]], op["us"]):
            if tokens >= 4096:
                model_s = max(g[1] * tokens / g[3], g[2]) + g[7]
                errors.append(math.log(model_s / (us * 1e-6)))
    assert errors
    # one efficiency per weight format: their mean within 15%, each shape within 45% (the farthest:
    # DeepSeek-V3's kv_b_proj, K 512, at 0.25 of the fp8 peak where the others run 0.29-0.39)
    assert max(map(abs, errors)) < math.log(1.45) and abs(statistics.mean(errors)) < math.log(1.15)


def _moe_ratios(sm, path: Path, min_tokens: int) -> list[float]:
    op = _op(path, "moe")[0]
    sm._moe_cache.clear()
    return [sm.moe_time(t) / sm.moe_layers / (us * 1e-6) for t, us in zip(op["grid"]["tokens"], op["us"])
            if t >= min_tokens]


def test_the_fused_moe_of_a_shallow_and_a_deep_shape_take_one_efficiency():
    """Qwen3-30B-A3B's experts (K 2048 and 768, uniform routing) and DeepSeek-V3's (K 7168 and 2048,
    the 10 experts its dummy-weight router picks: thousands of rows an expert) at compute-bound
    sizes: their model-over-table ratios agree; without the per-tile K cost DeepSeek's is ~1.5x."""
    qwen = _model("qwen3-30b-a3b", "h200", QWEN_FP8[1])
    dsv3 = _model("deepseek-v3", "h200", {**DSV3, "load-format": "dummy"})
    assert dsv3.moe_pool == 10
    q_path = TABLES / "h200" / "tables" / QWEN_FP8[0]
    d_path = TABLES / "h200" / "tables" / "deepseek-v3-tp1-fp8-fp8kv-dummy-moe-triton-0.5.17.json"

    def spread() -> float:
        q = statistics.geometric_mean(_moe_ratios(qwen, q_path, 4096))
        d = statistics.geometric_mean(_moe_ratios(dsv3, d_path, 4096))
        return d / q

    assert qwen.moe_k_overhead > 0 and 0.9 < spread() < 1.15
    k0 = qwen.moe_k_overhead
    try:  # the step models are memoised: put the value back
        qwen.moe_k_overhead = dsv3.moe_k_overhead = 0.0
        assert spread() > 1.35
    finally:
        qwen.moe_k_overhead = dsv3.moe_k_overhead = k0
        qwen._moe_cache.clear()
        dsv3._moe_cache.clear()


def test_only_an_mla_layer_takes_the_mla_layer_cost():
    from tuner.sim.calibrate import calibration_context, load_calibration

    flags = {"attention-backend": "triton", "disable-prefill-cuda-graph": True, **QWEN_FP8[1]}
    ov = load_calibration("h200", context=calibration_context(get_model("qwen3-30b-a3b"), get_gpu("h200"), flags,
                                                              "0.5.17"))["overhead"]
    assert ov["mla_layer_s"] > 0  # fitted on the DeepSeek-V3 servers of the committed entry
    qwen = _model("qwen3-30b-a3b", "h200", QWEN_FP8[1])
    dsv3 = _model("deepseek-v3", "h200", DSV3)
    assert qwen.layer_s == pytest.approx(ov["layer_s"])
    assert dsv3.layer_s == pytest.approx(ov["layer_s"] + ov["mla_layer_s"])


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_k_depth_cost_predicts_the_moe_tp_slices_it_was_not_set_on(tp):
    """DeepSeek-V3's fused MoE at the per-GPU slices of TP 1, 2 and 8 (the down GEMM 2,048, 1,024 and
    256 deep), timed on the H100 after moe_tile_k_overhead was set from the H200's K >= 768 tables."""
    path = TABLES / "h100" / "tables" / f"deepseek-v3-tp{tp}-fp8-fp8kv-dummy-moe-triton-0.5.17.json"
    model = get_model({"name": "deepseek-v3", "overrides": {"num_hidden_layers": 4}})
    flags = {"attention-backend": "triton", "disable-prefill-cuda-graph": True, **DSV3, "load-format": "dummy",
             "tp-size": tp}
    sm = _prepare(model, get_gpu("h100"), tp, flags, {}, 1, None, None, "0.5.17")[3]
    ratios = _moe_ratios(sm, path, 512)  # compute-bound sizes
    assert len(ratios) >= 2 and all(0.85 < r < 1.2 for r in ratios), ratios
    if tp == 8:  # without the term, a 256-deep slice would be taken as fast as a deep one
        k0 = sm.moe_k_overhead
        try:  # the step model is memoised: put the value back
            sm.moe_k_overhead = 0.0
            assert max(_moe_ratios(sm, path, 512)) < 0.8
        finally:
            sm.moe_k_overhead = k0
            sm._moe_cache.clear()
