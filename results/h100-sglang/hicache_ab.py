"""The HiCache on/off A/B of the H100 study (calls 45-49): what it measured, and the write-through
cost per runtime call it fits.

Usage, from the repository root: python results/h100-sglang/hicache_ab.py [--fit] [--calls US,...]

1. Per request, client TTFT with HiCache on (trials 7, 9) against off (6, 8, 10), by the prompt's
   uncached tokens, load points of 16-32 users (the committed request files).
2. With --fit: `tuner bench fidelity` on the A/B's trials and on every other HiCache point, with
   `overhead.hicache_write_call_s` set to each value of --calls (µs), as an overlay on the shipped
   calibration: the median signed P90 TTFT error of the HiCache trials against that of the same
   machine's trials without it. The shipped value is where the two meet (9 µs); the H200 HiCache
   points were not used to choose it. CPU only; --fit takes about a minute.
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
    ap.add_argument("--calls", default="0,5,7,9,11", help="µs per runtime call to try (comma-separated)")
    args = ap.parse_args()
    table()
    if args.fit:
        fit([float(x) for x in args.calls.split(",")])
