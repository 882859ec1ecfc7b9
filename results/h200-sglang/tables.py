"""The figures of the real SGLang studies in this folder, from their databases, as markdown tables.

    python results/h200-sglang/tables.py [DB ...]      (default: every *.db beside this file)

Per trial: what it changed from SGLang's defaults, how it ended, start-up (ready after, decode
CUDA-graph capture, HiCache host pool), teardown until the GPU memory was back, the planner's KV
pool against SGLang's own ``max_total_num_tokens``; then every load point.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINNED = {"attention-backend", "sampling-backend", "disable-prefill-cuda-graph", "enable-metrics", "tp-size"}


def _first(d):
    return next(iter(d.values()), None) if isinstance(d, dict) and d else None


def trial_rows(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = []
    for number, status, capacity, flags, telemetry, predicted, measured, fclass, reason in con.execute(
            "SELECT trial_number, status, capacity_users, flags, telemetry, predicted_kv_capacity_tokens, "
            "measured_kv_capacity_tokens, failure_class, failure_reason FROM tuner_trials ORDER BY trial_number"):
        flags, tel = json.loads(flags or "{}"), json.loads(telemetry or "{}")
        startup = ((tel.get("server") or {}).get("startup") or [{}])[0] or {}
        close = tel.get("close") or {}
        rows.append({
            "trial": number, "status": status, "capacity_users": capacity,
            "changes": {k: v for k, v in flags.items() if k not in PINNED} or "SGLang defaults",
            "ready_s": _first(tel.get("ready_after_s")),
            "decode_graph_capture_s": (startup.get("capture_s") or {}).get("decode"),
            "host_pool_s": (startup.get("timeline_s") or {}).get("host_pool_allocation_s"),
            "teardown_s": close.get("teardown_s"),
            "gpu_released": (close.get("gpu_release") or {}).get("released"),
            "cuda_visible_devices": tel.get("cuda_visible_devices"),
            "kv_predicted": predicted, "kv_measured": measured,
            "kv_error_pct": round(100 * (predicted - measured) / measured, 2) if predicted and measured else None,
            "failure": f"{fclass}: {reason}" if fclass else None,
        })
    return rows


def point_rows(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    return [dict(zip(("trial", "users", "requests", "p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput", "hit",
                      "meets_slo"), r))
            for r in con.execute("SELECT trial_number, users, requests, p50_ttft_s, p90_ttft_s, p90_tpot_s, "
                                 "throughput_tokens_per_s, prefix_cache_hit_rate, meets_slo FROM tuner_measurements "
                                 "ORDER BY trial_number, step")]


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return str(v)


def main(argv: list[str]) -> None:
    dbs = [Path(a) for a in argv] or sorted(HERE.glob("*.db"))
    for db in dbs:
        print(f"## {db.stem}\n")
        print("| trial | changes from the defaults | ended | capacity | ready s | decode graphs s | host pool s "
              "| teardown s | KV predicted | KV measured | error % |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in trial_rows(db):
            ended = r["status"] if not r["failure"] else f"{r['status']} ({r['failure'][:90]})"
            print(f"| {r['trial']} | {fmt(r['changes'])} | {ended} | {fmt(r['capacity_users'])} | {fmt(r['ready_s'])} "
                  f"| {fmt(r['decode_graph_capture_s'])} | {fmt(r['host_pool_s'], 0)} | {fmt(r['teardown_s'])} "
                  f"| {fmt(r['kv_predicted'])} | {fmt(r['kv_measured'])} | {fmt(r['kv_error_pct'], 2)} |")
        print("\n| trial | users | requests | P50 TTFT s | P90 TTFT s | P90 TPOT ms | output tok/s | hit rate | SLO |")
        print("|---|---|---|---|---|---|---|---|---|")
        for p in point_rows(db):
            print(f"| {p['trial']} | {p['users']} | {p['requests']} | {p['p50_ttft_s']:.3f} | {p['p90_ttft_s']:.3f} "
                  f"| {p['p90_tpot_s'] * 1000:.1f} | {p['throughput']:.0f} | {fmt(p['hit'], 3)} "
                  f"| {'met' if p['meets_slo'] else 'missed'} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
