"""`tuner profile` on the CPU (fake kernels and timer), the table format, interpolation and the
roofline fallback, and the composition check."""

import json

import pytest
from click.testing import CliRunner

from tuner.catalog import get_gpu, get_model
from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.profile import (FakeKernels, FakeTimer, build_plan, compose, fit_step_overhead, read_whole_steps,
                           run_profile, write_profile)
from tuner.profile.compose import WholeStep
from tuner.profile.modelcfg import hf_config
from tuner.sim import optable
from tuner.sim.calibrate import load_calibration
from tuner.sim.optable import OpTables, active_experts, causal_work, load_profile, parse_profile
from tuner.sim.steptime import RankWork, StepTimeModel

QWEN = {"tp-size": 1, "attention-backend": "triton"}


def fake_profile(tmp_path, flags=QWEN, model="qwen3-30b-a3b", fail_when=None, name="p.json"):
    plan = build_plan(model, "h200", flags, sglang_version="0.5.17", quick=True)
    timer = FakeTimer(fail_when)
    doc = run_profile(plan, FakeKernels(), timer, provenance={"note": "fake kernels for a CPU test"})
    return write_profile(doc, tmp_path / name), doc, timer


def step_model(flags=QWEN, model="qwen3-30b-a3b", tables=None, version="0.5.17"):
    m, g = get_model(model), get_gpu("h200")
    plan = plan_memory(m, g, 1, flags, sglang_version=version)
    return StepTimeModel(m, g, resolve_checkpoint(m, flags.get("quantization")), parse_layout(m, flags, 1),
                         plan.bytes_per_token, load_calibration("h200"), gpus_per_node=1,
                         kv_cache_dtype=plan.kv_cache_dtype, sglang_version=version, flags=flags,
                         op_tables=tables if tables is not None else OpTables.empty())


def test_fake_run_writes_a_profile_the_simulator_reads(tmp_path):
    path, doc, timer = fake_profile(tmp_path)
    pf = load_profile(path)
    assert pf.gpu == "h200" and pf.sglang_version == "0.5.17" and pf.attention_backend == "triton"
    ops = {(t.op, t.name or t.mode or t.variant) for t in pf.tables}
    assert {("gemm", "qkv_proj"), ("gemm", "o_proj"), ("gemm", "lm_head"), ("decode_attention", None),
            ("extend_attention", "mha"), ("moe", "default"), ("layer_misc", None), ("sampling", None)} <= ops
    assert pf.provenance["kernels"] == "fake" and pf.provenance["timer"] == "fake"
    assert len(timer.timed) == build_plan("qwen3-30b-a3b", "h200", QWEN, quick=True).points()


def test_points_that_cannot_run_are_null_and_recorded(tmp_path):
    path, doc, _ = fake_profile(tmp_path, fail_when=lambda m: m.get("op") == "decode_attention" and m["context"] > 8192)
    table = next(t for t in load_profile(path).tables if t.op == "decode_attention")
    assert table.us[0][-1] is None and table.lookup_us(1, 32768) is None and table.lookup_us(1, 4096) is not None
    assert any("decode_attention" in s["point"] for s in doc["provenance"]["skipped_points"])


def test_interpolation_is_piecewise_linear_and_none_below_the_grid():
    doc = {"format": "tuner-op-profile/1", "gpu": "h200", "sglang_version": "0.5.17", "attention_backend": "triton",
           "provenance": {"note": "hand-made"},
           "ops": [{"op": "gemm", "shape": {"n": 8, "k": 8, "dtype": "bf16"}, "axes": ["tokens"],
                    "grid": {"tokens": [1, 100, 200]}, "us": [10, 110, 130]},
                   {"op": "decode_attention", "shape": {"arch": "gqa"}, "axes": ["batch", "context"],
                    "grid": {"batch": [1, 3], "context": [100, 300]}, "us": [[1, 3], [5, None]]}]}
    pf = parse_profile(doc, "hand.json")
    gemm, dec = pf.tables
    assert gemm.lookup_us(50.5) == pytest.approx(60.0) and gemm.lookup_us(150) == pytest.approx(120)
    assert gemm.lookup_us(0.5) is None
    # above the grid a GEMM is compute-bound: linear on from the two largest sizes (20 us per 100 tokens)
    assert gemm.lookup_us(400) == pytest.approx(170.0)
    assert dec.lookup_us(2, 100) == pytest.approx(3)  # halfway between 1 and 5
    assert dec.lookup_us(1, 200) == pytest.approx(2)
    assert dec.lookup_us(2, 200) is None  # one corner was not measured
    assert dec.lookup_us(4, 100) is None and dec.lookup_us(1, 400) is None  # attention is not extrapolated


def _one_table(op, shape, axes, grid, us):
    doc = {"format": "tuner-op-profile/1", "gpu": "h200", "sglang_version": "0.5.17", "attention_backend": "triton",
           "provenance": {"note": "hand-made"},
           "ops": [{"op": op, "shape": shape, "axes": list(axes), "grid": grid, "us": us,
                    **({"variant": "default"} if op == "moe" else {}), **({"mode": "mha"} if op.startswith("ext") else {})}]}
    return parse_profile(doc, "hand.json").tables[0]


def test_active_experts_grow_from_topk_to_all():
    assert active_experts(1, 128, 8) == pytest.approx(8)
    assert active_experts(8, 128, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    vals = [active_experts(t, 128, 8) for t in (1, 2, 8, 64, 512)]
    assert vals == sorted(vals) and vals[-1] == pytest.approx(128, rel=1e-6)


def test_fused_moe_is_interpolated_in_active_experts_until_they_saturate():
    # a kernel whose time is a fixed cost plus one weight read per active expert, then compute per token
    e, k = 128, 8
    truth = lambda t: 20 + 2.0 * active_experts(t, e, k) + 0.1 * t
    grid = [1, 8, 64, 512, 4096]
    moe = _one_table("moe", {"experts": e, "n": 768, "k": 2048, "topk": k, "dtype": "bf16"}, ["tokens"],
                     {"tokens": grid}, [truth(t) for t in grid])
    for t in (3, 16, 24, 40):  # where the tokens leave experts idle: the mechanism, within 3%
        assert moe.lookup_us(t) == pytest.approx(truth(t), rel=0.03)
        linear = truth(8) + (truth(64) - truth(8)) * (t - 8) / 56 if t > 8 else truth(1) + (truth(8) - truth(1)) * (t - 1) / 7
        assert moe.lookup_us(t) > linear  # concave: a chord in tokens lies below it
    # every expert active: linear in tokens between the measured sizes
    assert moe.lookup_us(1000) == pytest.approx(truth(512) + (truth(4096) - truth(512)) * 488 / 3584)


def test_extend_attention_is_interpolated_in_query_key_pairs():
    truth = lambda n, p: 5 + 0.001 * causal_work(n, p)
    news, prefixes = [64, 1024, 8192], [0, 4096, 32768]
    ext = _one_table("extend_attention", {"arch": "gqa"}, ["new_tokens", "prefix"],
                     {"new_tokens": news, "prefix": prefixes}, [[truth(n, p) for p in prefixes] for n in news])
    for n, p in ((2048, 0), (512, 0), (2048, 4096), (3000, 10000)):
        assert ext.lookup_us(n, p) == pytest.approx(truth(n, p), rel=0.01)
    assert ext.lookup_us(16000, 0) is None  # beyond the largest chunk measured


@pytest.mark.parametrize("bad,key", [
    ({"format": "x"}, "format"),
    ({"provenance": {}}, "provenance"),
    ({"ops": [{"op": "nope"}]}, "ops[0].op"),
    ({"ops": [{"op": "gemm", "shape": {}, "axes": ["tokens"], "grid": {"tokens": [2, 1]}, "us": [1, 1]}]},
     "ops[0].grid.tokens"),
    ({"ops": [{"op": "gemm", "shape": {}, "axes": ["tokens"], "grid": {"tokens": [1, 2]}, "us": [1]}]}, "ops[0].us"),
    ({"ops": [{"op": "moe", "shape": {}, "axes": ["tokens"], "grid": {"tokens": [1]}, "us": [1]}]}, "ops[0].variant"),
])
def test_bad_profiles_name_the_key(bad, key):
    doc = {"format": "tuner-op-profile/1", "gpu": "h200", "sglang_version": "0.5.17", "attention_backend": "triton",
           "provenance": {"note": "x"}, "ops": []}
    doc.update(bad)
    with pytest.raises(ConfigError) as exc:
        parse_profile(doc, "bad.json")
    assert exc.value.key == key and exc.value.file == "bad.json"


def test_tables_replace_the_roofline_where_they_cover_and_only_there(tmp_path):
    path, _, _ = fake_profile(tmp_path)
    pf = load_profile(path)
    roof = step_model()
    prof = step_model(tables=OpTables([pf]))
    dec = next(t for t in pf.tables if t.op == "decode_attention")
    # inside the grid: the table times the number of layers
    assert prof.decode_attention_time(8, 8 * 4096) == pytest.approx(dec.lookup_s(8, 4096) * 48)
    assert prof.decode_attention_time(8, 8 * 4096) != pytest.approx(roof.decode_attention_time(8, 8 * 4096))
    # outside (context 100k > the quick grid's 32k): the roofline
    assert prof.decode_attention_time(8, 8 * 100_000) == pytest.approx(roof.decode_attention_time(8, 8 * 100_000))
    assert prof.source_summary()["ops"]["decode_attention"] == "mixed"
    assert roof.source_summary()["overall"] == "roofline"
    # a different attention backend or GPU shape finds no table
    other = step_model(flags={"tp-size": 1, "attention-backend": "fa3"}, tables=OpTables([pf]))
    assert other.decode_table is None and other.gemms[0][4] is not None  # GEMMs do not depend on the backend
    assert other.moe_table is not None


def test_a_profile_of_another_sglang_version_is_used_when_it_is_the_only_one(tmp_path):
    path, _, _ = fake_profile(tmp_path)
    tables = OpTables([load_profile(path)])
    assert step_model(tables=tables, version="0.5.23").decode_table is not None


def test_simulator_output_says_where_step_times_came_from(tmp_path, monkeypatch):
    from tuner.sim import simulate_load_point
    from tuner.bench.simulator_cost import CODING_AGENT

    def run():
        return simulate_load_point("qwen3-30b-a3b", "h200", 1, QWEN, {}, CODING_AGENT, 2, warmup_s=10,
                                   duration_s=20, sglang_version="0.5.17").extra["step_time_source"]

    monkeypatch.setattr(optable, "PROFILE_DIR", tmp_path / "none")
    optable.clear_cache()
    assert run()["overall"] == "roofline"
    d = tmp_path / "profiles" / "h200"
    d.mkdir(parents=True)
    fake_profile(d)
    monkeypatch.setattr(optable, "PROFILE_DIR", tmp_path / "profiles")
    optable.clear_cache()
    src = run()
    # the quick grid stops at 4096 tokens: 8192-token prefill chunks fall back to the roofline
    assert src["overall"] == "mixed" and src["ops"]["moe"] in ("profile", "mixed") and src["communication"] == "none"
    assert src["ops"]["sampling"] == "profile"
    assert src["profiles"] and src["ops"]["step_overhead"] == "roofline"  # no whole steps fitted yet
    optable.clear_cache()


def test_composition_against_whole_steps_and_the_fitted_overhead(tmp_path):
    path, _, _ = fake_profile(tmp_path)
    st = step_model(tables=OpTables([load_profile(path)]))
    rows = []
    for b in (1, 8, 64):
        ops = st.gpu_time([RankWork(decode_reqs=b, decode_ctx_tokens=b * 4096)], overheads=False)
        rows.append({"kind": "decode", "batch": b, "context": 4096, "seconds": ops * 1.05})
    pre = st.gpu_time([RankWork(prefill_tokens=1024, prefill_seqs=1, prefill_ctx_units=1024 * 512,
                                extend_items=[(1024, 0)])], overheads=False)
    rows.append({"kind": "prefill", "batch": 1, "new_tokens": 1024, "seconds": pre * 0.98})
    steps_file = tmp_path / "steps.jsonl"
    steps_file.write_text("\n".join(json.dumps(r) for r in rows))
    doc = compose(path, read_whole_steps(steps_file))
    assert doc["within_tolerance"] and doc["mean_abs_error"] == pytest.approx((3 * 0.05 / 1.05 + 0.02 / 0.98) / 4,
                                                                              rel=1e-3)
    assert all(r["ops_from_roofline"] == [] for r in doc["rows"])
    res = CliRunner().invoke(cli, ["profile", "compose", "--profile", str(path), "--whole-steps", str(steps_file)])
    assert res.exit_code == 0 and "met" in res.output
    # 50 % slower whole steps: the check fails
    slow = tmp_path / "slow.jsonl"
    slow.write_text("\n".join(json.dumps({**r, "seconds": r["seconds"] * 1.5}) for r in rows))
    assert CliRunner().invoke(cli, ["profile", "compose", "--profile", str(path),
                                    "--whole-steps", str(slow)]).exit_code == 1
    # the residual becomes the profile's step_overhead table, which the simulator then uses
    fit_step_overhead(path, read_whole_steps(steps_file))
    pf = load_profile(path)
    table = next(t for t in pf.tables if t.op == "step_overhead")
    assert table.grid[0] == (1.0, 8.0, 64.0) and pf.whole_steps
    fitted = step_model(tables=OpTables([pf]))
    assert fitted.step_overhead_time(8) == pytest.approx(rows[1]["seconds"] - rows[1]["seconds"] / 1.05, rel=1e-4)


def test_whole_steps_of_a_variant_with_fewer_layers_compose_with_its_overrides(tmp_path):
    # a model too large for one GPU is measured whole with fewer layers; the profile's operators
    # (keyed by shape) still cover it, and the per-op sum must be that of the variant
    path, _, _ = fake_profile(tmp_path)
    full = step_model(tables=OpTables([load_profile(path)]))
    rows = [{"kind": "decode", "batch": b, "context": 4096,
             "seconds": full.gpu_time([RankWork(decode_reqs=b, decode_ctx_tokens=b * 4096)], overheads=False) / 4}
            for b in (1, 8, 64)]  # about what 12 of the 48 layers take
    steps_file = tmp_path / "steps-12l.jsonl"
    steps_file.write_text("\n".join(json.dumps(r) for r in rows))
    assert not compose(path, read_whole_steps(steps_file))["within_tolerance"]  # the 48-layer sum: 4x off
    doc = compose(path, read_whole_steps(steps_file), {"num_hidden_layers": 12})
    assert doc["within_tolerance"] and doc["model_overrides"] == {"num_hidden_layers": 12}
    assert doc["mean_abs_error"] < 0.10
    res = CliRunner().invoke(cli, ["profile", "compose", "--profile", str(path), "--whole-steps", str(steps_file),
                                   "--model-override", "num_hidden_layers=12"])
    assert res.exit_code == 0 and "met" in res.output, res.output
    bad = CliRunner().invoke(cli, ["profile", "compose", "--profile", str(path), "--whole-steps", str(steps_file),
                                   "--model-override", "num_hidden_layers"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
    with pytest.raises(ConfigError, match="num_hiden_layers.*did you mean 'num_hidden_layers'"):
        compose(path, read_whole_steps(steps_file), {"num_hiden_layers": 12})


def test_bench_one_batch_rows_become_a_prefill_and_a_decode_step(tmp_path):
    f = tmp_path / "result.jsonl"
    f.write_text(json.dumps({"run_name": "x", "batch_size": 16, "input_len": 1024, "output_len": 32,
                             "prefill_latency": 0.2, "median_decode_latency": 0.012}) + "\n")
    steps = read_whole_steps(f)
    assert [(s.kind, s.batch, s.tokens, s.seconds) for s in steps] == [("prefill", 16, 1024, 0.2),
                                                                       ("decode", 16, 1040, 0.012)]
    (tmp_path / "bad.jsonl").write_text('{"kind": "decode", "batch": 1}\n')
    with pytest.raises(ConfigError, match="need batch"):
        read_whole_steps(tmp_path / "bad.jsonl")


def test_plan_shapes_follow_the_parallelism():
    tp1 = build_plan("deepseek-v3-5l", "h200", {"tp-size": 1})
    tp8 = build_plan("deepseek-v3-5l", "h200", {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8})
    assert tp1.attention.q_heads == 128 and tp1.extend_modes == ("mha", "absorbed")
    assert tp8.attention.q_heads == 128  # attention DP: every rank keeps all heads
    assert tp8.moe.experts == 32 and tp1.moe.experts == 256
    tp4 = build_plan("qwen3-30b-a3b", "h200", {"tp-size": 4})
    assert tp4.attention.q_heads == 8 and tp4.attention.kv_heads == 1 and tp4.moe.n == 192
    with pytest.raises(ConfigError):
        build_plan("qwen3-30b-a3b", "h200", {"tp-size": 1}, ops=("gemm", "bogus"))


def test_config_json_for_sglang_from_the_catalog():
    q = hf_config(get_model("qwen3-30b-a3b"), get_model("qwen3-30b-a3b").checkpoint("fp8"))
    assert q["architectures"] == ["Qwen3MoeForCausalLM"] and q["num_experts"] == 128
    assert q["quantization_config"]["weight_block_size"] == [128, 128]
    d = hf_config(get_model("deepseek-v3-5l"), get_model("deepseek-v3-5l").checkpoint("bf16"))
    assert d["num_hidden_layers"] == 5 and d["kv_lora_rank"] == 512 and "quantization_config" not in d
    with pytest.raises(ConfigError):
        hf_config(get_model("glm-5.1"), get_model("glm-5.1").checkpoint("bf16"))


def test_profile_cli_plan_and_show(tmp_path):
    res = CliRunner().invoke(cli, ["profile", "plan", "--model", "qwen3-30b-a3b", "--quick", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["points"] == build_plan("qwen3-30b-a3b", "h200", QWEN, quick=True).points()
    path, _, _ = fake_profile(tmp_path)
    res = CliRunner().invoke(cli, ["profile", "show", str(path)])
    assert res.exit_code == 0 and "decode_attention" in res.output and "moe default" in res.output


def test_profile_folders_from_the_environment_are_read_and_change_the_cache_key(tmp_path, monkeypatch):
    folder = tmp_path / "tables"
    folder.mkdir()
    monkeypatch.setattr(optable, "PROFILE_DIR", tmp_path / "committed")  # as if none were committed
    monkeypatch.delenv(optable.PROFILE_DIRS_ENV, raising=False)
    optable.clear_cache()
    before = optable.profiles_fingerprint("h200")
    def gpu_model():  # the step model as the simulator builds it: the GPU's tables, wherever they are
        m, g = get_model("qwen3-30b-a3b"), get_gpu("h200")
        plan = plan_memory(m, g, 1, QWEN, sglang_version="0.5.17")
        model = StepTimeModel(m, g, resolve_checkpoint(m, None), parse_layout(m, QWEN, 1), plan.bytes_per_token,
                              load_calibration("h200"), gpus_per_node=1, kv_cache_dtype=plan.kv_cache_dtype,
                              sglang_version="0.5.17", flags=QWEN)
        model.gpu_time([RankWork(decode_reqs=8, decode_ctx_tokens=8 * 4096)], overheads=False)
        return model.source_summary()

    assert gpu_model()["overall"] == "roofline"  # nothing committed
    fake_profile(folder)
    monkeypatch.setenv(optable.PROFILE_DIRS_ENV, str(folder))
    optable.clear_cache()
    assert str(folder) in optable.profile_dirs("h200")
    assert optable.profiles_fingerprint("h200") != before  # cached step models are not reused across it
    assert any(t.op == "moe" for t in optable.tables_for_gpu("h200").by_op.get("moe", ()))
    summary = gpu_model()
    assert summary["overall"] == "profile" and summary["ops"]["moe"] == "profile"
    assert all(str(folder) in f for f in summary["profiles"])
    optable.clear_cache()



DSV3_DUMMY = {"tp-size": 1, "attention-backend": "triton", "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3",
              "load-format": "dummy"}


def test_a_moe_table_timed_under_a_collapsed_router_serves_only_that_routing(tmp_path):
    # random weights send a biased gate's tokens to top-k + 2 experts (tuner.catalog.routing): the
    # table is timed that way, says so in its shape, and only a server with that routing reads it
    plan = build_plan("deepseek-v3", "h200", DSV3_DUMMY, sglang_version="0.5.17", quick=True, ops=("moe",))
    assert plan.moe_pool == 10
    timer = FakeTimer()
    doc = run_profile(plan, FakeKernels(), timer, provenance={"note": "fake kernels for a CPU test"})
    assert {m["routed_pool"] for m in timer.timed} == {10}
    path = write_profile(doc, tmp_path / "dsv3-dummy-moe.json")
    tables = OpTables([load_profile(path)])
    table = next(t for t in tables.files[0].tables if t.op == "moe")
    assert table.shape["routed_pool"] == 10
    dummy = step_model(DSV3_DUMMY, model="deepseek-v3", tables=tables)
    assert dummy.moe_table is table
    assert dummy.moe_time(64) == pytest.approx(table.lookup_s(64) * dummy.moe_layers)
    real = step_model({k: v for k, v in DSV3_DUMMY.items() if k != "load-format"}, model="deepseek-v3", tables=tables)
    assert real.moe_table is None  # trained weights route apart: the collapsed table does not hold
    # and a table timed with uniform routing does not serve the collapsed server
    uniform_plan = build_plan("deepseek-v3", "h200", {k: v for k, v in DSV3_DUMMY.items() if k != "load-format"},
                              sglang_version="0.5.17", quick=True, ops=("moe",))
    assert uniform_plan.moe_pool is None
    upath = write_profile(run_profile(uniform_plan, FakeKernels(), FakeTimer(), provenance={"note": "fake"}),
                          tmp_path / "dsv3-moe.json")
    assert step_model(DSV3_DUMMY, model="deepseek-v3", tables=OpTables([load_profile(upath)])).moe_table is None


def test_composition_reads_extra_profiles_and_the_weights_the_steps_ran(tmp_path):
    base_flags = {k: v for k, v in DSV3_DUMMY.items() if k != "load-format"}
    full = build_plan("deepseek-v3", "h200", base_flags, sglang_version="0.5.17", quick=True)
    base = write_profile(run_profile(full, FakeKernels(), FakeTimer(), provenance={"note": "fake"}),
                         tmp_path / "dsv3.json")
    moe_plan = build_plan("deepseek-v3", "h200", DSV3_DUMMY, sglang_version="0.5.17", quick=True, ops=("moe",))
    extra = write_profile(run_profile(moe_plan, FakeKernels(), FakeTimer(), provenance={"note": "fake"}),
                          tmp_path / "dsv3-dummy-moe.json")
    steps = [WholeStep("decode", 16, 2064, 0, 0.005, "bench_one_batch")]
    over = {"num_hidden_layers": 8}
    uniform = compose(str(base), steps, over)["rows"][0]
    assert uniform["moe_table_routed_pool"] is None and "moe" not in uniform["ops_from_roofline"]
    no_table = compose([str(base)], steps, over, "dummy")["rows"][0]
    assert "moe" in no_table["ops_from_roofline"]  # the uniform table does not hold for random weights
    both = compose([str(base), str(extra)], steps, over, "dummy")
    row = both["rows"][0]
    assert row["moe_table_routed_pool"] == 10 and "moe" not in row["ops_from_roofline"]
    assert both["profiles"] == [str(base), str(extra)] and both["load_format"] == "dummy"
    assert row["per_op_sum_s"] != pytest.approx(uniform["per_op_sum_s"])


def test_a_hicache_write_table_is_timed_on_the_host_and_replaces_the_call_count(tmp_path):
    flags = {**QWEN, "kv-cache-dtype": "fp8_e4m3"}
    plan = build_plan("qwen3-30b-a3b", "h200", flags, sglang_version="0.5.17", ops=("hicache_write",))
    assert plan.points() == len(plan.write_tokens) and "hicache_write" not in build_plan(
        "qwen3-30b-a3b", "h200", flags).ops  # opt-in: the forward's operators are the default
    assert plan.host_write.key == {"tensors": 2, "layers": 48, "element_bytes": 512, "page_size": 1,
                                   "layout": "page_first", "io_backend": "kernel"}

    class HostTimer(FakeTimer):
        """20 us per token, as a host clock would see it; the GPU timer must not be used."""

        def time_us(self, run):
            raise AssertionError("a HiCache backup is timed on the host")

        def host_us(self, run):
            run.meta["done_us"] = 30.0 * run.meta["tokens"]
            return 20.0 * run.meta["tokens"]

    doc = run_profile(plan, FakeKernels(), HostTimer(), provenance={"note": "fake kernels for a CPU test"})
    path = write_profile(doc, tmp_path / "hw.json")
    entry = next(e for e in doc["ops"] if e["op"] == "hicache_write")
    assert entry["done_us"] == [30.0 * t for t in plan.write_tokens]  # the copies' completion, recorded
    table = next(t for t in load_profile(path).tables if t.op == "hicache_write")
    assert table.shape == plan.host_write.key and table.lookup_us(1024) == pytest.approx(20480)
    assert table.lookup_us(65536) == pytest.approx(20.0 * 65536)  # linear above the grid
    sm = step_model(flags, tables=OpTables([load_profile(path)]))
    assert sm.host_write_cpu_s(400) == pytest.approx(400 * 20e-6)  # 807 calls: the copy queue holds them
    # 6,047 calls: past the queue's 1,000 the thread waits for copies (done_us: 30 us per token)
    # to finish, and behind a step that keeps the write stream waiting, for that step too
    calls = 3000 * 2 + 47
    assert sm.host_write_calls(3000) == calls
    assert sm.host_write_cpu_s(3000) == pytest.approx(3000 * 30e-6 * (calls - 1000) / calls)
    assert sm.host_write_cpu_s(3000, 0.2) == pytest.approx(0.2 + 3000 * 30e-6 * (calls - 1000) / calls)
    assert sm.host_write_cpu_s(400, 0.2) == pytest.approx(400 * 20e-6)
    assert sm.source_summary()["ops"]["hicache_write"] == "profile"
    # another page size is another shape: the call count at hicache_write_call_s serves it
    other = step_model({**flags, "page-size": 16}, tables=OpTables([load_profile(path)]))
    # (188 pages of 384 KiB: batched, one copy call per gather launch of 64 pages: 3 + 3 calls)
    call_s = load_calibration("h200")["overhead"]["hicache_write_call_s"]
    assert other.host_write_cpu_s(3000) == pytest.approx(6 * call_s)
    assert other.host_write_table is None and other.source_summary()["ops"]["hicache_write"] == "roofline"


def test_run_profile_refuses_a_gpu_other_than_hardware():
    """A table timed on an H100 but filed as --hardware h200 would be read for H200 trials."""
    plan = build_plan("qwen3-30b-a3b", "h200", QWEN, sglang_version="0.5.17", quick=True, ops=("hicache_write",))
    with pytest.raises(ConfigError) as err:
        run_profile(plan, FakeKernels(device="NVIDIA H100 80GB HBM3"), FakeTimer())
    assert "--hardware h200" in str(err.value) and "H100" in str(err.value)
    h100 = build_plan("qwen3-30b-a3b", "h100", QWEN, sglang_version="0.5.17", quick=True, ops=("hicache_write",))
    doc = run_profile(h100, FakeKernels(device="NVIDIA H100 80GB HBM3"), FakeTimer())
    assert doc["gpu"] == "h100" and doc["device_name"] == "NVIDIA H100 80GB HBM3"


def test_a_hicache_write_table_with_a_bad_done_us_is_refused_naming_the_key(tmp_path):
    plan = build_plan("qwen3-30b-a3b", "h200", {**QWEN, "kv-cache-dtype": "fp8_e4m3"}, sglang_version="0.5.17",
                      ops=("hicache_write",))
    doc = run_profile(plan, FakeKernels(), FakeTimer(), provenance={"note": "fake"})
    doc["ops"][0]["done_us"] = doc["ops"][0]["done_us"][:-1]  # one value short of the grid
    with pytest.raises(ConfigError) as err:
        parse_profile(doc, tmp_path / "hw.json")
    assert err.value.key == "ops[0].done_us" and "positive numbers" in str(err.value)
