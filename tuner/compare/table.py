"""The comparison itself, as one JSON-ready document: per study its hardware and quantization, its
best capacity per node and per GPU, the best configuration, its bottleneck, its KV capacity, the
cost per served user-hour where costs are given, and its capacity against scaled targets (from the
stored load points, tuner.explain.whatif)."""

from __future__ import annotations

import tuner
from tuner import catalog
from tuner.compare.plan import ComparePlan, Entry
from tuner.compare.run import Adapted, Ran, adapt
from tuner.errors import ConfigError
from tuner.explain import Bound, LoadPoint, best_of, what_if
from tuner.lifecycle import TrialStatus
from tuner.planner import plan_memory
from tuner.study.proposer import config_key
from tuner.study.summary import study_summary

# targets as multiples of each study's own, for the capacity-against-target chart
SLO_SCALES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
SCALED = ("both", "ttft", "tpot")  # which targets are scaled (the other stays the study's)
WEIGHT_LABELS = {"bf16": "BF16", "fp8_block": "FP8", "nvfp4": "NVFP4"}


def quantization_of(model_name, flag: str | None) -> dict:
    """The checkpoint a ``--quantization`` value loads: its flag, label and weight format."""
    try:
        model = catalog.get_model(model_name)
    except ConfigError:
        return {"flag": flag, "label": str(flag or "default"), "weight_format": None}
    for ckpt in model.checkpoints.values():
        if ckpt.sglang_quantization == flag:
            return {"flag": flag, "label": WEIGHT_LABELS.get(ckpt.weight_format, ckpt.weight_format),
                    "weight_format": ckpt.weight_format, "checkpoint": ckpt.hf_id}
    return {"flag": flag, "label": str(flag or "default"), "weight_format": None}


def capacity_vs_slo(summary: dict) -> list[dict]:
    """Best capacity over the study's trials at scaled targets, each with how the stored points
    cover it (never extrapolated)."""
    slo = summary["slo"]
    res = (summary.get("capacity_search") or {}).get("resolution_users") or 1
    points = {t["number"]: [LoadPoint.of(m) for m in t["measurements"]] for t in summary["trials"]}
    out = []
    for mode in SCALED:
        for k in SLO_SCALES:
            ttft = slo["p90_ttft_s"] * (k if mode in ("both", "ttft") else 1.0)
            tpot = slo["p90_tpot_s"] * (k if mode in ("both", "tpot") else 1.0)
            best = best_of([what_if(n, pts, ttft, tpot, res) for n, pts in points.items() if pts])
            out.append({"mode": mode, "scale": k, "p90_ttft_s": ttft, "p90_tpot_s": tpot,
                        "capacity_users": best.capacity_users if best else None,
                        "upper_bound_users": best.upper_bound_users if best else None,
                        "coverage": best.coverage.value if best else "no_points",
                        "trial": best.trial if best else None})
    return out


def kv_room(spec, quantization: str | None) -> list[dict]:
    """The planner's KV capacity of this checkpoint at each attention-DP size the study searches,
    with SGLang's defaults otherwise (expert parallelism over the node's GPUs under attention DP):
    how much room the weights leave for context. No trial needed."""
    hw = spec.hardware
    space = spec.space().params
    tps = [v for v in (space["tp-size"].grid() if "tp-size" in space else [hw.gpus_per_node]) if v]
    tp = max(tps) if tps else hw.gpus_per_node
    sizes = sorted({v for v in (space["attn-dp-size"].grid() if "attn-dp-size" in space else [1]) if v and tp % v == 0})
    version = (spec.backend_options or {}).get("sglang_version")
    out = []
    for dp in sizes or [1]:
        flags = {"tp-size": tp, "quantization": quantization}
        if dp > 1:
            flags.update({"attn-dp-size": dp, "ep-size": tp})
        try:
            plan = plan_memory(spec.model, hw.gpu, hw.gpus_per_node, flags, nodes=hw.nodes,
                               host_memory_gb=hw.host_memory_gb, sglang_version=version)
        except ConfigError as exc:
            out.append({"attn_dp_size": dp, "fits": False, "reason": str(exc), "kv_tokens_total": None,
                        "kv_tokens_per_pool": None})
            continue
        out.append({"attn_dp_size": dp, "fits": plan.fits, "reason": None if plan.fits else plan.reason,
                    "kv_tokens_total": plan.kv_capacity_tokens_total if plan.fits else None,
                    "kv_tokens_per_pool": plan.kv_capacity_tokens_per_gpu if plan.fits else None,
                    "mem_fraction_static": plan.mem_fraction_static})
    return out


def _pools(flags: dict) -> int:
    try:
        return max(1, int(flags.get("attn-dp-size") or 1)) * max(1, int(flags.get("dp-size") or 1))
    except (TypeError, ValueError):
        return 1


def study_row(entry: Entry, ran: Ran | None, summary: dict, costs: dict[str, float]) -> dict:
    spec = entry.spec
    hw = spec.hardware
    gpus = hw.gpus_per_node * hw.nodes
    best, base = summary.get("best"), summary.get("baseline")
    qflag = spec.baseline.get("quantization")
    if best:
        qflag = best["params"].get("quantization") or best["flags"].get("quantization")
    space_q = spec.space().params.get("quantization")
    searched = [quantization_of(spec.model, q)["label"] for q in space_q.grid()] if space_q else []
    row = {
        "name": spec.name, "given_as": entry.given_as, "action": ran.action.value if ran else entry.action.value,
        "backend_kind": summary["backend_kind"], "status": summary["status"],
        "model": spec.model if isinstance(spec.model, str) else getattr(spec.model, "name", str(spec.model)),
        "hardware": {"gpu": hw.gpu, "gpus_per_node": hw.gpus_per_node, "nodes": hw.nodes, "gpus": gpus},
        "quantization": quantization_of(spec.model, qflag) if best else None,
        "quantizations_searched": searched,
        "slo": summary["slo"], "target_users": summary["target_users"],
        "trials": {"launched": summary["trials_launched"], "budget": summary["trials_budget"],
                   "by_status": summary["counts"]},
        "baseline_capacity_users": base["capacity_users"] if base else None,
        "best": None, "kv_capacity_tokens": None, "bottleneck": None, "cost": None,
        "wall_time_s": ran.wall_time_s if ran else 0.0,
        "kv_room_by_attention_dp": kv_room(spec, qflag),
        "capacity_vs_slo": capacity_vs_slo(summary),
    }
    if not best:
        return row
    cap = best["capacity_users"]
    base_params = (base or {}).get("params") or {}
    row["best"] = {
        "trial": best["number"], "is_baseline": best["is_baseline"], "capacity_users": cap,
        "capacity_per_node": cap / hw.nodes, "capacity_per_gpu": cap / gpus if gpus else None,
        "params": {k: v for k, v in best["params"].items() if v is not None},
        "changes_from_baseline": {k: v for k, v in best["params"].items() if base is not None and base_params.get(k) != v},
        "at_capacity": best.get("at_capacity"),
        "at_search_limit": _at_search_limit(best),  # the capacity is a lower bound
    }
    at = best.get("at_capacity") or {}
    total = best.get("measured_kv_capacity_tokens") or at.get("kv_capacity_tokens_total") \
        or best.get("predicted_kv_capacity_tokens")
    pools = _pools(best["flags"])
    row["kv_capacity_tokens"] = {"total": total, "pools": pools, "per_pool": total / pools if total else None,
                                 "predicted": best.get("predicted_kv_capacity_tokens"),
                                 "measured": best.get("measured_kv_capacity_tokens")}
    b = best.get("bottleneck") or {}
    row["bottleneck"] = {"binding": b.get("binding"), "bound": b.get("bound"), "sentence": b.get("sentence"),
                         "not_measured": b.get("not_measured") or []}
    cost = costs.get(hw.gpu.lower())
    if cost is not None:
        node_hour = cost * gpus
        row["cost"] = {"per_gpu_hour": cost, "per_node_hour": cost * hw.gpus_per_node, "per_deployment_hour": node_hour,
                       "per_user_hour": node_hour / cap if cap else None}
    return row


def _at_search_limit(trial: dict) -> bool:
    return ((trial.get("bottleneck") or {}).get("bound")) == Bound.SEARCH_LIMIT.value


def _ran_as(trials: list[dict], config: dict) -> dict | None:
    """The trial of ``trials`` that ran ``config``: the completed one that served most, else the
    latest launch (pruned, failed ...)."""
    key = config_key(config)
    same = [t for t in trials if t["launched"] and config_key(t["params"]) == key]
    done = [t for t in same if t["status"] == TrialStatus.COMPLETE]
    if done:
        return max(done, key=lambda t: (t["capacity_users"] or 0, -t["number"]))
    return same[-1] if same else None


def same_configuration(plan: ComparePlan, summaries: dict[str, dict]) -> list[dict]:
    """Each study's best configuration (when it is not its baseline) as every compared study ran
    it, from storage: the configuration adapted to that study (its own checkpoint, a HiCache ratio
    its host memory holds), the trial that ran it, its status and capacity; or why it cannot run
    there, or that it was not tried (``--cross-seed`` runs it)."""
    out = []
    for e in plan.entries:
        best = summaries[e.spec.name]["best"]
        if not best or best["is_baseline"]:
            continue
        cells = []
        for other in plan.entries:
            gpus = other.spec.hardware.gpus_per_node * other.spec.hardware.nodes
            a = Adapted(dict(best["params"])) if other is e else adapt(best["params"], other.spec)
            cell = {"study": other.spec.name, "params": a.config, "changed": list(a.changed), "reason": a.reason,
                    "trial": None, "status": None, "capacity_users": None, "capacity_per_gpu": None,
                    "at_search_limit": False}
            t = _ran_as(summaries[other.spec.name]["trials"], a.config) if a.config is not None else None
            if t is not None:
                cap = t["capacity_users"]
                cell.update(trial=t["number"], status=t["status"], capacity_users=cap,
                            capacity_per_gpu=cap / gpus if cap is not None and gpus else None,
                            at_search_limit=_at_search_limit(t))
            elif a.config is not None:
                cell["reason"] = "not tried (tuner compare --cross-seed runs it)"
            cells.append(cell)
        out.append({"source": e.spec.name, "source_trial": best["number"], "params": best["params"],
                    "capacity_users": best["capacity_users"], "in": cells})
    return out


def build(plan: ComparePlan, ran: list[Ran], storage: str, cross_seeded: dict[str, list[dict]] | None = None) -> dict:
    by_name = {r.name: r for r in ran}
    rows = []
    summaries = {e.spec.name: study_summary(storage, e.spec.name) for e in plan.entries}
    for e in plan.entries:
        summary = summaries[e.spec.name]
        row = study_row(e, by_name.get(e.spec.name), summary, plan.gpu_hour_cost)
        row["cross_seeded"] = [{"from": x["from"], "trial": x["trial"], "params": x["params"]}
                               for x in (cross_seeded or {}).get(e.spec.name, [])]
        rows.append(row)
    served = [r for r in rows if r["best"]]
    per_gpu = sorted(served, key=lambda r: -(r["best"]["capacity_per_gpu"] or 0))
    costed = sorted((r for r in served if r["cost"] and r["cost"]["per_user_hour"]),
                    key=lambda r: r["cost"]["per_user_hour"])
    workload = plan.entries[0].spec.workload_profile()
    return {
        "comparison": plan.name, "description": plan.description, "tuner_version": tuner.__version__,
        "workload": {"name": workload.name, "description": workload.description},
        "gpu_hour_cost": plan.gpu_hour_cost,
        "studies": rows,
        "ranking": {"capacity_per_gpu": [r["name"] for r in per_gpu],
                    "cost_per_user_hour": [r["name"] for r in costed]},
        "slo_scales": list(SLO_SCALES),
        "cross_seed": plan.cross_seed,
        "same_configuration": same_configuration(plan, summaries),
        "notes": plan.notes + _backend_notes(rows) + _limit_notes(rows),
    }


def _backend_notes(rows: list[dict]) -> list[str]:
    kinds = {r["backend_kind"] for r in rows}
    if len(kinds) <= 1:
        return []
    return ["the studies ran on different backends (" + ", ".join(f"{r['name']}: {r['backend_kind']}" for r in rows)
            + "): simulated and measured capacities are compared as they are"]


def _limit_notes(rows: list[dict]) -> list[str]:
    at = [r for r in rows if r["best"] and r["best"]["at_search_limit"]]
    return [f"{r['name']} meets both targets at its capacity search's largest user count "
            f"({r['best']['capacity_users']}): its capacity is at least that (raise capacity.max_users to find "
            "where it ends)" for r in at]
