"""CPU cost of the simulator: one capacity search of the study, and cost vs users.

    tuner bench sim [--study h200 --model glm-5.1 --gpu h200 --warmup-s 120 --duration-s 600] [--json]

Runs the study's own capacity search (``tuner.evaluation.capacity``: its start, maximum,
resolution, growth factor and SLO) on one configuration, once with each bisection side by side,
and measures the CPU seconds of each; then the CPU seconds per simulated load point from 10 to
200 users.
"""

from __future__ import annotations

import math
import time

from tuner.config.load import load_study
from tuner.evaluation.capacity import CapacitySearch
from tuner.sim import simulate_load_point
from tuner.vocabulary import Bisection
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


def capacity_search(measure, search: CapacitySearch) -> tuple[CapacitySearch, float]:
    """Drive ``search`` to its end with ``measure(users)``; returns it and the CPU seconds it took."""
    t0 = time.process_time()
    while (users := search.next_users()) is not None:
        m = measure(users)
        search.record(users, search.meets(m), marginal=search.marginal(m), point=m)
    return search, time.process_time() - t0


def simulator_cost(*, study: str = "h200", model: str = "glm-5.1", gpu: str = "h200", warmup_s: float = 120,
                   duration_s: float = 600, users: tuple[int, ...] = (10, 25, 50, 100, 150, 200)) -> dict:
    """The `tuner bench sim` document: the study's capacity search's CPU time (under each
    bisection, the study's own first) and each load point's."""
    spec = load_study(study)
    flags, knobs = CONFIG

    def measure(n):
        return simulate_load_point(model, gpu, 8, flags, knobs, CODING_AGENT, n, warmup_s=warmup_s,
                                   duration_s=duration_s)

    own = Bisection(spec.capacity.bisect)
    searches = {}
    for bisect in (own, *(b for b in Bisection if b is not own)):
        search, cpu_s = capacity_search(measure, CapacitySearch.for_study(spec, bisect=bisect))
        searches[bisect.value] = {"capacity_users": search.capacity_users,
                                  "load_points": [u for u, _ in search.steps], "cpu_s": cpu_s}
    points = []
    for n in users:
        t0 = time.process_time()
        m = measure(n)
        points.append({"users": n, "cpu_s": time.process_time() - t0, "requests": m.requests,
                       "events": m.extra["sim_events"], "p90_ttft_s": m.p90_ttft_s, "p90_tpot_s": m.p90_tpot_s})
    c = spec.capacity
    return {"model": model, "gpu": gpu, "flags": flags, "knobs": knobs, "warmup_s": warmup_s, "duration_s": duration_s,
            "study": spec.name, "slo": {"p90_ttft_s": spec.slo.p90_ttft_s, "p90_tpot_s": spec.slo.p90_tpot_s},
            "capacity": {"start_users": c.start_users, "max_users": c.max_users,
                         "resolution_users": c.resolution_users, "growth_factor": c.growth_factor,
                         "bisect": own.value},
            "capacity_search": searches[own.value], "capacity_search_by_bisection": searches,
            "load_points": points}


def format_lines(doc: dict) -> list[str]:
    c = doc["capacity"]
    lines = [f"config: {doc['flags']} {doc['knobs']}",
             f"study {doc['study']}: users {c['start_users']}..{c['max_users']}, resolution {c['resolution_users']}, "
             f"growth x{c['growth_factor']:g}, P90 TTFT <= {doc['slo']['p90_ttft_s']:g} s, "
             f"P90 TPOT <= {doc['slo']['p90_tpot_s'] * 1000:g} ms"]
    for bisect, s in doc["capacity_search_by_bisection"].items():
        own = " (the study's)" if bisect == c["bisect"] else ""
        lines.append(f"capacity search, bisect {bisect}{own}: capacity={s['capacity_users']} users, "
                     f"{len(s['load_points'])} load points ({', '.join(str(u) for u in s['load_points'])}), "
                     f"CPU {s['cpu_s']:.2f} s")
    lines.append(f"{'users':>6} {'cpu_s':>7} {'requests':>9} {'events':>8} {'p90_ttft_s':>10} {'p90_tpot_ms':>11}")
    for p in doc["load_points"]:
        lines.append(f"{p['users']:>6} {p['cpu_s']:>7.3f} {p['requests']:>9} {p['events']:>8} "
                     f"{(p['p90_ttft_s'] or float('nan')):>10.2f} {(p['p90_tpot_s'] or float('nan')) * 1000:>11.1f}")
    return lines
