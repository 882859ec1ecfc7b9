"""Per request, a real load point against the simulator's: do the real sessions run behind?

A load point that kept its requests (``loadpoint-*.requests.jsonl.gz``, written beside a probe's or
trial's server log) is simulated again, the simulator's own request records are taken, and each
request is matched with the real one by (session, turn). Printed: how many match, the turn each
side had reached, the start-time lag of the real requests behind the simulated ones over the
window, and the per-request TPOT quantiles of both (matched and all).

Usage, from the repository root:
    python results/h200-sglang/request_lag.py PROBE_OR_DB LABEL REQUESTS_FILE
e.g. results/h200-sglang/calls/32-dsv3-tiles-ab-16-users-same-machine/default.probe.json
h200-sglang-dsv3-tiles-ab-default@16 .../default/trial-0005/loadpoint-00-16u.requests.jsonl.gz
(a label that names several points takes the first). CPU only, a few seconds.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys

import tuner.sim.simulate as simulate
from tuner.sim.measured import load_points


def _tpot(start_s: float, ttft_s: float, end_s: float, tokens: int) -> float:
    return (end_s - start_s - ttft_s) / max(1, tokens - 1)


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(source: str, label: str, requests_file: str) -> None:
    points = [p for p in load_points([source]).points if p.label == label]
    if not points:
        sys.exit(f"{source}: no load point {label!r}")
    p = points[0]
    captured: list = []
    aggregate = simulate.aggregate

    def keep(records, **kw):  # the simulator's own request records, as it aggregates them
        captured.extend(records)
        return aggregate(records, **kw)

    simulate.aggregate = keep
    try:
        simulate.simulate_load_point(p.model, p.gpu, p.gpus, p.flags, p.knobs, p.workload, p.users,
                                     warmup_s=p.warmup_s, duration_s=p.duration_s, seed=p.seed, nodes=p.nodes,
                                     host_memory_gb=p.host_memory_gb, sglang_version=p.sglang_version,
                                     fresh_server=p.fresh_server)
    finally:
        simulate.aggregate = aggregate
    sim = {(r.session_id, r.turn): r for r in captured if r.ok}
    real = {}
    with gzip.open(requests_file, "rt") as f:
        for line in f:
            d = json.loads(line)
            if d.get("error") is None and d.get("end_s") is not None and d.get("ttft_s") is not None:
                real[(d["session_id"], d["turn"])] = d
    both = sorted(set(sim) & set(real), key=lambda k: real[k]["start_s"])
    print(f"{label} ({'fresh' if p.fresh_server else 'warm'} server): {len(real)} real requests, "
          f"{len(sim)} simulated, {len(both)} matched by (session, turn)")
    if not both:
        return
    lag = [real[k]["start_s"] - sim[k].start_s for k in both]
    third = max(1, len(both) // 3)
    print(f"start lag of the real request behind the simulated one: median {statistics.median(lag):+.1f} s; "
          f"first third of the window {statistics.median(lag[:third]):+.1f} s, last third "
          f"{statistics.median(lag[-third:]):+.1f} s")
    print(f"mean prompt: real {statistics.mean(d['input_tokens'] for d in real.values()):,.0f}, simulated "
          f"{statistics.mean(r.input_tokens for r in sim.values()):,.0f} tokens")
    rt = [_tpot(d["start_s"], d["ttft_s"], d["end_s"], d["output_tokens"]) for d in real.values()]
    st = [_tpot(r.start_s, r.ttft_s, r.end_s, r.output_tokens) for r in sim.values()]
    print(f"TPOT P50 / P90 ms: real {_q(rt, .5) * 1e3:.1f} / {_q(rt, .9) * 1e3:.1f}, "
          f"simulated {_q(st, .5) * 1e3:.1f} / {_q(st, .9) * 1e3:.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
