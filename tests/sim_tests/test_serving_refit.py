"""Refit of the simulator's MoE tile speedups from two measured load-point sets."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli
from tuner.errors import ConfigError
from tuner.sim import serving_refit as sr


def _point(users, tpot, tput, valid=True):
    return {"users": users, "p50_tpot_s": tpot, "throughput_tokens_per_s": tput, "valid": valid}


def _moe(base, tuned, calls=48, tag="moe"):
    return sr.KernelTerm(sr.Kernel.MOE, tag, calls, base, tuned)


def test_pairs_invert_the_moe_share():
    default = [_point(8, 0.020, 400.0), _point(32, 0.040, 800.0)]
    tuned = [_point(8, 0.016, 500.0), _point(32, 0.040, 800.0)]
    # decode batch 0.020 * 400 = 8 tokens; MoE is 48 layers x 200 us = 9.6 ms of the 20 ms step
    pairs = sr.serving_pairs(default, tuned, terms=[_moe({1: 200.0, 64: 200.0}, {1: 150.0, 64: 150.0})])
    p8 = pairs[0]
    assert p8.decode_tokens == pytest.approx(8.0)
    assert p8.step_ratio == pytest.approx(1.25)
    assert p8.moe_share == pytest.approx(0.48)
    # 1/1.25 = 0.52 + 0.48 / s  ->  s = 0.48 / 0.28: with the MoE the only tuned kernel, all of the change
    assert p8.moe_speedup == pytest.approx(0.48 / 0.28)
    # kernels predicted 48 x 50 us per 20 ms step = 0.12 s/s saved, serving showed 1 - 1/1.25 = 0.2
    assert p8.predicted_saved_fraction == pytest.approx(0.12) and p8.realisation == pytest.approx(0.2 / 0.12)
    assert pairs[1].moe_speedup == pytest.approx(1.0) and pairs[1].realisation == pytest.approx(0.0)
    # without kernel times the whole step change is put on the MoE (the smallest speedup that fits)
    assert sr.serving_pairs(default, tuned)[0].moe_speedup == pytest.approx(1.25)


def test_the_change_is_shared_out_by_what_each_kernel_saves():
    moe = _moe({16: 100.0}, {16: 90.0})  # 48 x 10 us saved a step
    gemm = sr.KernelTerm(sr.Kernel.GEMM, "qkv", 96, {16: 20.0}, {16: 15.0})  # 96 x 5 us saved
    # one decode step of 16 tokens every 20 ms: kernels save 0.96 ms of it; serving shows 0.96 ms too
    default, tuned = [_point(8, 0.020, 800.0)], [_point(8, 0.02 - 0.00096, 800.0)]
    (p,) = sr.serving_pairs(default, tuned, terms=[moe, gemm])
    assert p.realisation == pytest.approx(1.0)
    # the MoE's own speedup, not the whole step's: 4.8 ms of MoE lose 0.48 ms
    assert p.moe_speedup == pytest.approx(4.8 / 4.32)
    fitted = sr.attributed_speedups([moe, gemm], 1.0)
    assert fitted["moe_tuned_speedup"] == {16: pytest.approx(100 / 90, abs=1e-4)}
    assert fitted["gemm_tuned_speedup"] == {16: pytest.approx(20 / 15, abs=1e-4)}
    # serving that shows twice the kernel saving doubles each kernel's saving, not the MoE's alone
    assert sr.attributed_speedups([moe, gemm], 2.0)["gemm_tuned_speedup"][16] == pytest.approx(2.0, abs=1e-4)


def test_prefill_passes_count_where_the_point_carries_them():
    point = {**_point(8, 0.02, 400.0), "duration_s": 100.0,
             "extra": {"prefix_reuse": {"computed_tokens": 100000},
                       "server_metrics": {"sglang:realtime_tokens_total{mode=prefill_compute}": 200000.0,
                                          "sglang:cuda_graph_passes_total{mode=prefill_none}": 250.0}}}
    assert sr.prefill_rate(point) == (pytest.approx(1.25), pytest.approx(800.0))  # 1,000 tok/s in 800-token passes
    assert sr.prefill_rate(_point(8, 0.02, 400.0)) is None
    moe = _moe({8: 100.0, 1024: 1000.0}, {8: 100.0, 1024: 900.0})  # saves only at prefill sizes
    (p,) = sr.serving_pairs([point], [{**point, "p50_tpot_s": 0.019}], terms=[moe])
    # 1.25 passes/s x 48 x (~100 us saved at 800 tokens) of the second; decode saves nothing
    assert p.prefill_tokens_per_pass == pytest.approx(800.0)
    assert 0 < p.predicted_saved_fraction < 0.01 and p.realisation > 1
    (q,) = sr.serving_pairs([_point(8, 0.02, 400.0)], [_point(8, 0.019, 400.0)], terms=[moe])
    assert q.predicted_saved_fraction == 0 and q.realisation is None and q.moe_speedup == 1.0


def test_decode_padding_times_the_kernels_at_the_batches_the_cuda_graphs_run():
    # 16 closed-loop users, 8.9 decoding on average: a binomial batch, padded to 1, 2, 4, 8, 12, 16
    batches = sr.padded_decode_batches(8.9, 16)
    assert [m for m, _ in batches] == [1, 2, 4, 8, 12, 16]
    assert sum(w for _, w in batches) == pytest.approx(1.0)
    assert sum(m * w for m, w in batches) > 8.9  # padding only adds rows
    assert sr.padded_decode_batches(16.0, 16) == [(16, 1.0)]  # every user decoding: a captured size already
    assert dict(sr.padded_decode_batches(9.0, 9))[12] == pytest.approx(1.0)  # 9 runs as 12
    # a kernel that saves only at M >= 12: the mean batch (8.9) predicts nothing, the padded batches do
    moe = _moe({8: 100.0, 12: 100.0, 64: 100.0}, {8: 100.0, 12: 80.0, 64: 80.0})
    default, tuned = [_point(16, 0.020, 445.0)], [_point(16, 0.019, 468.0)]
    (plain,) = sr.serving_pairs(default, tuned, terms=[moe])
    (padded,) = sr.serving_pairs(default, tuned, terms=[moe], decode_padding=True)
    assert plain.predicted_saved_fraction < padded.predicted_saved_fraction
    assert padded.realisation < plain.realisation


def test_kernel_terms_pick_the_models_shapes_from_a_summary():
    def rep(kind, tag, rows):
        return {"kind": kind, "tag": tag, "rows": rows}

    row = [{"batch_size": 16, "shipped_us": 109.5, "default_us": 123.3, "chosen_us": 107.3}]
    summary = {"reports": [
        rep("moe", "E128_N768_K2048_bf16", [{"batch_size": 16, "shipped_us": 191.5, "chosen_us": 188.1}]),
        rep("moe", "E128_N768_K2048_fp8_w8a8_b128x128", row),
        rep("moe", "E257_N2048_K7168_fp8_w8a8_b128x128", row),
        rep("gemm", "N5120_K2048_fp8_b128x128", [{"batch_size": 16, "default_us": 12.3, "chosen_us": 9.2}]),
        rep("gemm", "N2048_K4096_fp8_b128x128", [{"batch_size": 16, "default_us": 20.3, "chosen_us": 12.0}])]}
    terms = sr.kernel_terms(summary, "qwen3-30b-a3b", dtype="fp8_w8a8")
    assert [(t.kind, t.tag, t.calls) for t in terms] == [
        (sr.Kernel.MOE, "E128_N768_K2048_fp8_w8a8_b128x128", 48),
        (sr.Kernel.GEMM, "N5120_K2048_fp8_b128x128", 48), (sr.Kernel.GEMM, "N2048_K4096_fp8_b128x128", 48)]
    assert terms[0].base_us == {16: 109.5}  # SGLang's shipped file is the bar where there is one
    bf16 = sr.kernel_terms(summary, "qwen3-30b-a3b", dtype="bf16")
    assert [t.tag for t in bf16] == ["E128_N768_K2048_bf16"]  # bf16 linears read no block-fp8 tile file
    with pytest.raises(ConfigError, match="no tuned kernel of qwen3-30b-a3b at TP 2"):
        sr.kernel_terms(summary, "qwen3-30b-a3b", tp_size=2, dtype="bf16")


def test_refit_with_kernels_writes_both_tables_and_the_realisation(tmp_path):
    path = tmp_path / "h200.yaml"
    path.write_text("# notes\nmoe_tuned_speedup:\n  1: 1.6\n  64: 1.3\n")
    moe = _moe({1: 30.0, 64: 100.0}, {1: 25.0, 64: 95.0})
    gemm = sr.KernelTerm(sr.Kernel.GEMM, "o", 48, {1: 20.0, 64: 20.0}, {1: 12.0, 64: 16.0})
    pairs = sr.serving_pairs([_point(8, 0.02, 400.0)], [_point(8, 0.0198, 404.0)], terms=[moe, gemm])
    sr.write_gpu_calibration("h200", pairs, "a vs b", calibration_dir=tmp_path, terms=[moe, gemm])
    doc = yaml.safe_load(path.read_text())
    a = pairs[0].realisation
    assert doc["tile_serving_realisation"] == pytest.approx(a, abs=1e-4)
    # every tuned batch size, the look-alike kernel's old entries gone
    assert sorted(doc["moe_tuned_speedup"]) == [1, 64] and sorted(doc["gemm_tuned_speedup"]) == [1, 64]
    assert doc["gemm_tuned_speedup"][1] == pytest.approx(20 / (20 - a * 8), abs=1e-3)


def test_refit_replaces_nearby_kernel_points_only():
    pairs = sr.serving_pairs([_point(8, 0.02, 400.0)], [_point(8, 0.016, 500.0)])
    cal = sr.refit_from_serving(pairs, {"moe_tuned_speedup": {1: 1.6, 8: 1.4, 9: 1.39, 1024: 1.0}, "x": 1})
    assert cal["moe_tuned_speedup"] == {1: 1.6, 8: 1.25, 1024: 1.0}
    assert cal["x"] == 1


def test_write_keeps_the_files_comments(tmp_path):
    path = tmp_path / "h200.yaml"
    path.write_text("# NVIDIA H200 notes\nmemory_efficiency: 0.8\nmoe_tuned_speedup:\n  1: 1.6\n")
    pairs = sr.serving_pairs([_point(64, 0.03, 2133.4)], [_point(64, 0.025, 2560.0)])
    sr.write_gpu_calibration("h200", pairs, "a.json vs b.json", calibration_dir=tmp_path)
    text = path.read_text()
    assert text.startswith("# NVIDIA H200 notes\n# MoE entries refit from serving a.json vs b.json\n")
    doc = yaml.safe_load(text)
    assert doc["memory_efficiency"] == 0.8
    assert doc["moe_tuned_speedup"] == {1: 1.6, 64: 1.2}


def test_bad_load_points(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"users": 4}]))
    with pytest.raises(ConfigError, match="lacks p50_tpot_s"):
        sr.load_points(f)
    with pytest.raises(ConfigError, match="no user count"):
        sr.serving_pairs([_point(4, 0.02, 10.0)], [_point(8, 0.02, 10.0)])
    (tmp_path / "l.jsonl").write_text(json.dumps(_point(4, 0.02, 10.0)) + "\n")
    assert sr.load_points(tmp_path / "l.jsonl")[0]["users"] == 4


def test_the_command_refuses_to_write_a_change_the_kernels_do_not_explain(tmp_path):
    from click.testing import CliRunner

    from tuner.cli import cli

    real = sr.CALIBRATION_DIR / "h200.yaml"
    before = real.read_bytes()
    summary = {"reports": [{"kind": "moe", "tag": "E128_N768_K2048_bf16",
                            "rows": [{"batch_size": 8, "shipped_us": 100.0, "chosen_us": 99.0}]}]}
    (tmp_path / "s.json").write_text(json.dumps(summary))
    (tmp_path / "d.json").write_text(json.dumps([_point(8, 0.020, 400.0)]))
    (tmp_path / "t.json").write_text(json.dumps([_point(8, 0.018, 440.0)]))  # 10% faster: MoE saved 48 us
    args = ["kernels", "refit-serving", "--default", str(tmp_path / "d.json"), "--tuned", str(tmp_path / "t.json"),
            "--gpu", "h200", "--model", "qwen3-30b-a3b", "--kernel-report", str(tmp_path / "s.json")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "the kernels do not explain the change" in res.output
    assert real.read_bytes() == before  # nothing written
    dry = CliRunner().invoke(cli, args + ["--dry-run", "--json"])
    doc = json.loads(dry.output)
    assert dry.exit_code == 0 and doc["realisation"] > 1.5 and doc["written"] is None
    assert doc["kernels"] == [{"kind": "moe", "tag": "E128_N768_K2048_bf16", "calls": 48}]


def _decode_logs(tmp_path, saving_ms: dict[int, float], *, windows=400, name="p"):
    """A default and a tuned server's logs whose context-free decode step differs by ``saving_ms``."""
    from tests.sim_tests.synthetic_steplogs import write_decode_log

    c_default = {2: 8.0, 4: 9.0, 8: 11.0}
    c_tuned = {b: c - saving_ms[b] for b, c in c_default.items()}
    d, t = tmp_path / f"{name}-default.log", tmp_path / f"{name}-tuned.log"
    write_decode_log(d, c_ms=c_default, k_ms_per_ktok=0.05, seed=3, windows=windows,
                     tokens_of=lambda b, r: b * r.uniform(2000, 4000))
    write_decode_log(t, c_ms=c_tuned, k_ms_per_ktok=0.05, seed=4, windows=windows,
                     tokens_of=lambda b, r: b * r.uniform(3000, 6000))
    return d, t


MOE_SAVING_US = {2: 10.0, 4: 12.0, 8: 16.0}  # per layer call; 48 layers: 0.48-0.77 ms a step


def _moe_term():
    return _moe({b: 200.0 for b in MOE_SAVING_US}, {b: 200.0 - s for b, s in MOE_SAVING_US.items()})


def test_decode_steps_that_save_what_the_kernels_predict_confirm_them(tmp_path):
    from tuner.sim.decode_ab import paired_server_logs

    d, t = _decode_logs(tmp_path, {b: 48 * s / 1000 for b, s in MOE_SAVING_US.items()})
    fit = sr.decode_step_realisation([paired_server_logs(d, t)], [_moe_term()])
    assert fit.realisation == pytest.approx(1.0, abs=0.25)
    assert fit.confirms_kernels and fit.interval[0] < fit.realisation < fit.interval[1]
    # the predicted saving is the kernels' over the default server's own step at that batch
    row = next(r for r in fit.rows if r.batch == 8)
    assert row.predicted_saving == pytest.approx(48 * 16e-3 / row.default_step_ms, rel=1e-6)


def test_decode_steps_that_save_twice_the_prediction_do_not_confirm_them(tmp_path):
    from tuner.sim.decode_ab import paired_server_logs

    d, t = _decode_logs(tmp_path, {b: 2 * 48 * s / 1000 for b, s in MOE_SAVING_US.items()})
    d2, t2 = _decode_logs(tmp_path, {b: 2 * 48 * s / 1000 for b, s in MOE_SAVING_US.items()}, name="q", windows=200)
    fit = sr.decode_step_realisation([paired_server_logs(d, t), paired_server_logs(d2, t2)], [_moe_term()])
    assert fit.realisation == pytest.approx(2.0, abs=0.3)
    assert not fit.confirms_kernels and fit.interval[0] > 1.0
    assert {r.pair for r in fit.rows} == {0, 1}  # both pairs pooled
    path = tmp_path / "h200.yaml"
    path.write_text("moe_tuned_speedup:\n  1: 1.6\n")
    sr.write_gpu_calibration("h200", [], "decode steps", calibration_dir=tmp_path, terms=[_moe_term()],
                             realised=fit.realisation)
    doc = yaml.safe_load(path.read_text())
    assert doc["tile_serving_realisation"] == pytest.approx(fit.realisation, abs=1e-4)
    a = fit.realisation
    assert doc["moe_tuned_speedup"][8] == pytest.approx(200 / (200 - a * 16), abs=1e-3)


def test_refit_serving_from_logs_on_the_command_line(tmp_path):
    from click.testing import CliRunner

    from tuner.cli import cli

    real = sr.CALIBRATION_DIR / "h200.yaml"
    before = real.read_bytes()
    summary = {"reports": [{"kind": "moe", "tag": "E128_N768_K2048_bf16",
                            "rows": [{"batch_size": b, "shipped_us": 200.0, "chosen_us": 200.0 - s}
                                     for b, s in MOE_SAVING_US.items()]}]}
    (tmp_path / "s.json").write_text(json.dumps(summary))
    d, t = _decode_logs(tmp_path, {b: 48 * s / 1000 for b, s in MOE_SAVING_US.items()})
    base = ["kernels", "refit-serving", "--gpu", "h200", "--model", "qwen3-30b-a3b"]
    res = CliRunner().invoke(cli, base + ["--logs", str(d), str(t), "--kernel-report", str(tmp_path / "s.json"),
                                          "--json"])
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["confirms_kernels"] and doc["written"] is None
    assert real.read_bytes() == before  # confirmed: nothing to refit
    # twice the predicted saving is outside the plausible band: refused, nothing written
    d2, t2 = _decode_logs(tmp_path, {b: 3 * 48 * s / 1000 for b, s in MOE_SAVING_US.items()}, name="x")
    res = CliRunner().invoke(cli, base + ["--logs", str(d2), str(t2), "--kernel-report", str(tmp_path / "s.json")])
    assert res.exit_code == 1 and "the kernels do not explain the change" in res.output
    assert real.read_bytes() == before
    # the logs need the kernels' times; load points and logs do not mix
    res = run_cli(base + ["--logs", str(d), str(t)])
    assert res.returncode == 2 and "--kernel-report" in res.stderr
    (tmp_path / "p.json").write_text(json.dumps([_point(8, 0.02, 400.0)]))
    res = run_cli(base + ["--logs", str(d), str(t), "--default", str(tmp_path / "p.json"),
                          "--tuned", str(tmp_path / "p.json")])
    assert res.returncode == 2 and "not both" in res.stderr
