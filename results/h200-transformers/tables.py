"""Trials and measurements of a study database as CSV and JSON (what this folder commits instead of the DB).

    python results/h200-transformers/tables.py DB.sqlite STUDY OUT_DIR

trials.json keeps each trial's telemetry whole (NVML samples summary, memory before start / after
ready / after teardown, server start time, cache facts); trials.csv and measurements.csv are the flat
columns, plus the GPU figures pulled out of the telemetry.
"""

from __future__ import annotations

import csv
import json
import sqlite3
import sys
from pathlib import Path


def _gpu_columns(tel: dict) -> dict:
    close = tel.get("close") or {}
    release = close.get("gpu_release") or {}
    mem = tel.get("gpu_memory_used_mib") or {}
    gpu0 = next((v for k, v in (close.get("gpu_summary") or tel.get("gpu") or {}).items()
                 if k.startswith("gpu")), {})
    first = lambda d: next(iter(d.values()), None) if isinstance(d, dict) and d else None  # noqa: E731
    server = tel.get("server") or {}
    return {
        "server_ready_after_s": first(tel.get("ready_after_s")),
        "gpu_mem_before_start_mib": first(mem.get("before_start")),
        "gpu_mem_after_ready_mib": first(mem.get("after_ready")),
        "gpu_mem_after_warmup_mib": first(mem.get("after_warmup")),
        "gpu_mem_peak_mib": gpu0.get("peak_memory_used_mib"),
        "gpu_util_mean_pct": gpu0.get("mean_utilization_pct"),
        "gpu_mem_after_teardown_mib": first(release.get("used_mib")),
        "gpu_memory_released": release.get("released"),
        "gpu_release_waited_s": release.get("waited_s"),
        "cb_cache_tokens": server.get("cb_cache_tokens"),
        "cb_max_batch_tokens_used": server.get("cb_max_batch_tokens"),
        "warmup_ttft_s": (server.get("warmup") or {}).get("ttft_s"),
    }


def main(db: str, study: str, out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    trials = [dict(r) for r in con.execute(
        "select * from tuner_trials where study_name = ? order by trial_number", (study,))]
    for t in trials:
        for k in ("params", "flags", "knobs", "pids", "gpu_ids", "telemetry"):
            t[k] = json.loads(t[k]) if isinstance(t[k], str) else t[k]
    meas = [dict(r) for r in con.execute(
        "select * from tuner_measurements where study_name = ? order by trial_number, step", (study,))]
    for m in meas:
        m["extra"] = json.loads(m["extra"]) if isinstance(m["extra"], str) else m["extra"]
    (out / "trials.json").write_text(json.dumps(trials, indent=1) + "\n")

    cols = ["trial_number", "is_baseline", "status", "capacity_users", "failure_class", "failure_reason",
            "wall_time_s"]
    rows = []
    for t in trials:
        flags = {k: v for k, v in t["flags"].items() if v is not None}
        rows.append({**{c: t[c] for c in cols}, "flags": " ".join(f"{k}={v}" for k, v in sorted(flags.items())),
                     **_gpu_columns(t["telemetry"] or {})})
    with open(out / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else cols)
        w.writeheader()
        w.writerows(rows)

    mcols = ["trial_number", "step", "users", "meets_slo", "valid", "invalid_reason", "requests", "errors",
             "p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "p50_tpot_s", "p90_tpot_s", "p99_tpot_s", "p90_e2e_s",
             "throughput_tokens_per_s", "input_throughput_tokens_per_s", "prefix_cache_hit_rate",
             "kv_capacity_tokens_total", "wall_time_s"]
    with open(out / "measurements.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=mcols + ["max_in_flight", "client_bound"])
        w.writeheader()
        for m in meas:
            w.writerow({**{c: m[c] for c in mcols}, "max_in_flight": m["extra"].get("max_in_flight"),
                        "client_bound": m["extra"].get("client_bound")})
    print(f"{len(trials)} trials, {len(meas)} measurements -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
