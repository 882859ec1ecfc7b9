"""`tuner bench sim`: the simulator's CPU cost, as a JSON document and as a table."""

import json

from tests.conftest import run_cli


def test_bench_sim_json_and_text(tmp_path):
    args = ["bench", "sim", "--warmup-s", "10", "--duration-s", "30", "--users", "10,40"]
    r = run_cli([*args, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    search = doc["capacity_search"]
    assert search["load_points"][0] == 50 and search["cpu_s"] > 0
    assert search["capacity_users"] == 0 or 50 <= search["capacity_users"] <= 100
    assert [p["users"] for p in doc["load_points"]] == [10, 40]
    assert all(p["cpu_s"] > 0 and p["requests"] > 0 and p["events"] > 0 for p in doc["load_points"])
    r = run_cli(args, cwd=tmp_path)
    assert r.returncode == 0 and "capacity search 50..100 users: capacity=" in r.stdout
    assert r.stdout.splitlines()[-1].split()[0] == "40"


def test_bench_lists_its_benchmarks_and_refuses_bad_input(tmp_path):
    r = run_cli(["bench", "--help"], cwd=tmp_path)
    assert r.returncode == 0 and all(name in r.stdout for name in ("client", "search", "sim"))
    r = run_cli(["bench", "sim", "--users", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "every step must be >= 1" in r.stderr
    r = run_cli(["bench", "search", "--study", "h200", "--samplers", "grid"], cwd=tmp_path)
    assert r.returncode == 2 and "valid: default, tpe, random, gp" in r.stderr
