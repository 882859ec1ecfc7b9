"""`tuner compare`: the JSON contract on the shipped GLM-5.1 comparison at a CI budget (the founding
story's shape on the simulator: FP8 leaves little KV room under attention-DP, B200 serves more
users), reuse from storage, and bad input (exit 2 with the reason, nothing run)."""

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tuner.compare.plan import Action, plan_comparison
from tuner.errors import ConfigError

HERE = Path(__file__).parent
CI = HERE / "compare-glm-5.1-ci.yaml"
NAMES = ["glm-5.1-h200-fp8-ci", "glm-5.1-h200-nvfp4-ci", "glm-5.1-b200-fp8-ci", "glm-5.1-b200-nvfp4-ci"]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    storage = f"sqlite:///{tmp}/c.db"
    r = run_cli(["compare", str(CI), "--json", "--no-ray", "--storage", storage, "-o", str(tmp / "c.html")], cwd=tmp)
    assert r.returncode == 0, r.stderr
    return tmp, storage, json.loads(r.stdout)


def test_the_database_file_alone_holds_the_run_once_compare_exits(ran):
    # every connection is closed at exit, so SQLite folded its WAL into c.db: a copy of the file
    # (a backup, a committed result) has every study; an open one left the last in c.db-wal
    tmp, _, doc = ran
    wal = tmp / "c.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    import sqlite3

    copy = tmp / "copy-of-c.db"
    copy.write_bytes((tmp / "c.db").read_bytes())
    with sqlite3.connect(copy) as c:
        names = {r[0] for r in c.execute("SELECT DISTINCT study_name FROM tuner_trials")}
    assert names == set(NAMES)


def test_the_json_contract(ran):
    _, _, doc = ran
    assert set(doc) >= {"comparison", "description", "tuner_version", "workload", "gpu_hour_cost", "studies", "ranking",
                        "slo_scales", "notes"}
    assert doc["comparison"] == "compare-glm-5.1-ci" and doc["workload"]["name"] == "coding-agent"
    assert doc["gpu_hour_cost"] == {"h200": 3.5, "b200": 6.0}
    assert [r["name"] for r in doc["studies"]] == NAMES
    for r in doc["studies"]:
        assert set(r) >= {"name", "given_as", "action", "backend_kind", "status", "model", "hardware", "quantization",
                          "quantizations_searched", "slo", "target_users", "trials", "baseline_capacity_users",
                          "best", "kv_capacity_tokens", "kv_room_by_attention_dp", "bottleneck", "cost",
                          "capacity_vs_slo", "wall_time_s"}
        assert r["action"] == "run" and r["backend_kind"] == "simulator" and r["trials"]["launched"] == 3
        assert r["hardware"] == {"gpu": r["name"].split("-")[2], "gpus_per_node": 8, "nodes": 1, "gpus": 8}
        b = r["best"]
        assert isinstance(b["capacity_users"], int) and b["capacity_users"] > 0
        assert b["capacity_per_node"] == b["capacity_users"] and b["capacity_per_gpu"] == b["capacity_users"] / 8
        assert b["params"]["quantization"] == r["quantization"]["flag"]
        assert b["at_search_limit"] == (r["bottleneck"]["bound"] == "search_limit")
        assert r["quantization"]["label"] == ("FP8" if "fp8" in r["name"] else "NVFP4")
        assert r["quantizations_searched"] == [r["quantization"]["label"]]
        kv = r["kv_capacity_tokens"]
        assert kv["total"] > 0 and kv["per_pool"] == kv["total"] / kv["pools"]
        assert r["bottleneck"]["sentence"] and r["bottleneck"]["bound"]
        cost = r["cost"]
        per_gpu_hour = doc["gpu_hour_cost"][r["hardware"]["gpu"]]
        assert cost["per_gpu_hour"] == per_gpu_hour and cost["per_deployment_hour"] == 8 * per_gpu_hour
        assert cost["per_user_hour"] == pytest.approx(8 * per_gpu_hour / b["capacity_users"])
        curve = r["capacity_vs_slo"]
        assert len(curve) == 3 * len(doc["slo_scales"])
        assert {(p["mode"], p["scale"]) for p in curve} == {(m, k) for m in ("both", "ttft", "tpot")
                                                           for k in doc["slo_scales"]}
        at_own = next(p for p in curve if p["mode"] == "both" and p["scale"] == 1.0)
        # at the study's own targets the stored points give back the best capacity
        assert at_own["capacity_users"] == b["capacity_users"]
        assert at_own["p90_ttft_s"] == r["slo"]["p90_ttft_s"] and at_own["p90_tpot_s"] == r["slo"]["p90_tpot_s"]
        both = [p["capacity_users"] or 0 for p in curve if p["mode"] == "both"]
        assert both == sorted(both)  # looser targets never serve fewer users
        for p in curve:
            assert p["coverage"] in ("exact", "bracketed", "at_least", "fewer_than", "no_points")
    by_capacity = sorted(doc["studies"], key=lambda r: -r["best"]["capacity_per_gpu"])
    assert doc["ranking"]["capacity_per_gpu"] == [r["name"] for r in by_capacity]
    assert set(doc["ranking"]["cost_per_user_hour"]) == set(NAMES)


def test_the_founding_story_shape(ran):
    _, _, doc = ran
    rows = {r["name"].removesuffix("-ci").removeprefix("glm-5.1-"): r for r in doc["studies"]}
    room = {k: {x["attn_dp_size"]: x["kv_tokens_total"] for x in r["kv_room_by_attention_dp"]} for k, r in rows.items()}
    # FP8 weights under attention-DP 8 leave an H200 little KV room: a tenth of NVFP4's, 0.17 M tokens
    assert room["h200-fp8"][8] < 0.2e6 and room["h200-fp8"][8] < room["h200-nvfp4"][8] / 10
    assert room["h200-fp8"][8] < room["h200-fp8"][1]  # attention-DP replicates the weights: less room, not more
    # ... while a B200 keeps millions of tokens with either checkpoint
    assert room["b200-fp8"][8] > 20 * room["h200-fp8"][8] and room["b200-nvfp4"][8] > room["b200-fp8"][8]
    # B200 serves more users than H200 with either checkpoint
    for q in ("fp8", "nvfp4"):
        assert rows[f"b200-{q}"]["best"]["capacity_users"] > 1.5 * rows[f"h200-{q}"]["best"]["capacity_users"]
    # the H200 baselines (TP8, defaults) re-prefill evicted context: KV-bound
    for q in ("fp8", "nvfp4"):
        assert rows[f"h200-{q}"]["baseline_capacity_users"] < rows[f"h200-{q}"]["best"]["capacity_users"]


def test_a_second_run_reuses_the_stored_studies(ran):
    tmp, storage, first = ran
    r = run_cli(["compare", str(CI), "--json", "--no-ray", "--storage", storage], cwd=tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["action"] for x in doc["studies"]] == ["reuse"] * 4
    assert [x["best"] for x in doc["studies"]] == [x["best"] for x in first["studies"]]
    # a study already in storage is also found by its name alone
    r = run_cli(["compare", NAMES[0], NAMES[2], "--json", "--storage", storage], cwd=tmp)
    assert r.returncode == 0, r.stderr
    assert [x["action"] for x in json.loads(r.stdout)["studies"]] == ["reuse", "reuse"]


def test_the_html_report_embeds_the_comparison(ran):
    tmp, _, doc = ran
    html = (tmp / "c.html").read_text()
    assert 'id="compare-data"' in html and "TunerCompare.render" in html and "TunerCharts" in html
    assert "http://" not in html.split("<script", 1)[0].lower().replace("http://www.w3.org", "")
    assert all(n in html for n in NAMES)


# ---------------------------------------------------------------------------------- bad input
def _study_file(tmp: Path, name: str, **changes) -> Path:
    data = yaml.safe_load((REPO / "studies/glm-5.1-h200-fp8.yaml").read_text())
    data.update(name=name, **changes)
    (tmp / "studies").mkdir(exist_ok=True)
    p = tmp / "studies" / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_different_workloads_are_refused_unless_allowed(tmp_path):
    a = _study_file(tmp_path, "wa")
    b = _study_file(tmp_path, "wb", workload="coding-agent-40k")
    storage = f"sqlite:///{tmp_path}/w.db"
    r = run_cli(["compare", str(a), str(b), "--storage", storage], cwd=tmp_path)
    assert r.returncode == 2
    assert "'wa' and 'wb' replay different workloads (coding-agent and coding-agent-40k" in r.stderr
    assert "--allow-different-workloads" in r.stderr and not (tmp_path / "runs").exists()
    plan = plan_comparison([str(a), str(b)], storage, allow_different_workloads=True)
    assert [e.action for e in plan.entries] == [Action.RUN, Action.RUN]


def test_unknown_cost_keys_and_bad_costs_are_refused(tmp_path):
    a = _study_file(tmp_path, "ca")
    storage = f"sqlite:///{tmp_path}/c.db"
    for arg, words in [("h300=3.5", "unknown GPU 'h300' in the costs; valid:"), ("h200", "give costs as GPU=COST"),
                       ("h200=cheap", "is not a number"), ("h200=-1", "more than 0"), ("h200=1,h200=2", "given twice")]:
        r = run_cli(["compare", str(a), "--gpu-hour-cost", arg, "--storage", storage], cwd=tmp_path)
        assert r.returncode == 2 and words in r.stderr and "--gpu-hour-cost" in r.stderr, (arg, r.stderr)
    bad = tmp_path / "studies" / "compare-bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "compare-bad", "studies": ["ca"], "gpu_hour_cost": {"b300x": 1.0}}))
    r = run_cli(["compare", str(bad), "--storage", storage], cwd=tmp_path)
    assert r.returncode == 2 and f"{bad}: gpu_hour_cost: unknown GPU 'b300x'" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_study_with_no_completed_trial_is_refused_after_it_ran(tmp_path):
    # FP8 GLM-5.1 does not fit 8x H100 with TP8: the planner screens the baseline out, nothing completes
    a = _study_file(tmp_path, "nofit", hardware={"gpu": "h100", "gpus_per_node": 8, "nodes": 1, "host_memory_gb": 2048},
                    trials=1)
    r = run_cli(["compare", str(a), "--no-ray", "--storage", f"sqlite:///{tmp_path}/n.db"], cwd=tmp_path)
    # (the sampler keeps proposing until the space is exhausted: every configuration is screened out)
    assert r.returncode == 2 and re.search(r"no completed trial to compare in: nofit \(\d+ infeasible\)", r.stderr), r.stderr


def test_unknown_duplicate_and_changed_studies_are_refused(tmp_path, ran):
    _, storage, _ = ran
    r = run_cli(["compare", "no-such-study", "--storage", f"sqlite:///{tmp_path}/u.db"], cwd=tmp_path)
    assert r.returncode == 2 and "unknown study" in r.stderr and "no study 'no-such-study'" in r.stderr
    a = _study_file(tmp_path, "dup")
    r = run_cli(["compare", str(a), str(a), "--storage", f"sqlite:///{tmp_path}/u.db"], cwd=tmp_path)
    assert r.returncode == 2 and "named twice" in r.stderr
    # the stored CI study against a file of the same name that now describes other targets
    changed = _study_file(tmp_path, NAMES[0], slo={"p90_ttft_s": 10.0, "p90_tpot_s": 0.05})
    with pytest.raises(ConfigError, match="was started from a different spec"):
        plan_comparison([str(changed)], storage)


def test_a_capacity_at_the_search_limit_is_shown_as_a_lower_bound(tmp_path):
    # the H200 FP8 baseline serves about 20 users: a search that stops at 16 cannot say where it ends
    a = _study_file(tmp_path, "lim", trials=1, target_users=16, capacity={"start_users": 8, "max_users": 16, "resolution_users": 4},
                    measurement={"warmup_s": 30, "duration_s": 120})
    storage = f"sqlite:///{tmp_path}/l.db"
    r = run_cli(["compare", str(a), "--json", "--no-ray", "--storage", storage], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["studies"][0]
    assert row["best"]["capacity_users"] == 16 and row["best"]["at_search_limit"] is True
    assert row["bottleneck"]["bound"] == "search_limit"
    assert any(n.startswith("lim meets both targets at its capacity search's largest user count (16): its capacity "
                            "is at least that") for n in json.loads(r.stdout)["notes"])
    text = run_cli(["compare", str(a), "--storage", storage], cwd=tmp_path).stdout
    assert ">= 16" in text


def test_comparison_files_validate(tmp_path):
    r = run_cli(["validate", str(REPO / "studies/compare-glm-5.1.yaml"), str(CI)])
    assert r.returncode == 0 and r.stdout.count("(comparison)") == 2, r.stdout + r.stderr
    bad = tmp_path / "studies" / "compare-x.yaml"
    bad.parent.mkdir()
    bad.write_text(yaml.safe_dump({"name": "compare-x", "studies": ["h200", "no-such"]}))
    r = run_cli(["validate", str(bad)], cwd=tmp_path)
    assert r.returncode == 2 and f"{bad}: studies[1]: no-such: unknown study" in r.stderr


def test_cross_seeding_runs_each_best_configuration_on_the_others(ran, tmp_path):
    tmp, storage, first = ran
    import sqlite3

    db = tmp_path / "x.db"
    with sqlite3.connect(tmp / "c.db") as src, sqlite3.connect(db) as dst:
        src.backup(dst)  # the module's stored studies, seeded on a copy
    r = run_cli(["compare", str(CI), "--cross-seed", "--json", "--no-ray", "--storage", f"sqlite:///{db}"], cwd=tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cross_seed"] is True
    before = {x["name"]: x for x in first["studies"]}
    added_any = False
    for row in doc["studies"]:
        seeded = row["cross_seeded"]
        assert row["trials"]["launched"] == before[row["name"]]["trials"]["launched"] + len(seeded)
        for s in seeded:
            assert s["from"] in NAMES and s["from"] != row["name"]
            added_any = True
        # a cross-seeded configuration can only raise the best
        assert row["best"]["capacity_users"] >= before[row["name"]]["best"]["capacity_users"]
    assert added_any
    # each study's best as the others ran it: after seeding every runnable cell has run, unpruned
    same = {r["source"]: r for r in doc["same_configuration"]}
    assert set(same) == {x["name"] for x in doc["studies"] if not x["best"]["is_baseline"]}
    rows = {x["name"]: x for x in doc["studies"]}
    for src, r in same.items():
        assert r["capacity_users"] == rows[src]["best"]["capacity_users"]
        assert [c["study"] for c in r["in"]] == NAMES
        for c in r["in"]:
            if c["study"] == src:
                assert c["trial"] == r["source_trial"] and c["capacity_users"] == r["capacity_users"]
                assert c["changed"] == []
            if c["params"] is None:
                assert c["trial"] is None and c["reason"]
                continue
            assert c["trial"] is not None and c["status"] == "complete", c
            assert c["capacity_users"] <= rows[c["study"]]["best"]["capacity_users"]
            assert c["capacity_per_gpu"] == c["capacity_users"] / 8
            assert set(c["changed"]) <= {"quantization", "enable-hierarchical-cache", "hicache-ratio"}
            assert ("quantization" in c["changed"]) == (c["study"].split("-")[3] != src.split("-")[3])
    # before seeding the same cells said they were not tried
    before_same = {r["source"]: r for r in first["same_configuration"]}
    assert any(c["reason"] and c["reason"].startswith("not tried") for r in before_same.values() for c in r["in"])
    # a rerun finds the seeded trials in storage: the same table, nothing new to run
    r = run_cli(["compare", str(CI), "--cross-seed", "--json", "--no-ray", "--storage", f"sqlite:///{db}"], cwd=tmp)
    again = json.loads(r.stdout)
    assert r.returncode == 0 and all(x["cross_seeded"] == [] for x in again["studies"])
    assert again["same_configuration"] == doc["same_configuration"]
    from tuner.study.summary import study_summary

    adapted = ("quantization", "enable-hierarchical-cache", "hicache-ratio")  # own checkpoint; host memory
    for row in doc["studies"]:
        params = [t["params"] for t in study_summary(f"sqlite:///{db}", row["name"])["trials"]]
        for s in row["cross_seeded"]:
            # its best before seeding, or (a later pass) one that seeding made its best
            src_trials = {t["number"]: t for t in study_summary(f"sqlite:///{db}", s["from"])["trials"]}
            src_best = src_trials[s["trial"]]
            assert s["trial"] == before[s["from"]]["best"]["trial"] or s["trial"] >= before[s["from"]]["trials"]["launched"]
            assert s["params"] in params  # the configuration ran in this study
            assert s["params"]["quantization"] == row["quantization"]["flag"]
            assert {k: v for k, v in s["params"].items() if v is not None and k not in adapted} == \
                {k: v for k, v in src_best["params"].items() if v is not None and k not in adapted}


def test_adapting_a_configuration_to_another_studys_space():
    from tuner.compare.run import adapt, adapt_config
    from tuner.config.load import load_study

    h200_fp8, b200_nvfp4 = load_study("glm-5.1-h200-fp8"), load_study("glm-5.1-b200-nvfp4")
    cfg = {"tp-size": 8, "attn-dp-size": 2, "ep-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3",
           "max-running-requests": 32, "chunked-prefill-size": 4096, "mem-fraction-static": 0.9,
           "cuda-graph-max-bs-decode": 64, "schedule-policy": "lpm", "enable-hierarchical-cache": True,
           "hicache-ratio": 4.0, "router-policy": "cache_aware", "moe-tile-configs": "tuned"}
    out = adapt_config(cfg, b200_nvfp4)
    # the checkpoint is the study's own; a B200's bigger pool needs more host memory than 2 TB gives
    # at ratio 4, so a smaller ratio is taken
    assert out["quantization"] == "modelopt_fp4" and out["hicache-ratio"] in (2.0, None)
    assert {k: v for k, v in out.items() if k not in ("quantization", "hicache-ratio", "enable-hierarchical-cache")} \
        == {k: v for k, v in cfg.items() if k not in ("quantization", "hicache-ratio", "enable-hierarchical-cache")}
    assert adapt_config(cfg, h200_fp8) == cfg  # fits as it is
    assert adapt_config({**cfg, "max-running-requests": 48}, h200_fp8) is None  # not a value of the space
    assert "max-running-requests=48 is not in its search space" in adapt({**cfg, "max-running-requests": 48}, h200_fp8).reason
    # knobs a condition turns off stay off: no attention DP (no ep-size, no router), HiCache off (no ratio)
    plain = {**cfg, "attn-dp-size": 1, "ep-size": None, "router-policy": None, "enable-hierarchical-cache": False,
             "hicache-ratio": None}
    got = adapt(plain, b200_nvfp4)
    assert got.config == {**plain, "quantization": "modelopt_fp4"} and got.changed == ("quantization",)
    assert adapt(plain, h200_fp8).config == plain and adapt(plain, h200_fp8).changed == ()
