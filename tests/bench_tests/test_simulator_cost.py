"""`tuner bench sim`: the simulator's CPU cost, as a JSON document and as a table."""

import json

from tests.conftest import run_cli


def test_bench_sim_json_and_text(tmp_path):
    args = ["bench", "sim", "--warmup-s", "10", "--duration-s", "30", "--users", "10,40"]
    r = run_cli([*args, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    # the h200 study's own search: from 16 users, galloping x2 to at most 256, resolution 4
    assert doc["study"] == "h200" and doc["capacity"]["bisect"] == "interpolate"
    search = doc["capacity_search"]
    assert search == doc["capacity_search_by_bisection"]["interpolate"]
    assert set(doc["capacity_search_by_bisection"]) == {"interpolate", "midpoint"}
    for s in doc["capacity_search_by_bisection"].values():
        assert s["load_points"][0] == 16 and s["cpu_s"] > 0 and s["capacity_users"] <= 256
        assert s["capacity_users"] == 0 or s["capacity_users"] in s["load_points"]
    assert [p["users"] for p in doc["load_points"]] == [10, 40]
    assert all(p["cpu_s"] > 0 and p["requests"] > 0 and p["events"] > 0 for p in doc["load_points"])
    r = run_cli(args, cwd=tmp_path)
    assert r.returncode == 0 and "capacity search, bisect interpolate (the study's): capacity=" in r.stdout
    assert "study h200: users 16..256, resolution 4" in r.stdout
    assert r.stdout.splitlines()[-1].split()[0] == "40"


def test_bench_lists_its_benchmarks_and_refuses_bad_input(tmp_path):
    r = run_cli(["bench", "--help"], cwd=tmp_path)
    assert r.returncode == 0 and all(name in r.stdout for name in ("client", "search", "sim"))
    r = run_cli(["bench", "sim", "--users", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "every step must be >= 1" in r.stderr
    r = run_cli(["bench", "sim", "--study", "no-such-study"], cwd=tmp_path)
    assert r.returncode == 2 and "no-such-study" in r.stderr
    r = run_cli(["bench", "search", "--study", "h200", "--samplers", "grid"], cwd=tmp_path)
    assert r.returncode == 2 and "valid: default, tpe, random, gp" in r.stderr
