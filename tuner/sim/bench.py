"""CPU cost of the simulator: one capacity search (gallop + bisect) and cost vs users.

    python -m tuner.sim.bench [--model glm-5.1 --gpu h200 --warmup-s 120 --duration-s 600]

Prints the CPU seconds of a capacity search between 50 and 100 users (the SLO of the h200 study)
and a table of CPU seconds per simulated load point from 10 to 200 users.
"""

from __future__ import annotations

import argparse
import math
import time

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


def main(argv=None) -> None:
    from tuner.sim import simulate_load_point

    p = argparse.ArgumentParser(description="simulator CPU-cost benchmark")
    p.add_argument("--model", default="glm-5.1")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--warmup-s", type=float, default=120)
    p.add_argument("--duration-s", type=float, default=600)
    p.add_argument("--users", default="10,25,50,100,150,200")
    args = p.parse_args(argv)
    flags, knobs = CONFIG

    def measure(users):
        return simulate_load_point(args.model, args.gpu, 8, flags, knobs, CODING_AGENT, users,
                                   warmup_s=args.warmup_s, duration_s=args.duration_s)

    t0 = time.process_time()
    cap, calls = capacity_search(measure, 50, 100, 30.0, 0.050)
    cpu = time.process_time() - t0
    print(f"config: {flags} {knobs}")
    print(f"capacity search 50..100 users: capacity={cap} users, {len(calls)} load points "
          f"({', '.join(str(u) for u, _ in calls)}), CPU {cpu:.2f} s")
    print(f"{'users':>6} {'cpu_s':>7} {'requests':>9} {'events':>8} {'p90_ttft_s':>10} {'p90_tpot_ms':>11}")
    for users in (int(x) for x in args.users.split(",")):
        t0 = time.process_time()
        m = measure(users)
        cpu = time.process_time() - t0
        print(f"{users:>6} {cpu:>7.3f} {m.requests:>9} {m.extra['sim_events']:>8} "
              f"{(m.p90_ttft_s or float('nan')):>10.2f} {(m.p90_tpot_s or float('nan')) * 1000:>11.1f}")


if __name__ == "__main__":
    main()
