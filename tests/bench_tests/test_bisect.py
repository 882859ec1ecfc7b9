"""`tuner bench bisect`: load points per capacity search under each bisection, on simulated P90 curves."""

import json
from types import SimpleNamespace

from tests.conftest import run_cli
from tuner.bench.bisect import SETTINGS, search_counts


def _curve(crossing: float, max_users: int = 64, step: int = 2):
    """A P90 TPOT rising linearly through the 50 ms limit at ``crossing`` users."""
    return {u: SimpleNamespace(users=u, valid=True, requests=100, p90_ttft_s=1.0, p90_tpot_s=0.05 * u / crossing,
                               extra={}, meets=lambda ttft_s, tpot_s, ok=u <= crossing: ok)
            for u in range(step, max_users + 1, step)}


def test_search_counts_compare_both_bisections_on_the_same_draws():
    tables = {"a": [_curve(37.0), _curve(41.0)], "b": [_curve(21.0)]}
    by = search_counts(tables, draws=5, max_users=64, step=2)
    assert set(by) == {"midpoint", "interpolate"}
    for t in by.values():
        assert t["searches"] == 2 * len(SETTINGS) * 5 and t["mean_load_points"] > 2
    # straight curves: interpolation needs fewer load points, and lands within the resolution
    assert by["interpolate"]["mean_load_points"] < by["midpoint"]["mean_load_points"]
    assert abs(by["interpolate"]["mean_capacity_users"] - by["midpoint"]["mean_capacity_users"]) < 4


def test_bench_bisect_json_and_text(tmp_path):
    args = ["bench", "bisect", "--seeds", "1", "--max-users", "16", "--step", "4", "--draws", "2",
            "--warmup-s", "5", "--duration-s", "10"]
    r = run_cli([*args, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["configs"] and doc["by_bisection"]["midpoint"]["searches"] == len(doc["configs"]) * len(SETTINGS) * 2
    assert doc["load_point_ratio"] > 0
    r = run_cli(args, cwd=tmp_path)
    assert r.returncode == 0 and "interpolate / midpoint load points:" in r.stdout
    r = run_cli(["bench", "bisect", "--draws", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "--draws" in r.stderr
