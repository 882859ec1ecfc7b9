"""Planner benchmark: the memory planner against SGLang's own accounting, configuration by
configuration.

Sources under the given results directories:

* study databases: every real SGLang trial that was launched, with the ``/server_info`` snapshot
  and the server log its run kept beside the database (``runs/<study>/trial-NNNN/``, as results are
  collected) or in the trial's telemetry;
* planner probes (``planner/*.json`` or ``*.planner.json``, format ``tuner-planner-probe/1``):
  written by ``tuner bench planner-probe`` on a GPU, which starts each configuration of a matrix
  only until ``/server_info`` answers (or start-up fails) and keeps the snapshot and the log.

For each configuration the planner (``tuner.planner.plan_memory``, with the configuration's SGLang
version) is asked for its KV capacity, weight memory and whether it fits, and SGLang's answer is
read from the snapshot and the log (``max_total_num_tokens``; "Load weight end ... mem usage";
"KV Cache is allocated"; whether the server became ready). The target (issue: planner against
SGLang): KV tokens and weight memory within 1 %, and "fits" right for every configuration,
over at least 12 configurations covering GQA and MLA, bf16 and fp8 weights and KV, default and
explicit ``mem-fraction-static``, ``max-total-tokens`` and HiCache.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


from tuner.backends.sglang_log import StartupReport, startup_report
from tuner.catalog import get_gpu, get_model
from tuner.config.load import results_study
from tuner.errors import ConfigError, UserError
from tuner.lifecycle import TrialStatus
from tuner.planner import plan_memory
from tuner.planner import resolve_checkpoint
from tuner.planner.parallel import flag_float
from tuner.sim.measured import find_sources
from tuner.storage import repo
from tuner.storage.snapshot import read_snapshot

PROBE_FORMAT = "tuner-planner-probe/1"
GIB = 2**30
TOLERANCE = 0.01  # KV tokens and weight memory within 1 % of SGLang's
MIN_CONFIGURATIONS = 12
# the dimensions the matrix must cover, each with the values it must hold
REQUIRED = {
    "attention": ("gqa", "mla"),
    "weights": ("bf16", "fp8"),
    "kv_cache": ("bf16", "fp8"),
    "mem_fraction_static": ("default", "explicit"),
    "max_total_tokens": ("set",),
    "hicache": ("on",),
}
STARTUP_FAILURES = ("oom", "exit_at_start", "startup_timeout")


@dataclass
class PlannerCase:
    """One configuration SGLang started (or failed to), and what it reported."""

    label: str
    source: str
    model: Any  # a catalog name or a {name, overrides} reference
    gpu: str
    gpus: int
    nodes: int
    host_memory_gb: float | None
    flags: dict
    sglang_version: str | None
    started: bool | None  # None: unknown (no log, no snapshot)
    # started and then served without running out of memory (None: not replayed, as a probe):
    # "fits" promises that, so the verdict is checked against it where it is known
    served: bool | None = None
    failure: str | None = None  # SGLang's own words when it did not start
    max_total_num_tokens: int | None = None  # /server_info, else the scheduler's log line
    kv_tokens_allocated: int | None = None  # "KV Cache is allocated. #tokens" (also before a start-up OOM)
    weight_gib: float | None = None
    kv_gib: float | None = None
    notes: list[str] = field(default_factory=list)


def _log_text(path: Path) -> str | None:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", errors="replace") as f:
                return f.read()
        return path.read_text(errors="replace")
    except (OSError, EOFError):
        return None


def _snapshot(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if isinstance(doc, list):
        doc = next((d for d in doc if isinstance(d, dict)), None)
    return doc if isinstance(doc, dict) else None


def _fill(case: PlannerCase, info: dict | None, report: StartupReport | None) -> PlannerCase:
    if info:
        tokens = info.get("max_total_num_tokens")
        case.max_total_num_tokens = int(tokens) if isinstance(tokens, (int, float)) else None
        for state in info.get("internal_states") or []:
            mem = (state or {}).get("memory_usage") or {}
            if case.weight_gib is None and isinstance(mem.get("weight"), (int, float)):
                case.weight_gib = float(mem["weight"])  # SGLang's "GB" are GiB (bytes / 2**30)
            if case.kv_gib is None and isinstance(mem.get("kvcache"), (int, float)):
                case.kv_gib = float(mem["kvcache"])
    if report:
        case.kv_tokens_allocated = report.kv_tokens
        if case.max_total_num_tokens is None:
            case.max_total_num_tokens = report.max_total_num_tokens
        if case.weight_gib is None:
            case.weight_gib = report.weight_memory_gb
        if case.kv_gib is None:
            case.kv_gib = report.kv_memory_gb
        if case.started is None:
            case.started = report.ready
    return case


def cases_from_database(path: Path) -> list[PlannerCase]:
    out: list[PlannerCase] = []
    with read_snapshot(path) as engine:
        if engine is None:
            return out
        for study_row in repo.list_studies(engine):
            spec = results_study(study_row.spec_yaml, study_row.name, str(path))
            options = spec.backend_options or {}
            for t in repo.trials(engine, study_row.name):
                if t.backend_kind != "sglang" or not t.launched:
                    continue
                run = path.parent / "runs" / study_row.name / f"trial-{t.trial_number:04d}"
                logs = sorted([*run.glob("*.log.gz"), *run.glob("*.log")]) if run.is_dir() else []
                snaps = sorted(run.glob("*.server_info.json")) if run.is_dir() else []
                text = _log_text(logs[0]) if logs else None
                failed_at_start = t.failure_class in STARTUP_FAILURES and not snaps
                report = startup_report(text, exited=failed_at_start) if text else None
                info = _snapshot(snaps[0]) if snaps else None
                if info is None:
                    tele = (t.telemetry or {}).get("server_info")
                    info = tele[0] if isinstance(tele, list) and tele else tele if isinstance(tele, dict) else None
                if not logs and info is None and not failed_at_start:
                    continue  # stopped before its server said anything (e.g. at a time limit): nothing to compare
                started = True if info else (False if failed_at_start else None)
                died_serving = bool(info) and t.failure_class == "oom"
                served = (False if (died_serving or started is False)
                          else True if t.status == TrialStatus.COMPLETE else None)
                case = PlannerCase(
                    label=f"{study_row.name}#{t.trial_number}", source=str(path), model=spec.model,
                    gpu=spec.hardware.gpu, gpus=spec.hardware.gpus_per_node, nodes=spec.hardware.nodes,
                    host_memory_gb=spec.hardware.host_memory_gb, flags=dict(t.flags or {}),
                    sglang_version=str(options.get("sglang_version") or "") or None, started=started,
                    served=served, failure=(t.failure_reason or None) if (failed_at_start or died_serving) else None)
                if not logs:
                    case.notes.append("no server log")
                out.append(_fill(case, info, report))
    return out


def cases_from_probe(path: Path) -> PlannerCase:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read planner probe: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("format") != PROBE_FORMAT:
        raise ConfigError(f"not a planner probe: expected format {PROBE_FORMAT!r}", file=str(path), key="format")
    for key, kind in (("name", str), ("gpu", str), ("flags", dict)):
        if not isinstance(doc.get(key), kind):
            raise ConfigError(f"required {kind.__name__}", file=str(path), key=key)
    if not isinstance(doc.get("model"), (str, dict)):
        raise ConfigError("required: a catalog model name or {name, overrides}", file=str(path), key="model")
    log = path.with_name(str(doc["log"])) if doc.get("log") else None
    text = _log_text(log) if log and log.exists() else None
    report = startup_report(text, exited=not doc.get("started")) if text else None
    case = PlannerCase(label=str(doc["name"]), source=str(path), model=doc["model"], gpu=doc["gpu"],
                       gpus=int(doc.get("gpus", 1)), nodes=int(doc.get("nodes", 1)),
                       host_memory_gb=doc.get("host_memory_gb"), flags=dict(doc["flags"]),
                       sglang_version=doc.get("sglang_version"), started=doc.get("started"),
                       failure=doc.get("failure"))
    return _fill(case, doc.get("server_info"), report)


def find_planner_probes(dirs: Iterable[str | Path]) -> list[Path]:
    out: set[Path] = set()
    for d in dirs:
        d = Path(d)
        if d.is_file() and d.suffix == ".json":
            out.add(d)
        elif d.is_dir():
            out |= {p for p in d.rglob("*.json") if p.name.endswith(".planner.json") or p.parent.name == "planner"
                    or (d.name == "planner" and p.parent == d) or _is_probe_file(p)}
    return sorted(out)


def _is_probe_file(path: Path) -> bool:
    """A file `tuner bench planner-probe` wrote (its format key comes first), whatever its name."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return b'"format": "tuner-planner-probe/' in head


# ---- evaluation ----------------------------------------------------------------------------------

def dimensions(case: PlannerCase, plan) -> dict[str, str]:
    """Where the configuration sits on the matrix's dimensions."""
    model = get_model(case.model)
    ckpt = resolve_checkpoint(model, case.flags.get("quantization"))
    return {
        "attention": "mla" if model.is_mla else "gqa",
        "weights": "fp8" if ckpt.weight_format == "fp8_block" else ckpt.weight_format,
        "kv_cache": "fp8" if "fp8" in str(plan.kv_cache_dtype) else "bf16",
        "mem_fraction_static": "explicit" if flag_float(case.flags, "mem-fraction-static") else "default",
        "max_total_tokens": "set" if case.flags.get("max-total-tokens") else "unset",
        "hicache": "on" if case.flags.get("enable-hierarchical-cache") else "off",
    }


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return (pred - meas) / meas


def evaluate(case: PlannerCase) -> dict:
    row: dict[str, Any] = {"label": case.label, "source": case.source, "flags": case.flags,
                           "sglang_version": case.sglang_version, "notes": list(case.notes)}
    try:
        plan = plan_memory(case.model, get_gpu(case.gpu), case.gpus, case.flags, nodes=case.nodes,
                           host_memory_gb=case.host_memory_gb, sglang_version=case.sglang_version)
    except ConfigError as exc:
        row.update(error=str(exc))
        return row
    measured_kv = case.max_total_num_tokens if case.started else (case.kv_tokens_allocated or None)
    row.update({
        "dimensions": dimensions(case, plan),
        "predicted": {"kv_tokens": plan.kv_capacity_tokens_per_gpu, "weight_gib": plan.weights_gb_per_gpu * 1e9 / GIB,
                      "mem_fraction_static": plan.mem_fraction_static, "fits": plan.fits,
                      "reason": plan.reason if not plan.fits else ""},
        "measured": {"kv_tokens": measured_kv, "kv_tokens_is": "max_total_num_tokens" if case.started else
                     "allocated before start-up failed", "weight_gib": case.weight_gib, "kv_gib": case.kv_gib,
                     "started": case.started, "served": case.served, "failure": case.failure},
    })
    row["kv_error"] = _err(plan.kv_capacity_tokens_per_gpu, measured_kv)
    row["weight_error"] = _err(row["predicted"]["weight_gib"], case.weight_gib)
    outcome = case.served if case.served is not None else case.started
    row["fits_agrees"] = None if outcome is None else plan.fits == outcome
    row["within_target"] = (row["fits_agrees"] is not False
                            and (row["kv_error"] is None or abs(row["kv_error"]) <= TOLERANCE)
                            and (row["weight_error"] is None or abs(row["weight_error"]) <= TOLERANCE))
    return row


def coverage(rows: list[dict]) -> dict[str, dict[str, int]]:
    seen: dict[str, dict[str, int]] = {k: {v: 0 for v in vals} for k, vals in REQUIRED.items()}
    for r in rows:
        for k, v in (r.get("dimensions") or {}).items():
            if k in seen and v in seen[k]:
                seen[k][v] += 1
    return seen


def run_planner_bench(dirs: Iterable[str | Path]) -> dict:
    dirs = list(dirs)
    dbs, _ = find_sources(dirs)
    cases: list[PlannerCase] = []
    for db in dbs:
        cases += cases_from_database(db)
    for probe in find_planner_probes(dirs):
        cases.append(cases_from_probe(probe))
    if not cases:
        raise UserError(f"no real SGLang start-ups found under {', '.join(map(str, dirs))}: need study databases "
                        "with launched sglang trials, or planner probes (planner/*.json)")
    rows = [evaluate(c) for c in cases]
    cov = coverage(rows)
    kv = [abs(r["kv_error"]) for r in rows if r.get("kv_error") is not None]
    w = [abs(r["weight_error"]) for r in rows if r.get("weight_error") is not None]
    fits = [r["fits_agrees"] for r in rows if r.get("fits_agrees") is not None]
    missing = {k: [v for v, n in vals.items() if not n] for k, vals in cov.items()}
    missing = {k: v for k, v in missing.items() if v}
    checks = {
        "configurations": len(rows) >= MIN_CONFIGURATIONS,
        "coverage": not missing,
        "kv_within_1pct": bool(kv) and max(kv) <= TOLERANCE,
        "weights_within_1pct": bool(w) and max(w) <= TOLERANCE,
        "fits_agree": bool(fits) and all(fits),
    }
    return {"rows": rows, "configurations": len(rows), "coverage": cov, "missing": missing,
            "max_abs_kv_error": max(kv) if kv else None, "max_abs_weight_error": max(w) if w else None,
            "fits_agreement": (sum(fits) / len(fits)) if fits else None, "checks": checks,
            "passed": all(checks.values()) and not any(r.get("error") for r in rows),
            "sources": [str(d) for d in dbs] + [str(p) for p in find_planner_probes(dirs)]}


def format_planner_report(doc: dict) -> str:
    pct = lambda v: "-" if v is None else f"{v:+.2%}"
    head = (f"{'configuration':<26}{'attn':>5}{'W':>5}{'KV':>5}{'mfs':>9}{'max-tot':>8}{'hicache':>8}"
            f"{'KV tokens pred / SGLang':>28}{'err':>8}{'weights GiB pred / SGLang':>28}{'err':>8}"
            f"{'fits pred / real':>21}")
    lines = [head]
    for r in doc["rows"]:
        if r.get("error"):
            lines.append(f"{r['label'][:25]:<26} planner refused it: {r['error']}")
            continue
        d, p, m = r["dimensions"], r["predicted"], r["measured"]
        kv_meas = "-" if m["kv_tokens"] is None else f"{m['kv_tokens']:,}" + ("" if m["started"] else "*")
        w_meas = "-" if m["weight_gib"] is None else f"{m['weight_gib']:.2f}"
        yn = lambda v: "-" if v is None else ("yes" if v else "no")
        # "served": started and served its load points; "started": a probe, which only starts
        real = lambda m: ("died serving" if m["started"] and m.get("served") is False
                          else yn(m["started"]))
        lines.append(f"{r['label'][:25]:<26}{d['attention']:>5}{d['weights']:>5}{d['kv_cache']:>5}"
                     f"{d['mem_fraction_static']:>9}{d['max_total_tokens']:>8}{d['hicache']:>8}"
                     f"{p['kv_tokens']:>14,} / {kv_meas:>11}{pct(r['kv_error']):>8}"
                     f"{p['weight_gib']:>14.2f} / {w_meas:>11}{pct(r['weight_error']):>8}"
                     f"{yn(p['fits']) + ' / ' + real(m):>21}" + ("" if r["within_target"] else "  !"))
        if not p["fits"]:
            lines.append(f"{'':<26}planner: {p['reason']}")
        if m["failure"]:
            lines.append(f"{'':<26}SGLang: {m['failure'][:160]}")
    lines.append("(* KV tokens SGLang allocated before its start-up failed)")
    pc = lambda v: "-" if v is None else f"{v:.2%}"
    lines.append("")
    lines.append(f"{doc['configurations']} configurations (target >= {MIN_CONFIGURATIONS}); max |KV error| "
                 f"{pc(doc['max_abs_kv_error'])}, max |weight error| {pc(doc['max_abs_weight_error'])} "
                 f"(target <= {TOLERANCE:.0%}); fits verdict right on {pc(doc['fits_agreement'])}")
    cov = ", ".join(f"{k} {'/'.join(f'{v}:{n}' for v, n in vals.items())}" for k, vals in doc["coverage"].items())
    lines.append(f"coverage: {cov}")
    if doc["missing"]:
        lines.append("not covered yet: " + "; ".join(f"{k} {', '.join(v)}" for k, v in doc["missing"].items())
                     + " (run `tuner bench planner-probe probes/planner-matrix-h200.yaml` on the GPU)")
    return "\n".join(lines)


__all__ = ["PROBE_FORMAT", "PlannerCase", "cases_from_database", "cases_from_probe", "evaluate",
           "format_planner_report", "run_planner_bench"]
