"""The ledger of trust: the simulator's predictions beside a study's real measurements.

Every real load point carries the simulator's prediction of it (``extra.simulator_prediction``,
written by ``tuner.evaluation.prediction``; older databases can be filled in with ``tuner db
predict``). From those this module builds what the reports show: predicted against measured per
load point, and the study's running fidelity (the MAPEs and verdict agreement of every load
point so far). ``simulator_trust`` says how far the calibrated simulator has been checked for a
study's configuration context, for ``--warm-start-from-simulator``.
"""

from __future__ import annotations

from typing import Any

import yaml

from tuner.catalog import get_gpu, get_model
from tuner.config.schema import StudySpec
from tuner.evaluation.prediction import PREDICTION_KEY, predict
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.measured import ran_on_fresh_server, stored_cached_kernels, warmup_of
from tuner.storage import repo
from tuner.vocabulary import BackendKind
from tuner.workload.metrics import SPREAD_KEY, verdict_marginal

COMPARED = ("p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s", "prefix_cache_hit_rate")
TARGETS = {"p90_ttft_s": 0.20, "p90_tpot_s": 0.10, "verdict_agreement": 0.95}  # as tuner bench fidelity


def prediction_of(extra: dict | None) -> dict | None:
    p = (extra or {}).get(PREDICTION_KEY)
    return p if isinstance(p, dict) else None


def ledger_rows(trials: list[dict], slo: dict | None = None) -> list[dict]:
    """One row per real, valid load point with a stored prediction: trial, users, the predicted
    and measured values and their relative errors, both verdicts. With the study's ``slo``
    (``p90_ttft_s``, ``p90_tpot_s``) each row also says whether its measured verdict is marginal,
    one its window's own noise could turn (``metrics.verdict_marginal``; None: no intervals)."""
    rows = []
    for t in sorted(trials, key=lambda t: t["number"]):
        if t.get("backend_kind") == BackendKind.SIMULATOR.value:
            continue
        for m in t.get("measurements") or []:
            pred = m.get(PREDICTION_KEY)
            if not m.get("valid") or not isinstance(pred, dict):
                continue
            row = {"trial": t["number"], "users": m["users"], "step": m.get("step"), "measured_meets": m["meets_slo"],
                   "predicted_meets": pred.get("meets_slo"), "error": pred.get("error"),
                   "calibration": pred.get("calibration") or [], "measured": {}, "predicted": {}, "rel_error": {}}
            for k in COMPARED:
                meas, p = m.get(k), pred.get(k)
                row["measured"][k], row["predicted"][k] = meas, p
                row["rel_error"][k] = None if meas in (None, 0) or p is None else (p - meas) / meas
            row["measured_marginal"] = None if not slo else verdict_marginal(
                bool(m["meets_slo"]), (m.get("p90_ttft_s"), m.get("p90_tpot_s")), m.get(SPREAD_KEY),
                (slo["p90_ttft_s"], slo["p90_tpot_s"]))
            rows.append(row)
    return rows


def running_fidelity(rows: list[dict]) -> dict[str, Any]:
    """MAPE per metric and verdict agreement over every row so far (None when there are none)."""
    mape = {}
    for k in COMPARED:
        errs = [abs(r["rel_error"][k]) for r in rows if r["rel_error"].get(k) is not None]
        mape[k] = sum(errs) / len(errs) if errs else None
    judged = [r for r in rows if r["predicted_meets"] is not None and not r["error"]]
    verdicts = [r["measured_meets"] == r["predicted_meets"] for r in judged]
    agreement = sum(verdicts) / len(verdicts) if verdicts else None
    decided = [r["measured_meets"] == r["predicted_meets"] for r in judged if r.get("measured_marginal") is False]
    return {"load_points": len(rows), "mape": mape, "verdict_agreement": agreement,
            # not a target: on the points whose own window decides the measured verdict (bench fidelity's split)
            "verdicts_decided": {"points": len(decided), "agreement": sum(decided) / len(decided) if decided else None,
                                 "marginal_points": sum(1 for r in judged if r.get("measured_marginal"))},
            "unpredictable": sum(1 for r in rows if r["error"]),
            "within_targets": (None if not rows or mape["p90_ttft_s"] is None else
                               mape["p90_ttft_s"] <= TARGETS["p90_ttft_s"]
                               and (mape["p90_tpot_s"] or 0) <= TARGETS["p90_tpot_s"]
                               and (agreement or 0) >= TARGETS["verdict_agreement"])}


def simulator_trust(spec) -> dict[str, Any]:
    """Which calibration the simulator uses for this study's configurations and how far it has
    been checked against real measurements (the fitted entry's ``checked`` record)."""
    options = getattr(spec, "backend_options", None) or {}
    flags = {**(options.get("server_flags") or {}), **(getattr(spec, "baseline", None) or {})}
    model, gpu = get_model(spec.model), get_gpu(spec.hardware.gpu)
    context = calibration_context(model, gpu, flags, options.get("sglang_version"))
    cal = load_calibration(gpu.name, options.get("calibration"), context=context)
    return {"context": context, "fitted": list(cal.get("fitted_applied") or []),
            "fitted_on": cal.get("fitted_on"),  # another GPU of the same architecture, or None
            "checked": list(cal.get("fitted_checks") or []),
            "rechecked": list(cal.get("fitted_rechecks") or []),
            "checked_here": list(cal.get("fitted_checks_here") or [])}  # a transferred entry's, on this GPU


def trust_line(spec) -> str:
    """One line for the console: what the warm start's simulator has been checked against."""
    t = simulator_trust(spec)
    c = t["context"]
    where = (f"SGLang {c['sglang_version']}, {c['attention_backend']} attention, "
             f"{'prefill CUDA graphs' if c['prefill_cuda_graph'] else 'eager prefill'}")
    if not t["fitted"]:
        return (f"simulator: not calibrated on real servers for {where}; its step times are rooflines with "
                "UNVERIFIED efficiencies (docs/calibration.md), so treat its ranking as a rough guess")
    parts = []
    for chk in t["checked"]:
        fig = _figures(chk)
        held = chk.get("held_out") or {}
        if held:
            hm = held.get("mape") or {}
            fig += (f"; held out by {held.get('by')}: P90 TTFT {hm.get('p90_ttft_s', 0):.0%}, "
                    f"P90 TPOT {hm.get('p90_tpot_s', 0):.0%}")
        parts.append(f"{fig} over {chk.get('load_points')} real load points ({chk.get('date', '?')})")
    later = [f"{_figures(chk)} over {chk.get('load_points')} real load points ({chk.get('date', '?')})"
             for chk in t.get("rechecked") or []]
    if t.get("fitted_on"):  # its checks were on the other GPU's load points
        here = [f"{_figures(chk)} over {chk.get('load_points')} real load points ({chk.get('date', '?')})"
                for chk in t.get("checked_here") or []]
        where += (f", on {t['fitted_on']} (the same GPU architecture as this study's; "
                  + (f"checked on {spec.hardware.gpu} itself: " + "; ".join(here) if here
                     else f"not yet checked on {spec.hardware.gpu} itself") + ")")
    return (f"simulator: calibrated for {where} ({', '.join(t['fitted'])}); checked: "
            + ("; ".join(parts) if parts else "no fidelity record")
            + ("; rechecked by today's simulator: " + "; ".join(later) if later else ""))


def _figures(chk: dict) -> str:
    m = chk.get("mape") or {}
    return (f"P90 TTFT MAPE {m.get('p90_ttft_s', 0):.0%}, P90 TPOT MAPE {m.get('p90_tpot_s', 0):.0%}, "
            f"verdicts {chk.get('verdict_agreement', 0):.0%}")


def backfill_predictions(engine, *, study: str | None = None, force: bool = False, progress=None) -> dict[str, int]:
    """Store the simulator's prediction in every real, valid measurement that lacks one (or every
    one with ``force``), as a study run would have: the study's seed, trial and step give the
    replay's seed, the study's window its warm-up and duration. Returns counts per outcome."""
    counts = {"predicted": 0, "kept": 0, "unpredictable": 0}
    for row in repo.list_studies(engine):
        if study is not None and row.name != study:
            continue
        spec = StudySpec.model_validate(yaml.safe_load(row.spec_yaml))
        trials = {t.trial_number: t for t in repo.trials(engine, row.name)}
        rows = repo.measurements(engine, row.name)
        first_step: dict[int, int] = {}
        for m in rows:  # one server per trial: its first load point ran on a fresh server
            first_step[m.trial_number] = min(m.step, first_step.get(m.trial_number, m.step))
        for m in rows:
            t = trials.get(m.trial_number)
            if m.backend_kind == BackendKind.SIMULATOR.value or not m.valid or t is None:
                continue
            if prediction_of(m.extra) is not None and not force:
                counts["kept"] += 1
                continue
            fid = max(0.05, min(1.0, m.fidelity or 1.0))
            fresh = ran_on_fresh_server(m, first_step)
            cached = stored_cached_kernels(m.extra, f"{row.name}#{m.trial_number}@{m.users}") if fresh else None
            pred = predict(spec, t.flags or {}, t.knobs or {}, m.users, warmup_s=warmup_of(m, spec, fid),
                           duration_s=m.duration_s, seed=spec.seed + m.trial_number + 1009 * m.step,
                           fresh_server=fresh, cached_kernels=cached)
            pred["backfilled"] = True
            repo.set_measurement_extra(engine, m.id, {**(m.extra or {}), PREDICTION_KEY: pred})
            counts["unpredictable" if pred.get("error") else "predicted"] += 1
            if progress:
                progress(f"{row.name} trial {m.trial_number} at {m.users} users: "
                         + (pred["error"] if pred.get("error") else f"P90 TTFT {pred['p90_ttft_s']:.3f} s predicted, "
                            f"{m.p90_ttft_s:.3f} s measured"))
    return counts
