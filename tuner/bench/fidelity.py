"""Fidelity benchmark: the simulator's predictions against real SGLang measurements.

Sources (found under the given results directories):

* study databases (``*.db``, the project's SQLite schema): every valid load point measured by a
  real backend (``tuner_measurements.backend_kind``, default ``sglang``), with the trial's flags and
  knobs (``tuner_trials``) and the study as it was started (``tuner_studies.spec_yaml``);
* probe files (``*.probe.json`` or ``probes/*.json``, format ``tuner-probe/1``, below): load points
  measured outside a study, e.g. with a forced-small KV pool or HiCache.

For each load point the same configuration, workload, user count, seed and window is re-simulated
(``tuner.sim.simulate_load_point``, with the trial's SGLang version) and predicted P50/P90 TTFT,
P90 TPOT, throughput and prefix-cache hit rate are compared with the measurement: absolute
percentage error per point, MAPE per metric, and whether the SLO verdict agrees. Targets: P90 TTFT
MAPE <= 20 %, P90 TPOT MAPE <= 10 %, verdicts agree on >= 95 % of points.

Probe format (``tuner-probe/1``)::

    {"format": "tuner-probe/1", "name": "...", "model": "qwen3-30b-a3b", "gpu": "h200",
     "gpus": 1, "nodes": 1, "host_memory_gb": 2048, "sglang_version": "0.5.17",
     "flags": {"tp-size": 1, "attention-backend": "triton", ...}, "knobs": {},
     "workload": "coding-agent" | {inline workload profile},
     "slo": {"p90_ttft_s": 5.0, "p90_tpot_s": 0.05},
     "points": [{"users": 16, "warmup_s": 60, "duration_s": 300, "seed": 0,
                 "measured": {"p50_ttft_s": ..., "p90_ttft_s": ..., "p90_tpot_s": ...,
                              "throughput_tokens_per_s": ..., "prefix_cache_hit_rate": ...}}],
     "provenance": {"date": "...", "command": "...", "server_info": {...}}}
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tuner.errors import ConfigError, TrialError, UserError
import yaml
from tuner.config.schema import StudySpec
from tuner.workload.profiles import load_profile
from tuner.workload.session import WorkloadProfile
from tuner.sim import simulate_load_point

log = logging.getLogger(__name__)

PROBE_FORMAT = "tuner-probe/1"
METRICS = ("p50_ttft_s", "p90_ttft_s", "p90_tpot_s", "throughput_tokens_per_s", "prefix_cache_hit_rate")
TARGETS = {"p90_ttft_s_mape_max": 0.20, "p90_tpot_s_mape_max": 0.10, "verdict_agreement_min": 0.95}
REAL_BACKENDS = ("sglang",)


@dataclass
class LoadPoint:
    """One measured load point and everything needed to re-simulate it."""

    source: str
    label: str
    model: str
    gpu: str
    gpus: int
    nodes: int
    host_memory_gb: float | None
    flags: dict
    knobs: dict
    workload: Any  # WorkloadProfile
    users: int
    warmup_s: float
    duration_s: float
    seed: int
    p90_ttft_slo_s: float
    p90_tpot_slo_s: float
    sglang_version: str | None
    measured: dict
    study: str | None = None
    trial: int | None = None


@dataclass
class PointResult:
    point: LoadPoint
    predicted: dict = field(default_factory=dict)
    ape: dict = field(default_factory=dict)
    measured_meets: bool | None = None
    predicted_meets: bool | None = None
    error: str | None = None
    step_time_source: str | None = None

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


# ---- sources -------------------------------------------------------------------------------

def find_sources(dirs: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(study databases, probe files) under ``dirs`` (a file is taken as it is)."""
    dbs, probes = [], []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            (dbs if d.suffix in (".db", ".sqlite") else probes).append(d)
            continue
        if not d.is_dir():
            raise ConfigError(f"no such results directory: {d}", key="--results")
        dbs += sorted(p for p in d.rglob("*.db") if p.is_file())
        probes += sorted({*d.rglob("*.probe.json"), *d.rglob("probes/*.json")})
    return dbs, probes


def extra_args_to_flags(args: Iterable[str]) -> dict[str, Any]:
    """``["--attention-backend", "triton", "--disable-radix-cache"]`` -> flags."""
    out: dict[str, Any] = {}
    args = list(args or [])
    i = 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def _version_from_trial(trial, spec_options: dict) -> str | None:
    tele = trial.telemetry or {}
    info = tele.get("server_info") or {}
    if isinstance(info, list):  # one snapshot per server process
        info = next((i for i in info if isinstance(i, dict)), {})
    for v in ((tele.get("plan") or {}).get("sglang_version"), info.get("version"),
              (tele.get("server") or {}).get("sglang_version"), tele.get("sglang_version"),
              spec_options.get("sglang_version")):
        if v:
            return str(v).split("-")[0]
    return None


def points_from_database(path: Path, backends: tuple[str, ...] = REAL_BACKENDS) -> list[LoadPoint]:

    from tuner.storage import repo
    from tuner.storage.db import get_engine, has_schema

    engine = get_engine(f"sqlite:///{path}", create=False, readonly=True)
    try:
        if not has_schema(engine):
            return []
        out: list[LoadPoint] = []
        for study_row in repo.list_studies(engine):
            try:
                spec = StudySpec.model_validate(yaml.safe_load(study_row.spec_yaml))
                profile = spec.workload_profile()
            except Exception as exc:  # a study this tuner cannot read: report, do not stop
                raise ConfigError(f"study {study_row.name!r}: cannot read its spec: {exc}", file=str(path)) from None
            trials = {t.trial_number: t for t in repo.trials(engine, study_row.name)}
            extra_flags = extra_args_to_flags((spec.backend_options or {}).get("extra_server_args") or [])
            for m in repo.measurements(engine, study_row.name):
                if m.backend_kind not in backends or not m.valid:
                    continue
                trial = trials.get(m.trial_number)
                if trial is None:
                    continue
                fid = max(0.05, min(1.0, m.fidelity or 1.0))
                measured = {k: getattr(m, k) for k in METRICS}
                out.append(LoadPoint(
                    source=str(path), label=f"{study_row.name}#{m.trial_number}@{m.users}",
                    model=spec.model, gpu=spec.hardware.gpu, gpus=spec.hardware.gpus_per_node,
                    nodes=spec.hardware.nodes, host_memory_gb=spec.hardware.host_memory_gb,
                    flags={**extra_flags, **(trial.flags or {})}, knobs=dict(trial.knobs or {}), workload=profile,
                    users=m.users, warmup_s=spec.measurement.warmup_s * fid, duration_s=m.duration_s,
                    seed=spec.seed + m.trial_number + 1009 * m.step,
                    p90_ttft_slo_s=spec.slo.p90_ttft_s, p90_tpot_slo_s=spec.slo.p90_tpot_s,
                    sglang_version=_version_from_trial(trial, spec.backend_options or {}),
                    measured=measured, study=study_row.name, trial=m.trial_number))
        return out
    finally:
        engine.dispose()


def _req(doc: dict, key: str, kind, path: Path, where: str = ""):
    value = doc.get(key)
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ConfigError(f"required {name}", file=str(path), key=f"{where}{key}")
    return value


def points_from_probe(path: Path) -> list[LoadPoint]:

    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read probe: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("format") != PROBE_FORMAT:
        raise ConfigError(f"not a probe file: expected format {PROBE_FORMAT!r}", file=str(path), key="format")
    model = _req(doc, "model", str, path)
    gpu = _req(doc, "gpu", str, path)
    flags = _req(doc, "flags", dict, path)
    slo = _req(doc, "slo", dict, path)
    workload = doc.get("workload")
    try:
        if isinstance(workload, str):
            profile = load_profile(workload)
        elif isinstance(workload, dict):
            profile = WorkloadProfile.model_validate(workload)
        else:
            raise ConfigError("required: a workload profile name or an inline profile", file=str(path),
                              key="workload")
    except ConfigError as exc:
        raise ConfigError(exc.detail, file=str(path), key=exc.key or "workload") from None
    except Exception as exc:
        raise ConfigError(f"invalid workload: {exc}", file=str(path), key="workload") from None
    points = _req(doc, "points", list, path)
    if not points:
        raise ConfigError("needs at least one load point", file=str(path), key="points")
    out = []
    for i, p in enumerate(points):
        where = f"points[{i}]."
        if not isinstance(p, dict):
            raise ConfigError("must be an object", file=str(path), key=f"points[{i}]")
        users = _req(p, "users", int, path, where)
        measured = _req(p, "measured", dict, path, where)
        for k in ("p90_ttft_s", "p90_tpot_s"):
            if not isinstance(measured.get(k), (int, float)):
                raise ConfigError("required number", file=str(path), key=f"{where}measured.{k}")
        out.append(LoadPoint(
            source=str(path), label=f"{doc.get('name', path.stem)}@{users}", model=model, gpu=gpu,
            gpus=int(doc.get("gpus", 8)), nodes=int(doc.get("nodes", 1)), host_memory_gb=doc.get("host_memory_gb"),
            flags=dict(flags), knobs=dict(doc.get("knobs") or {}), workload=profile, users=users,
            warmup_s=float(p.get("warmup_s", 120)), duration_s=float(_req(p, "duration_s", (int, float), path, where)),
            seed=int(p.get("seed", 0)), p90_ttft_slo_s=float(_req(slo, "p90_ttft_s", (int, float), path, "slo.")),
            p90_tpot_slo_s=float(_req(slo, "p90_tpot_s", (int, float), path, "slo.")),
            sglang_version=doc.get("sglang_version"), measured={k: measured.get(k) for k in METRICS}))
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
                                sglang_version=sglang_version or p.sglang_version)
    except (TrialError, ConfigError) as exc:
        res.error = str(exc)
        return res
    res.predicted = {k: getattr(m, k) for k in METRICS}
    res.predicted_meets = _meets(res.predicted, p)
    res.step_time_source = (m.extra.get("step_time_source") or {}).get("overall")
    for k in METRICS:
        meas, pred = p.measured.get(k), res.predicted.get(k)
        res.ape[k] = None if meas in (None, 0) or pred is None else abs(pred - meas) / abs(meas)
    return res


def summarize(results: list[PointResult]) -> dict:
    mape = {}
    for k in METRICS:
        vals = [r.ape[k] for r in results if r.ape.get(k) is not None]
        mape[k] = sum(vals) / len(vals) if vals else None
    verdicts = [r.verdict_agrees for r in results if r.verdict_agrees is not None]
    agreement = sum(verdicts) / len(verdicts) if verdicts else None
    checks = {
        "p90_ttft_s": mape["p90_ttft_s"] is not None and mape["p90_ttft_s"] <= TARGETS["p90_ttft_s_mape_max"],
        "p90_tpot_s": mape["p90_tpot_s"] is not None and mape["p90_tpot_s"] <= TARGETS["p90_tpot_s_mape_max"],
        "verdict_agreement": agreement is not None and agreement >= TARGETS["verdict_agreement_min"],
    }
    return {"mape": mape, "verdict_agreement": agreement, "target_results": checks,
            "passed": bool(results) and all(checks.values()) and not any(r.error for r in results)}


def run_fidelity(dirs: Iterable[str | Path], *, backends: tuple[str, ...] = REAL_BACKENDS,
                 sglang_version: str | None = None, calibration=None, progress=None) -> dict:
    dbs, probes = find_sources(dirs)
    points: list[LoadPoint] = []
    skipped = []
    for path in dbs:
        try:
            points += points_from_database(path, backends)
        except UserError as exc:
            skipped.append({"source": str(path), "reason": str(exc)})
    for path in probes:
        points += points_from_probe(path)
    if not points:
        where = ", ".join(str(d) for d in dirs)
        raise UserError(f"no real measurements found under {where}: need study databases (*.db) with "
                        f"{'/'.join(backends)} load points, or probe files (*.probe.json, probes/*.json)")
    results = []
    for i, p in enumerate(points):
        if progress:
            progress(i, len(points), p)
        results.append(predict_point(p, sglang_version=sglang_version, calibration=calibration))
    doc = summarize(results)
    doc.update({
        "targets": dict(TARGETS),
        "sources": [str(p) for p in dbs + probes],
        "skipped": skipped,
        "points": [_point_doc(r) for r in results],
    })
    return doc


def _point_doc(r: PointResult) -> dict:
    p = r.point
    return {
        "label": p.label, "source": p.source, "study": p.study, "trial": p.trial, "users": p.users,
        "model": p.model, "gpu": p.gpu, "sglang_version": p.sglang_version, "flags": p.flags, "knobs": p.knobs,
        "measured": {**{k: p.measured.get(k) for k in METRICS}, "meets_slo": r.measured_meets},
        "predicted": {**r.predicted, "meets_slo": r.predicted_meets, "step_time_source": r.step_time_source},
        "ape": r.ape, "verdict_agrees": r.verdict_agrees, "off_target": r.off_target(), "error": r.error,
    }


def format_report(doc: dict) -> str:
    def f(v, kind):
        if v is None:
            return "-"
        if kind == "s":
            return f"{v:.2f}"
        if kind == "ms":
            return f"{v * 1000:.1f}"
        if kind == "tok":
            return f"{v:,.0f}"
        return f"{v:.2f}"

    cols = (("p50_ttft_s", "P50 TTFT s", "s"), ("p90_ttft_s", "P90 TTFT s", "s"), ("p90_tpot_s", "P90 TPOT ms", "ms"),
            ("throughput_tokens_per_s", "tok/s", "tok"), ("prefix_cache_hit_rate", "hit", "r"))
    lines = []
    head = f"{'point':<36}" + "".join(f"{name:>22}" for _, name, _ in cols) + f"{'SLO pred/meas':>15}"
    lines.append(head)
    lines.append(" " * 36 + "".join(f"{'pred / meas':>22}" for _ in cols))
    for pt in doc["points"]:
        cells = []
        for k, _, kind in cols:
            cells.append(f"{f(pt['predicted'].get(k), kind) + ' / ' + f(pt['measured'].get(k), kind):>22}")
        verdict = lambda v: "-" if v is None else ("met" if v else "miss")
        mark = "  ! " + ",".join(pt["off_target"]) if pt["off_target"] else ""
        lines.append(f"{pt['label'][:35]:<36}" + "".join(cells)
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
    t = doc["targets"]
    checks = doc["target_results"]
    lines.append(f"targets: P90 TTFT MAPE <= {t['p90_ttft_s_mape_max']:.0%} "
                 f"({'met' if checks['p90_ttft_s'] else 'MISSED'}), P90 TPOT MAPE <= {t['p90_tpot_s_mape_max']:.0%} "
                 f"({'met' if checks['p90_tpot_s'] else 'MISSED'}), verdicts >= {t['verdict_agreement_min']:.0%} "
                 f"({'met' if checks['verdict_agreement'] else 'MISSED'})")
    for s in doc.get("skipped") or []:
        lines.append(f"skipped {s['source']}: {s['reason']}")
    return "\n".join(lines)


__all__ = ["LoadPoint", "PointResult", "find_sources", "format_report", "points_from_database", "points_from_probe",
           "predict_point", "run_fidelity", "summarize"]
