"""The HiCache on/off A/B of the H100 study (calls 45-49): what it measured, and how the simulated
write-through cost compares with it.

Usage, from the repository root: python results/h100-sglang/hicache_ab.py [--fit] [--calls US,...]

1. Per request, client TTFT with HiCache on (trials 7, 9) against off (6, 8, 10), by the prompt's
   uncached tokens, load points of 16-32 users (the committed request files).
2. With --fit: `tuner bench fidelity` on the A/B's trials and on every other HiCache point, with
   `overhead.hicache_write_call_s` (the scheduler's time to issue one copy) set to each value of
   --calls (µs), as an overlay on the shipped calibration: the median signed P90 TTFT error of the
   HiCache trials against that of the same machine's trials without it. The shipped 2 µs is
   measured (`tuner profile run --ops hicache_write`, results/profiles/h100/tables), not chosen
   here; past the driver's copy queue the copies, not their issue, set the cost, so the figures
   barely move between 0 and 2 µs.
3. With --sim-bins: the same per-request table as 1, simulated (each A/B load point on its own
   seed and window) at each value of --calls, and the weighted squared error of the simulated
   on - off differences against the measured ones (few requests per bin: noisy).
CPU only; --fit and --sim-bins take under a minute each.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs" / "h100-sglang-qwen3"
ON, OFF = (7, 9), (6, 8, 10)
BINS = (0, 250, 500, 1000, 1500, 2000, 3000, 4000, 6000, 1 << 30)


def requests(trials) -> list[dict]:
    rows = []
    for t in trials:
        for f in sorted((RUNS / f"trial-{t:04d}").glob("loadpoint-*u.requests.jsonl.gz")):
            users = int(f.name.split("-")[-1].split("u")[0])
            if users > 32:
                continue
            with gzip.open(f, "rt") as fh:
                rows += [r for r in map(json.loads, fh) if not r.get("error")]
    return rows


def by_uncached(rows) -> dict[tuple[int, int], list[float]]:
    out: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        new = r["input_tokens"] - r["cached_tokens"]
        for lo, hi in zip(BINS, BINS[1:]):
            if lo <= new < hi:
                out.setdefault((lo, hi), []).append(r["ttft_s"])
    return out


def diffs(on_rows, off_rows) -> dict[int, tuple[float, int]]:
    """Median TTFT on minus off per bin of uncached tokens: (seconds, requests on)."""
    on, off = by_uncached(on_rows), by_uncached(off_rows)
    return {lo: (statistics.median(on[(lo, hi)]) - statistics.median(off[(lo, hi)]), len(on[(lo, hi)]))
            for lo, hi in zip(BINS, BINS[1:]) if on.get((lo, hi)) and off.get((lo, hi))}


def simulated_requests(call_us: float) -> tuple[list[dict], list[dict]]:
    """Each A/B load point simulated (its own seed, window and flags) with that cost per call; the
    simulator's request records, as the replay client writes them."""
    import tuner.sim.simulate as simulate
    from tuner.sim.measured import load_points

    captured = []
    aggregate = simulate.aggregate

    def keep(records, **kw):
        captured.append(records)
        return aggregate(records, **kw)

    points, _, _ = load_points([HERE], ("sglang",))
    out: dict[str, list[dict]] = {"on": [], "off": []}
    simulate.aggregate = keep
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(f"overhead:\n  hicache_write_call_s: {call_us * 1e-6:g}\n")
            f.flush()
            for p in points:
                if p.trial not in ON + OFF or p.users > 32:
                    continue
                simulate.simulate_load_point(p.model, p.gpu, p.gpus, p.flags, p.knobs, p.workload, p.users,
                                             warmup_s=p.warmup_s, duration_s=p.duration_s, seed=p.seed,
                                             nodes=p.nodes, host_memory_gb=p.host_memory_gb, calibration=f.name,
                                             sglang_version=p.sglang_version, fresh_server=p.fresh_server)
                out["on" if p.trial in ON else "off"] += [
                    {"input_tokens": r.input_tokens, "cached_tokens": r.cached_tokens or 0, "ttft_s": r.ttft_s}
                    for r in captured[-1] if r.ok and r.ttft_s is not None]
    finally:
        simulate.aggregate = aggregate
    return out["on"], out["off"]


def sim_bins(calls_us: list[float]) -> None:
    measured = diffs(requests(ON), requests(OFF))
    print("\nsimulated on - off per bin (ms), against measured; error: sum over bins of requests x (sim - measured)^2")
    print("call µs  " + "".join(f"{lo:>8,}+" for lo in measured) + "      error")
    print("measured " + "".join(f"{d * 1e3:+9.1f}" for d, _ in measured.values()))
    for us in calls_us:
        sim = diffs(*simulated_requests(us))
        err = sum(n * ((sim[lo][0] if lo in sim else 0.0) - d) ** 2 * 1e6 for lo, (d, n) in measured.items())
        print(f"{us:7.1f}  " + "".join(f"{sim[lo][0] * 1e3:+9.1f}" if lo in sim else f"{'-':>9}" for lo in measured)
              + f"  {err:9.0f}")


def table() -> None:
    on, off = by_uncached(requests(ON)), by_uncached(requests(OFF))
    print("uncached tokens   requests on/off   median TTFT on    off      on - off")
    for lo, hi in zip(BINS, BINS[1:]):
        a, b = on.get((lo, hi), []), off.get((lo, hi), [])
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        span = f"{lo:,}-{hi:,}" if hi < 1 << 30 else f"over {lo:,}"
        print(f"{span:>16}   {len(a):5d} / {len(b):<5d}   {ma * 1e3:8.1f} ms {mb * 1e3:8.1f} ms {(ma - mb) * 1e3:+8.1f} ms")


def fit(calls_us: list[float]) -> None:
    from tuner.bench.fidelity import run_fidelity

    def signed(points, pick):
        errs = [p["predicted"]["p90_ttft_s"] / p["measured"]["p90_ttft_s"] - 1 for p in points if pick(p)]
        return (statistics.median(errs) * 100, len(errs)) if errs else (float("nan"), 0)

    def hicache(p):
        return str(p["flags"].get("enable-hierarchical-cache")).lower() == "true"

    print("\ncall µs  A/B on (7, 9)   A/B off (6, 8, 10)   other H100 HiCache   H200 HiCache   (median signed P90 TTFT error, points)")
    for us in calls_us:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(f"overhead:\n  hicache_write_call_s: {us * 1e-6:g}\n")
            f.flush()
            doc = run_fidelity([HERE.parent], calibration=f.name)
        pts = doc["points"]
        h100 = [p for p in pts if p["study"] == "h100-sglang-qwen3"]
        cells = [signed(h100, lambda p: p["trial"] in ON), signed(h100, lambda p: p["trial"] in OFF),
                 signed(h100, lambda p: hicache(p) and p["trial"] not in ON),
                 signed([p for p in pts if p["gpu"].lower().startswith("h200")], hicache)]
        print(f"{us:7.1f}  " + "   ".join(f"{m:+6.1f}% ({n:2d})" for m, n in cells) +
              f"   all: P90 TTFT MAPE {doc['mape']['p90_ttft_s'] * 100:.1f}%")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--sim-bins", action="store_true")
    ap.add_argument("--calls", default="0,1,2,3,5,9", help="µs per runtime call to try (comma-separated)")
    args = ap.parse_args()
    table()
    calls = [float(x) for x in args.calls.split(",")]
    if args.fit:
        fit(calls)
    if args.sim_bins:
        sim_bins(calls)
