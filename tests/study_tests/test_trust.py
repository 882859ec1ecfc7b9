"""The ledger of trust: predicted against measured per load point, the running fidelity, the
warm start's line, and filling predictions into a database measured without them."""

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from tuner.cli import cli
from tuner.config.load import load_study
from tuner.report.html import render_report
from tuner.report.ledger import ledger_html
from tuner.sim import simulate_load_point
from tuner.storage import db, repo
from tuner.study import trust
from tuner.study.summary import study_summary
from tests.conftest import REPO


def _trial(number, measurements, backend="sglang"):
    return {"number": number, "backend_kind": backend, "measurements": measurements}


def _m(users, meas, pred, meets=True, pmeets=True, **extra):
    m = {"users": users, "valid": True, "meets_slo": meets, "step": 0, "p50_ttft_s": meas, "p90_ttft_s": meas,
         "p90_tpot_s": 0.02, "throughput_tokens_per_s": 100.0, "prefix_cache_hit_rate": 0.5}
    m[trust.PREDICTION_KEY] = {"p50_ttft_s": pred, "p90_ttft_s": pred, "p90_tpot_s": 0.02,
                               "throughput_tokens_per_s": 110.0, "prefix_cache_hit_rate": 0.5, "meets_slo": pmeets,
                               **extra}
    return m


def test_rows_and_running_fidelity():
    trials = [_trial(0, [_m(8, 1.0, 1.2), _m(16, 2.0, 1.0, meets=False, pmeets=True)]),
              _trial(1, [_m(8, 1.0, None, error="does not fit")]),
              _trial(2, [_m(8, 1.0, 1.0)], backend="simulator")]  # simulated trials are not evidence
    rows = trust.ledger_rows(trials)
    assert [(r["trial"], r["users"]) for r in rows] == [(0, 8), (0, 16), (1, 8)]
    assert rows[0]["rel_error"]["p90_ttft_s"] == pytest.approx(0.2)
    fid = trust.running_fidelity(rows)
    assert fid["load_points"] == 3 and fid["unpredictable"] == 1
    assert fid["mape"]["p90_ttft_s"] == pytest.approx((0.2 + 0.5) / 2)
    assert fid["mape"]["throughput_tokens_per_s"] == pytest.approx(0.1)
    assert fid["verdict_agreement"] == pytest.approx(0.5) and fid["within_targets"] is False


def test_the_section_escapes_and_says_what_is_missing():
    s = {"backend_kind": "sglang", "simulator_ledger": trust.ledger_rows(
        [_trial(0, [_m(8, 1.0, None, error="<script>alert(1)</script>")])])}
    s["simulator_fidelity"] = trust.running_fidelity(s["simulator_ledger"])
    html = ledger_html(s)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "tuner db predict" in ledger_html({"backend_kind": "sglang", "simulator_ledger": []})
    assert "ran on the simulator" in ledger_html({"backend_kind": "simulator"})


def test_the_warm_start_says_how_far_the_simulator_was_checked():
    calibrated = trust.trust_line(load_study(str(REPO / "studies" / "h200-sglang-qwen3.yaml")))
    assert "calibrated for SGLang 0.5.17, triton attention, eager prefill" in calibrated
    assert "P90 TTFT MAPE" in calibrated and "real load points" in calibrated
    assert "not calibrated on real servers" in trust.trust_line(load_study("h200"))


def test_the_trust_line_adds_a_later_recheck(monkeypatch):
    spec = load_study(str(REPO / "studies" / "h200-sglang-qwen3.yaml"))
    real = trust.simulator_trust(spec)
    # the committed h200 entry carries a recheck, and the line prints it
    assert real["rechecked"] and "rechecked by today's simulator" in trust.trust_line(spec)
    later = {"load_points": 48, "mape": {"p90_ttft_s": 0.207, "p90_tpot_s": 0.085}, "verdict_agreement": 0.917,
             "date": "2026-12-05"}
    monkeypatch.setattr(trust, "simulator_trust", lambda s: {**real, "rechecked": [later]})
    line = trust.trust_line(spec)
    assert line.endswith("rechecked by today's simulator: P90 TTFT MAPE 21%, P90 TPOT MAPE 8%, verdicts 92% "
                         "over 48 real load points (2026-12-05)")
    assert line.index("checked:") < line.index("rechecked")  # the fit-time record still comes first


STUDY = """
name: ledger
model: {name: qwen3-30b-a3b, overrides: {num_hidden_layers: 4}}
hardware: {gpu: h200, gpus_per_node: 1, nodes: 1, host_memory_gb: 128}
workload: WORKLOAD
search_space: {name: s, engine: sglang, params: {mem-fraction-static: {values: [null, 0.8]}}}
slo: {p90_ttft_s: 1.5, p90_tpot_s: 0.025}
measurement: {warmup_s: 5, duration_s: 10}
baseline: {}
backend: sglang
backend_options: {sglang_version: "0.5.17", server_flags: {attention-backend: triton}}
seed: 7
"""


def _ledger_study(tmp_path, *, trials: int):
    """STUDY in a fresh SQLite database, with no trial yet: (spec, storage URL, engine)."""
    path = tmp_path / "ledger.yaml"
    path.write_text(STUDY.replace("WORKLOAD", str(REPO / "workloads" / "coding-agent-40k.yaml")))
    study = load_study(str(path))
    url = f"sqlite:///{tmp_path}/t.db"
    engine = db.get_engine(url)
    db.ensure_schema(engine)
    repo.create_study(engine, name="ledger", spec_yaml=yaml.safe_dump(study.model_dump(mode="json")), spec_hash="x",
                      source_path=None, backend_kind="sglang", target_users=4, p90_ttft_slo_s=1.5,
                      p90_tpot_slo_s=0.025, trials_budget=trials, tuner_version="test")
    return study, url, engine


def test_db_predict_fills_in_predictions_and_the_report_shows_them(tmp_path):
    study, url, engine = _ledger_study(tmp_path, trials=1)
    flags = {"attention-backend": "triton"}
    repo.start_trial(engine, study_name="ledger", trial_number=0, optuna_trial_id=0, backend_kind="sglang",
                     params={}, flags=flags, knobs={}, is_baseline=True)
    for step, users in enumerate((2, 4)):
        m = simulate_load_point(study.model, "h200", 1, flags, {}, study.workload_profile(), users, warmup_s=5,
                                duration_s=10, seed=7 + 1009 * step, host_memory_gb=128, sglang_version="0.5.17",
                                fresh_server=step == 0)  # the trial's first point ran on its fresh server
        m = replace(m, p90_ttft_s=m.p90_ttft_s * 2)  # "measured": twice the prediction
        repo.add_measurement(engine, study_name="ledger", trial_number=0, step=step, backend_kind="sglang",
                             metrics=m, meets_slo=True, wall_time_s=1.0)
    repo.finish_trial(engine, "ledger", 0, status="complete", capacity_users=4)
    assert study_summary(url, "ledger")["simulator_fidelity"]["load_points"] == 0
    res = CliRunner().invoke(cli, ["db", "predict", "--storage", url, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["predicted"] == 2
    s = study_summary(url, "ledger")
    # the stored prediction is the same simulation: |p - 2p| / 2p
    assert s["simulator_fidelity"]["mape"]["p90_ttft_s"] == pytest.approx(0.5, abs=1e-6)
    assert all(r[trust.PREDICTION_KEY]["backfilled"] for t in s["trials"] for r in t["measurements"])
    # the trial's first load point ran on a fresh server, the next one did not
    assert [r[trust.PREDICTION_KEY]["fresh_server"] for t in s["trials"] for r in t["measurements"]] == [True, False]
    again = CliRunner().invoke(cli, ["db", "predict", "--storage", url, "--json"])
    assert json.loads(again.output)["kept"] == 2  # nothing predicted twice without --force
    from tuner.errors import StudyNotFoundError

    wrong = CliRunner().invoke(cli, ["db", "predict", "--storage", url, "--study", "ledgre"])
    assert isinstance(wrong.exception, StudyNotFoundError) and wrong.exception.exit_code == 2
    assert "no study 'ledgre'" in str(wrong.exception) and "studies there: ledger" in str(wrong.exception)
    html = render_report(s, {"importances": [], "note": None, "trials": 0})
    assert "Simulator against this study" in html and "P90 TTFT MAPE" in html


def test_the_trust_line_says_when_the_fit_was_made_on_another_gpu(monkeypatch):
    h100 = load_study(str(REPO / "studies" / "h100-sglang-qwen3.yaml"))
    line = trust.trust_line(h100)
    # the committed H200 entry carries its check on the H100's own load points (results/h100-sglang)
    assert "on h200 (the same GPU architecture" in line and "checked on h100 itself: P90 TTFT MAPE" in line
    assert "on h200 (the same" not in trust.trust_line(load_study(str(REPO / "studies" / "h200-sglang-qwen3.yaml")))
    real = trust.simulator_trust(h100)
    assert real["checked_here"] and real["checked_here"][0]["gpu"] == "h100"
    monkeypatch.setattr(trust, "simulator_trust", lambda s: {**real, "checked_here": []})
    assert "not yet checked on h100 itself" in trust.trust_line(h100)


def test_db_predict_reads_the_kernel_warmup_and_the_cached_kernels_of_a_first_point(tmp_path):
    study, url, engine = _ledger_study(tmp_path, trials=2)
    flags = {"attention-backend": "triton"}
    # trial 0: the kernel warm-up ran before its first point; trial 1: its server found sizes 3 and
    # 2,048 built in a pinned cache, as the live evaluator records them
    extras = ({"kernel_warmup": {"requests": 35, "failed": 0}},
              {"kernel_cache": {"kernel_set": "0123456789abcdef", "cache_dir": "/c",
                                "cached": {"prefill_tokens": [3, 2048], "graph_tokens": [1, 2]}}})
    for trial, extra in enumerate(extras):
        repo.start_trial(engine, study_name="ledger", trial_number=trial, optuna_trial_id=trial, backend_kind="sglang",
                         params={}, flags=flags, knobs={}, is_baseline=trial == 0)
        m = simulate_load_point(study.model, "h200", 1, flags, {}, study.workload_profile(), 2, warmup_s=5,
                                duration_s=10, seed=7 + trial, host_memory_gb=128, sglang_version="0.5.17")
        repo.add_measurement(engine, study_name="ledger", trial_number=trial, step=0, backend_kind="sglang",
                             metrics=replace(m, extra={**m.extra, **extra}), meets_slo=True, wall_time_s=1.0)
        repo.finish_trial(engine, "ledger", trial, status="complete", capacity_users=2)
    res = CliRunner().invoke(cli, ["db", "predict", "--storage", url, "--json"])
    assert res.exit_code == 0, res.output
    preds = [r[trust.PREDICTION_KEY] for t in study_summary(url, "ledger")["trials"] for r in t["measurements"]]
    assert [p["fresh_server"] for p in preds] == [False, True]
    assert [p["cached_prefill_sizes"] for p in preds] == [0, 2]


def test_the_ledger_splits_the_verdicts_by_whether_each_window_decides_its_own():
    slo = {"p90_ttft_s": 1.5, "p90_tpot_s": 0.025}
    decided = _m(8, 1.0, 1.0)
    decided["p90_spread"] = {"ttft_s": [0.9, 1.1], "tpot_s": [0.019, 0.021]}
    marginal = _m(16, 1.0, 1.0, meets=True, pmeets=False)  # the TPOT interval reaches past 25 ms
    marginal["p90_spread"] = {"ttft_s": [0.9, 1.1], "tpot_s": [0.019, 0.026]}
    unknown = _m(24, 1.0, 1.0)
    rows = trust.ledger_rows([_trial(0, [decided, marginal, unknown])], slo)
    assert [r["measured_marginal"] for r in rows] == [False, True, None]
    fid = trust.running_fidelity(rows)
    assert fid["verdict_agreement"] == pytest.approx(2 / 3)
    assert fid["verdicts_decided"] == {"points": 1, "agreement": 1.0, "marginal_points": 1}
    html = ledger_html({"backend_kind": "sglang", "simulator_ledger": rows, "simulator_fidelity": fid})
    assert "of the 1 whose own window decides the measured verdict (1 marginal" in html
    assert html.count("(marginal)") == 1
    # without the SLO nothing is said about the windows
    assert all(r["measured_marginal"] is None for r in trust.ledger_rows([_trial(0, [decided, marginal])]))
