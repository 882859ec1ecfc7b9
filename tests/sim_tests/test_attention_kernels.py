"""SGLang's Triton attention kernels against their own times measured alone (operator tables,
``results/profiles/<gpu>/tables``) and inside whole forward steps: an fp8 KV cache's decode is not
half a bf16 one's (a per-SM element rate bounds it), and the absorbed-MLA extend kernel's parts over
the cached prefix and over the new tokens run at the shares its table gives."""

import json
import statistics
from pathlib import Path

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.steptime import RankWork
from tuner.sim.wholesteps import read_whole_step_sets

from tests.sim_tests.stepmodels import server_step_model

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "results" / "profiles"
FP8_KV = {"quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.7}
DSV3_8L = {"name": "deepseek-v3", "overrides": {"num_hidden_layers": 8}}


def _op(path: Path, op: str, **match) -> dict:
    return next(o for o in json.loads(path.read_text())["ops"]
                if o["op"] == op and all(o.get(k) == v for k, v in match.items()))


def _cells(op: dict):
    (a, b) = op["axes"]
    for i, x in enumerate(op["grid"][a]):
        for j, y in enumerate(op["grid"][b]):
            yield x, y, op["us"][i][j] * 1e-6


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_fp8_kv_decode_streams_at_the_tables_element_rate(gpu):
    """Where the kernel streams (64-512 requests x 8-32k tokens), the fp8 cache's time per layer
    is the table's within 5% on average (each cell within 15%: the table's own spread) on both
    GPUs; bytes alone would make it 1.2x or more too fast."""
    table = _op(TABLES / gpu / "tables" / "qwen3-30b-a3b-tp1-fp8-fp8kv-triton-0.5.17.json", "decode_attention")
    sm = server_step_model("qwen3-30b-a3b", gpu, FP8_KV)
    assert sm.decode_kv_element_s_per_token > sm.cell / sm.kv_bw  # the element rate binds, not the bytes
    ratios, bytes_only = [], []
    for batch, ctx, seconds in _cells(table):
        if batch < 64 or ctx < 8192:
            continue
        per_layer = sm.decode_attention_time(batch, batch * ctx) / sm.layers
        ratios.append(per_layer / seconds)
        bytes_only.append(batch * ctx * sm.cell / sm.kv_bw / sm.layers / seconds)
    assert len(ratios) >= 4
    assert statistics.mean(ratios) == pytest.approx(1.0, abs=0.05), ratios
    assert all(0.85 < r < 1.15 for r in ratios), ratios
    assert max(bytes_only) < 0.85


def test_without_a_measured_rate_fp8_kv_streams_at_its_bytes():
    flags = {"attention-backend": "triton", "disable-prefill-cuda-graph": True, **FP8_KV}
    base = load_calibration("h200", context=calibration_context(get_model("qwen3-30b-a3b"), get_gpu("h200"), flags,
                                                                "0.5.17"))
    sm = server_step_model("qwen3-30b-a3b", "h200", FP8_KV, {**base, "decode_kv_elements_per_sm_s": {}})
    assert sm.decode_kv_element_s_per_token == 0.0
    assert sm.decode_attention_time(512, 512 * 32768) == pytest.approx(512 * 32768 * sm.cell / sm.kv_bw)
    # the rate is the kernel's, with or without the split-KV latency term
    no_latency = server_step_model("qwen3-30b-a3b", "h200", FP8_KV, {**base, "decode_attention_blocks_per_sm": 0})
    assert not no_latency.split_kv and no_latency.decode_kv_element_s_per_token > 0
    # a bf16 cache has no rate of its own: its HBM share decides
    bf16 = server_step_model("qwen3-30b-a3b", "h200", {})
    assert bf16.decode_kv_element_s_per_token == 0.0
    # and an MLA cache's decode is its compute (the absorbed kernel), not this rate
    assert server_step_model(DSV3_8L, "h200", FP8_KV).decode_kv_element_s_per_token == 0.0


def test_whole_decode_steps_with_an_fp8_cache_agree_at_long_contexts():
    """SGLang's one-batch benchmark on the H100 (results/h100-sglang/decode-probe-2), fp8 KV at 16k
    and 32k tokens a request: the decode steps within 6% on average (15-19% with bytes alone)."""
    sets = {ws.label: ws for ws in read_whole_step_sets(ROOT / "results/h100-sglang/decode-probe-2/whole-steps.yaml")}

    def mean_error(label, **overrides):
        ws = sets[label]
        cal = load_calibration("h100", context=calibration_context(ws.model, ws.gpu, ws.flags, ws.sglang_version))
        cal.update(overrides)
        steps = [s for s in ws.steps if s.kind == "decode"]
        pred = ws.predicted_s(cal, steps)
        return statistics.mean(abs(p / s.seconds - 1) for p, s in zip(pred, steps))

    for label in ("decode-probe-2/one-batch-ctx16k.jsonl", "decode-probe-2/one-batch-ctx32k.jsonl"):
        assert mean_error(label) < 0.06
        assert mean_error(label, decode_kv_elements_per_sm_s={}) > 0.10


def test_the_absorbed_mla_extend_takes_its_tables_time_over_prefix_and_new_tokens():
    """DeepSeek-V3's Triton extend kernel on the H200 with a cached prefix (absorbed form): 1,024 and
    8,192 new tokens over 4k and 32k cached ones, within 12% a layer."""
    table = _op(TABLES / "h200" / "tables" / "deepseek-v3-tp1-fp8-fp8kv-triton-0.5.17.json", "extend_attention",
                mode="absorbed")
    sm = server_step_model(DSV3_8L, "h200", FP8_KV)
    checked = 0
    for new, prefix, seconds in _cells(table):
        if prefix == 0 or new < 1024:  # a batch without a prefix runs MHA; 64 new tokens are launch-bound
            continue
        w = RankWork(prefill_tokens=new, prefill_seqs=1, prefill_ctx_units=new * prefix + new * new / 2,
                     extend_items=((new, prefix),))
        assert sm.extend_attention_time(w) / sm.layers / seconds == pytest.approx(1.0, abs=0.12), (new, prefix)
        checked += 1
    assert checked == 4


def test_a_cached_prefix_runs_the_absorbed_rate_only_on_the_triton_backend():
    cal = load_calibration("h200")
    ext = cal["compute_efficiency"]["extend_attention"]
    w = RankWork(prefill_tokens=2048, prefill_seqs=1, prefill_ctx_units=2048 * 16384 + 2048 * 1024,
                 extend_items=((2048, 16384),))
    triton = server_step_model(DSV3_8L, "h200", FP8_KV)
    fa3 = server_step_model(DSV3_8L, "h200", {**FP8_KV, "attention-backend": "fa3"})
    peak = get_gpu("h200").bf16_tflops * 1e12
    assert triton.extend_rates[1] == pytest.approx(peak * ext["mla_absorbed"])  # measured, held by every fit
    # FA3 runs the prefix as MHA over expanded K/V, at the MHA share, not the Triton kernel's absorbed one
    assert fa3.extend_rates[1] == pytest.approx(fa3.extend_rates[0])
    assert fa3.extend_attention_time(w) < triton.extend_attention_time(w)


@pytest.mark.parametrize("table_file,flags", [
    ("qwen3-30b-a3b-tp1-bf16-triton-0.5.17.json", {"mem-fraction-static": 0.7}),
    ("qwen3-30b-a3b-tp1-fp8-fp8kv-triton-0.5.17.json", FP8_KV)])
def test_the_gqa_extend_kernels_causal_part_grows_with_the_chunk_as_its_table(table_file, flags):
    """Qwen3's Triton extend kernel over new tokens alone (prefix 0) on the H200: 0.11 of the bf16
    peak at 1,024 tokens, 0.20 at 8,192. With ``extend_causal_tile_tokens`` the simulator's times at
    1-8k tokens keep the table's proportions within 8% (one share would put 1,024 tokens 1.7x short)."""
    table = _op(TABLES / "h200" / "tables" / table_file, "extend_attention")
    sm = server_step_model("qwen3-30b-a3b", "h200", flags)
    assert sm.extend_causal_tiles[0] > 0 and sm.extend_causal_tiles[0] == sm.extend_causal_tiles[1]
    cells = {new: s for new, prefix, s in _cells(table) if prefix == 0 and new >= 1024}
    assert sorted(cells) == [1024, 2048, 4096, 8192]

    def simulated(new):
        w = RankWork(prefill_tokens=new, prefill_seqs=1, prefill_ctx_units=new * new / 2, extend_items=((new, 0),))
        return sm.extend_attention_time(w) / sm.layers

    ref = simulated(8192) / cells[8192]
    for new, seconds in cells.items():
        assert simulated(new) / seconds == pytest.approx(ref, rel=0.08), new
    flat = (1024 / 8192) ** 2  # one share: time in proportion to the pairs
    assert (cells[1024] / cells[8192]) / flat > 1.6
