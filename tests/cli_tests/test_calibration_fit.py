"""`tuner calibration fit` on the committed H200 data: choosing the trials it fits on, reporting the
load points of the trials it left out as unseen, and writing the fit to a file of its own."""

import json

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import REPO
from tuner.cli import cli
from tuner.sim.calibrate import load_calibration

RESULTS = str(REPO / "results" / "h200-sglang")


def _main(args, capsys):
    from tuner.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    return exc.value.code, capsys.readouterr().err


def test_a_trial_that_is_not_in_the_data_is_a_clear_error(capsys):
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#42"], capsys)
    assert code == 2 and "no trial 'h200-sglang-qwen3#42'" in err and "h200-sglang-qwen3#7" in err
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--exclude-trials",
                       "h200-sglang-qwen3,h200-sglang-dsv3"], capsys)
    assert code == 2 and "leaves no trial" in err


def test_the_fit_uses_only_the_chosen_trials_and_reports_the_others_as_unseen(tmp_path):
    out = tmp_path / "fit.yaml"
    res = CliRunner().invoke(cli, ["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#1",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["trials"] == ["h200-sglang-qwen3#1"]
    assert {"h200-sglang-qwen3#0", "h200-sglang-dsv3#2", "h200-sglang-qwen3#9"} <= set(doc["left_out"])
    # the check predicts every load point; those of the trials left out are summarised apart
    points = doc["fidelity"]["points"]
    unseen = doc["unseen"]
    assert unseen["load_points"] == len(points) - 3  # trial 1 measured 3 load points
    assert "h200-sglang-qwen3#1" not in unseen["trials"]
    assert set(unseen["mape"]) >= {"p90_ttft_s", "p90_tpot_s"} and unseen["verdict_agreement"] is not None
    # bf16 weights only: the fp8 call cost is not seen, and not written
    fitted = {p["name"]: p for p in doc["parameters"]}
    assert not fitted["overhead.fp8_block_gemm_s"]["fitted_from_data"]
    # the file of its own: the values, the stalls measured, and where they came from
    text = out.read_text()
    assert text.startswith("# tuner calibration fit --results") and "--only-trials h200-sglang-qwen3#1" in text
    values = yaml.safe_load(text)
    assert values["fresh_server_stalls"] == doc["calibration"]["fresh_server_stalls"]
    assert "fp8_block_gemm_s" not in values["overhead"]
    cal = load_calibration("h200", out)
    assert cal["overhead"]["layer_s"] == values["overhead"]["layer_s"]
    # the scheduler's CPU is measured by its probe: held by default, neither fitted nor written
    # and so are the Triton MLA extend kernel's two forms, timed alone in its operator tables
    assert doc["held_measured"] == ["overhead.cpu_step_s", "overhead.per_request_s",
                                    "compute_efficiency.extend_attention.mla_absorbed",
                                    "compute_efficiency.extend_attention.mla_absorbed_causal",
                                    "compute_efficiency.extend_attention.mla_mha_triton_causal"]
    assert "cpu_step_s" not in values["overhead"] and "per_request_s" not in values["overhead"]
    assert "mla_absorbed" not in (values.get("compute_efficiency") or {}).get("extend_attention", {})


def test_a_fit_with_prefill_graphs_holds_the_eager_fits_values_and_fits_the_launch_cost(tmp_path):
    """The committed server with prefill CUDA graphs: the eager-prefill entry holds in part there,
    so only the graph prefill step's launch cost (and the stalls) are fitted and written, and the
    check covers the points of this context alone."""
    out = tmp_path / "graphs.yaml"
    res = CliRunner().invoke(cli, ["calibration", "fit", "--results", str(REPO / "results" / "h200-sglang-prefill-graphs"),
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["context"]["prefill_cuda_graph"] is True
    assert {"overhead.cpu_step_s", "memory_efficiency", "compute_efficiency.moe"} <= set(doc["held"])
    fitted = {p["name"]: p for p in doc["parameters"] if p["fitted_from_data"]}
    assert set(fitted) == {"overhead.prefill_per_layer_s"}
    # far above the 40 us prior of a whole-graph replay: 0.5.17's breakable graphs run attention eagerly
    assert 1e-4 < doc["calibration"]["overhead"]["prefill_per_layer_s"] < 1.136e-3
    assert set(doc["calibration"]["overhead"]) == {"prefill_per_layer_s"}
    # the launch cost is all the prefill scale could move: with it fitted to the windows, SGLang's own
    # prefill stage on these servers needs no scale
    assert doc["prefill_scale"]["scale"] == pytest.approx(1.0, abs=0.02)
    assert doc["prefill_scale"]["points"]
    assert {pt["study"] for pt in doc["fidelity"]["points"]} == {"h200-sglang-qwen3-prefill-graphs"}
    assert "--only-trials h200-sglang-qwen3-prefill-graphs#0" in out.read_text()


def test_recheck_groups_the_points_by_context_and_records_them_in_the_entry(tmp_path, monkeypatch):
    import shutil

    import tuner.sim.calibrate as calibrate

    cal_dir = tmp_path / "calibration"
    shutil.copytree(calibrate.CALIBRATION_DIR, cal_dir)
    monkeypatch.setattr(calibrate, "CALIBRATION_DIR", cal_dir)  # --write goes to the copy
    res = CliRunner().invoke(cli, ["calibration", "recheck", "--results", RESULTS, "--json"])
    assert res.exit_code == 0, res.output
    (group,) = json.loads(res.output)["groups"]  # every committed point is 0.5.17, triton, eager prefill
    assert group["gpu"] == "h200" and group["fitted"] == ["h200-sglang-0.5.17-triton-eager-prefill"]
    assert group["context"] == {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    record = group["rechecked"]
    assert record["load_points"] >= 40 and 0 < record["mape"]["p90_ttft_s"] < 1 and group["written"] is None
    before = (cal_dir / "h200.yaml").read_text()
    res = CliRunner().invoke(cli, ["calibration", "recheck", "--results", RESULTS, "--write"])
    assert res.exit_code == 0, res.output
    assert f"{record['load_points']} load points, P90 TTFT MAPE" in res.output and "recorded in" in res.output
    entry = next(e for e in yaml.safe_load((cal_dir / "h200.yaml").read_text())["fitted"]
                 if e["name"] == "h200-sglang-0.5.17-triton-eager-prefill")
    assert entry["rechecked"]["load_points"] == record["load_points"]
    assert entry["values"] == next(e for e in yaml.safe_load(before)["fitted"] if e["name"] == entry["name"])["values"]
    # the warm start's trust line now prints it
    cal = load_calibration("h200", context=group["context"])
    assert cal["fitted_rechecks"][0]["mape"] == record["mape"]


def test_recheck_without_real_points_says_so_and_fails(tmp_path, capsys):
    code, err = _main(["calibration", "recheck", "--results", str(tmp_path), "--write"], capsys)
    assert code != 0 and "no real measurements found" in err and str(tmp_path) in err


def test_recheck_of_an_h100_records_its_check_beside_the_h200_fit_it_runs(tmp_path, monkeypatch):
    import shutil

    import tuner.bench.fidelity as fidelity
    import tuner.sim.calibrate as calibrate

    cal_dir = tmp_path / "calibration"
    shutil.copytree(calibrate.CALIBRATION_DIR, cal_dir)
    monkeypatch.setattr(calibrate, "CALIBRATION_DIR", cal_dir)
    point = {"gpu": "h100", "model": "qwen3-30b-a3b", "sglang_version": "0.5.17",
             "flags": {"attention-backend": "triton", "disable-prefill-cuda-graph": True},
             "ape": {"p90_ttft_s": 0.2, "p90_tpot_s": 0.1}, "verdict_agrees": True, "error": None,
             "clear_of_slo": True}
    monkeypatch.setattr(fidelity, "run_fidelity", lambda dirs: {"points": [point], "skipped": []})
    before = (cal_dir / "h200.yaml").read_text()
    res = CliRunner().invoke(cli, ["calibration", "recheck", "--results", str(tmp_path), "--write"])
    assert res.exit_code == 0, res.output
    assert "h100, SGLang 0.5.17, triton attention, eager prefill: 1 load points" in res.output
    assert "these points run on h200's (same GPU architecture)" in res.output
    assert not (cal_dir / "h100.yaml").exists()
    after = yaml.safe_load((cal_dir / "h200.yaml").read_text())["fitted"]
    old = yaml.safe_load(before)["fitted"]
    eager = next(i for i, e in enumerate(after) if e["when"].get("prefill_cuda_graph") is False)
    assert after[eager]["rechecked_on"]["h100"]["load_points"] == 1
    assert after[eager]["rechecked_on"]["h100"]["mape"]["p90_ttft_s"] == 0.2
    # the H200's own records and values are untouched
    assert after[eager].get("rechecked") == old[eager].get("rechecked")
    assert after[eager]["values"] == old[eager]["values"]
    assert [e for i, e in enumerate(after) if i != eager] == [e for i, e in enumerate(old) if i != eager]


def test_a_bad_whole_step_file_is_a_clear_error_before_any_fit(tmp_path, capsys):
    bad = tmp_path / "sets.yaml"
    bad.write_text("sets:\n  - rows: missing.jsonl\n    model: qwen3-30b-a3b\n    gpu: h200\n")
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#1",
                       "--whole-steps", str(bad)], capsys)
    assert code == 2 and "missing.jsonl" in err and "cannot read" in err


def test_whole_steps_join_the_fit_and_are_reported_with_the_source(tmp_path):
    sets = REPO / "results" / "profiles" / "h200" / "whole-steps.yaml"
    out = tmp_path / "fit.yaml"
    res = CliRunner().invoke(cli, ["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#1",
                                   "--whole-steps", str(sets), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    ws = doc["whole_steps"]
    assert set(ws) >= {"h200/whole-steps-fp8.jsonl", "h200/whole-steps-bf16.jsonl"}
    fp8 = ws["h200/whole-steps-fp8.jsonl"]
    # one trial's prefill stage sets the prefill scale: its server's stage runs ~20% past a lone
    # batch's forward (fitted on all 14 trials: 10.7%)
    assert fp8["fitted_kinds"] == ["prefill", "decode"] and fp8["mean_abs_error_prefill"] < 0.25
    assert fp8["mean_abs_error_decode"] < 0.15
    assert ws["h200/whole-steps-dsv3-8l-fp8-fp8kv.jsonl"]["fitted_kinds"] == ["prefill"]
    assert len(fp8["rows"]) == 16 and {r["kind"] for r in fp8["rows"]} == {"prefill", "decode"}
    assert f"--whole-steps {sets}" in out.read_text().splitlines()[0]


def test_whole_steps_are_predicted_under_each_sets_own_entry(tmp_path):
    sets = REPO / "results" / "h100-sglang" / "prefill-probe" / "whole-steps.yaml"
    res = CliRunner().invoke(cli, ["calibration", "whole-steps", str(sets), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)["sets"]
    assert set(doc) == {"prefill-probe/one-batch-eager.jsonl", "prefill-probe/one-batch-graph.jsonl"}
    eager, graph = doc["prefill-probe/one-batch-eager.jsonl"], doc["prefill-probe/one-batch-graph.jsonl"]
    assert eager["gpu"] == graph["gpu"] == "h100"
    # the same kernels, another launch cost: a short prompt's step differs by mode, a long one's not
    short = lambda d: next(r for r in d["rows"] if r["kind"] == "prefill" and r["tokens"] == 64)  # noqa: E731
    long_ = lambda d: next(r for r in d["rows"] if r["kind"] == "prefill" and r["tokens"] == 8192)  # noqa: E731
    assert short(eager)["predicted_s"] > 2 * short(graph)["predicted_s"]
    assert long_(eager)["predicted_s"] == pytest.approx(long_(graph)["predicted_s"], rel=0.05)
    text = CliRunner().invoke(cli, ["calibration", "whole-steps", str(sets), "--rows"]).output
    assert "prefill-probe/one-batch-eager.jsonl" in text and "8192 tokens" in text


def test_a_measured_value_is_held_and_not_written_unless_freed(tmp_path, capsys):
    """--hold keeps a value measured directly as the calibration files give it; the scheduler's CPU
    (timed by its own probe) is held without being named, and --free fits it again."""
    out = tmp_path / "held.yaml"
    res = CliRunner().invoke(cli, ["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#1",
                                   "--hold", "overhead.layer_s", "--free", "overhead.per_request_s",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["held_measured"] == ["overhead.layer_s", "overhead.cpu_step_s",
                                    "compute_efficiency.extend_attention.mla_absorbed",
                                    "compute_efficiency.extend_attention.mla_absorbed_causal",
                                    "compute_efficiency.extend_attention.mla_mha_triton_causal"]
    params = {p["name"]: p for p in doc["parameters"]}
    for name in doc["held_measured"]:
        assert params[name]["measured"] and not params[name]["fitted_from_data"]
    assert params["overhead.per_request_s"]["fitted_from_data"] and not params["overhead.per_request_s"]["measured"]
    assert params["memory_efficiency"]["fitted_from_data"]
    values = yaml.safe_load(out.read_text())
    assert "cpu_step_s" not in values["overhead"] and "layer_s" not in values["overhead"]
    assert "per_request_s" in values["overhead"]
    prior = load_calibration("h200")["overhead"]
    assert load_calibration("h200", out)["overhead"]["cpu_step_s"] == prior["cpu_step_s"]
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--hold", "overhead.cpu_s"], capsys)
    assert code == 2 and "--hold" in err and "overhead.cpu_s" in err and "overhead.per_request_s" in err
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--free", "overhead.layer_s",
                       "--hold", "overhead.layer_s"], capsys)
    assert code == 2 and "--free" in err and "overhead.layer_s" in err