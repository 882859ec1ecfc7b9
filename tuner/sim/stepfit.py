"""Fit the step-time model's mechanism to what real SGLang servers logged about their own steps.

The data are the windows of ``tuner.sim.steplog``: 40 decode batches (batch size and KV held at
both ends) plus the prefill batches that ran between them (new tokens, cached prefix, sequences),
and the window's wall time from SGLang's own ``gen throughput``. The model is the simulator's own
step-time model (``tuner.sim.steptime.StepTimeModel``) built for each trial's configuration, so
the fitted values are exactly the calibration keys the simulator reads:

* ``overhead.cpu_step_s`` + ``overhead.per_request_s`` x running: the scheduler's CPU time per
  step; the overlap scheduler hides it behind the GPU step, so it is the floor of a step (on the
  studies' servers it fits well above the scheduler's own CPU, measured alone by
  results/h100-sglang/sched_probe.py: docs/calibration.md, "The scheduler's CPU, measured");
* ``overhead.layer_s``: fixed GPU time per layer of a decode step (the small kernels of a layer
  inside a CUDA graph);
* ``memory_efficiency``: the share of HBM bandwidth at which a decode step streams the weights it
  touches (dense weights and the experts the batch routes to);
* ``kv_memory_efficiency``: the same for the decode attention kernel reading the KV cache;
* ``compute_efficiency.decode_attention``: SGLang's Triton MLA decode kernel (absorbed, compute-bound);
* ``overhead.eager_prefill_per_layer_s``: launch cost per layer of a prefill step without prefill
  CUDA graphs (every kernel launched from Python); ``overhead.prefill_batch_s``: the fixed cost of a
  prefill step outside its kernels (building the batch, sampling its first tokens);
  ``overhead.prefill_per_layer_s``: the same launch cost with SGLang's breakable prefill CUDA
  graphs, whose attention runs eagerly between the captured segments;
* ``compute_efficiency.moe`` and ``.dense``: the fused-MoE and linear GEMMs of prefill steps;
* ``compute_efficiency.extend_attention.<mode>``: the extend-attention kernel over new tokens x
  (cached prefix + new), per mode (``gqa``, ``mla_absorbed``, ``mla_mha``).

A parameter the data cannot see (no MLA trial, no prefill without a cached prefix) is left at
its prior value and reported as not fitted. Where the fits of other contexts hold in part (an
eager-prefill fit for servers with prefill graphs: ``calibrate.fit_base``), their values are held
and only the rest is fitted. Residuals are relative (window time), with a soft-L1
loss so that a window disturbed by something the log does not show (an idle gap, a stalled
client) counts less.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from tuner.catalog import get_gpu, get_model
from tuner.config.load import results_study
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.planner.memory import captured_token_counts, prefill_graph_enabled
from tuner.storage import repo
from tuner.storage.snapshot import read_snapshot

from .calibrate import calibration_context, load_calibration
from .scheduler import check_version, version_tuple
from .simulate import build_step_model, simulate_load_point
from .measured import find_sources, points_from_database, stored_cached_kernels
from tuner.catalog.routing import random_weight_flags
from .steplog import PrefillLine, StepWindow, decode_windows, read_step_lines
from .steptime import RankWork, StepTimeModel
from .ctxspread import ContextSpread, context_spread
from .wholesteps import WholeStepSet
from .warmup import (JIT_FIRST_PREFILL_TOKENS, KEY as STALL_KEY, LAUNCH_WARMUP_PROMPT_TOKENS, MOE_CONFIG_KEYS,
                     CachedKernels, KernelWarmup, default_split_m, fit_decay_s, groups_for, jit_wait_s, moe_config_key,
                     server_linears, triton_moe_shape, tuned_groups_of)


@dataclass(frozen=True)
class Parameter:
    """One calibration value the fit may move: its key path, bounds, and which data see it."""

    path: tuple[str, ...]
    lower: float
    upper: float
    needs: str = "any"  # any | mla | gqa | eager_prefill | mla_no_prefix
    meaning: str = ""
    tied: tuple[tuple[str, ...], ...] = ()  # other keys set to the same value (the data cannot split them)
    # measured directly (a probe), so `tuner calibration fit` holds it unless told --free: the
    # windows barely see it, and a fit left it wherever it started
    measured: bool = False

    @property
    def name(self) -> str:
        return ".".join(self.path)


PARAMETERS: tuple[Parameter, ...] = (
    Parameter(("overhead", "cpu_step_s"), 1e-4, 0.03, measured=True,
              meaning="the scheduler's CPU per decode step, hidden behind a longer GPU step (overlap scheduler)"),
    Parameter(("overhead", "per_request_s"), 0.0, 1e-3, measured=True,
              meaning="the scheduler's CPU per running request per step"),
    Parameter(("overhead", "layer_s"), 0.0, 1e-3, meaning="fixed GPU time per layer of a decode step"),
    Parameter(("overhead", "mla_layer_s"), 0.0, 1e-3, needs="mla",
              meaning="the same, more for an MLA layer (its extra small kernels)"),
    Parameter(("memory_efficiency",), 0.1, 1.0, meaning="HBM share when a decode step streams weights"),
    Parameter(("kv_memory_efficiency",), 0.05, 1.0, needs="gqa", meaning="HBM share of the decode KV reads"),
    Parameter(("overhead", "fp8_block_gemm_s"), 0.0, 2e-4, needs="fp8_block",
              meaning="fixed GPU time per fp8 block-quantized linear call (input quantization kernel + block GEMM)"),
    Parameter(("compute_efficiency", "decode_attention"), 0.01, 1.0, needs="mla",
              meaning="compute share of SGLang's Triton MLA decode kernel (absorbed)"),
    Parameter(("overhead", "eager_prefill_per_layer_s"), 0.0, 5e-3, needs="eager_prefill",
              meaning="launch cost per layer of a prefill step without prefill CUDA graphs"),
    Parameter(("overhead", "prefill_per_layer_s"), 0.0, 5e-3, needs="graph_prefill",
              meaning="launch cost per layer of a prefill step with breakable prefill CUDA graphs (attention "
                      "runs eagerly between the captured segments)"),
    Parameter(("overhead", "prefill_batch_s"), 0.0, 0.2, meaning="fixed cost of a prefill step outside its kernels"),
    # the other linears' share is measured (operator tables: compute_efficiency.dense, dense_fp8_block)
    Parameter(("compute_efficiency", "moe"), 0.02, 1.0, meaning="the fused-MoE GEMMs in prefill (share of peak)"),
    Parameter(("compute_efficiency", "extend_attention", "gqa"), 0.01, 1.0, needs="gqa",
              meaning="extend attention over the cached prefix, GQA"),
    Parameter(("compute_efficiency", "extend_attention", "gqa_causal"), 0.01, 1.0, needs="gqa",
              meaning="extend attention over the new tokens (causal), GQA"),
    # SGLang's Triton absorbed-MLA extend kernel, timed alone (operator tables): the windows see its
    # two parts only together, and a fit traded one for the other
    Parameter(("compute_efficiency", "extend_attention", "mla_absorbed"), 0.005, 1.0, needs="mla", measured=True,
              meaning="extend attention over the cached prefix, MLA (absorbed: a batch with a prefix)"),
    Parameter(("compute_efficiency", "extend_attention", "mla_absorbed_causal"), 0.005, 1.0, needs="mla",
              measured=True, meaning="extend attention over the new tokens, MLA absorbed"),
    # Triton: a batch with a prefix runs absorbed, so the MHA form only ever runs its causal part
    Parameter(("compute_efficiency", "extend_attention", "mla_mha_triton_causal"), 0.01, 1.0, needs="mla_no_prefix",
              measured=True, meaning="extend attention, MLA without a cached prefix (MHA over expanded K/V, Triton)"),
)


def get_path(cal: dict, path: tuple[str, ...], default=None):
    node = cal
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def set_path(cal: dict, path: tuple[str, ...], value) -> None:
    node = cal
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


# ---- the data --------------------------------------------------------------------------------

@dataclass
class TrialSteps:
    """One real trial: its configuration and the step windows of its server log."""

    label: str
    study: str
    trial: int
    model: Any  # ModelDescription
    gpu: Any  # GPUDescription
    gpus: int
    nodes: int
    host_memory_gb: float | None
    flags: dict
    knobs: dict
    sglang_version: str
    shared_prefix_tokens: int
    windows: list[StepWindow] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    context_spread: ContextSpread | None = None  # the workload's: a logged batch's longest context
    # per-M kernels its server found built in a pinned Triton cache (tuner.evaluation.kernel_ledger)
    cached_kernels: CachedKernels | None = None
    _plan: Any = None

    @property
    def arch(self) -> str:
        return "mla" if self.model.is_mla else "gqa"

    @property
    def weight_format(self) -> str:
        return resolve_checkpoint(self.model, self.flags.get("quantization")).weight_format

    def moe_kernel_shape(self):
        """The expert shape its Triton fused MoE ran (``tuner.sim.warmup.triton_moe_shape``)."""
        layout = parse_layout(self.model, self.flags, self.gpus * self.nodes)
        return triton_moe_shape(self.model, self.weight_format, layout.tp, layout.ep, self.flags)

    def step_model_prefill_graph(self) -> bool:
        return prefill_graph_enabled(self.model, self.flags, version_tuple(self.sglang_version))

    def planned(self) -> tuple:
        """(memory plan, parallel layout) of its server, planned once."""
        if self._plan is None:
            plan = plan_memory(self.model, self.gpu, self.gpus, self.flags, nodes=self.nodes,
                               host_memory_gb=self.host_memory_gb, sglang_version=self.sglang_version)
            self._plan = (plan, parse_layout(self.model, self.flags, self.gpus * self.nodes))
        return self._plan

    def step_model(self, calibration: dict) -> StepTimeModel:
        plan, layout = self.planned()
        return build_step_model(self.model, self.gpu, plan, layout, self.flags, self.knobs, calibration,
                                self.gpus, self.sglang_version)


def trial_log_files(db_path: Path, study: str, trial: int, log_path: str | None) -> list[Path]:
    """The trial's server logs: ``runs/<study>/trial-NNNN/*.log[.gz]`` beside the database (as
    results are collected), else where the trial recorded them."""
    here = db_path.parent / "runs" / study / f"trial-{trial:04d}"
    found = sorted([*here.glob("*.log.gz"), *here.glob("*.log")]) if here.is_dir() else []
    if not found and log_path and Path(log_path).is_file():
        found = [Path(log_path)]
    return found


def trials_from_database(path: str | Path, *, backends: tuple[str, ...] = ("sglang",)) -> list[TrialSteps]:
    """Every real trial of the database whose server log has step lines."""
    path = Path(path)
    out: list[TrialSteps] = []
    with read_snapshot(path) as engine:
        if engine is None:
            return out
        for study_row in repo.list_studies(engine):
            spec = results_study(study_row.spec_yaml, study_row.name, str(path))
            profile = spec.workload_profile()
            options = spec.backend_options or {}
            version = check_version(options.get("sglang_version"))
            model = get_model(spec.model)
            gpu = get_gpu(spec.hardware.gpu)
            first: dict[int, Any] = {}  # each trial's first load point: what its server found cached
            for m in repo.measurements(engine, study_row.name):
                if m.trial_number not in first or m.step < first[m.trial_number].step:
                    first[m.trial_number] = m
            for t in repo.trials(engine, study_row.name):
                if t.backend_kind not in backends:
                    continue
                logs = trial_log_files(path, study_row.name, t.trial_number, t.log_path)
                windows = []
                for log in logs:
                    windows += decode_windows(read_step_lines(log), source=str(log))
                if not windows:
                    continue
                out.append(TrialSteps(
                    label=f"{study_row.name}#{t.trial_number}", study=study_row.name, trial=t.trial_number,
                    model=model, gpu=gpu, gpus=spec.hardware.gpus_per_node, nodes=spec.hardware.nodes,
                    host_memory_gb=spec.hardware.host_memory_gb,
                    flags={**random_weight_flags(options), **(t.flags or {})},
                    knobs=dict(t.knobs or {}), sglang_version=version,
                    shared_prefix_tokens=int(round(profile.system_prefix_tokens * profile.scale)),
                    windows=windows, logs=[str(x) for x in logs], context_spread=context_spread(profile),
                    cached_kernels=stored_cached_kernels(
                        getattr(first.get(t.trial_number), "extra", None), f"{study_row.name}#{t.trial_number}")))
    return out


def load_real_data(dirs: Iterable[str | Path]) -> tuple[list[TrialSteps], list]:
    """Every real trial with step lines and every real load point under ``dirs``."""
    dbs, _probes = find_sources(dirs)
    trials, points = [], []
    for db in dbs:
        trials += trials_from_database(db)
        points += points_from_database(db)
    return trials, points


def fit_context(trials: list[TrialSteps]) -> dict:
    """The calibration context all trials share (``calibrate.calibration_context``)."""
    contexts = {json.dumps(calibration_context(t.model, t.gpu, t.flags, t.sglang_version), sort_keys=True)
                for t in trials}
    if len(contexts) != 1:
        raise ConfigError("the trials run under different calibration contexts (SGLang version, attention "
                          f"backend, prefill CUDA graphs): {sorted(contexts)}; fit one at a time", key="--results")
    return json.loads(contexts.pop())


# ---- the model of one window --------------------------------------------------------------------

def _decode_work(running: int, kv_tokens: int, shared_prefix: int, spread: ContextSpread | None = None) -> RankWork:
    # each request reads its whole context; the log counts a shared prefix once
    ctx = kv_tokens + max(0, running - 1) * shared_prefix
    hi, lo = spread.extremes(running, ctx) if spread is not None else (0, 0)
    return RankWork(decode_reqs=running, decode_ctx_tokens=ctx, decode_max_ctx_tokens=hi, decode_min_ctx_tokens=lo)


def _prefill_work(line: PrefillLine) -> RankWork:
    items = line.extend_items()
    return RankWork(prefill_tokens=line.new_tokens, prefill_seqs=len(items),
                    prefill_ctx_units=sum(c * (p + c / 2) for c, p in items), extend_items=tuple(items))


def window_time(sm: StepTimeModel, w: StepWindow, shared_prefix: int, overlap: bool = True,
                spread: ContextSpread | None = None) -> float:
    """Predicted wall time of a window: its decode batches (half at each end's batch) and its
    prefill batches, each step ``max(GPU, scheduler CPU)`` under the overlap scheduler. ``spread``:
    the workload's, for each batch's longest context (else every request at the mean)."""
    half = w.interval / 2
    t = 0.0
    for n, kv in ((w.running_start, w.kv_tokens_start), (w.running_end, w.kv_tokens_end)):
        t += half * sm.step_time([_decode_work(n, kv, shared_prefix, spread)], n, overlap=overlap)
    for p in w.prefills:
        t += sm.step_time([_prefill_work(p)], p.running, overlap=overlap)
    return t


WHOLE_STEP_WEIGHT = 0.5  # the whole steps together against all the windows (least-squares weight)
MIN_WINDOWS_FOR_A_MODE = 30  # prefill batches of a kind the data must hold before its efficiency is fitted


def _sees(trials: list[TrialSteps], needs: str) -> bool:
    if needs == "any":
        return bool(trials)
    if needs in ("mla", "gqa"):
        return any(t.arch == needs for t in trials)
    if needs == "fp8_block":
        return any(t.weight_format == "fp8_block" for t in trials)
    if needs == "eager_prefill":
        return any(not t.step_model_prefill_graph() for t in trials)
    if needs == "graph_prefill":
        return any(t.step_model_prefill_graph() for t in trials)
    if needs == "mla_no_prefix":
        return sum(1 for t in trials if t.arch == "mla" for w in t.windows for p in w.prefills
                   if p.cached_tokens == 0 and not p.chunk_prefix_tokens) >= MIN_WINDOWS_FOR_A_MODE
    raise ValueError(needs)


@dataclass
class FitResult:
    values: dict[str, float]  # parameter name -> fitted value
    prior: dict[str, float]
    fixed: list[str]  # parameters the data could not see (left at the prior)
    trials: list[str]
    windows: int
    residuals: dict[str, dict]  # trial label -> {median_abs, mean, n}
    calibration: dict  # the full calibration with the fitted values
    at_bound: list[str] = field(default_factory=list)  # fitted to a bound: the data push past it
    held: list[str] = field(default_factory=list)  # value paths another context's fit gives (calibrate.fit_base)
    prefill_scale: "PrefillScale | None" = None
    warmup: "WarmupStalls | None" = None
    whole_steps: dict[str, dict] = field(default_factory=dict)  # set label -> whole_step_errors()

    def as_overrides(self) -> dict:
        """The calibration keys this fit set, with their final values (after the prefill scale)."""
        paths = [path for p in PARAMETERS if p.name in self.values for path in (p.path, *p.tied)]
        if self.prefill_scale is not None:
            paths += [*PREFILL_COMPUTE, ("overhead", "eager_prefill_per_layer_s"), ("overhead", "prefill_per_layer_s"),
                      ("overhead", "prefill_batch_s")]
            paths += [("compute_efficiency", "extend_attention", m) for m in
                      ("gqa", "gqa_causal", "mla_absorbed", "mla_absorbed_causal", "mla_mha_triton_causal")]
        if self.warmup is not None:
            paths.append((STALL_KEY,))
        out: dict = {}
        for path in dict.fromkeys(paths):
            if is_held(path, self.held):  # not this fit's: the other context's entry gives it
                continue
            v = get_path(self.calibration, path)
            set_path(out, path, dict(v) if isinstance(v, dict) else float(f"{v:.4g}"))
        return out


def _overlap(t: TrialSteps) -> bool:
    return not bool(t.flags.get("disable-overlap-schedule")) and int(t.flags.get("pp-size") or 1) == 1


def trial_window_times(t: TrialSteps, calibration: dict) -> np.ndarray:
    sm = t.step_model(calibration)
    overlap = _overlap(t)
    return np.array([window_time(sm, w, t.shared_prefix_tokens, overlap, t.context_spread) for w in t.windows])


def residual_summary(trials: list[TrialSteps], calibration: dict) -> dict[str, dict]:
    """Per trial: how far the calibrated model's window times are from the log's."""
    out = {}
    for t in trials:
        wall = np.array([w.wall_s for w in t.windows])
        rel = (trial_window_times(t, calibration) - wall) / wall
        out[t.label] = {"windows": len(rel), "median_abs_error": float(np.median(np.abs(rel))),
                        "mean_error": float(np.mean(rel)),
                        "p90_abs_error": float(np.quantile(np.abs(rel), 0.9))}
    return out


def is_held(path: tuple[str, ...], held: Iterable[str]) -> bool:
    """Whether the value at ``path`` is, or lies below, one of the ``held`` dotted paths."""
    name = ".".join(path)
    return any(name == h or name.startswith(h + ".") for h in held)


def fit(trials: list[TrialSteps], *, calibration: dict | None = None, parameters: Iterable[Parameter] = PARAMETERS,
        held: Iterable[str] = (), progress: Callable[[str], None] | None = None,
        whole_steps: Iterable[WholeStepSet] = (), whole_step_weight: float = WHOLE_STEP_WEIGHT) -> FitResult:
    """Least squares of the relative window-time error over the parameters the data can see, but
    those ``held`` (value paths another context's fit gives: ``calibrate.fit_base``).

    ``whole_steps``: forward steps measured alone (``tuner.sim.wholesteps``), whose relative errors
    join the windows' with, together, ``whole_step_weight`` times the windows' weight: they pin
    the forward (kernels, launch, weight and KV streaming), so the windows are left to say what
    the scheduler adds."""
    from scipy.optimize import least_squares  # heavy

    if not trials:
        raise ConfigError("no trial with SGLang step lines to fit", key="--results")
    gpus = {t.gpu.name for t in trials}
    if len(gpus) != 1:
        raise ConfigError(f"fit one GPU at a time; the data hold {sorted(gpus)}", key="--results")
    base = copy.deepcopy(calibration if calibration is not None else load_calibration(trials[0].gpu.name))
    held = list(held)
    free = [p for p in parameters if _sees(trials, p.needs) and not is_held(p.path, held)]
    fixed = [p.name for p in parameters if p not in free]
    prior = {p.name: float(_prior(base, p)) for p in parameters}

    def cal_for(x) -> dict:
        cal = copy.deepcopy(base)
        for p, v in zip(free, x):
            for path in (p.path, *p.tied):
                set_path(cal, path, float(v))
        return cal

    walls = [np.array([w.wall_s for w in t.windows]) for t in trials]
    whole_steps = list(whole_steps)
    # (set, its rows a fit uses, their measured seconds), for the sets with any
    step_rows = [(ws, steps, np.array([s.seconds for s in steps])) for ws in whole_steps
                 if (steps := ws.fitted_steps)]
    n_steps = sum(len(steps) for _, steps, _ in step_rows)
    # per row, so that the rows together weigh whole_step_weight x the windows (a least-squares weight)
    step_w = math.sqrt(whole_step_weight * sum(len(w) for w in walls) / n_steps) if n_steps else 0.0
    evals = [0]

    def residuals(x):
        cal = cal_for(x)
        res = [_prior_residuals(free, x, prior)]
        for t, wall in zip(trials, walls):
            res.append((trial_window_times(t, cal) - wall) / wall)
        for ws, steps, meas in step_rows:
            res.append(step_w * (np.array(ws.predicted_s(cal, steps)) - meas) / meas)
        evals[0] += 1
        if progress and evals[0] % 25 == 0:
            progress(f"fit: {evals[0]} evaluations")
        return np.concatenate(res)

    lo = np.array([p.lower for p in free])
    hi = np.array([p.upper for p in free])
    best = None
    # A step is max(GPU, CPU): while the CPU floor sits below every GPU step its gradient is 0, so
    # the floor starts near the data's fastest decode steps.
    for start in _starts(free, prior, trials, whole_steps):
        x0 = np.clip(start, lo + 1e-12, hi - 1e-12)
        sol = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale="jac",
                            diff_step=1e-3, max_nfev=200)
        if best is None or sol.cost < best.cost:
            best = sol
    sol = best
    cal = cal_for(sol.x)
    values = {p.name: float(v) for p, v in zip(free, sol.x)}
    at_bound = [p.name for p, v in zip(free, sol.x) if v <= p.lower * 1.001 or v >= p.upper * 0.999]
    return FitResult(values=values, prior=prior, fixed=fixed, trials=[t.label for t in trials],
                     windows=sum(len(t.windows) for t in trials), residuals=residual_summary(trials, cal),
                     calibration=cal, at_bound=at_bound, held=held,
                     whole_steps={ws.label: whole_step_errors(ws, cal) for ws in whole_steps})


def whole_step_errors(ws: WholeStepSet, calibration: dict) -> dict:
    """How far the calibrated forward is from a set's whole steps: mean |error| by kind, and
    every row's signed error."""
    rows = []
    for s, pred in zip(ws.steps, ws.predicted_s(calibration)):
        rows.append({"kind": s.kind, "batch": s.batch, "tokens": s.tokens, "prefix": s.prefix,
                     "measured_s": s.seconds, "predicted_s": pred, "error": (pred - s.seconds) / s.seconds})

    def mean_abs(kind=None):
        v = [abs(r["error"]) for r in rows if kind in (None, r["kind"])]
        return float(np.mean(v)) if v else None

    return {"gpu": ws.gpu.name, "fitted_kinds": list(ws.fit_kinds), "mean_abs_error": mean_abs(),
            "mean_abs_error_decode": mean_abs("decode"), "mean_abs_error_prefill": mean_abs("prefill"), "rows": rows}


# ---- stage 2: prefill time from SGLang's own prefill-forward stage -------------------------------

PREFILL_COMPUTE = (("compute_efficiency", "moe"),)  # the dense linears' efficiency is measured
SCALE_BOUNDS = (0.4, 4.0)
SCALE_MIN_EFFECT = 0.2  # d log(stage) / d log(scale) below which the stage cannot set the scale


@dataclass
class PrefillScale:
    """How much longer (> 1) or shorter prefill steps are than the window fit made them, so that
    the simulator's mean prefill-forward stage equals SGLang's own over steady load points."""

    scale: float
    points: list[dict]  # per load point: label, measured and simulated stage means at the scale
    fitted: bool = True  # False: left at 1 (the scaled values barely move the stage), the stages a check

    @property
    def log_ratio_spread(self) -> float:
        r = [math.log(p["simulated_prefill_forward_s"] / p["measured_prefill_forward_s"]) for p in self.points]
        return float(np.std(r)) if r else 0.0


def scale_prefill(calibration: dict, scale: float, held: Iterable[str] = ()) -> dict:
    """Prefill steps ``scale`` times as long: prefill compute efficiencies / scale, launch costs x
    scale; values ``held`` (another context's fit gives them) stay."""
    cal = copy.deepcopy(calibration)
    held = list(held)

    def rescale(path: tuple[str, ...], value: float, factor: float) -> None:
        if not is_held(path, held):
            set_path(cal, path, float(value) * factor)

    for path in PREFILL_COMPUTE:
        rescale(path, get_path(cal, path), 1.0 / scale)
    ext = dict(get_path(cal, ("compute_efficiency", "extend_attention")) or {})
    base = get_path(cal, ("compute_efficiency", "attention"))
    for mode in ("gqa", "mla_absorbed", "mla_mha", "dsa"):
        for key in (mode, mode + "_causal"):
            rescale(("compute_efficiency", "extend_attention", key), ext.get(key, ext.get(mode, base)), 1.0 / scale)
    # Triton's MHA form runs its causal part alone (a batch with a prefix runs absorbed)
    rescale(("compute_efficiency", "extend_attention", "mla_mha_triton_causal"),
            ext.get("mla_mha_triton_causal", ext.get("mla_mha", base)), 1.0 / scale)
    ov = cal["overhead"]
    rescale(("overhead", "eager_prefill_per_layer_s"), ov.get("eager_prefill_per_layer_s", ov["prefill_per_layer_s"]),
            scale)
    rescale(("overhead", "prefill_per_layer_s"), ov["prefill_per_layer_s"], scale)
    rescale(("overhead", "prefill_batch_s"), ov.get("prefill_batch_s", 0.0), scale)
    return cal


def steady_points(points) -> list:
    """Load points with SGLang's stage metrics measured on a warm server (not its first)."""
    return [p for p in points if not p.fresh_server and p.server_stage_means()]


def simulated_stages(p, calibration: dict) -> dict:
    m = simulate_load_point(p.model, p.gpu, p.gpus, p.flags, p.knobs, p.workload, p.users, warmup_s=p.warmup_s,
                            duration_s=p.duration_s, seed=p.seed, nodes=p.nodes, host_memory_gb=p.host_memory_gb,
                            calibration=calibration, sglang_version=p.sglang_version)
    return m.extra["server_stage_means"]


def fit_prefill_scale(points, calibration: dict, progress: Callable[[str], None] | None = None,
                      held: Iterable[str] = ()) -> PrefillScale:
    """Bisection on the scale for mean log(simulated / measured prefill forward) = 0 (the values
    ``held`` do not scale)."""
    pts = steady_points(points)
    if not pts:
        raise ConfigError("no warm-server load point with SGLang's stage metrics (extra.server_metrics)",
                          key="--results")

    def evaluate(scale):
        cal = scale_prefill(calibration, scale, held)
        rows = []
        for p in pts:
            sim = simulated_stages(p, cal)
            meas = p.server_stage_means()
            rows.append({"label": p.label, "measured_prefill_forward_s": meas["prefill_forward_s"],
                         "simulated_prefill_forward_s": max(sim["prefill_forward_s"], 1e-6),
                         "measured_queue_s": meas["queue_s"], "simulated_queue_s": sim["queue_s"],
                         "measured_ttft_s": meas["ttft_s"], "simulated_ttft_s": sim["ttft_s"]})
        err = float(np.mean([math.log(r["simulated_prefill_forward_s"] / r["measured_prefill_forward_s"])
                             for r in rows]))
        if progress:
            progress(f"prefill scale {scale:.3f}: mean log(simulated/measured prefill forward) {err:+.3f}")
        return err, rows

    lo, hi = SCALE_BOUNDS
    e1, rows = evaluate(1.0)
    if abs(e1) < 0.01:
        return PrefillScale(1.0, rows)
    # bracket: the stage grows with the scale
    a, b = (1.0, min(hi, 2.0)) if e1 < 0 else (max(lo, 0.5), 1.0)
    # what the scale acts on must move the stage: where the values left to scale (a launch cost
    # the kernels hide, the others held) barely do, the scale is not fitted and the stage is a check
    probe = b if e1 < 0 else a
    e_probe, _ = evaluate(probe)
    if abs(e_probe - e1) < SCALE_MIN_EFFECT * abs(math.log(probe)):
        return PrefillScale(1.0, rows, fitted=False)
    ea, eb = (e1, e_probe) if e1 < 0 else (e_probe, e1)
    if e1 < 0:
        while eb < 0 and b < hi:
            a, ea, b = b, eb, min(hi, b * 1.6)
            eb, _ = evaluate(b)
    else:
        while ea > 0 and a > lo:
            b, eb, a = a, ea, max(lo, a / 1.6)
            ea, _ = evaluate(a)
    best = (abs(e1), 1.0, rows)
    for _ in range(8):
        mid = math.sqrt(a * b)
        em, rows_m = evaluate(mid)
        if abs(em) < best[0]:
            best = (abs(em), mid, rows_m)
        if abs(em) < 0.01:
            break
        if em < 0:
            a, ea = mid, em
        else:
            b, eb = mid, em
    return PrefillScale(best[1], best[2])


WARMUP_LOOK_S = 60.0  # a fresh server's first seconds of traffic searched for stalls
STALL_MIN_S = 0.3  # a window this much (and half) slower than the model holds a stall


@dataclass
class WarmupStalls:
    """Stalls of fresh servers: windows of their first ``WARMUP_LOOK_S`` of traffic far slower
    than the step-time model, which warm servers show far less often. The simulator's
    ``fresh_server_stalls`` (``tuner.sim.warmup``) come from here."""

    count: float  # per server start, within its first WARMUP_LOOK_S
    stall_s: float  # mean excess of a stall window
    decay_s: float  # time constant of their decaying rate (maximum likelihood over the look)
    servers: int
    stalls: list[dict] = field(default_factory=list)  # log, seconds after first traffic, excess
    later_rate_per_min: float = 0.0  # the same excess after WARMUP_LOOK_S, per minute
    # the kernel-variant model: windows holding a prefill batch that runs a fused-MoE variant new to
    # its server, over the whole log (tuner.sim.warmup.KernelWarmup)
    per_new_kernel_s: float = 0.0  # extra time per new variant, above other prefill windows' mean
    new_kernel_windows: int = 0
    new_kernel_window_stalls: int = 0  # of them holding a stall (as above, at any time)
    other_prefill_windows: int = 0
    other_prefill_window_stalls: int = 0
    moe_config_groups: dict = field(default_factory=dict)

    @property
    def per_start(self) -> float:
        """Expected stalls per start over all time (the look sees 1 - exp(-look/decay) of them)."""
        seen = -math.expm1(-WARMUP_LOOK_S / self.decay_s) if self.decay_s > 0 else 1.0
        return self.count / seen if seen > 0 else self.count

    def as_calibration(self) -> dict:
        """The simulator's ``fresh_server_stalls`` entry: the kernel-variant model where new
        variants were seen, else the time schedule."""
        if self.new_kernel_windows:
            return {"per_new_kernel_s": float(f"{self.per_new_kernel_s:.4g}"),
                    "moe_config_groups": {k: [list(g) for g in v] for k, v in sorted(self.moe_config_groups.items())}}
        return {"per_start": float(f"{self.per_start:.4g}"), "stall_s": float(f"{self.stall_s:.4g}"),
                "decay_s": float(f"{self.decay_s:.4g}")}

    def as_dict(self) -> dict:
        return {"count_per_start": round(self.count, 2), "stall_s": round(self.stall_s, 3),
                "decay_s": round(self.decay_s, 1), "look_s": WARMUP_LOOK_S, "servers": self.servers,
                "later_per_min": round(self.later_rate_per_min, 3), "stalls": self.stalls,
                "per_new_kernel_s": round(self.per_new_kernel_s, 3), "new_kernel_windows": self.new_kernel_windows,
                "new_kernel_window_stalls": self.new_kernel_window_stalls,
                "other_prefill_windows": self.other_prefill_windows,
                "other_prefill_window_stalls": self.other_prefill_window_stalls,
                "calibration": self.as_calibration()}


def _is_stall(excess: float, predicted: float) -> bool:
    return excess > STALL_MIN_S and excess > 0.5 * predicted


def new_variant_times(t: TrialSteps, log: str, groups: list[list[int]] | None, topk: int,
                      default_split_m: int | None = None) -> list[float]:
    """Times of the prefill lines of a server log that ran a per-M kernel variant first on it, once per
    kernel the line built (``KernelWarmup.new_kernels``), of
    its fused MoE (``topk`` > 0) or of its block-fp8 linears (``tuner.sim.warmup.KernelWarmup``: the
    key groups of SGLang's files, the batch sizes its CUDA graphs ran at start-up), from the whole
    log where it exists, else from its windows' prefills."""
    plan, layout = t.planned()
    linears = server_linears(t.model, t.weight_format, layout.tp, layout.ep, t.flags, t.gpu.device_name,
                             t.sglang_version)
    captured = tuple(captured_token_counts(t.model, t.flags, plan)) if linears else ()
    cached = t.cached_kernels or CachedKernels()  # built in its cache by earlier servers: not new to it
    variants = KernelWarmup(1.0, groups, topk, default_split_m=default_split_m, linears=linears,
                            precompiled_tokens=(*captured, *cached.graph_tokens),
                            prefilled_tokens=(LAUNCH_WARMUP_PROMPT_TOKENS, *cached.prefill_tokens))
    # a time per kernel built: the fit measures the cost of one
    return [ev.t for ev in _prefill_events(t, log) for _ in range(variants.new_kernels(ev.new_tokens))]


def _prefill_events(t: TrialSteps, log: str) -> list[PrefillLine]:
    """A server's prefill lines: from its whole log where it exists, else from its windows' prefills."""
    events = read_step_lines(log) if Path(log).is_file() else [p for w in t.windows if w.source == log
                                                               for p in w.prefills]
    return [ev for ev in events if isinstance(ev, PrefillLine)]


def first_long_prefill_time(t: TrialSteps, log: str) -> float | None:
    """When a server's first prefill of ``JIT_FIRST_PREFILL_TOKENS`` or more ran (None: none ran)."""
    return next((ev.t for ev in _prefill_events(t, log) if ev.new_tokens >= JIT_FIRST_PREFILL_TOKENS), None)


def warmup_stalls(trials: list[TrialSteps], calibration: dict,
                  groups: dict[str, list[list[int]]] | None = None) -> WarmupStalls | None:
    """Fresh servers' stalls against the calibrated step times: their times (the time model) and
    the windows holding a prefill batch that runs a fused-MoE kernel variant new to its server
    (the kernel-variant model: the mean extra time of those windows over other prefill windows').
    ``groups`` (per config selector) replaces those of the files SGLang ships for each trial's GPU."""
    stalls, servers, late, late_minutes = [], 0, 0, 0.0
    new_ex, new_n, new_st, new_variants, old_ex, old_n, old_st = 0.0, 0, 0, 0, 0.0, 0, 0
    used: dict = {}
    for t in trials:
        pred = trial_window_times(t, calibration)
        shape = t.moe_kernel_shape()
        key = moe_config_key(shape) if shape is not None else None
        shape_groups = None
        if shape is not None:
            shape_groups = (groups or {}).get(key)
            if shape_groups is None:
                # on tuned tiles the tuned file's groups, else the shipped file's (not the logged ones the fit sets)
                if (t.knobs or {}).get("moe-tile-configs") == "tuned":
                    shape_groups = tuned_groups_of(shape, calibration)
                if shape_groups is None:
                    shape_groups = groups_for(shape, None, t.gpu.device_name, t.sglang_version)
            if shape_groups:
                used[key] = shape_groups
            elif shape_groups == [] and default_split_m(shape, shape_groups) is None:
                # no file: SGLang's default block-fp8 config, one for every M (what the logs show)
                used[key] = [list(MOE_CONFIG_KEYS)]
        split = default_split_m(shape, shape_groups) if shape is not None else None
        by_log: dict[str, list] = {}
        for w, p in zip(t.windows, pred):
            by_log.setdefault(w.source, []).append((w, p))
        for i, (log, rows) in enumerate(by_log.items()):
            servers += 1
            t0 = rows[0][0].t_start
            fresh = np.array(new_variant_times(t, log, shape_groups, shape.topk if shape is not None else 0, split))
            # the first server of a cold machine also waits for SGLang's JIT modules: not a Triton build
            jit_s = jit_wait_s(t.model, t.cached_kernels) if i == 0 else 0.0
            jit_t = first_long_prefill_time(t, log) if jit_s else None
            for w, p in rows:
                excess = w.wall_s - p
                if jit_t is not None and w.t_start < jit_t <= w.t_end:
                    excess -= jit_s
                if _is_stall(excess, p):
                    if w.t_end - t0 <= WARMUP_LOOK_S:  # at the middle of its window
                        stalls.append({"log": log, "after_s": (w.t_start + w.t_end) / 2 - t0, "excess_s": excess})
                    else:
                        late += 1
                if not w.prefills:
                    continue
                k = int(((fresh > w.t_start) & (fresh <= w.t_end)).sum()) if fresh.size else 0
                if k:
                    new_ex, new_n, new_st, new_variants = new_ex + excess, new_n + 1, new_st + _is_stall(excess, p), \
                        new_variants + k
                else:
                    old_ex, old_n, old_st = old_ex + excess, old_n + 1, old_st + _is_stall(excess, p)
            late_minutes += max(0.0, rows[-1][0].t_end - t0 - WARMUP_LOOK_S) / 60
    if not servers:
        return None
    later = late / late_minutes if late_minutes else 0.0
    per_new = max(0.0, (new_ex - new_n * (old_ex / old_n if old_n else 0.0)) / new_variants) if new_variants else 0.0
    kernel = dict(per_new_kernel_s=per_new, new_kernel_windows=new_n, new_kernel_window_stalls=new_st,
                  other_prefill_windows=old_n, other_prefill_window_stalls=old_st, moe_config_groups=used)
    if not stalls:
        return WarmupStalls(0.0, 0.0, WARMUP_LOOK_S, servers, [], later, **kernel)
    times = [s["after_s"] for s in stalls]
    return WarmupStalls(len(stalls) / servers, float(np.mean([s["excess_s"] for s in stalls])),
                        fit_decay_s(times, WARMUP_LOOK_S), servers, stalls, later, **kernel)


def calibrate(trials: list[TrialSteps], points, *, calibration: dict | None = None, held: Iterable[str] = (),
              progress: Callable[[str], None] | None = None,
              whole_steps: Iterable[WholeStepSet] = ()) -> FitResult:
    """Every stage: the window fit (with any whole steps), the prefill scale, then the fresh-server
    stalls; none moves the values ``held`` (another context's fit gives them: ``calibrate.fit_base``)."""
    whole_steps = list(whole_steps)
    res = fit(trials, calibration=calibration, held=held, progress=progress, whole_steps=whole_steps)
    pts = [p for p in points if any(p.study == t.study and p.trial == t.trial for t in trials)]
    if steady_points(pts):
        scale = fit_prefill_scale(pts, res.calibration, progress, held=res.held)
        res.prefill_scale = scale
        res.calibration = scale_prefill(res.calibration, scale.scale, res.held)
    # the stalls of fresh servers, measured against the calibrated step times; the simulator puts
    # them into a deployment's first load point (tuner.sim.warmup)
    res.warmup = warmup_stalls(trials, res.calibration)
    if res.warmup is not None:
        res.calibration[STALL_KEY] = res.warmup.as_calibration()
    res.residuals = residual_summary(trials, res.calibration)
    res.whole_steps = {ws.label: whole_step_errors(ws, res.calibration) for ws in whole_steps}
    return res


PRIOR_WEIGHT = 1.0  # a factor of e from an efficiency's prior costs as much as one window 100 % off


def _prior_residuals(free: list[Parameter], x, prior: dict[str, float]) -> np.ndarray:
    """A weak pull toward the priors (maximum a posteriori): a direction the windows cannot see
    (e.g. weight against KV bandwidth inside one trial) stays near the prior instead of drifting."""
    out = []
    for p, v in zip(free, x):
        p0 = prior[p.name]
        if p.path[0] in ("memory_efficiency", "kv_memory_efficiency", "compute_efficiency") and p0 > 0:
            out.append(PRIOR_WEIGHT * math.log(max(v, 1e-9) / p0))
        else:  # times: relative to the parameter's range
            out.append(PRIOR_WEIGHT * (v - p0) / (p.upper - p.lower) * 0.1)
    return np.array(out)


def _starts(free: list[Parameter], prior: dict[str, float], trials: list[TrialSteps],
            whole_steps: Iterable[WholeStepSet] = ()) -> list[list[float]]:
    x = [prior[p.name] for p in free]
    names = [p.name for p in free]
    if "overhead.cpu_step_s" in names:
        steps = [w.wall_s / w.interval for t in trials for w in t.windows if not w.prefills]
        if steps:  # the floor at the fastest decode steps: its gradient is not 0 there
            x[names.index("overhead.cpu_step_s")] = float(np.quantile(steps, 0.1)) * 0.8
    # a prefill's launch cost is hidden behind longer kernels (max): it starts near the fastest
    # whole prefill of its mode, where it binds, so that its gradient is not 0
    def within(i: int, v: float) -> float:
        return min(free[i].upper, max(free[i].lower, v))

    for name, graph in LAUNCH_PARAMETERS:
        if name not in names:
            continue
        fastest = [s.seconds / ws.model.num_layers for ws in whole_steps
                   if ws.prefill_graph == graph for s in ws.fitted_steps if s.kind == "prefill"]
        if fastest:
            x[names.index(name)] = within(names.index(name), 0.9 * min(fastest))
    starts = [x]
    # without such a step, also from a launch cost that binds the windows' short prefills (about a
    # millisecond per layer, as Python launches an eager prefill's kernels): the best start wins
    launch = [names.index(n) for n, _ in LAUNCH_PARAMETERS if n in names and x[names.index(n)] == prior[n]]
    if launch:
        y = list(x)
        for i in launch:
            y[i] = within(i, LAUNCH_START_S)
        starts.append(y)
    return starts


# the launch cost of a prefill step, and whether its steps run prefill CUDA graphs
LAUNCH_PARAMETERS = (("overhead.eager_prefill_per_layer_s", False), ("overhead.prefill_per_layer_s", True))
LAUNCH_START_S = 1e-3


def _prior(cal: dict, p: Parameter) -> float:
    v = get_path(cal, p.path)
    if v is not None:
        return float(v)
    # keys the step-time model derives from others when absent
    if p.path == ("kv_memory_efficiency",):
        return float(cal["memory_efficiency"])
    if p.path[:2] == ("compute_efficiency", "extend_attention") and p.path[2].endswith("_causal"):
        return _prior(cal, Parameter(p.path[:2] + (p.path[2][:-len("_causal")],), p.lower, p.upper))
    if p.path[:2] == ("compute_efficiency", "extend_attention") or p.path == ("compute_efficiency",
                                                                               "decode_attention"):
        return float(cal["compute_efficiency"]["attention"])
    raise KeyError(p.name)


__all__ = ["FitResult", "PARAMETERS", "Parameter", "TrialSteps", "fit", "residual_summary", "trials_from_database",
           "window_time"]
