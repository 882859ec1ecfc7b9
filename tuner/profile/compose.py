"""Composition check: does the per-operator sum of a profile add up to whole forward steps?

Whole steps come from SGLang's one-batch benchmark (``python -m sglang.bench_one_batch ...
--result-filename FILE``: JSON lines with ``batch_size``, ``input_len``, ``output_len``,
``prefill_latency`` and ``median_decode_latency``) or from timed server steps (JSON lines
``{"kind": "decode", "batch": B, "context": C, "seconds": S}`` or ``{"kind": "prefill", "batch": B,
"new_tokens": N, "prefix": P, "seconds": S}``). Each step is predicted by the simulator's own
step-time model restricted to this one profile, without the overheads no table measures, and the
relative error is reported. ``fit_step_overhead`` stores what the operators do not explain (the
decode residual per batch size) in the profile as its ``step_overhead`` table.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.errors import ConfigError
from tuner.catalog import get_gpu, get_model
from tuner.planner import parse_layout, plan_memory
from tuner.sim.calibrate import load_calibration
from tuner.sim.optable import OpTables, load_profile
from tuner.sim.simulate import build_step_model
from tuner.sim.wholesteps import WholeStep, read_whole_steps, step_work
from tuner.sim.optable import clear_cache, parse_profile
from .runner import write_profile

TOLERANCE = 0.10


def _paths(profile_path) -> list:
    return list(profile_path) if isinstance(profile_path, (list, tuple)) else [profile_path]


def _step_model(profile_path, model_overrides: dict | None = None, load_format: str | None = None):
    """The step-time model over the first profile's configuration and the tables of every profile
    given (e.g. a fused-MoE table timed under another routing, in a file of its own)."""
    paths = _paths(profile_path)
    profile_path = paths[0]
    pf = load_profile(profile_path)
    more = [load_profile(p) for p in paths[1:]]
    doc = json.loads(Path(profile_path).read_text())
    if not pf.model:
        raise ConfigError("the profile names no model; composition needs one", file=str(profile_path), key="model")
    # the operators are keyed by shape, so a profile of the full model also covers a variant with
    # fewer layers (the whole steps of a model too large for one GPU are measured on such a variant)
    ref = {"name": pf.model, "overrides": dict(model_overrides)} if model_overrides else pf.model
    model, gpu = get_model(ref), get_gpu(pf.gpu)
    flags = dict(doc.get("flags") or {"tp-size": pf.parallel.get("tp_size", 1)})
    if load_format:  # the weights the whole steps ran (random weights route a biased gate's tokens to few experts)
        flags["load-format"] = load_format
    gpus = int(flags.get("tp-size", 1)) * int(flags.get("dp-size", 1))
    plan = plan_memory(model, gpu, gpus, flags, sglang_version=pf.sglang_version)
    layout = parse_layout(model, flags, gpus)
    st = build_step_model(model, gpu, plan, layout, flags, {}, load_calibration(gpu.name), gpus, pf.sglang_version,
                          op_tables=OpTables([pf, *more]))
    return st, pf, doc


def compose(profile_path, steps: list[WholeStep], model_overrides: dict | None = None,
            load_format: str | None = None) -> dict:
    """Per-op sum against whole steps: one row per step, the mean absolute error, and whether it
    is within 10 %. ``profile_path``: one profile, or several (the first names the configuration).
    ``model_overrides`` (config.json keys, e.g. ``num_hidden_layers``) name the model variant the
    whole steps ran, ``load_format`` the weights it ran with."""
    st, pf, _ = _step_model(profile_path, model_overrides, load_format)
    rows = []
    for s in steps:
        st._src = {c: [0, 0] for c in st._src}
        predicted = st.gpu_time(step_work(s), overheads=False)
        summary = st.source_summary()
        rows.append({"kind": s.kind, "batch": s.batch, "tokens": s.tokens, "prefix": s.prefix,
                     "measured_s": s.seconds, "per_op_sum_s": predicted,
                     "error": (predicted - s.seconds) / s.seconds, "source": s.source,
                     "ops_from_roofline": sorted(k for k, v in summary["ops"].items() if v != "profile"),
                     "moe_table_routed_pool": (st.moe_table.shape.get("routed_pool")
                                               if getattr(st, "moe_table", None) is not None else None)})
    def mean_abs(kind=None):
        vals = [abs(r["error"]) for r in rows if kind is None or r["kind"] == kind]
        return sum(vals) / len(vals) if vals else None

    overall = mean_abs()
    return {"profile": str(_paths(profile_path)[0]), "profiles": [str(p) for p in _paths(profile_path)],
            "load_format": load_format, "model_overrides": dict(model_overrides or {}), "rows": rows,
            "mean_abs_error": overall, "mean_abs_error_decode": mean_abs("decode"),
            "mean_abs_error_prefill": mean_abs("prefill"),
            "tolerance": TOLERANCE, "within_tolerance": overall is not None and overall <= TOLERANCE}


def fit_step_overhead(profile_path, steps: list[WholeStep], model_overrides: dict | None = None,
                      load_format: str | None = None) -> dict:
    """Store the decode residual (whole step minus per-op sum, per batch size) and the whole steps
    in the (first) profile; returns the updated document (written back to it)."""
    st, pf, doc = _step_model(profile_path, model_overrides, load_format)
    profile_path = _paths(profile_path)[0]
    resid: dict[int, list[float]] = {}
    for s in steps:
        if s.kind != "decode":
            continue
        r = s.seconds - st.gpu_time(step_work(s), overheads=False)
        resid.setdefault(s.batch, []).append(max(r, 1e-6))
    doc["ops"] = [o for o in doc["ops"] if o["op"] != "step_overhead"]
    if resid:
        batches = sorted(resid)
        doc["ops"].append({"op": "step_overhead", "shape": {"model": pf.model, "tp": pf.parallel.get("tp_size", 1)},
                           "axes": ["batch"], "grid": {"batch": batches},
                           "us": [round(sum(resid[b]) / len(resid[b]) * 1e6, 3) for b in batches]})
    doc["whole_steps"] = [s.__dict__ for s in steps]
    parse_profile(doc, profile_path)
    write_profile(doc, profile_path)
    clear_cache()
    return doc
