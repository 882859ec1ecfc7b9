"""`tuner bench fidelity` on a small constructed study database and probe files: the JSON
contract, the MAPE arithmetic, and that it fails when a prediction is off."""

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import REPO
from tuner.bench.fidelity import extra_args_to_flags, format_report, run_fidelity
from tuner.cli import cli
from tuner.sim import simulate_load_point
from tuner.config.load import load_study
from tuner.storage import db, repo
from tuner.sim.warmup import CachedKernels

STUDY = """
name: fid
model: qwen3-30b-a3b
hardware: {gpu: h200, gpus_per_node: 1, nodes: 1, host_memory_gb: 256}
workload: coding-agent
search_space:
  name: one-gpu
  engine: sglang
  params:
    tp-size: {values: [1]}
    mem-fraction-static: {values: [null, 0.85]}
slo: {p90_ttft_s: 2.0, p90_tpot_s: 0.030}
measurement: {warmup_s: 20, duration_s: 60}
baseline: {tp-size: 1}
backend: sglang
backend_options: {extra_server_args: ["--attention-backend", "triton", "--load-format", "dummy"],
                  sglang_version: "0.5.17"}
seed: 3
"""
FLAGS = {"tp-size": 1}
USERS = (2, 6)


def _simulated(study, users, step, trial=0):
    return simulate_load_point(study.model, study.hardware.gpu, 1, {"attention-backend": "triton", "load-format": "dummy", **FLAGS},
                               {}, study.workload_profile(), users, warmup_s=20, duration_s=60,
                               seed=study.seed + trial + 1009 * step, host_memory_gb=256, sglang_version="0.5.17")



def _resolved_calibration(gpu="h200"):
    """The calibration the simulator resolves for make_db's points (its context: 0.5.17, triton,
    prefill CUDA graphs), so a test can add to it and still match the measurements elsewhere."""
    from tuner.catalog import get_gpu, get_model
    from tuner.sim.calibrate import calibration_context, load_calibration

    return load_calibration(gpu, context=calibration_context(
        get_model("qwen3-30b-a3b"), get_gpu(gpu), {"attention-backend": "triton", **FLAGS}, "0.5.17"))

def make_db(tmp_path, *, ttft_scale=1.0, backend="sglang", name="study.db", kernel_warmup=False, gpu="h200",
            kernel_cache=None):
    (tmp_path / "studies").mkdir(parents=True, exist_ok=True)
    (tmp_path / "studies" / "fid.yaml").write_text(STUDY.replace("gpu: h200", f"gpu: {gpu}"))
    study = load_study(str(tmp_path / "studies" / "fid.yaml"))
    path = tmp_path / "results" / name
    path.parent.mkdir(exist_ok=True)
    engine = db.get_engine(f"sqlite:///{path}")
    db.ensure_schema(engine)
    repo.create_study(engine, name=study.name, spec_yaml=yaml.safe_dump(study.model_dump(mode="json")),
                      spec_hash="x", source_path=None, backend_kind=backend, target_users=8,
                      p90_ttft_slo_s=2.0, p90_tpot_slo_s=0.03, trials_budget=1, tuner_version="test")
    repo.start_trial(engine, study_name="fid", trial_number=0, optuna_trial_id=0, backend_kind=backend,
                     params={}, flags=FLAGS, knobs={}, is_baseline=True)
    for step, users in enumerate(USERS):
        m = _simulated(study, users, step)
        m = replace(m, p90_ttft_s=m.p90_ttft_s * ttft_scale, p50_ttft_s=m.p50_ttft_s * ttft_scale)
        if kernel_warmup and step == 0:  # as the live evaluator records it
            m = replace(m, extra={**m.extra, "kernel_warmup": {"requests": 35, "failed": 0}})
        if kernel_cache is not None:  # as the live evaluator records it on a pinned cache
            m = replace(m, extra={**m.extra, "kernel_cache": {"kernel_set": "0123456789abcdef", "cache_dir": "/c",
                                                              "cached": kernel_cache if step == 0 else None}})
        repo.add_measurement(engine, study_name="fid", trial_number=0, step=step, backend_kind=backend, metrics=m,
                             meets_slo=m.meets(2.0, 0.03), wall_time_s=1.0)
    repo.finish_trial(engine, "fid", 0, status="complete", capacity_users=USERS[-1])
    engine.dispose()
    return tmp_path / "results", study


def test_exact_measurements_give_zero_error_and_the_json_contract(tmp_path):
    results, _ = make_db(tmp_path)
    res = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("points", "mape", "verdict_agreement", "targets", "target_results", "passed", "sources"):
        assert key in doc
    assert doc["passed"] is True and doc["verdict_agreement"] == 1.0
    assert doc["mape"]["p90_ttft_s"] == 0.0 and doc["mape"]["p90_tpot_s"] == 0.0
    assert [p["users"] for p in doc["points"]] == list(USERS)
    pt = doc["points"][0]
    for key in ("p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s", "prefix_cache_hit_rate",
                "meets_slo"):
        assert key in pt["measured"] and key in pt["predicted"]
    # the trial's flags plus the study's extra server arguments, at the version the study recorded
    assert pt["flags"]["attention-backend"] == "triton" and pt["sglang_version"] == "0.5.17"
    assert pt["predicted"]["step_time_source"] in ("roofline", "profile", "mixed")


def test_a_prediction_off_by_2x_fails_and_is_flagged(tmp_path):
    results, _ = make_db(tmp_path, ttft_scale=2.0)
    res = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["passed"] is False and doc["target_results"]["p90_ttft_s"] is False
    assert doc["mape"]["p90_ttft_s"] == pytest.approx(0.5)  # |x - 2x| / 2x
    assert all("p90_ttft" in p["off_target"] for p in doc["points"])
    text = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results)])
    assert text.exit_code == 1 and "MISSED" in text.output and "! p90_ttft" in text.output


def _main(args, capsys):
    from tuner.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    return exc.value.code, capsys.readouterr().err


def test_simulated_measurements_are_not_real_data(tmp_path, capsys):
    results, _ = make_db(tmp_path, backend="simulator")
    code, err = _main(["bench", "fidelity", "--results", str(results)], capsys)
    assert code == 1 and "no real measurements found" in err


def _probe(**over):
    doc = {"format": "tuner-probe/1", "name": "p", "model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 1,
           "sglang_version": "0.5.17", "flags": {"tp-size": 1, "attention-backend": "triton"},
           "workload": "coding-agent", "slo": {"p90_ttft_s": 2.0, "p90_tpot_s": 0.03},
           "points": [{"users": 2, "warmup_s": 20, "duration_s": 60, "seed": 1,
                       "measured": {"p50_ttft_s": 0.1, "p90_ttft_s": 0.2, "p90_tpot_s": 0.02,
                                    "throughput_tokens_per_s": 100.0, "prefix_cache_hit_rate": 0.5}}],
           "provenance": {"note": "constructed for a test"}}
    doc.update(over)
    return doc


def test_probe_files_are_read_and_bad_ones_name_file_and_key(tmp_path, capsys):
    d = tmp_path / "probes"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(_probe()))
    doc = run_fidelity([tmp_path])
    assert len(doc["points"]) == 1 and doc["points"][0]["label"] == "p@2"
    assert doc["points"][0]["predicted"]["p90_ttft_s"] is not None
    (d / "b.json").write_text(json.dumps(_probe(points=[{"users": 2, "duration_s": 60, "measured": {}}])))
    code, err = _main(["bench", "fidelity", "--results", str(tmp_path)], capsys)
    assert code == 2 and "b.json" in err and "points[0].measured.p90_ttft_s" in err


def test_the_report_names_every_point_whole(tmp_path):
    # labels of tile A/B probes run past 36 characters; a cut one named another point ("...@1" for "...@16")
    d = tmp_path / "probes"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(_probe(name="h200-sglang-dsv3-tiles-ab-default", points=[
        {**_probe()["points"][0], "users": 16}])))
    text = format_report(run_fidelity([tmp_path]))
    (row,) = [line for line in text.splitlines() if line.startswith("h200-sglang-dsv3-tiles-ab-default@")]
    assert row.split()[0] == "h200-sglang-dsv3-tiles-ab-default@16"


def test_extra_server_args_become_flags():
    assert extra_args_to_flags(["--attention-backend", "triton", "--disable-radix-cache", "--page-size=16"]) == {
        "attention-backend": "triton", "disable-radix-cache": True, "page-size": "16"}


def test_trials_are_selected_by_name_and_a_wrong_name_is_a_clear_error(tmp_path, capsys):
    results, _ = make_db(tmp_path)
    res = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results), "--only-trials", "fid#0", "--json"])
    assert res.exit_code == 0, res.output
    assert [p["label"] for p in json.loads(res.output)["points"]] == ["fid#0@2", "fid#0@6"]
    code, err = _main(["bench", "fidelity", "--results", str(results), "--only-trials", "fid#7"], capsys)
    assert code == 2 and "no trial 'fid#7'" in err and "fid#0" in err and "--only-trials" in err
    code, err = _main(["bench", "fidelity", "--results", str(results), "--exclude-trials", "fid"], capsys)
    assert code == 2 and "leaves no trial" in err


def test_the_first_load_point_of_a_trial_is_predicted_on_a_fresh_server(tmp_path):
    results, _ = make_db(tmp_path)  # measured as the simulator predicts a warm server
    cal = _resolved_calibration()  # with the time model's stalls added
    cal["fresh_server_stalls"] = {"per_start": 8.0, "stall_s": 1.5, "decay_s": 40.0}
    doc = run_fidelity([results], calibration=cal)
    first, second = doc["points"]
    assert first["fresh_server"] and not second["fresh_server"]
    assert first["predicted"]["p90_ttft_s"] > first["measured"]["p90_ttft_s"]  # its stalls
    # the second is not: its step times are memoised per 256-token context bucket and timed at the
    # bucket's middle, so predicting it alone gives what it gave after the first point
    assert second["ape"]["p90_ttft_s"] == 0.0 and second["ape"]["p90_tpot_s"] == 0.0
    # the report says where the error is: all of it on the fresh server's first point
    warm, fresh = doc["by_server"]["warm"], doc["by_server"]["fresh"]
    assert warm["load_points"] == 1 and fresh["load_points"] == 1
    assert warm["mape"]["p90_ttft_s"] < 1e-3 < fresh["mape"]["p90_ttft_s"] == first["ape"]["p90_ttft_s"]
    assert "on fresh servers' first load points (1): P90 TTFT" in format_report(doc)


def test_a_first_load_point_after_the_kernel_warmup_is_predicted_on_a_warm_server(tmp_path):
    results, _ = make_db(tmp_path, kernel_warmup=True)
    cal = _resolved_calibration()
    cal["fresh_server_stalls"] = {"per_start": 8.0, "stall_s": 1.5, "decay_s": 40.0}
    first, second = run_fidelity([results], calibration=cal)["points"]
    assert not first["fresh_server"] and not second["fresh_server"]
    assert first["ape"]["p90_ttft_s"] < 1e-3  # no stalls put into it


def test_a_first_load_point_on_a_cache_earlier_servers_filled_is_predicted_with_those_kernels_built(tmp_path):
    cal = _resolved_calibration()
    cal["fresh_server_stalls"] = {"per_new_kernel_s": 1.5}  # the kernel-variant model: stalls per new variant
    cold, _ = make_db(tmp_path / "cold")  # measured as the simulator predicts a warm server
    first = run_fidelity([cold], calibration=cal)["points"][0]
    assert first["fresh_server"] and first["ape"]["p90_ttft_s"] > 0.05 and first["cached_prefill_sizes"] == 0
    every_size = {"prefill_tokens": list(range(1, 8193)), "graph_tokens": []}
    filled, _ = make_db(tmp_path / "filled", kernel_cache=every_size)
    first = run_fidelity([filled], calibration=cal)["points"][0]
    assert first["fresh_server"] and first["cached_prefill_sizes"] == 8192
    assert first["ape"]["p90_ttft_s"] < 1e-3  # every variant it runs was built: no stall put into it
    # a damaged record is named (its point and key) and its database set aside, as any unreadable one
    broken, _ = make_db(tmp_path / "broken", kernel_cache={"prefill_tokens": [-1]})
    doc = run_fidelity([filled, broken], calibration=cal)
    assert len(doc["points"]) == 2 and [s["source"] for s in doc["skipped"]] == [str(broken / "study.db")]
    assert "fid#0@2: prefill_tokens must be positive token counts" in doc["skipped"][0]["reason"]
    assert "extra.kernel_cache.cached_kernels.prefill_tokens" in doc["skipped"][0]["reason"]


def test_verdicts_are_also_counted_on_the_points_clear_of_the_slo(tmp_path):
    from tuner.bench.fidelity import summarize_points

    def pt(agrees, ttft, tpot):
        return {"ape": {}, "verdict_agrees": agrees, "error": None,
                "clear_of_slo": abs(ttft / 1.0 - 1) > 0.1 and abs(tpot / 0.02 - 1) > 0.1}

    doc = summarize_points([pt(True, 0.5, 0.010), pt(False, 0.97, 0.010), pt(True, 2.0, 0.030), pt(False, 0.5, 0.021)])
    assert doc["verdict_agreement"] == 0.5
    assert doc["verdicts_clear_of_slo"] == {"margin": 0.1, "points": 2, "agreement": 1.0}
    results, _ = make_db(tmp_path)
    full = run_fidelity([results])
    assert all(isinstance(p["clear_of_slo"], bool) for p in full["points"])
    assert full["points"][0]["slo"] == {"p90_ttft_s": 2.0, "p90_tpot_s": 0.03}


def test_window_noise_is_the_mean_difference_of_two_samples_of_a_point(tmp_path, monkeypatch):
    import tuner.bench.fidelity as fid

    results, _ = make_db(tmp_path)
    res = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results), "--json", "--noise-seeds", "3"])
    assert "expectation_model" in json.loads(res.output)["window_noise"]
    assert res.exit_code == 0, res.output
    noise = json.loads(res.output)["window_noise"]
    assert noise["seeds"] == 3 and noise["points"] == len(USERS)
    assert set(noise["pairwise_ape"]) == {"p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s"}
    assert noise["pairwise_ape"]["p90_ttft_s"] > 0  # other workload samples of a point are other windows
    assert 0 <= noise["verdict_agreement"] <= 1
    off = CliRunner().invoke(cli, ["bench", "fidelity", "--results", str(results), "--json", "--noise-seeds", "0"])
    assert json.loads(off.output)["window_noise"] is None
    # the arithmetic: two samples 1.0 and 2.0 differ by |1 - 2| / 2 and |2 - 1| / 1, mean 0.75
    values = iter([1.0, 2.0, 1.0, 2.0, 4.0])

    def fake(point, **kw):
        v = next(values)
        return fid.PointResult(point=point, predicted={k: v for k in fid.NOISE_METRICS})

    from tuner.sim.measured import points_from_database

    p0 = points_from_database(next(results.glob("*.db")))[0]
    monkeypatch.setattr(fid, "predict_point", fake)
    doc = fid.window_noise([p0], 2)
    assert doc["pairwise_ape"]["p90_ttft_s"] == pytest.approx(0.75)
    # P90 TTFT 1.0 s and 2.0 s against the study's 2.0 s limit (TPOT 1.0 and 2.0 s over its 0.03 s): both miss
    assert doc["verdict_agreement"] == 1.0
    assert doc["expectation_model"]["ape"]["p90_ttft_s"] is None  # needs 3 samples
    # 1, 2, 4: each against the median of the other two (3, 2.5, 1.5): 2/1, 0.5/2, 2.5/4
    doc = fid.window_noise([p0], 3)
    assert doc["expectation_model"]["ape"]["p90_ttft_s"] == pytest.approx((2 + 0.25 + 0.625) / 3)
    assert doc["expectation_model"]["verdict_agreement"] == 1.0


def test_each_gpu_gets_its_own_figures_and_says_whether_it_was_fitted(tmp_path):
    h200, _ = make_db(tmp_path / "a")
    h100, _ = make_db(tmp_path / "b", gpu="h100", ttft_scale=2.0)
    doc = run_fidelity([h200, h100])
    gpus = doc["by_gpu"]
    assert set(gpus) == {"h100", "h200"}
    assert gpus["h200"]["mape"]["p90_ttft_s"] == 0.0 and gpus["h200"]["load_points"] == len(USERS)
    assert gpus["h100"]["mape"]["p90_ttft_s"] == pytest.approx(0.5)  # only the H100's points are off
    # no step times were ever fitted on an H100: it runs the H200's entry, in part (these servers
    # capture prefill CUDA graphs, the fit's did not)
    assert gpus["h100"]["fitted_on"] == ["h200"] and gpus["h200"]["fitted_on"] == []
    assert all("(fitted on h200, same SM90)" in name for name in gpus["h100"]["fitted"]) and gpus["h100"]["fitted"]
    assert "on h100 (2, step times fitted on h200 (same architecture), none on it): P90 TTFT 50.0%" in format_report(doc)
    # one GPU: no per-GPU lines, the totals are its own
    assert "on h100 (" not in format_report(run_fidelity([h100]))


def test_a_gpu_whose_fit_came_from_another_gpu_says_so(tmp_path):
    from tuner.bench.fidelity import by_gpu

    def doc(gpu, applied, on):
        return {"gpu": gpu, "ape": {"p90_ttft_s": 0.1, "p90_tpot_s": 0.05}, "verdict_agrees": True, "error": None,
                "clear_of_slo": True, "fresh_server": False,
                "predicted": {"calibration_applied": applied, "calibration_fitted_on": on}}

    docs = [doc("h200", ["fit"], None), doc("h100", ["fit (fitted on h200, same SM90)"], "h200")]
    gpus = by_gpu(docs)
    assert gpus["h100"]["fitted_on"] == ["h200"] and gpus["h200"]["fitted_on"] == []
    results, _ = make_db(tmp_path)
    report = format_report({**run_fidelity([results]), "by_gpu": gpus})
    assert "on h100 (1, step times fitted on h200 (same architecture), none on it)" in report
    assert "on h200 (1, step times fitted on it: fit)" in report


def test_priors_only_drops_every_fitted_entry_and_says_so(tmp_path):
    results, _ = make_db(tmp_path)  # measured as the simulator predicts with the fit (in part) applied
    fitted = run_fidelity([results])
    assert fitted["mape"]["p90_tpot_s"] == 0.0 and fitted["points"][0]["predicted"]["calibration_applied"]
    priors = run_fidelity([results], priors_only=True)
    assert priors["priors_only"] is True and priors["window_noise"] is None
    assert all(p["predicted"]["calibration_applied"] == [] for p in priors["points"])
    assert priors["mape"]["p90_tpot_s"] > 0.05  # the fit's scheduler and kernel values are what moved it
    assert format_report(priors).startswith("priors only: no fitted calibration entry applied")
    assert "priors only" not in format_report(fitted)


def test_points_of_trials_no_applied_fit_saw_get_their_own_figures(tmp_path):
    """study 'fid' trial 0 is in no fitted entry's trials: every point is unseen; a fit that lists
    it makes them seen; with the priors alone no fit applied, so neither."""
    from tuner.sim import calibrate

    results, _ = make_db(tmp_path, ttft_scale=2.0)
    doc = run_fidelity([results])
    assert all(p["seen_by_fit"] is False for p in doc["points"])
    unseen = doc["unseen_by_fit"]
    assert unseen["trials"] == ["fid#0"] and unseen["load_points"] == len(USERS)
    assert unseen["mape"]["p90_ttft_s"] == pytest.approx(0.5)
    assert "on the 2 points of trials no fit they used was fitted on (fid#0): P90 TTFT 50.0%" in format_report(doc)
    assert run_fidelity([results], priors_only=True)["unseen_by_fit"] is None
    # an entry that names the trial: its points were seen by the fit
    cal = _resolved_calibration()
    cal["fitted_trials"] = ["fid#0"]
    seen = run_fidelity([results], calibration=cal)
    assert all(p["seen_by_fit"] is True for p in seen["points"]) and seen["unseen_by_fit"] is None
    # the committed entries name the trials they were fitted on
    trials = calibrate.load_calibration("h200", context={"sglang_version": "0.5.17", "attention_backend": "triton",
                                                         "prefill_cuda_graph": False})["fitted_trials"]
    assert "h200-sglang-qwen3#0" in trials and "h200-sglang-qwen3#17" not in trials


def test_hicache_points_compare_the_load_back_sglang_counted_with_the_simulators():
    doc = run_fidelity([REPO / "results" / "h100-sglang" / "h100-sglang-qwen3.db"])
    pts = {p["label"]: p for p in doc["points"]}
    assert pts["h100-sglang-qwen3#0@16"]["hicache"] is None  # HiCache off
    evicting = pts["h100-sglang-qwen3#5@32"]["hicache"]  # a 128 k-token pool over a larger working set
    assert evicting["measured"] == {"load_back_tokens": 385_334, "loads": 75}
    assert 0.5 * 385_334 < evicting["predicted"]["load_back_tokens"] < 1.5 * 385_334
    never = pts["h100-sglang-qwen3#1@24"]["hicache"]  # an 820 k-token pool that never evicts
    assert never["measured"]["load_back_tokens"] == 0 == never["predicted"]["load_back_tokens"]
    text = format_report(doc)
    assert "HiCache load-back over the whole load point" in text and "385,334" in text


def test_repeats_pair_only_measurements_of_one_configuration_and_count_their_verdicts(tmp_path):
    import tuner.bench.fidelity as fid
    from tuner.sim.measured import points_from_database

    results, _ = make_db(tmp_path)
    p2, p6 = points_from_database(next(results.glob("*.db")))  # one trial at 2 and 6 users: no repeat
    assert run_fidelity([results])["repeats"] is None

    def result(p, measured_meets, predicted_meets, **over):
        return fid.PointResult(point=replace(p, **over), measured_meets=measured_meets,
                               predicted_meets=predicted_meets)

    rs = [result(p6, True, True, label="a@6"), result(p6, False, True, label="b@6", trial=1),
          result(p6, False, True, label="c@6", trial=2, flags={**p6.flags, "enable-metrics": True}),
          result(p6, True, True, label="fresh@6", fresh_server=True),  # not a repeat of the warm ones
          # nor of a fresh server on a cold cache
          result(p6, True, True, label="cached@6", fresh_server=True, cached_kernels=CachedKernels((3, 2048))),
          result(p6, True, True, label="other@6", flags={**p6.flags, "chunked-prefill-size": 4096}),
          result(p2, True, True, label="x@2"), result(p2, True, False, label="y@2", seed=p2.seed + 1)]
    doc = fid.repeats(rs)
    assert [g["points"] for g in doc["groups"]] == [["a@6", "b@6", "c@6"], ["x@2", "y@2"]]
    # pairs a-b, a-c, b-c (1 of 3 agree) and x-y (agrees); the simulator is right on a, x: 2 of 5
    assert doc["pairs"] == 4 and doc["measured_pairs_agreement"] == pytest.approx(0.5)
    assert doc["points"] == 5 and doc["simulator_agreement"] == pytest.approx(2 / 5)
    text = format_report({**run_fidelity([results]), "repeats": doc})
    assert "two real servers' SLO verdicts agree on 50.0% of 4 pairs" in text


def test_verdicts_are_split_by_whether_the_measured_window_decides_them(tmp_path, capsys):
    d = tmp_path / "probes"
    d.mkdir()
    base = {"users": 2, "warmup_s": 20, "duration_s": 60, "seed": 1,
            "measured": {"p50_ttft_s": 0.1, "p90_ttft_s": 0.2, "p90_tpot_s": 0.02,
                         "throughput_tokens_per_s": 100.0, "prefix_cache_hit_rate": 0.5}}
    points = [  # SLO 2.0 s / 30 ms: the first window's TPOT interval reaches past 30 ms, the second's does not
        {**base, "p90_spread": {"ttft_s": [0.15, 0.25], "tpot_s": [0.018, 0.031]}},
        {**base, "users": 4, "p90_spread": {"ttft_s": [0.15, 0.25], "tpot_s": [0.018, 0.022]}},
        {**base, "users": 6}]
    (d / "a.json").write_text(json.dumps(_probe(points=points)))
    doc = run_fidelity([tmp_path])
    assert [p["measured_verdict_marginal"] for p in doc["points"]] == [True, False, None]
    wn = doc["verdicts_by_window_noise"]
    assert wn["decided"]["points"] == 1 and wn["marginal"]["points"] == 1 and wn["unknown_points"] == 1
    assert wn["decided"]["agreement"] == doc["points"][1]["verdict_agrees"]
    assert "points whose own window decides their verdict" in format_report(doc) and "(p@2)" in format_report(doc)
    # a database point carries the intervals its window recorded (none under 10 requests: 2 users)
    results, _ = make_db(tmp_path / "db")
    assert [type(p["measured_verdict_marginal"]) for p in run_fidelity([results])["points"]] == [type(None), bool]
    # a malformed interval names the file and the key
    (d / "a.json").write_text(json.dumps(_probe(points=[{**base, "p90_spread": {"tpot_s": [0.03, 0.01]}}])))
    code, err = _main(["bench", "fidelity", "--results", str(tmp_path)], capsys)
    assert code == 2 and "a.json" in err and "points[0].p90_spread.tpot_s" in err
