"""CPU cost of the simulator: one capacity search (gallop + bisect) and cost vs users.

    tuner bench sim [--model glm-5.1 --gpu h200 --warmup-s 120 --duration-s 600] [--json]

Measures the CPU seconds of a capacity search between 50 and 100 users (the SLO of the h200 study)
and the CPU seconds per simulated load point from 10 to 200 users.
"""

from __future__ import annotations

import math
import time

from tuner.sim import simulate_load_point
from tuner.workload.session import LogNormal, WorkloadProfile

CODING_AGENT = WorkloadProfile(
    name="coding-agent-bench",
    system_prefix_tokens=5000,
    first_turn_context_tokens=LogNormal(mu=math.log(8000), sigma=0.6, min=200, max=40000),
    new_tokens_per_turn=LogNormal(mu=math.log(1200), sigma=0.9, min=20, max=20000),
    output_tokens_per_turn=LogNormal(mu=math.log(300), sigma=0.8, min=10, max=4000),
    turns_per_session=LogNormal(mu=math.log(15), sigma=0.6, min=2, max=40),
    think_time_s=LogNormal(mu=math.log(10), sigma=0.8, min=1, max=120),
)

CONFIG = ({"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4",
           "kv-cache-dtype": "fp8_e4m3"}, {"router-policy": "cache_aware", "moe-tile-configs": "tuned"})


def capacity_search(measure, lo: int, hi: int, p90_ttft_s: float, p90_tpot_s: float, resolution: int = 2):
    """Gallop up from ``lo`` (x1.5) until the SLO fails or ``hi``, then bisect; returns (capacity, calls)."""
    calls = []

    def ok(users):
        m = measure(users)
        calls.append((users, m))
        return m.meets(p90_ttft_s, p90_tpot_s)

    good, bad = 0, None
    u = lo
    while u <= hi:
        if ok(u):
            good = u
            u = min(hi + 1, max(u + 1, int(u * 1.5)))
        else:
            bad = u
            break
    if bad is None:
        return good, calls
    lo_u = good if good else 1
    while bad - lo_u > resolution:
        mid = (lo_u + bad) // 2
        if ok(mid):
            lo_u = mid
        else:
            bad = mid
    return (lo_u if good or lo_u > 1 else 0), calls


def simulator_cost(*, model: str = "glm-5.1", gpu: str = "h200", warmup_s: float = 120, duration_s: float = 600,
                   users: tuple[int, ...] = (10, 25, 50, 100, 150, 200)) -> dict:
    """The `tuner bench sim` document: the capacity search's CPU time and each load point's."""
    flags, knobs = CONFIG

    def measure(n):
        return simulate_load_point(model, gpu, 8, flags, knobs, CODING_AGENT, n, warmup_s=warmup_s,
                                   duration_s=duration_s)

    t0 = time.process_time()
    cap, calls = capacity_search(measure, 50, 100, 30.0, 0.050)
    search_cpu_s = time.process_time() - t0
    points = []
    for n in users:
        t0 = time.process_time()
        m = measure(n)
        points.append({"users": n, "cpu_s": time.process_time() - t0, "requests": m.requests,
                       "events": m.extra["sim_events"], "p90_ttft_s": m.p90_ttft_s, "p90_tpot_s": m.p90_tpot_s})
    return {"model": model, "gpu": gpu, "flags": flags, "knobs": knobs, "warmup_s": warmup_s, "duration_s": duration_s,
            "capacity_search": {"capacity_users": cap, "load_points": [u for u, _ in calls], "cpu_s": search_cpu_s},
            "load_points": points}


def format_lines(doc: dict) -> list[str]:
    c = doc["capacity_search"]
    lines = [f"config: {doc['flags']} {doc['knobs']}",
             f"capacity search 50..100 users: capacity={c['capacity_users']} users, {len(c['load_points'])} load "
             f"points ({', '.join(str(u) for u in c['load_points'])}), CPU {c['cpu_s']:.2f} s",
             f"{'users':>6} {'cpu_s':>7} {'requests':>9} {'events':>8} {'p90_ttft_s':>10} {'p90_tpot_ms':>11}"]
    for p in doc["load_points"]:
        lines.append(f"{p['users']:>6} {p['cpu_s']:>7.3f} {p['requests']:>9} {p['events']:>8} "
                     f"{(p['p90_ttft_s'] or float('nan')):>10.2f} {(p['p90_tpot_s'] or float('nan')) * 1000:>11.1f}")
    return lines
