"""`tuner study start --dry-run`: the servers each trial would launch, on a CPU machine, with
nothing launched and nothing written."""

from __future__ import annotations

import json

import yaml

from tests.conftest import REPO, run_cli
from tests.study_tests._tiny import TINY_SPACE, write_tiny_study

KEYS = {"number", "argv", "env", "config_yaml", "moe_config_files"}


def _files(tmp_path):
    return sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))


def test_h200_dry_run_prints_each_trials_sglang_command_and_writes_nothing(tmp_path):
    before = _files(tmp_path)
    r = run_cli(["study", "start", str(REPO / "studies/h200.yaml"), "--backend", "sglang", "--dry-run",
                 "--trials", "4", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _files(tmp_path) == before, "no database, no trial directory"
    doc = json.loads(r.stdout)
    assert doc["study"] == "h200" and doc["backend"] == "sglang" and len(doc["trials"]) >= 4
    assert all(KEYS <= set(t) for t in doc["trials"])
    base = doc["trials"][0]
    assert base["number"] == 0 and base["is_baseline"] and base["planned"] == "launch"
    argv = base["argv"]
    assert argv[argv.index("--model-path") + 1] == "nvidia/GLM-5.1-NVFP4"
    config_path = argv[argv.index("--config") + 1]
    assert config_path == str(tmp_path / "results/runs/h200/trial-0000/sglang.yaml"), "the real run's trial directory"
    assert yaml.safe_load(base["config_yaml"]) == {"tp-size": 8, "quantization": "modelopt_fp4"}
    assert base["moe_config_files"] is None
    # the planner-ranked seeds ask for tuned MoE tiles, which this study gives no directory for:
    # a real trial would fail at once, and the dry run says why
    seeds = [t for t in doc["trials"][1:] if t["config"]["moe-tile-configs"] == "tuned"]
    assert seeds and all(t["planned"] == "plan_failed" and t["argv"] is None and "moe_config_dir" in t["reason"]
                         for t in seeds)


def test_tuned_tiles_name_their_files_and_a_router_fronts_attention_dp(tmp_path):
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data["backend_options"] = {"moe_config_dir": str(REPO / "results/kernels/h200")}
    study = tmp_path / "h200-tuned.yaml"
    study.write_text(yaml.safe_dump(data))
    r = run_cli(["study", "start", str(study), "--backend", "sglang", "--dry-run", "--trials", "2", "--json"],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    seed = json.loads(r.stdout)["trials"][1]
    assert seed["planned"] == "launch" and seed["config"]["moe-tile-configs"] == "tuned"
    assert seed["moe_config_files"] and all(f.endswith(".json") and "device_name=NVIDIA_H200" in f
                                            for f in seed["moe_config_files"])
    assert seed["env"]["SGLANG_MOE_CONFIG_DIR"] == str(tmp_path / "results/runs/h200/trial-0001/moe")
    assert seed["router"]["argv"][seed["router"]["argv"].index("--policy") + 1] == "cache_aware"
    assert "--dp-aware" in seed["router"]["argv"]
    assert yaml.safe_load(seed["config_yaml"])["attn-dp-size"] == seed["config"]["attn-dp-size"]


def test_screened_and_rejected_configurations_are_listed_with_their_reason_and_no_argv(tmp_path):
    space = dict(TINY_SPACE, params={**TINY_SPACE["params"], "quantization": {"values": [None, "modelopt_fp4"]}},
                 constraints=["tp_size % attn_dp_size == 0", "kv_cache_dtype is None"])
    study = write_tiny_study(tmp_path, space=space, sampler="random", trials=4)
    r = run_cli(["study", "start", str(study), "--backend", "sglang", "--dry-run", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = json.loads(r.stdout)["trials"]
    launched = [t for t in trials if t["planned"] == "launch"]
    assert len(launched) == 4 and all(t["argv"] for t in launched)
    screened = [t for t in trials if t["planned"] == "screened"]
    rejected = [t for t in trials if t["planned"] == "constraint"]
    assert screened and all(t["argv"] is None and t["reason"].startswith("planner: ") and
                            t["config"]["quantization"] is None for t in screened)
    assert rejected and all(t["argv"] is None and t["reason"] == "violates constraint(s): kv_cache_dtype is None"
                            for t in rejected)
    r = run_cli(["study", "start", str(study), "--backend", "sglang", "--dry-run"], cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.startswith("dry run of study tiny on sglang: nothing is launched or written")
    assert "trial 0 (baseline): launch" in r.stdout and "    sglang: " in r.stdout and "--config" in r.stdout
    assert "screened: planner: " in r.stdout and "4 launch" in r.stdout.splitlines()[-1]


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    study = write_tiny_study(tmp_path)
    r = run_cli(["study", "start", str(study), "--backend", "simulator", "--dry-run"], cwd=tmp_path)
    assert r.returncode == 2 and "--backend: backend 'simulator' launches no server processes" in r.stderr
    r = run_cli(["study", "start", str(study), "--dry-run", "--warm-start-from-simulator", "2"], cwd=tmp_path)
    assert r.returncode == 2 and "--dry-run writes nothing" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(study.read_text().replace("gpu: h200", "gpu: h20"))
    r = run_cli(["study", "start", str(bad), "--backend", "sglang", "--dry-run"], cwd=tmp_path)
    assert r.returncode == 2 and "bad.yaml: hardware.gpu: unknown GPU 'h20'" in r.stderr
    grid = write_tiny_study(tmp_path, name="grid", sampler="grid", trials=3)
    r = run_cli(["study", "start", str(grid), "--backend", "sglang", "--dry-run", "--json"], cwd=tmp_path)
    assert r.returncode == 2 and "grid.yaml: sampler: sampler 'grid': the space has 6 configurations" in r.stderr
    assert r.stdout == ""
    assert not (tmp_path / "results").exists()
