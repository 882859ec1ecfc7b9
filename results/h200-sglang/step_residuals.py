"""Measured over predicted wall time of each real server's 40-step decode windows (the prefill
batches inside them included), by the server's age: does a fresh server run its steps slower than
the calibrated step-time model for longer than its compile stalls, and do two servers of one
configuration run at the same speed?

Usage, from the repository root: python results/h200-sglang/step_residuals.py [--by-batch]
[--calibration FILE] [DB ...]
(default: both study databases here); --calibration FILE: fitted values to try over the committed
entries (`tuner calibration fit --out FILE`). Median ratio per age bucket (windows in brackets), then the
median over every server per bucket. With --by-batch: the median per GPU, window kind (decode only,
or holding prefill batches) and running requests in groups of 4, GQA trials only (the decode
attention's batch shape). Reads the committed server logs; CPU only, ~20 s.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.stepfit import trial_window_times, trials_from_database

HERE = Path(__file__).resolve().parent
OVERRIDE: str | None = None  # --calibration FILE
AGES_S = ((0, 60), (60, 120), (120, 240), (240, 480), (480, None))


def main(dbs: list[str]) -> None:
    pooled: dict[tuple, list[float]] = {}
    print("trial".ljust(24) + "".join(f"{lo}-{hi or ''} s".rjust(13) for lo, hi in AGES_S))
    for db in dbs:
        for t in trials_from_database(db):
            cal = load_calibration(t.gpu.name, OVERRIDE,
                                   context=calibration_context(t.model, t.gpu, t.flags, t.sglang_version))
            by_log: dict[str, list[tuple]] = {}
            for w, predicted in zip(t.windows, trial_window_times(t, cal)):
                if predicted > 0:
                    by_log.setdefault(w.source, []).append((w, w.wall_s / predicted))
            for windows in by_log.values():
                t0 = windows[0][0].t_start
                cells = []
                for lo, hi in AGES_S:
                    ratios = [r for w, r in windows if lo <= w.t_start - t0 < (hi or float("inf"))]
                    pooled.setdefault((lo, hi), []).extend(ratios)
                    cells.append(f"{statistics.median(ratios):.2f} ({len(ratios)})" if ratios else "-")
                print(t.label.ljust(24) + "".join(c.rjust(13) for c in cells))
    print("all servers".ljust(24) + "".join(
        (f"{statistics.median(pooled[a]):.2f} ({len(pooled[a])})" if pooled.get(a) else "-").rjust(13)
        for a in AGES_S))


def by_batch(dbs: list[str]) -> None:
    pooled: dict[tuple, list[float]] = {}
    for db in dbs:
        for t in trials_from_database(db):
            if t.arch != "gqa":
                continue
            cal = load_calibration(t.gpu.name, OVERRIDE,
                                   context=calibration_context(t.model, t.gpu, t.flags, t.sglang_version))
            for w, predicted in zip(t.windows, trial_window_times(t, cal)):
                if predicted > 0:
                    group = min(32, int((w.running_start + w.running_end) / 2) // 4 * 4)
                    kind = "with prefill" if w.prefills else "decode only"
                    pooled.setdefault((t.gpu.name, kind, group), []).append(w.wall_s / predicted)
    print("gpu".ljust(8) + "windows".ljust(14) + "running".rjust(9) + "measured / predicted".rjust(22))
    for (gpu, kind, group), ratios in sorted(pooled.items()):
        print(gpu.ljust(8) + kind.ljust(14) + f"{group}-{group + 3}".rjust(9)
              + f"{statistics.median(ratios):.3f} ({len(ratios)})".rjust(22))


if __name__ == "__main__":
    args = sys.argv[1:]
    batch = "--by-batch" in args
    if "--calibration" in args:
        i = args.index("--calibration")
        if i + 1 >= len(args):
            sys.exit("--calibration: expected a file")
        OVERRIDE = args[i + 1]
        del args[i:i + 2]
    dbs = [a for a in args if a != "--by-batch"] or [str(HERE / "h200-sglang-qwen3.db"), str(HERE / "h200-sglang-dsv3.db")]
    (by_batch if batch else main)(dbs)
