"""The sglang backend end to end on a CPU: a study whose trials start a stand-in ``sglang serve``
(fake_sglang.py, timed by the simulator, reading its arguments as SGLang 0.5.17 does) through the
real CLI, real local Ray and a real SQLite file; dummy weights from a rendered config.json, token
ids to /generate, /server_info and /metrics read, flags 0.5.17's YAML refuses on the command line.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tuner.workload.metrics import PREDICTION_KEY

FAKE = Path(__file__).with_name("fake_sglang.py")


def _study(tmp: Path, name: str = "fake-sglang", trials: int = 3, env: dict | None = None, **over) -> Path:
    (tmp / "search_spaces").mkdir(exist_ok=True)
    (tmp / "studies").mkdir(exist_ok=True)
    (tmp / "search_spaces" / "s.yaml").write_text(yaml.safe_dump({
        "name": "s", "engine": "sglang",
        "params": {"kv-cache-dtype": {"values": [None, "fp8_e4m3"]},
                   "cuda-graph-max-bs-decode": {"values": [64, None]}}}))
    data = {
        "name": name,
        "model": {"name": "qwen3-30b-a3b", "overrides": {"num_hidden_layers": 4}},
        "hardware": {"gpu": "h200", "gpus_per_node": 1, "nodes": 1, "host_memory_gb": 128},
        "workload": str(REPO / "workloads" / "coding-agent-40k.yaml"),
        "search_space": "s",
        "slo": {"p90_ttft_s": 1.5, "p90_tpot_s": 0.025},
        "target_users": 8,
        "capacity": {"start_users": 4, "max_users": 16, "resolution_users": 4, "growth_factor": 2},
        "measurement": {"warmup_s": 1, "first_warmup_s": 2, "duration_s": 3, "request_timeout_s": 30,
                        "time_scale": 0.1},
        "trials": trials,
        "backend": "sglang",
        "backend_options": {
            "sglang_version": "0.5.17", "load_format": "dummy",
            "server_flags": {"attention-backend": "triton", "sampling-backend": "pytorch",
                             "disable-prefill-cuda-graph": True, "enable-metrics": True},
            "server_command": [sys.executable, str(FAKE), "--sglang-version", "0.5.17"],
            "env": {"FAKE_SGLANG_TIME_SCALE": "10", **(env or {})},
            "startup_timeout_s": 60,
        },
    }
    data.update(over)
    path = tmp / "studies" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake-sglang")
    # two trials: the baseline (a whole capacity search: 4 then 8 users, so a first load point on a
    # fresh server and a later one) and one other configuration (fp8 KV cache), pruned after its first point
    study = _study(tmp, trials=2, capacity={"start_users": 4, "max_users": 8, "resolution_users": 4, "growth_factor": 2})
    storage = f"sqlite:///{tmp}/t.db"
    # in-process: Ray on this CPU machine has no GPU to give a trial (see the next test)
    r = run_cli(["study", "start", str(study), "--storage", storage, "--json", "--no-ray"], cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, storage, json.loads(r.stdout)


def test_trials_needing_more_gpus_than_ray_has_are_infeasible_not_pending_forever(tmp_path):
    study = _study(tmp_path, name="no-gpu", trials=2)
    r = run_cli(["study", "start", str(study), "--storage", f"sqlite:///{tmp_path}/t.db", "--json"],
                cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    outcome = json.loads(r.stdout)
    assert outcome["trials_infeasible"] == 2
    con = sqlite3.connect(tmp_path / "t.db")
    reasons = [row[0] for row in con.execute("SELECT failure_reason FROM tuner_trials")]
    assert reasons and all("needs 1 GPU(s) but the Ray cluster has 0" in why for why in reasons)


def test_trials_ran_through_the_sglang_path(finished):
    tmp, _, outcome = finished
    assert outcome["backend_kind"] == "sglang"
    con = sqlite3.connect(tmp / "t.db")
    rows = con.execute("SELECT trial_number, status, flags, telemetry, measured_kv_capacity_tokens, "
                       "predicted_kv_capacity_tokens FROM tuner_trials ORDER BY trial_number").fetchall()
    launched = [r for r in rows if not json.loads(r[3]).get("not_launched")]
    assert launched and launched[0][1] == "complete"
    for number, _, flags, tel, measured, predicted in launched:
        flags, tel = json.loads(flags), json.loads(tel)
        # pinned flags are part of every trial's flags, the baseline's too
        assert flags["attention-backend"] == "triton" and flags["enable-metrics"] is True
        plan = tel["plan"]
        assert plan["sglang_version"] == "0.5.17" and plan["load_format"] == "dummy"
        trial_dir = tmp / "results" / "runs" / "fake-sglang" / f"trial-{number:04d}"
        cfg = json.loads((trial_dir / "model" / "config.json").read_text())
        assert cfg["num_hidden_layers"] == 4 and cfg["architectures"] == ["Qwen3MoeForCausalLM"]
        config_yaml = yaml.safe_load((trial_dir / "sglang.yaml").read_text())
        # 0.5.17's parser refuses cuda-graph-max-bs-decode in YAML: it went on the command line
        assert "cuda-graph-max-bs-decode" not in config_yaml
        argv = (trial_dir / "sglang0.log").read_text().splitlines()[0]
        assert "--load-format dummy --skip-tokenizer-init" in argv
        if flags.get("cuda-graph-max-bs-decode"):
            assert plan["command_line_flags"] == ["--cuda-graph-max-bs-decode", str(flags["cuda-graph-max-bs-decode"])]
            assert "--cuda-graph-max-bs-decode" in argv
        # KV capacity read from /server_info, and the start-up as the server's log tells it
        assert measured and measured > 0 and predicted and predicted > 0
        (startup,) = tel["server"]["startup"]
        assert startup["ready"] and startup["max_total_num_tokens"] == measured
        assert startup["capture_s"] == {"decode": 0.2}
        assert (trial_dir / "sglang0.server_info.json").is_file()


def test_every_load_point_keeps_its_requests_and_its_p90s_spread(finished):
    import gzip

    import numpy as np

    tmp, _, _ = finished
    con = sqlite3.connect(tmp / "t.db")
    rows = con.execute("SELECT trial_number, step, users, requests, p90_ttft_s, extra FROM tuner_measurements").fetchall()
    assert rows
    for n, step, users, requests, p90_ttft_s, extra in rows:
        extra = json.loads(extra)
        path = tmp / "results" / "runs" / "fake-sglang" / f"trial-{n:04d}" / extra["requests_file"]
        assert path.name == f"loadpoint-{step:02d}-{users}u.requests.jsonl.gz"
        with gzip.open(path, "rt") as f:
            recs = [json.loads(line) for line in f]
        assert len(recs) == requests and "itl_s" not in recs[0]
        ttfts = sorted(r["ttft_s"] for r in recs if r["error"] is None)
        assert abs(float(np.percentile(ttfts, 90)) - p90_ttft_s) < 1e-9  # the stored P90, re-derived
        if len(ttfts) >= 10:
            lo, hi = extra["p90_spread"]["ttft_s"]
            assert lo <= p90_ttft_s <= hi and lo < hi


def test_a_fresh_servers_first_load_point_warms_up_longer(finished):
    tmp, _, _ = finished
    con = sqlite3.connect(tmp / "t.db")
    rows = con.execute("SELECT trial_number, step, extra FROM tuner_measurements").fetchall()
    warmups = {(n, step): json.loads(extra)["warmup_s"] for n, step, extra in rows}
    assert any(step > 0 for _, step in warmups)
    for (n, step), w in warmups.items():
        assert w == (2.0 if step == 0 else 1.0), (n, step, w)


def test_the_kernel_warmup_runs_before_a_fresh_servers_first_load_point_only(tmp_path):
    measurement = {"warmup_s": 1, "duration_s": 2, "request_timeout_s": 30, "time_scale": 0.1,
                   "kernel_warmup": True}
    # two load points (4 and 8 users): the first on the fresh server, the second on a warm one
    study = _study(tmp_path, name="fake-warm", trials=1, measurement=measurement,
                   capacity={"start_users": 4, "max_users": 8, "resolution_users": 4, "growth_factor": 2})
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--json", "--no-ray"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    con = sqlite3.connect(tmp_path / "t.db")
    rows = [(step, json.loads(extra)) for step, extra in
            con.execute("SELECT step, extra FROM tuner_measurements WHERE valid = 1 ORDER BY step")]
    assert len(rows) >= 2
    first = rows[0][1]["kernel_warmup"]
    # SGLang's 18 config-file keys with both parities (1..4097 tokens), all answered
    from tuner.kernels.targets import SGLANG_BATCH_SIZES
    from tuner.workload.kernel_warmup import prompt_lengths

    assert first["requests"] == len(prompt_lengths(SGLANG_BATCH_SIZES, 4097)) == 35
    assert first["failed"] == 0 and first["max_prompt_tokens"] == 4097
    assert all("kernel_warmup" not in extra for _, extra in rows[1:])
    # the simulator's prediction beside it treats the warmed server as one that has run its kernels
    assert rows[0][1][PREDICTION_KEY]["fresh_server"] is False


def test_replay_sent_token_ids_to_generate_and_read_metrics(finished):
    tmp, _, _ = finished
    con = sqlite3.connect(tmp / "t.db")
    rows = con.execute("SELECT users, requests, errors, extra FROM tuner_measurements").fetchall()
    assert rows
    for users, requests, errors, extra in rows:
        extra = json.loads(extra)
        assert extra["api"] == "generate"
        assert requests > 0 and errors == 0  # an id >= vocab_size would have killed the server
        metrics = extra["server_metrics"]
        assert metrics["sglang:num_requests_total"] >= requests  # counted over this load point only
        assert metrics["sglang:prompt_tokens_total"] > 0


def test_export_targets_the_version_the_user_deploys(finished):
    tmp, storage, outcome = finished
    for version, yaml_has_graph_flag in (("0.5.17", False), ("0.5.23", True)):
        out = tmp / f"best-{version}.yaml"
        r = run_cli(["study", "export", "fake-sglang", "--storage", storage, "-o", str(out), "--trial", "0",
                     "--sglang-version", version], cwd=tmp)
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        assert f"target: SGLang {version}" in text
        body = yaml.safe_load(text)
        assert body["attention-backend"] == "triton"  # pinned flags are exported
        assert "load-format" not in body  # dummy weights are how it was measured, not what to deploy
    r = run_cli(["study", "export", "fake-sglang", "--storage", storage, "--sglang-version", "0.4.0"], cwd=tmp)
    assert r.returncode == 2 and "0.5.17, 0.5.23" in r.stderr


def test_a_graph_capture_oom_is_classified_and_the_study_goes_on(tmp_path):
    study = _study(tmp_path, name="fake-oom", trials=2, env={"FAKE_SGLANG_FAULT": "graph_oom"})
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--json", "--no-ray"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    con = sqlite3.connect(tmp_path / "t.db")
    rows = con.execute("SELECT status, failure_class, failure_reason FROM tuner_trials "
                       "WHERE failure_class IS NOT NULL").fetchall()
    assert len(rows) == 2
    for status, cls, reason in rows:
        assert status == "failed" and cls == "oom"
        assert "while capturing decode CUDA graphs after the KV pool" in reason


@pytest.mark.parametrize("change, key, message", [
    ({"search_space": {"engine": "sglang", "params": {"attn-dp-size": {"values": [1, 2]}}}},
     "search_space.params.attn-dp-size", "enable-dp-attention"),
    ({"baseline": {"schedule-policy": "hrrn"}}, "baseline.schedule-policy", "SGLang 0.5.17"),
    ({"model": {"name": "qwen3-30b-a3b", "overrides": {"num_hiden_layers": 4}}},
     "model.overrides.num_hiden_layers", "did you mean 'num_hidden_layers'"),
])
def test_bad_input_for_the_target_version_exits_2_and_writes_nothing(tmp_path, change, key, message):
    study = _study(tmp_path, **change)
    db = tmp_path / "t.db"
    r = run_cli(["study", "start", str(study), "--storage", f"sqlite:///{db}"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert key in r.stderr and message in r.stderr and str(study) in r.stderr
    assert not db.exists()


def test_model_directories_need_a_supported_config(tmp_path):
    no_cfg = tmp_path / "empty-model"
    no_cfg.mkdir()
    odd = tmp_path / "odd-model"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "hidden_size": 8}))
    for model, message in ((str(no_cfg), "has no config.json"), (str(odd), "unsupported architecture 'MambaForCausalLM'")):
        study = _study(tmp_path, model=model)
        db = tmp_path / "t.db"
        r = run_cli(["study", "start", str(study), "--storage", f"sqlite:///{db}"], cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr and "model" in r.stderr, r.stderr
        assert not db.exists()


def test_dummy_weights_need_a_backend_that_can_load_them(tmp_path):
    study = _study(tmp_path)
    db = tmp_path / "t.db"
    r = run_cli(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--backend", "serve-sim"], cwd=tmp_path)
    assert r.returncode == 2 and "backend_options.load_format" in r.stderr, r.stderr
    assert not db.exists()


def test_time_limit_starts_no_trial_that_cannot_finish_and_resume_continues(tmp_path):
    # trials of two load points (4 and 8 users, about 10 s each): the first one fits the limit, and
    # then says the next one would not
    study = _study(tmp_path, name="fake-time", trials=6,
                   capacity={"start_users": 4, "max_users": 8, "resolution_users": 4, "growth_factor": 2})
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--json", "--no-ray", "--no-pruning",
                 "--time-limit", "14"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    outcome = json.loads(r.stdout)
    assert "time limit" in outcome["stopped_reason"]
    assert outcome["wall_time_s"] < 2 * 14  # no trial was started that the first one said could not fit
    con = sqlite3.connect(tmp_path / "t.db")
    first = con.execute("SELECT count(*) FROM tuner_trials WHERE status != 'running'").fetchone()[0]
    assert 1 <= first < 6
    assert con.execute("SELECT count(*) FROM tuner_trials WHERE status = 'running'").fetchone()[0] == 0
    r = run_cli(["study", "resume", "fake-time", "--storage", storage, "--json", "--no-ray", "--trials", str(first + 1)],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert con.execute("SELECT count(*) FROM tuner_trials").fetchone()[0] >= first + 1


def test_durations_are_checked():
    from tuner.cli.study import parse_duration
    from tuner.errors import ConfigError

    assert parse_duration("9m") == 540 and parse_duration("540") == 540 and parse_duration("2h") == 7200
    for bad in ("soon", "-5", "0", "999d"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_verify_export_starts_the_exported_yaml_and_compares_with_the_trial(finished):
    tmp, storage, outcome = finished
    out = tmp / "best-check.yaml"
    assert run_cli(["study", "export", "fake-sglang", "--storage", storage, "-o", str(out),
                    "--sglang-version", "0.5.17"], cwd=tmp).returncode == 0
    result_path = tmp / "check.json"
    r = run_cli(["study", "verify-export", "fake-sglang", str(out), "--storage", storage, "--json",
                 "-o", str(result_path)], cwd=tmp)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: measured, but not within 10% on a busy CPU
    data = json.loads(r.stdout)
    assert data == json.loads(result_path.read_text())
    assert data["users"] == outcome["best_capacity_users"] and data["requests"] > 0
    assert data["export_p90_ttft_s"] > 0 and data["export_p90_tpot_s"] > 0
    assert data["ok"] == (r.returncode == 0) == (data["within_agreement"] and data["export_meets_slo"])
    from tuner.study.summary import study_summary
    best = next(t for t in study_summary(storage, "fake-sglang")["trials"] if t["number"] == data["trial_number"])
    point = next(m for m in best["measurements"] if m["users"] == data["users"])
    assert point["warmup_s"] is not None and data["replay_warmup_s"] == point["warmup_s"]
    if data["requests"] >= 10:  # the check's own window's spread, beside the trial's
        lo, hi = data["export_p90_spread"]["tpot_s"]
        assert lo <= data["export_p90_tpot_s"] <= hi
    assert data["trial_p90_spread"] == point["p90_spread"]
    # a point that was not its server's first is replayed on a server that ran the kernel warm-up
    assert data["server_before_window"].startswith("kernel warm-up" if point["step"] > 0 else "fresh")
    log = next((tmp / "results" / "runs" / "fake-sglang-export-check").glob("trial-*/sglang0.log")).read_text()
    assert f"--config {out.resolve()}" in log.splitlines()[0]  # the exported file, not a re-rendered one


def test_verify_export_warms_the_kernels_for_a_point_that_was_not_its_servers_first(finished):
    from tuner.study.summary import study_summary

    tmp, storage, _ = finished
    summary = study_summary(storage, "fake-sglang")
    trial = summary["best"]
    later = [m for m in trial["measurements"] if m["step"] > 0]
    assert later, trial["measurements"]  # the stand-in's capacity search measures several points
    out = tmp / "best-later.yaml"
    assert run_cli(["study", "export", "fake-sglang", "--storage", storage, "-o", str(out),
                    "--sglang-version", "0.5.17"], cwd=tmp).returncode == 0
    r = run_cli(["study", "verify-export", "fake-sglang", str(out), "--storage", storage, "--json",
                 "--users", str(later[0]["users"])], cwd=tmp)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["users"] == later[0]["users"] and data["requests"] > 0
    assert data["server_before_window"] == f"kernel warm-up, as the trial's server had served {later[0]['step']} load point(s) before"
    warm = data["kernel_warmup"]  # its prompts were served before the window
    assert warm["requests"] > 0 and warm["failed"] == 0


def test_verify_export_refuses_a_file_that_is_not_an_export(finished, tmp_path):
    tmp, storage, _ = finished
    bogus = tmp_path / "x.yaml"
    bogus.write_text("tp-size: 1\n")
    r = run_cli(["study", "verify-export", "fake-sglang", str(bogus), "--storage", storage], cwd=tmp)
    assert r.returncode == 2 and "launch:" in r.stderr


def test_every_real_load_point_keeps_the_simulators_prediction(finished):
    tmp, storage, _ = finished
    con = sqlite3.connect(tmp / "t.db")
    rows = con.execute("SELECT trial_number, step, users, valid, extra FROM tuner_measurements").fetchall()
    assert rows
    first = {}
    for trial, step, *_ in rows:
        first[trial] = min(step, first.get(trial, step))
    for trial, step, users, valid, extra in rows:
        pred = json.loads(extra)["simulator_prediction"]
        # the same load point simulated: its seed is the replay's, its version the study's, and the
        # trial's first load point on a fresh server
        assert pred.get("error") is None, pred
        assert pred["sglang_version"] == "0.5.17" and pred["seed"] == 0 + trial + 1009 * step
        assert pred["fresh_server"] == (step == first[trial])
        assert pred["p90_ttft_s"] > 0 and pred["throughput_tokens_per_s"] > 0 and "meets_slo" in pred
    from tuner.study.summary import study_summary

    s = study_summary(storage, "fake-sglang")
    valid = sum(1 for r in rows if r[3])
    assert s["simulator_fidelity"]["load_points"] == valid == len(s["simulator_ledger"])
    assert s["simulator_fidelity"]["mape"]["p90_ttft_s"] is not None


def test_real_load_points_carry_the_step_time_models_decode_split(finished):
    """The server exports no per-operator times: the prediction stored beside each real load point
    carries the calibrated step-time model's split of the decode step, and the diagnosis shows it
    as the model's (not a measurement)."""
    tmp, storage, _ = finished
    from tuner.explain import Cause
    from tuner.study.summary import study_summary

    s = study_summary(storage, "fake-sglang")
    for t in s["trials"]:
        for m in t["measurements"]:
            pred = m["simulator_prediction"]
            split = pred["decode_step_split"]
            assert set(split) <= {"attention", "moe", "dense", "communication", "overhead"} and "moe" in split
            assert sum(split.values()) == pytest.approx(1.0) and pred["decode_step_s"] > 0
    shown = 0
    for t in s["trials"]:
        point = (t["bottleneck"] or {}).get("point") or {}
        step = next((f for f in point.get("findings", []) if f["cause"] == Cause.DECODE_STEP), None)
        if step is None or step["coverage"] != "measured":
            continue
        assert step["figures"]["decode_parts_source"] == "step_time_model"
        assert "by the calibrated step-time model at this configuration: " in step["text"]
        assert "not a measurement" in step["missing"]
        shown += 1
    assert shown


def test_tiles_ab_serves_default_then_tuned_tiles_and_proves_ours_were_loaded(tmp_path):
    study = _study(tmp_path, name="fake-tiles", trials=1, target_users=4,
                   capacity={"start_users": 4, "max_users": 4, "resolution_users": 4, "growth_factor": 2},
                   measurement={"warmup_s": 0.5, "duration_s": 2, "request_timeout_s": 30, "time_scale": 0.1})
    data = yaml.safe_load(study.read_text())
    import shutil

    tuned_dir = tmp_path / "tuned"
    shutil.copytree(REPO / "results" / "kernels" / "h200" / "sglang" / "configs", tuned_dir / "configs")
    data["backend_options"]["moe_config_dir"] = str(tuned_dir)
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", str(study), "--storage", storage, "--json", "--no-ray"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out, points = tmp_path / "ab.json", tmp_path / "refit"
    r = run_cli(["study", "tiles-ab", "fake-tiles", "--users", "4,8", "--trial", "0", "--storage", storage,
                 "--json", "-o", str(out), "--refit-points", str(points)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc == {**json.loads(out.read_text()), "refit_points": doc["refit_points"]}
    default, tuned = doc["variants"]
    assert (default["tiles"], tuned["tiles"]) == ("default", "tuned")
    for v in (default, tuned):
        assert [p["users"] for p in v["load_points"]] == [4, 8] and all(p["valid"] for p in v["load_points"])
        assert v["error"] is None
    # the default server warned it had no tuned file; the tuned one loaded ours from the trial's directory
    assert "Using default MoE kernel config" in Path(default["log_path"]).read_text()
    assert tuned["tiles_loaded"] is True and doc["tuned_tiles_proven_loaded"] is True
    assert "tiles-ab/tuned" in tuned["log_path"] and "tiles-ab/default" in default["log_path"]
    assert [row["users"] for row in doc["comparison"]] == [4, 8]
    assert all(row["tuned_over_default"]["p90_tpot_s"] > 0 for row in doc["comparison"])
    # each ratio with its window noise, from the two points' request files (the same sessions: paired)
    for row in doc["comparison"]:
        paired = row["intervals"]["paired_tpot"]
        assert paired["requests"][0] >= 10 and paired["low"] <= paired["ratio"] <= paired["high"]
        assert paired["verdict"] in ("faster", "slower", "within noise")
    # both variants replayed the same sessions (same seeds): the same prompts were sent
    assert [p["requests"] > 0 for p in default["load_points"]] == [True, True]
    refit = run_cli(["kernels", "refit-serving", "--default", doc["refit_points"]["default"], "--tuned",
                     doc["refit_points"]["tuned"], "--gpu", "h200", "--dry-run", "--json"], cwd=tmp_path)
    assert refit.returncode == 0, refit.stderr[-2000:]
    assert [p["users"] for p in json.loads(refit.stdout)["pairs"]] == [4, 8]
    # bad input: refused before any server starts, nothing written
    bad = run_cli(["study", "tiles-ab", "fake-tiles", "--users", "4,x", "--storage", storage,
                   "-o", str(tmp_path / "never.json")], cwd=tmp_path)
    assert bad.returncode == 2 and "--users" in bad.stderr and not (tmp_path / "never.json").exists()
    tuned_dir.rename(tmp_path / "gone")  # no tuned files: refused before the default variant's server starts
    gone = run_cli(["study", "tiles-ab", "fake-tiles", "--users", "4", "--storage", storage,
                    "-o", str(tmp_path / "never.json")], cwd=tmp_path)
    assert gone.returncode == 2 and "backend_options.moe_config_dir" in gone.stderr, gone.stderr[-2000:]
    assert not (tmp_path / "never.json").exists()
    # a tuned directory holding other shapes' files only: refused before any server, naming the option
    # and the files this configuration reads (its tuned server would have run SGLang's own tiles)
    other = tmp_path / "other" / "configs" / "triton_3_6_0"
    other.mkdir(parents=True)
    for f in (tmp_path / "gone" / "configs" / "triton_3_6_0").glob("*.json"):
        shutil.copyfile(f, other / f.name.replace("E=128,N=768", "E=64,N=512"))
    runs_before = sorted(p.name for p in (tmp_path / "results" / "runs").iterdir())
    wrong = run_cli(["study", "tiles-ab", "fake-tiles", "--users", "4", "--storage", storage, "--tuned-dir",
                     str(tmp_path / "other"), "-o", str(tmp_path / "never.json")], cwd=tmp_path)
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "--tuned-dir" in wrong.stderr and "holds none of the tile files" in wrong.stderr
    assert "E=128,N=768" in wrong.stderr and not (tmp_path / "never.json").exists()
    assert sorted(p.name for p in (tmp_path / "results" / "runs").iterdir()) == runs_before
    # --tuned-dir names a directory the stored study options do not: the tuned variant loads from it
    moved = tmp_path / "moved.json"
    r = run_cli(["study", "tiles-ab", "fake-tiles", "--users", "4", "--trial", "0", "--variants", "tuned",
                 "--storage", storage, "--tuned-dir", str(tmp_path / "gone"), "--json", "-o", str(moved)],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(moved.read_text())
    assert doc["tuned_tiles_proven_loaded"] is True and len(doc["variants"][0]["load_points"]) == 1
