"""Fidelity benchmark: the simulator's predictions against real SGLang measurements.

The measurements are read by ``tuner.sim.measured`` (study databases of any schema version, and
``tuner-probe/1`` files). For each load point the same configuration, workload, user count, seed
and window is re-simulated (``tuner.sim.simulate_load_point``, with the trial's SGLang version)
and predicted P50/P90 TTFT, P90 TPOT, throughput and prefix-cache hit rate are compared with the measurement: absolute percentage
error per point, MAPE per metric, and whether the SLO verdict agrees. Beside them it shows
SGLang's own per-request stages (queue time, prefill forward, TTFT means from ``/metrics``)
against the simulator's, which says which part of TTFT is off. Targets: P90 TTFT MAPE <= 20 %,
P90 TPOT MAPE <= 10 %, verdicts agree on >= 95 % of points.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError, UserError
from tuner.planner.parallel import flag_bool
from tuner.sim import simulate_load_point
from tuner.sim.stepfit import calibrate
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.hostlink import load_back_counters
from tuner.workload.metrics import verdict_marginal
from tuner.sim.measured import (METRICS, PROBE_FORMAT, REAL_BACKENDS, LoadPoint, TrialSelection, extra_args_to_flags,
                                find_sources, format_metric, load_points, points_from_database, points_from_probe,
                                trial_label)

log = logging.getLogger(__name__)

TARGETS = {"p90_ttft_s_mape_max": 0.20, "p90_tpot_s_mape_max": 0.10, "verdict_agreement_min": 0.95}
# seeds of the window-noise estimate: other workload samples of the same load point, far apart
NOISE_SEED_STRIDE = 100_003
NOISE_METRICS = ("p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s")
# a point whose measured P90s are this close to an SLO limit has a verdict that a prediction within the
# TPOT target (10 %) may flip either way; the share of agreeing verdicts is also given without them
SLO_MARGIN = 0.10


@dataclass
class PointResult:
    point: LoadPoint
    predicted: dict = field(default_factory=dict)
    ape: dict = field(default_factory=dict)
    measured_meets: bool | None = None
    predicted_meets: bool | None = None
    error: str | None = None
    step_time_source: str | None = None
    calibration_applied: list[str] = field(default_factory=list)  # the fitted entries its prediction used
    calibration_fitted_on: str | None = None  # where they were fitted on another GPU (same architecture)
    calibration_fitted_trials: list[str] = field(default_factory=list)  # the trials those entries were fitted on
    predicted_stages: dict | None = None  # the simulator's per-request stage means (SGLang's /metrics)
    predicted_hicache: dict | None = None  # HiCache servers: the simulator's load-back over the load point

    @property
    def clear_of_slo(self) -> bool | None:
        """Both measured P90s farther than ``SLO_MARGIN`` (relative) from their limits."""
        p = self.point
        ttft, tpot = p.measured.get("p90_ttft_s"), p.measured.get("p90_tpot_s")
        if ttft is None or tpot is None:
            return None
        return abs(ttft / p.p90_ttft_slo_s - 1) > SLO_MARGIN and abs(tpot / p.p90_tpot_slo_s - 1) > SLO_MARGIN

    @property
    def measured_marginal(self) -> bool | None:
        """Whether the measured verdict is one its own window's sampling noise could turn (an SLO limit
        inside a P90's 90% interval: ``metrics.verdict_marginal``, the capacity search's rule); None
        where the window recorded no intervals."""
        p = self.point
        if self.measured_meets is None:
            return None
        return verdict_marginal(self.measured_meets, (p.measured.get("p90_ttft_s"), p.measured.get("p90_tpot_s")),
                                p.p90_spread, (p.p90_ttft_slo_s, p.p90_tpot_slo_s))

    @property
    def verdict_agrees(self) -> bool | None:
        if self.error or self.measured_meets is None:
            return None
        return self.measured_meets == self.predicted_meets

    def off_target(self) -> list[str]:
        out = []
        if self.error:
            return ["no prediction"]
        if (self.ape.get("p90_ttft_s") or 0) > TARGETS["p90_ttft_s_mape_max"]:
            out.append("p90_ttft")
        if (self.ape.get("p90_tpot_s") or 0) > TARGETS["p90_tpot_s_mape_max"]:
            out.append("p90_tpot")
        if self.verdict_agrees is False:
            out.append("verdict")
        return out


# ---- evaluation ----------------------------------------------------------------------------

def _meets(values: dict, p: LoadPoint) -> bool | None:
    ttft, tpot = values.get("p90_ttft_s"), values.get("p90_tpot_s")
    if ttft is None or tpot is None:
        return None
    return ttft <= p.p90_ttft_slo_s and tpot <= p.p90_tpot_slo_s


def predict_point(p: LoadPoint, *, sglang_version: str | None = None, calibration=None) -> PointResult:

    res = PointResult(point=p, measured_meets=_meets(p.measured, p))
    try:
        m = simulate_load_point(p.model, p.gpu, p.gpus, p.flags, p.knobs, p.workload, p.users,
                                warmup_s=p.warmup_s, duration_s=p.duration_s, seed=p.seed, nodes=p.nodes,
                                host_memory_gb=p.host_memory_gb, calibration=calibration,
                                sglang_version=sglang_version or p.sglang_version, fresh_server=p.fresh_server,
                                cached_kernels=p.cached_kernels)
    except (TrialError, ConfigError) as exc:
        res.error = str(exc)
        return res
    res.predicted = {k: getattr(m, k) for k in METRICS}
    res.predicted_meets = _meets(res.predicted, p)
    res.step_time_source = (m.extra.get("step_time_source") or {}).get("overall")
    res.calibration_applied = list(m.extra.get("calibration_applied") or [])
    res.calibration_fitted_on = m.extra.get("calibration_fitted_on")
    res.calibration_fitted_trials = list(m.extra.get("calibration_fitted_trials") or [])
    res.predicted_stages = m.extra.get("server_stage_means")
    if flag_bool(p.flags, "enable-hierarchical-cache"):
        res.predicted_hicache = {"load_back_tokens": int(m.extra.get("hicache_load_tokens") or 0),
                                 "loads": int(m.extra.get("hicache_loads") or 0)}
    for k in METRICS:
        meas, pred = p.measured.get(k), res.predicted.get(k)
        res.ape[k] = None if meas in (None, 0) or pred is None else abs(pred - meas) / abs(meas)
    return res


def window_noise(points: list[LoadPoint], seeds: int, *, sglang_version: str | None = None, calibration=None,
                 first: list[PointResult] | None = None) -> dict | None:
    """How far two measurements of the same load point differ by chance: each point simulated on
    ``seeds`` workload samples (its own seed and others), the mean absolute difference between two
    of them relative to the second (ordered pairs), averaged over the points. It is the MAPE a
    perfect model would show against one window of this length, where the real windows vary as the
    simulated ones do; a target below it cannot be told from noise. ``verdict_agreement``: how often
    two samples call the SLO the same way (the agreement a perfect model would reach)."""
    if seeds < 2:
        return None
    per_metric: dict[str, list[float]] = {k: [] for k in NOISE_METRICS}
    loo: dict[str, list[float]] = {k: [] for k in NOISE_METRICS}
    verdicts: list[float] = []
    loo_verdicts: list[float] = []
    for i, p in enumerate(points):
        samples = [first[i].predicted] if first is not None and first[i].predicted else []
        k = 1 if samples else 0
        while len(samples) < seeds and k < 4 * seeds:
            r = predict_point(dataclasses.replace(p, seed=p.seed + NOISE_SEED_STRIDE * k),
                              sglang_version=sglang_version, calibration=calibration)
            k += 1
            if r.predicted:
                samples.append(r.predicted)
        for key in NOISE_METRICS:
            v = [x[key] for x in samples if x.get(key)]
            if len(v) >= 2:
                per_metric[key].append(statistics.mean(abs(a - b) / b for a, b in itertools.permutations(v, 2)))
            if len(v) >= 3:  # each sample against the median of the others: a model that knows the expectation
                loo[key].append(statistics.mean(abs(statistics.median(v[:j] + v[j + 1:]) - x) / x
                                                for j, x in enumerate(v)))
        called = [_meets(x, p) for x in samples]
        called = [c for c in called if c is not None]
        if len(called) >= 2:
            verdicts.append(statistics.mean(a == b for a, b in itertools.permutations(called, 2)))
        if len(called) >= 3:  # the others' majority (a tie calls it met)
            loo_verdicts.append(statistics.mean(
                ((sum(called[:j] + called[j + 1:]) * 2 >= len(called) - 1) == c) for j, c in enumerate(called)))
    mean = lambda v: statistics.mean(v) if v else None
    return {"seeds": seeds, "points": len(points),
            "pairwise_ape": {k: mean(v) for k, v in per_metric.items()},
            "verdict_agreement": mean(verdicts),
            # what a model that predicted each point's typical window exactly would score against one window
            "expectation_model": {"ape": {k: mean(v) for k, v in loo.items()}, "verdict_agreement": mean(loo_verdicts),
                                  "method": "each sample against the median (verdicts: the majority) of the others"},
            "method": "each point simulated on its own and other workload seeds; mean |a - b| / b over "
                      "ordered pairs, averaged over points"}


def summarize(results: list[PointResult]) -> dict:
    return _summary([r.ape for r in results], [r.verdict_agrees for r in results], [r.error for r in results],
                    [r.clear_of_slo for r in results], [r.measured_marginal for r in results])


def summarize_points(point_docs: list[dict]) -> dict:
    """``summarize`` over the point records of a report (``doc["points"]``), e.g. a subset of them."""
    out = _summary([p["ape"] for p in point_docs], [p["verdict_agrees"] for p in point_docs],
                   [p["error"] for p in point_docs], [p.get("clear_of_slo") for p in point_docs],
                   [p.get("measured_verdict_marginal") for p in point_docs])
    out["load_points"] = len(point_docs)
    return out


def _summary(apes: list[dict], agrees: list, errors: list, clear: list, marginal: list) -> dict:
    mape = {}
    for k in METRICS:
        vals = [a[k] for a in apes if a.get(k) is not None]
        mape[k] = sum(vals) / len(vals) if vals else None
    verdicts = [v for v in agrees if v is not None]
    agreement = sum(verdicts) / len(verdicts) if verdicts else None
    checks = {
        "p90_ttft_s": mape["p90_ttft_s"] is not None and mape["p90_ttft_s"] <= TARGETS["p90_ttft_s_mape_max"],
        "p90_tpot_s": mape["p90_tpot_s"] is not None and mape["p90_tpot_s"] <= TARGETS["p90_tpot_s_mape_max"],
        "verdict_agreement": agreement is not None and agreement >= TARGETS["verdict_agreement_min"],
    }
    clear_verdicts = [v for v, c in zip(agrees, clear) if v is not None and c]
    return {"mape": mape, "verdict_agreement": agreement, "target_results": checks,
            "passed": bool(apes) and all(checks.values()) and not any(errors),
            # not a target: the agreement on the points whose measured P90s are clear of the SLO
            "verdicts_clear_of_slo": {"margin": SLO_MARGIN, "points": len(clear_verdicts),
                                      "agreement": sum(clear_verdicts) / len(clear_verdicts) if clear_verdicts
                                      else None},
            "verdicts_by_window_noise": _by_window_noise(agrees, marginal)}


def _by_window_noise(agrees: list, marginal: list) -> dict:
    """The agreement on the points whose measured verdict their own window decides, and on those it
    does not (``PointResult.measured_marginal``): not a target; it says how much of the disagreement
    is the measurement's own noise."""
    def part(want: bool) -> dict:
        got = [a for a, m in zip(agrees, marginal) if a is not None and m is want]
        return {"points": len(got), "agreement": sum(got) / len(got) if got else None}
    return {"decided": part(False), "marginal": part(True),
            "unknown_points": sum(1 for a, m in zip(agrees, marginal) if a is not None and m is None),
            "method": "marginal: an SLO limit inside the 90% interval of a measured P90 (order statistics of the "
                      "window's requests), the capacity search's confirm_marginal rule; unknown: no intervals recorded"}


def point_context(model: str, gpu: str, flags: dict, sglang_version: str | None) -> dict:
    """The calibration context a load point (catalog model and GPU names) is predicted under
    (``calibrate.calibration_context``)."""
    return calibration_context(get_model(model), get_gpu(gpu), flags, sglang_version)


def run_fidelity(dirs: Iterable[str | Path], *, backends: tuple[str, ...] = REAL_BACKENDS,
                 sglang_version: str | None = None, calibration=None, progress=None,
                 selection: TrialSelection | None = None, noise_seeds: int = 0, priors_only: bool = False,
                 context: dict | None = None) -> dict:
    """Every real load point under ``dirs`` (those of the ``selection``'s trials, and with
    ``context`` those predicted under that calibration context) predicted and compared.
    ``priors_only``: with no fitted entry at all (neither the GPU's own nor one of its architecture),
    what the fits add."""
    points, skipped, sources = load_points(dirs, backends)
    if selection is not None and not selection.everything and points:
        selection.check({(p.study, p.trial) if p.study is not None else (p.label.rsplit("@", 1)[0], None)
                         for p in points})
        points = [p for p in points if selection.keeps_point(p)]
    if context is not None:
        points = [p for p in points if point_context(p.model, p.gpu, p.flags, sglang_version or p.sglang_version)
                  == context]
    if not points:
        where = ", ".join(str(d) for d in dirs) + (f" in calibration context {context}" if context else "")
        raise UserError(f"no real measurements found under {where}: need study databases (*.db) with "
                        f"{'/'.join(backends)} load points, or probe files (*.probe.json, probes/*.json)")
    results = []
    for i, p in enumerate(points):
        if progress:
            progress(i, len(points), p)
        results.append(predict_point(p, sglang_version=sglang_version, calibration=_point_calibration(
            p, calibration, priors_only)))
    doc = summarize(results)
    point_docs = [_point_doc(r) for r in results]
    doc.update({
        "targets": dict(TARGETS),
        "sources": [str(p) for p in sources],
        "skipped": skipped,
        "points": point_docs,
        "by_server": by_server(point_docs),
        "by_gpu": by_gpu(point_docs),
        "unseen_by_fit": unseen_by_fit(point_docs),
        "repeats": repeats(results),
        "window_noise": None if priors_only else window_noise(
            points, noise_seeds, sglang_version=sglang_version, calibration=calibration, first=results),
        "priors_only": priors_only,
    })
    return doc


def _point_calibration(p: LoadPoint, calibration, priors_only: bool):
    """What ``predict_point`` gets: the override as given, or with ``priors_only`` the GPU's whole
    calibration resolved without a context (so no fitted entry applies), which the simulator then
    uses as it is."""
    return load_calibration(p.gpu, calibration) if priors_only else calibration


def by_server(point_docs: list[dict]) -> dict:
    """The same figures for warm servers and for fresh servers' first load points apart: a fresh
    server compiles kernels in its first traffic, which the simulator models as one mean cost per
    new kernel variant (not a target; it says where the error is)."""
    out = {}
    for name, fresh in (("warm", False), ("fresh", True)):
        sel = [p for p in point_docs if bool(p.get("fresh_server")) == fresh]
        if sel:
            out[name] = _subset_figures(sel)
    return out


def _subset_figures(point_docs: list[dict]) -> dict:
    """The figures a breakdown gives for a subset of the points (``by_server``, ``by_gpu``)."""
    s = summarize_points(point_docs)
    return {k: s[k] for k in ("mape", "verdict_agreement", "target_results", "load_points")}


def unseen_by_fit(point_docs: list[dict]) -> dict | None:
    """The figures on the points whose trials none of the fitted entries they used was fitted on:
    measured after the fit, or left out of it (the check a fit cannot have been tuned to); None
    where there are none."""
    sel = [p for p in point_docs if p.get("seen_by_fit") is False]
    if not sel:
        return None
    return {**_subset_figures(sel), "trials": sorted({trial_label(p["study"], p["trial"]) if p.get("study") is not None
                                                      else p["label"].rsplit("@", 1)[0] for p in sel})}


# flags that change what a server reports, not what it does: repeats may differ in them
OBSERVATION_FLAGS = frozenset({"enable-metrics"})


def repeat_key(p: LoadPoint) -> tuple:
    """What makes two load points measurements of the same thing: one configuration on one kind of
    machine, at one user count, window and SLO, and both first points of fresh servers or both not."""
    flags = {k: v for k, v in p.flags.items() if k not in OBSERVATION_FLAGS}
    canon = lambda d: tuple(sorted((str(k), repr(v)) for k, v in (d or {}).items()))
    model = (p.model.name, canon(p.model.overrides)) if hasattr(p.model, "overrides") else (str(p.model), ())
    return (*model, p.gpu, p.gpus, p.nodes, canon(flags), canon(p.knobs), p.workload.model_dump_json(), p.users,
            p.warmup_s, p.duration_s, p.p90_ttft_slo_s, p.p90_tpot_slo_s, p.fresh_server,
            # a fresh server on a cache that earlier servers filled is not a repeat of one on a cold cache
            p.cached_kernels or None)


def repeats(results: list[PointResult]) -> dict | None:
    """How often two real servers of one configuration call the SLO the same way: the load points
    measured more than once (``repeat_key``), every pair of their measured verdicts, beside the
    simulator's agreement on the same points. The former bounds what any one prediction per
    configuration can reach on them (not a target); None where nothing was measured twice."""
    groups: dict[tuple, list[PointResult]] = {}
    for r in results:
        if r.measured_meets is not None:
            groups.setdefault(repeat_key(r.point), []).append(r)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return None
    pairs = [(a.measured_meets == b.measured_meets) for v in groups.values() for a, b in itertools.combinations(v, 2)]
    sim = [r.verdict_agrees for v in groups.values() for r in v if r.verdict_agrees is not None]
    return {"groups": [{"points": [r.point.label for r in v], "measured_meets": [r.measured_meets for r in v],
                        "predicted_meets": [r.predicted_meets for r in v]} for v in groups.values()],
            "points": sum(len(v) for v in groups.values()), "pairs": len(pairs),
            "measured_pairs_agreement": sum(pairs) / len(pairs),
            "simulator_agreement": sum(sim) / len(sim) if sim else None,
            "method": "load points of one configuration, machine kind, user count, window, SLO and server "
                      "freshness; every unordered pair of their measured SLO verdicts"}


def by_gpu(point_docs: list[dict]) -> dict:
    """The same figures per GPU, with the fitted entries its predictions used (``fitted``; [] for the
    priors alone) and, where those were fitted on another GPU of the same architecture, which
    (``fitted_on``): a GPU with no fit of its own checks the mechanism on hardware the fit has not
    seen (not a target)."""
    out = {}
    for gpu in sorted({str(p.get("gpu")) for p in point_docs}):
        sel = [p for p in point_docs if str(p.get("gpu")) == gpu]
        fitted = sorted({name for p in sel for name in p["predicted"].get("calibration_applied") or []})
        fitted_on = sorted({str(p["predicted"]["calibration_fitted_on"]) for p in sel
                            if p["predicted"].get("calibration_fitted_on")})
        out[gpu] = {**_subset_figures(sel), "fitted": fitted, "fitted_on": fitted_on}
    return out


def _point_doc(r: PointResult) -> dict:
    p = r.point
    return {
        "label": p.label, "source": p.source, "study": p.study, "trial": p.trial, "users": p.users,
        "model": p.model, "gpu": p.gpu, "sglang_version": p.sglang_version, "flags": p.flags, "knobs": p.knobs,
        "measured": {**{k: p.measured.get(k) for k in METRICS}, "meets_slo": r.measured_meets},
        "predicted": {**r.predicted, "meets_slo": r.predicted_meets, "step_time_source": r.step_time_source,
                      "calibration_applied": r.calibration_applied,
                      "calibration_fitted_on": r.calibration_fitted_on},
        "ape": r.ape, "verdict_agrees": r.verdict_agrees, "clear_of_slo": r.clear_of_slo,
        "measured_verdict_marginal": r.measured_marginal,
        "slo": {"p90_ttft_s": p.p90_ttft_slo_s, "p90_tpot_s": p.p90_tpot_slo_s},
        "off_target": r.off_target(), "error": r.error,
        "fresh_server": p.fresh_server,
        # prefill batch sizes whose kernels that fresh server found built (tuner.evaluation.kernel_ledger)
        "cached_prefill_sizes": len(p.cached_kernels.prefill_tokens) if p.cached_kernels else 0,
        # whether a fitted entry its prediction used was fitted on this point's trial (None: no fit applied)
        "seen_by_fit": (trial_label(p.study, p.trial) in r.calibration_fitted_trials
                        if r.calibration_applied else None),
        "stages": {"measured": p.server_stage_means(), "predicted": r.predicted_stages},
        # HiCache servers: tokens loaded back from host memory over the whole load point, warm-up
        # included (SGLang's counters; the measured side is None where the server exported none)
        "hicache": None if r.predicted_hicache is None else {
            "measured": _measured_load_back(p.server_metrics), "predicted": r.predicted_hicache},
    }


def _measured_load_back(sm: dict | None) -> dict | None:
    c = load_back_counters(sm)
    return None if c is None else {"load_back_tokens": c["load_back_tokens"], "loads": c["loads"]}


def held_out(trials, points: list[LoadPoint], *, by: str = "trial", progress=None, whole_steps=(),
             calibration: dict | None = None, held=()) -> dict:
    """Cross-validation of the calibration fit (``tuner.sim.stepfit.calibrate``): for each group
    of trials (one trial, or one model), fit on every other trial (and the ``whole_steps``) from
    ``calibration`` with the values ``held`` kept, as the fit itself, and predict the group's load
    points; the MAPEs are of those predictions only."""
    if by not in ("trial", "model"):
        raise ConfigError(f"unknown hold-out {by!r}; valid: trial, model", key="--hold-out")
    key = (lambda t: t.label) if by == "trial" else (lambda t: t.model.name)
    trial_of = {(t.study, t.trial): t for t in trials}
    groups: dict[str, list] = {}
    for t in trials:
        groups.setdefault(key(t), []).append(t)
    results, folds = [], []
    for name, members in groups.items():
        train = [t for t in trials if key(t) != name]
        test = [p for p in points if (p.study, p.trial) in trial_of and key(trial_of[(p.study, p.trial)]) == name]
        if not train or not test:
            continue
        if progress:
            progress(f"hold out {name}: fit on {len(train)} trials, predict {len(test)} load points")
        fitted = calibrate(train, [p for p in points if p not in test], whole_steps=whole_steps,
                           calibration=calibration, held=held)
        fold = [predict_point(p, calibration=fitted.calibration) for p in test]
        results += fold
        folds.append({"held_out": name, "trained_on": [t.label for t in train], **summarize(fold),
                      "points": [_point_doc(r) for r in fold]})
    doc = summarize(results)
    doc.update({"by": by, "targets": dict(TARGETS), "folds": folds, "points": [_point_doc(r) for r in results]})
    return doc


def format_report(doc: dict) -> str:
    cols = (("p50_ttft_s", "P50 TTFT s"), ("p90_ttft_s", "P90 TTFT s"), ("p90_tpot_s", "P90 TPOT ms"),
            ("throughput_tokens_per_s", "tok/s"), ("prefix_cache_hit_rate", "hit"))
    lines = []
    if doc.get("priors_only"):
        lines.append("priors only: no fitted calibration entry applied (what the fits add, not the simulator's figures)")
    w = max([36] + [len(pt["label"]) + 2 for pt in doc["points"]])  # labels are never cut: they name the point
    head = f"{'point':<{w}}" + "".join(f"{name:>22}" for _, name in cols) + f"{'SLO pred/meas':>15}"
    lines.append(head)
    lines.append(" " * w + "".join(f"{'pred / meas':>22}" for _ in cols))
    for pt in doc["points"]:
        cells = []
        for k, _ in cols:
            pair = f"{format_metric(pt['predicted'].get(k), k)} / {format_metric(pt['measured'].get(k), k)}"
            cells.append(f"{pair:>22}")
        verdict = lambda v: "-" if v is None else ("met" if v else "miss")
        mark = "  ! " + ",".join(pt["off_target"]) if pt["off_target"] else ""
        lines.append(f"{pt['label']:<{w}}" + "".join(cells)
                     + f"{verdict(pt['predicted'].get('meets_slo')) + '/' + verdict(pt['measured'].get('meets_slo')):>15}"
                     + mark)
        if pt["error"]:
            lines.append(f"    no prediction: {pt['error']}")
    m = doc["mape"]
    pct = lambda v: "-" if v is None else f"{v:.1%}"
    lines.append("")
    lines.append("MAPE: " + ", ".join(f"{k} {pct(m[k])}" for k in METRICS))
    va = doc["verdict_agreement"]
    lines.append(f"SLO verdicts agree on {pct(va)} of {len(doc['points'])} points")
    vc = doc.get("verdicts_clear_of_slo") or {}
    if vc.get("points") is not None:
        near = [pt["label"] for pt in doc["points"] if pt.get("clear_of_slo") is False]
        lines.append(f"  on {pct(vc['agreement'])} of the {vc['points']} points whose measured P90s are more than "
                     f"{vc['margin']:.0%} from their SLO" + (f" (near it: {', '.join(near)})" if near else ""))
    wn = doc.get("verdicts_by_window_noise") or {}
    if wn.get("decided", {}).get("points") or wn.get("marginal", {}).get("points"):
        marginal = [pt["label"] for pt in doc["points"] if pt.get("measured_verdict_marginal")]
        lines.append(f"  on {pct(wn['decided']['agreement'])} of the {wn['decided']['points']} points whose own window "
                     f"decides their verdict (no SLO limit inside a measured P90's 90% interval), and "
                     f"{pct(wn['marginal']['agreement'])} of the {wn['marginal']['points']} it does not"
                     + (f" ({', '.join(marginal)})" if marginal else "")
                     + (f"; {wn['unknown_points']} points recorded no intervals" if wn.get("unknown_points") else ""))
    subset = lambda what, b: (f"  on {what}: P90 TTFT {pct(b['mape']['p90_ttft_s'])}, "
                              f"P90 TPOT {pct(b['mape']['p90_tpot_s'])}, verdicts {pct(b['verdict_agreement'])}")
    for name, what in (("warm", "warm servers"), ("fresh", "fresh servers' first load points")):
        b = (doc.get("by_server") or {}).get(name)
        if b:
            lines.append(subset(f"{what} ({b['load_points']})", b))
    unseen = doc.get("unseen_by_fit")
    if unseen:
        lines.append(subset(f"the {unseen['load_points']} points of trials no fit they used was fitted on "
                            f"({', '.join(unseen['trials'])})", unseen))
    gpus = doc.get("by_gpu") or {}
    if len(gpus) > 1:  # one GPU: the figures above are its own
        for gpu, b in gpus.items():
            if b.get("fitted_on"):
                fit = f"step times fitted on {', '.join(b['fitted_on'])} (same architecture), none on it"
            elif b["fitted"]:
                fit = f"step times fitted on it: {', '.join(b['fitted'])}"
            else:
                fit = "priors only, no fit on it"
            lines.append(subset(f"{gpu} ({b['load_points']}, {fit})", b))
    rep = doc.get("repeats")
    if rep:
        lines.append(f"repeats of one configuration ({len(rep['groups'])} groups, {rep['points']} points): two real "
                     f"servers' SLO verdicts agree on {pct(rep['measured_pairs_agreement'])} of {rep['pairs']} pairs; "
                     f"the simulator's agree with theirs on {pct(rep['simulator_agreement'])} of these points")
    noise = doc.get("window_noise")
    if noise:
        ap = noise["pairwise_ape"]
        lines.append(f"one window's own noise (the simulator on {noise['seeds']} workload samples of each point, "
                     f"the mean difference of two): P50 TTFT {pct(ap['p50_ttft_s'])}, P90 TTFT {pct(ap['p90_ttft_s'])}, "
                     f"P90 TPOT {pct(ap['p90_tpot_s'])}, throughput {pct(ap['throughput_tokens_per_s'])}; "
                     f"two samples' SLO verdicts agree on {pct(noise['verdict_agreement'])}")
        em = noise.get("expectation_model") or {}
        if em.get("ape"):
            lines.append(f"  a model exact on each point's typical window would score P90 TTFT {pct(em['ape']['p90_ttft_s'])}, "
                         f"P90 TPOT {pct(em['ape']['p90_tpot_s'])}, verdicts {pct(em['verdict_agreement'])} "
                         f"against one window")
    t = doc["targets"]
    checks = doc["target_results"]
    lines.append(f"targets: P90 TTFT MAPE <= {t['p90_ttft_s_mape_max']:.0%} "
                 f"({'met' if checks['p90_ttft_s'] else 'MISSED'}), P90 TPOT MAPE <= {t['p90_tpot_s_mape_max']:.0%} "
                 f"({'met' if checks['p90_tpot_s'] else 'MISSED'}), verdicts >= {t['verdict_agreement_min']:.0%} "
                 f"({'met' if checks['verdict_agreement'] else 'MISSED'})")
    for s in doc.get("skipped") or []:
        lines.append(f"skipped {s['source']}: {s['reason']}")
    staged = [pt for pt in doc["points"] if (pt.get("stages") or {}).get("measured") and pt["stages"]["predicted"]]

    def stage_row(pt):
        m_, p_ = pt["stages"]["measured"], pt["stages"]["predicted"]
        cell = lambda k: f"{p_[k] * 1e3:.0f} / {m_[k] * 1e3:.0f}"
        return (f"{pt['label']:<{w}}{cell('queue_s'):>18}{cell('prefill_forward_s'):>22}"
                f"{cell('ttft_s'):>18}  {'fresh' if pt.get('fresh_server') else 'warm'}")

    _section(lines, "SGLang's own stages, mean per request over the whole load point (its /metrics), pred / meas:",
             f"{'point':<{w}}{'queue ms':>18}{'prefill forward ms':>22}{'TTFT ms':>18}  server",
             [stage_row(pt) for pt in staged],
             "(the simulator's queue is arrival to batch; SGLang's starts when the scheduler receives "
             "the request, and its TTFT adds the HTTP and tokenizer path)")

    def load_back_row(pt):
        m_, p_ = pt["hicache"]["measured"], pt["hicache"]["predicted"]
        return (f"{pt['label']:<{w}}{p_['load_back_tokens']:>10,d} / {m_['load_back_tokens']:<9,d}"
                f"{p_['loads']:>6d} / {m_['loads']:<5d}")

    _section(lines, "HiCache load-back over the whole load point (SGLang's /metrics), pred / meas:",
             f"{'point':<{w}}{'tokens':>22}{'loads':>14}",
             [load_back_row(pt) for pt in doc["points"] if (pt.get("hicache") or {}).get("measured")])
    return "\n".join(lines)


def _section(lines: list[str], title: str, header: str, rows: list[str], footer: str | None = None) -> None:
    """A per-point pred / meas table after a blank line, where it has rows."""
    if rows:
        lines += ["", title, header, *rows, *([footer] if footer else [])]


__all__ = ["LoadPoint", "PointResult", "PROBE_FORMAT", "TrialSelection", "extra_args_to_flags", "find_sources",
           "format_report", "held_out", "points_from_database", "points_from_probe", "predict_point", "repeat_key",
           "repeats", "run_fidelity",
           "summarize", "summarize_points"]
