"""Do a fresh server's stalls fall where a prefill batch reaches a new batch-size bucket?

For each server log of the named databases (and the DeepSeek tile A/B logs of calls 32 and 34, under
trial 5's configuration): its prefill windows of the first LOOK_S of traffic, split by whether they
hold a batch whose token count is nearest to a config key (SGLang's 1-4,096, as its tile-config
files are keyed) that the server had not reached before (prefill lines before the first window
count as reached), and how many of each kind stalled (``tuner.sim.stepfit._is_stall`` against the
calibrated step times). Decode-only windows are counted apart.

Usage, from the repository root: python results/h200-sglang/stall_buckets.py [DB ...]
(default: the H100 DeepSeek studies and the H200 DeepSeek and Qwen3 studies). CPU only, ~20 s.
"""

from __future__ import annotations

import dataclasses
import glob
import sys
from pathlib import Path

from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.stepfit import TrialSteps, _is_stall, trial_window_times, trials_from_database
from tuner.sim.steplog import PrefillLine, decode_windows, read_step_lines
from tuner.sim.warmup import MOE_CONFIG_KEYS

ROOT = Path(__file__).resolve().parents[2]
LOOK_S = 120.0
DEFAULT_DBS = ["results/h100-sglang/h100-sglang-dsv3-5l-fresh.db", "results/h100-sglang/h100-sglang-dsv3-5l-fresh-cached.db",
               "results/h100-sglang/h100-sglang-dsv3-5l-fresh-cold2.db", "results/h100-sglang/h100-sglang-dsv3-5l.db",
               "results/h200-sglang/h200-sglang-dsv3.db", "results/h200-sglang/h200-sglang-qwen3.db"]
TILES_AB_LOGS = "results/h200-sglang/calls/3[24]-*/runs/*/*/trial-0005/sglang0.log.gz"


def bucket(tokens: int) -> int:
    """The config key nearest to ``tokens`` (ties to the smaller, as SGLang's ``min`` does)."""
    return min(MOE_CONFIG_KEYS, key=lambda k: abs(k - tokens))


def counts(t: TrialSteps) -> dict[str, list[int]]:
    """{"new" | "other" | "decode": [windows, stalls]} over the first LOOK_S of each log."""
    cal = load_calibration(t.gpu.name, None, context=calibration_context(t.model, t.gpu, t.flags, t.sglang_version))
    predicted = trial_window_times(t, cal)
    out = {"new": [0, 0], "other": [0, 0], "decode": [0, 0]}
    for log in sorted({w.source for w in t.windows}):
        rows = [(w, p) for w, p in zip(t.windows, predicted) if w.source == log]
        t0 = rows[0][0].t_start
        reached = {bucket(e.new_tokens) for e in read_step_lines(log) if isinstance(e, PrefillLine) and e.t < t0}
        for w, p in rows:
            if w.t_end - t0 > LOOK_S:
                break
            kind = "decode"
            if w.prefills:
                buckets = {bucket(x.new_tokens) for x in w.prefills}
                kind = "new" if buckets - reached else "other"
                reached |= buckets
            out[kind][0] += 1
            out[kind][1] += int(_is_stall(w.wall_s - p, p))
    return out


def main(dbs: list[str]) -> None:
    servers: list[tuple[str, TrialSteps]] = []
    for db in dbs:
        servers += [(t.label, t) for t in trials_from_database(ROOT / db)]
    dsv3 = {t.trial: t for label, t in servers if label.startswith("h200-sglang-dsv3#")}
    if 5 in dsv3:
        for f in sorted(glob.glob(str(ROOT / TILES_AB_LOGS))):
            parts = Path(f).parts
            label = f"tiles-ab call {parts[-6][:2]} {parts[-3]}"
            servers.append((label, dataclasses.replace(dsv3[5], windows=decode_windows(read_step_lines(f), source=f),
                                                       logs=[f])))
    print(f"{'server':38}{'new-bucket windows (stalls)':>30}{'other prefill windows':>26}{'decode only':>16}")
    for label, t in servers:
        c = counts(t)
        print(f"{label:38}{c['new'][0]:>22} ({c['new'][1]:>3}){c['other'][0]:>18} ({c['other'][1]:>3})"
              f"{c['decode'][0]:>10} ({c['decode'][1]:>2})")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_DBS)
