"""How firm is each measured SLO verdict? A session bootstrap of every load point that kept its requests,
beside the rule the fidelity benchmark and the capacity search use (``metrics.verdict_marginal``).

    python results/h200-sglang/verdict_bootstrap.py [--resamples 1000] [--results results]

For each study load point whose ``loadpoint-NN-Uu.requests.jsonl.gz`` sits in ``runs/`` beside its
database, whole sessions are resampled (``tuner.workload.ab``) and the verdict recomputed; the share
of resamples that keep the measured verdict is printed per point, then summarized for the points the
rule calls decided and for the marginal ones.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from tuner.sim.measured import REAL_BACKENDS, load_points
from tuner.workload.ab import _Window, read_requests
from tuner.workload.metrics import verdict_marginal


def requests_file(p) -> Path | None:
    src = Path(p.source)
    if p.study is None or src.suffix != ".db":
        return None
    f = src.parent / "runs" / p.study / f"trial-{p.trial:04d}" / f"loadpoint-{p.step:02d}-{p.users}u.requests.jsonl.gz"
    return f if f.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--results", default="results")
    args = ap.parse_args()
    points, _skipped, _sources = load_points([args.results], REAL_BACKENDS)
    rng = np.random.default_rng(0)
    kept: dict[bool, list[float]] = {False: [], True: []}
    for p in points:
        f = requests_file(p)
        if f is None:
            continue
        m, limits = p.measured, (p.p90_ttft_slo_s, p.p90_tpot_slo_s)
        meets = m["p90_ttft_s"] <= limits[0] and m["p90_tpot_s"] <= limits[1]
        boot = _Window(read_requests(f)).bootstrap(rng, args.resamples)
        same = float(np.mean(((boot["p90_ttft_s"] <= limits[0]) & (boot["p90_tpot_s"] <= limits[1])) == meets))
        marginal = bool(verdict_marginal(meets, (m["p90_ttft_s"], m["p90_tpot_s"]), p.p90_spread, limits))
        kept[marginal].append(same)
        print(f"{p.label:<44} {'met ' if meets else 'miss'}  {'marginal' if marginal else 'decided '}  "
              f"kept in {same:.1%} of resamples")
    for marginal, name in ((False, "decided"), (True, "marginal")):
        v = kept[marginal]
        if v:
            print(f"{name}: {len(v)} points, verdict kept in {min(v):.1%}-{max(v):.1%} of resamples "
                  f"(median {statistics.median(v):.1%})")


if __name__ == "__main__":
    main()
