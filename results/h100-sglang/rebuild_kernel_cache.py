"""Rebuild what each trial's server found in its pinned Triton cache, from the committed server logs.

The live evaluator records, beside each trial's first load point, the batch sizes earlier servers of
its kernel set ran on the pinned cache (``extra.kernel_cache.cached``; ``tuner.evaluation.kernel_ledger``).
In calls 90-93 the baseline named ``tp-size: 1`` explicitly and the sampled trials did not, and the
kernel-set key then counted that as another set: trial 1 found no record of the baseline, and the
later trials' records left the baseline's sizes out. The key now drops flags equal to SGLang's
defaults. This replays the ledger with that key over the trials in the order they ran (one machine,
one cache: the machine stayed warm through the four calls, and ``kernel_cache_before_start`` grew
0, 72, 78, 80, 80, 81, 81), and stores the result as ``cached``, keeping what was recorded at run
time as ``cached_at_run_time``. The run-time predictions are left as they were.

``--fresh-machine-trial N`` marks trial N's server as the first on a fresh machine (``jit_cold``: SGLang's
nvcc-built modules not there yet; tuner records this itself since these calls). Call 90's baseline
was: its ``install.log`` unpacked the kit (a machine already used says "kit already installed"), and
its Triton cache held no kernel before it started.

    python results/h100-sglang/rebuild_kernel_cache.py results/h100-sglang/h100-sglang-dsv3-5l-ledger.db \
        --fresh-machine-trial 0
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from tuner.backends.sglang import flag_defaults, kernel_set_flags
from tuner.catalog.sglang_flags import load_flagset
from tuner.evaluation.kernel_ledger import kernel_set_key, served_token_counts
from tuner.sim.warmup import CachedKernels
from tuner.workload.metrics import KERNEL_CACHE_KEY

SCRIPT = "results/h100-sglang/rebuild_kernel_cache.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="print what would be stored, store nothing")
    ap.add_argument("--fresh-machine-trial", type=int, action="append", default=[],
                    help="a trial whose server was the first on a fresh machine (repeatable)")
    args = ap.parse_args()
    con = sqlite3.connect(args.db)
    (study,) = con.execute("select name from tuner_studies").fetchone()
    runs = args.db.parent / "runs" / study
    built: dict[str, set[int]] = {}
    graphs: dict[str, set[int]] = {}
    rows = con.execute("select trial_number, telemetry from tuner_trials order by trial_number").fetchall()
    for trial, telemetry in rows:
        facts = (json.loads(telemetry or "{}").get("plan") or {})
        parts = dict(facts.get("kernel_set") or {})
        if not parts:
            continue
        fs = load_flagset(parts.get("sglang_version"))
        parts["flags"] = kernel_set_flags(parts["flags"], flag_defaults(fs, parts["flags"]))
        key = kernel_set_key(parts)
        found = CachedKernels(tuple(built.get(key, ())), tuple(graphs.get(key, ())),
                              jit_cold=trial in args.fresh_machine_trial)
        first = con.execute("select id, extra from tuner_measurements where study_name = ? and trial_number = ? "
                            "order by step limit 1", (study, trial)).fetchone()
        if first is not None:
            mid, extra = first
            extra = json.loads(extra or "{}")
            record = dict(extra.get(KERNEL_CACHE_KEY) or {})
            record.setdefault("cached_at_run_time", record.get("cached"))
            record.update({"kernel_set": key, "cached": found.to_dict() if found else None, "rebuilt_by": SCRIPT})
            extra[KERNEL_CACHE_KEY] = record
            print(f"trial {trial}: set {key}, found {len(found.prefill_tokens)} prefill and "
                  f"{len(found.graph_tokens)} graph sizes{', JIT modules not built' if found.jit_cold else ''} "
                  f"(recorded at run time: "
                  f"{len(((record['cached_at_run_time'] or {}).get('prefill_tokens')) or [])})")
            if not args.dry_run:
                con.execute("update tuner_measurements set extra = ? where id = ?", (json.dumps(extra), mid))
        logs = sorted((runs / f"trial-{trial:04d}").glob("sglang*.log*"))
        served = served_token_counts(logs)
        built.setdefault(key, set()).update(served.prefill_tokens)
        graphs.setdefault(key, set()).update(served.graph_tokens)
    if not args.dry_run:
        con.commit()
    con.close()


if __name__ == "__main__":
    main()
