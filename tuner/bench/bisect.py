"""How many load points each bisection takes: capacity searches over simulated P90 curves.

    tuner bench bisect [--seeds 2 --max-users 160 --step 2 --draws 40] [--json]

For three GLM-5.1 configurations on 8 H200s (those of ``tuner bench sim``'s workload) the simulator
measures P90 TTFT and TPOT at every ``step`` users up to ``max_users``, once per workload seed. Then
the study's ``CapacitySearch`` runs under several capacity settings with each bisection, every load
point read from the curve of a seed drawn at random (two windows of one user count differ as two
samples of sessions do), ``draws`` times per configuration and setting. A user count between grid
points reads the next one up. It prints the mean load points and the mean capacity of each bisection.
"""

from __future__ import annotations

import random
import time

from tuner.bench.simulator_cost import CODING_AGENT, capacity_search
from tuner.evaluation.capacity import CapacitySearch
from tuner.sim import simulate_load_point
from tuner.vocabulary import Bisection
from tuner.workload.metrics import LoadPointMetrics

CONFIGS = {
    "dp8-ep8-fp8kv": ({"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4",
                       "kv-cache-dtype": "fp8_e4m3"}, {"router-policy": "cache_aware", "moe-tile-configs": "tuned"}),
    "tp8": ({"tp-size": 8, "quantization": "modelopt_fp4"}, {}),
    "tp8-fp8kv-chunk4096": ({"tp-size": 8, "quantization": "modelopt_fp4", "kv-cache-dtype": "fp8_e4m3",
                             "chunked-prefill-size": 4096}, {}),
}
# (start_users, max_users, resolution_users, growth_factor)
SETTINGS = ((16, 256, 4, 2.0), (50, 100, 2, 1.5), (8, 512, 2, 2.0), (8, 160, 1, 2.0), (4, 160, 8, 2.0))
SLO = (30.0, 0.050)


def curves(*, seeds: int, max_users: int, step: int, warmup_s: float, duration_s: float,
           progress=lambda s: None) -> dict[str, list[dict[int, LoadPointMetrics]]]:
    """{configuration: [one {users: point} per seed]} of simulated load points on the user grid."""
    out = {}
    for name, (flags, knobs) in CONFIGS.items():
        out[name] = []
        for seed in range(seeds):
            t0 = time.monotonic()
            grid = {}
            for users in range(step, max_users + 1, step):
                grid[users] = simulate_load_point("glm-5.1", "h200", 8, flags, knobs, CODING_AGENT, users,
                                                  warmup_s=warmup_s, duration_s=duration_s, seed=seed)
            out[name].append(grid)
            progress(f"{name} seed {seed}: {len(grid)} load points in {time.monotonic() - t0:.0f} s")
    return out


def search_counts(tables: dict[str, list[dict]], *, draws: int, max_users: int, step: int) -> dict:
    """Mean load points and capacity of each bisection over every configuration, setting and draw."""
    totals = {b.value: {"searches": 0, "load_points": 0, "capacity_users": 0} for b in Bisection}
    for name, grids in tables.items():
        for start, top, res, growth in SETTINGS:
            for b in Bisection:
                rng = random.Random(f"{name}/{start}/{top}/{res}")  # the same draws for both bisections
                def measure(users):
                    return rng.choice(grids)[min(max_users, users + (-users % step))]

                for _ in range(draws):
                    s, _ = capacity_search(measure, CapacitySearch(
                        start_users=min(start, max_users), max_users=min(top, max_users), resolution_users=res,
                        growth_factor=growth, p90_ttft_s=SLO[0], p90_tpot_s=SLO[1], bisect=b))
                    t = totals[b.value]
                    t["searches"] += 1
                    t["load_points"] += len(s.steps)
                    t["capacity_users"] += s.capacity_users
    for t in totals.values():
        n = max(1, t["searches"])
        t["mean_load_points"] = t.pop("load_points") / n
        t["mean_capacity_users"] = t.pop("capacity_users") / n
    return totals


def bench_bisect(*, seeds: int = 2, max_users: int = 160, step: int = 2, draws: int = 40, warmup_s: float = 120,
                 duration_s: float = 600, progress=lambda s: None) -> dict:
    tables = curves(seeds=seeds, max_users=max_users, step=step, warmup_s=warmup_s, duration_s=duration_s,
                    progress=progress)
    by = search_counts(tables, draws=draws, max_users=max_users, step=step)
    mid, interp = by[Bisection.MIDPOINT.value], by[Bisection.INTERPOLATE.value]
    ratio = interp["mean_load_points"] / mid["mean_load_points"] if mid["mean_load_points"] else None
    return {"configs": list(CONFIGS), "settings": [list(s) for s in SETTINGS], "seeds": seeds, "draws": draws,
            "max_users": max_users, "step_users": step, "warmup_s": warmup_s, "duration_s": duration_s,
            "by_bisection": by, "load_point_ratio": ratio}


def format_lines(doc: dict) -> list[str]:
    lines = [f"{len(doc['configs'])} configurations x {len(doc['settings'])} capacity settings x {doc['draws']} draws, "
             f"P90 curves of {doc['seeds']} workload seeds every {doc['step_users']} users to {doc['max_users']}",
             f"{'bisect':>12} {'searches':>9} {'load points':>12} {'capacity':>9}"]
    for b, t in doc["by_bisection"].items():
        lines.append(f"{b:>12} {t['searches']:>9} {t['mean_load_points']:>12.2f} {t['mean_capacity_users']:>9.2f}")
    if doc["load_point_ratio"] is not None:
        lines.append(f"interpolate / midpoint load points: {doc['load_point_ratio']:.3f}")
    return lines
