"""`tuner bench search`: how few trials each sampler needs to find the best configuration.

Every configuration of the space is measured once on the simulator (``tuner.bench.table``); then each
sampler runs the runner's ask/tell loop against that table -- the same ``suggest``, constraint,
planner pre-screen, duplicate and ``mark_feasible`` code paths -- so what is benchmarked is what
``tuner study start`` runs. A trial counts when the runner would launch it (the baseline
included); configurations settled without launching (constraint, planner, duplicate) are free and
reported separately.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tuner.bench.table import Table, config_key, require_entry, stderr_progress
from tuner.errors import ConfigError
from tuner.lifecycle import TrialStatus
from tuner.config.load import load_search_space, load_study
from tuner.config.schema import StudySpec
from tuner.study import cost as cost_mod
from tuner.study import space as space_mod
from tuner.study.pruning import replay_pruned
from tuner.study.proposer import baseline_values, max_asks
from tuner.study.samplers import make_sampler, mark_feasible, seed_configs
from tuner.study.warm_start import top_k_configs

RESULTS_DIR = Path("results/search")
BENCH_SAMPLERS = ("default", "tpe", "random")
MAX_GRID_POINTS = 5000


@dataclass
class BenchSetup:
    study: StudySpec
    grid: list[dict]
    baseline: dict
    table: Table
    space_note: str = ""


def resolve_study(name: str, space: str | None = None, max_grid: int = MAX_GRID_POINTS) -> tuple[StudySpec, str]:
    """The study with the space to benchmark: ``space`` if given; else the study's own if its grid
    has at most ``max_grid`` points, else ``<space name>-bench`` when that file exists."""
    study = load_study(name)
    note = ""
    if space is None:
        n = space_mod.grid_size_upper_bound(study.space())
        if n > max_grid:
            candidate = f"{study.space().name}-bench"
            try:
                load_search_space(candidate)
            except ConfigError:
                raise ConfigError(f"the search space {study.space().name!r} has up to {n:,} grid points (more than "
                                  f"{max_grid:,}); pass --space with a smaller space (search_spaces/*-bench.yaml)",
                                  key="search_space") from None
            space = candidate
            note = f"space {study.space().name!r} has up to {n:,} grid points; benchmarking {candidate!r}"
    if space is not None:
        sp, _ = load_search_space(space)
        study = study.model_copy(update={"search_space": sp})
    return study, note


def with_calibration(study: StudySpec, calibration: dict | None) -> StudySpec:
    """The same study measured under a different simulator calibration (a perturbed 'reality')."""
    if not calibration:
        return study
    opts = dict(study.backend_options or {})
    opts["calibration"] = calibration
    return study.model_copy(update={"backend_options": opts})


def setup(study: StudySpec, *, results_dir: Path = RESULTS_DIR, tag: str = "", workers: int | None = None,
          quiet: bool = False) -> BenchSetup:
    """Enumerate the grid and make sure every configuration (and the baseline) is in the table."""
    grid = space_mod.enumerate_grid(study.space(), space_mod.env_for(study))
    if not grid:
        raise ConfigError("the search space has no configuration that meets its constraints", key="search_space")
    baseline = baseline_values(study)
    table = Table(study, Path(results_dir) / f"table-{study.name}{tag}-{study.space().name}.json.gz")
    todo = table.missing(grid + [baseline])
    if todo:
        table.fill(todo, workers=workers, progress=None if quiet else stderr_progress(f"grid{tag}"))
    return BenchSetup(study=study, grid=grid, baseline=baseline, table=table)


# ---------------------------------------------------------------- one sampler run
@dataclass
class SamplerRun:
    """One ask/tell loop against the table. ``best_by_trial[i]`` = best capacity after i+1 launches."""

    sampler: str
    seed: int
    best_by_trial: list[int] = field(default_factory=list)
    launched: list[dict] = field(default_factory=list)  # table entries of the launched trials, in order
    prescreened: int = 0
    infeasible: int = 0
    duplicates: int = 0
    asks: int = 0

    def trials_to(self, target: float) -> int | None:
        return trials_to_reach(self.best_by_trial, target)

    def best_at(self, n: int) -> int:
        if not self.best_by_trial:
            return 0
        return self.best_by_trial[min(n, len(self.best_by_trial)) - 1]


def trials_to_reach(best_by_trial: list[int], target: float) -> int | None:
    """1-based number of launched trials after which the best capacity is >= target (None: never)."""
    for i, best in enumerate(best_by_trial):
        if best >= target:
            return i + 1
    return None


def run_sampler(bs: BenchSetup, sampler: str, seed: int, budget: int, *, enqueue: list[dict] | None = None,
                table: Table | None = None, pruning: bool = True, lazy: bool = False) -> SamplerRun:
    """The runner's proposals (tuner.study.proposer) and tells (tuner.study.ledger) against the table.

    With ``pruning`` a launched trial that the runner would stop early is told its lower bound (as
    the runner tells Optuna). With ``lazy`` a configuration missing from the table is measured now."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = table or bs.table
    study, sp, env = bs.study, bs.study.space(), space_mod.env_for(bs.study)
    ostudy = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed))
    run = SamplerRun(sampler=sampler, seed=seed)
    seen: dict[str, int] = {}
    best = 0
    first = True
    while len(run.launched) < budget and run.asks < max_asks(budget):
        run.asks += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            otrial = ostudy.ask()
        if first:  # trial 0: the baseline; then what the runner enqueues behind it
            values = bs.baseline
            for cfg in (enqueue or []) + (seed_configs(study) if sampler == "default" else []):
                ostudy.enqueue_trial(cfg, skip_if_exists=True)
        else:
            values = space_mod.suggest(otrial, sp, env)
        if not first and space_mod.violated_constraints(sp, values, env):
            run.infeasible += 1
            mark_feasible(otrial, False)
            ostudy.tell(otrial, 0.0)
            continue
        key = config_key(values)
        if key in seen and not first:
            run.duplicates += 1
            mark_feasible(otrial, seen[key] > 0)
            ostudy.tell(otrial, float(seen[key]))
            continue
        first = False
        if lazy and table.get(values) is None:
            table.fill([values], workers=1)
        entry = require_entry(table, values)
        if entry["prescreened"]:
            run.prescreened += 1
            run.infeasible += 1
            mark_feasible(otrial, False)
            ostudy.tell(otrial, 0.0)
            continue
        cap = int(entry["capacity_users"])
        if pruning and run.launched and entry["status"] == TrialStatus.COMPLETE:
            _, cap, _ = replay_pruned(study, entry["steps"], best)  # the lower bound where pruned
        seen[key] = cap
        run.launched.append(entry)
        best = max(best, cap)
        run.best_by_trial.append(best)
        mark_feasible(otrial, entry["status"] == TrialStatus.COMPLETE)
        ostudy.tell(otrial, float(cap))
    return run


# ---------------------------------------------------------------- the benchmark
def grid_optimum(bs: BenchSetup, table: Table | None = None) -> tuple[int, dict]:
    table = table or bs.table
    best_cap, best_cfg = -1, {}
    for v in bs.grid:
        e = require_entry(table, v)
        if e["capacity_users"] > best_cap:
            best_cap, best_cfg = e["capacity_users"], v
    return best_cap, best_cfg


def _median(xs: list[float | None], budget: int) -> float:
    """Median with 'never reached' counted as budget + 1 (so it ranks after every success)."""
    return float(statistics.median([budget + 1 if x is None else x for x in xs]))


def summarize(runs: list[SamplerRun], target: float, budget: int, bs: BenchSetup,
              pruning: bool = True) -> dict:
    study = bs.study
    t95 = [r.trials_to(target) for r in runs]
    # GPU-hours of a study of the spec's own trial budget, and of the trials until 95% was reached
    gpu_h = [cost_mod.trials_cost(study, r.launched[:study.trials], pruned=pruning)["gpu_hours"] for r in runs]
    gpu_h95 = [None if t is None else round(cost_mod.trials_cost(study, r.launched[:t], pruned=pruning)["gpu_hours"], 1)
               for r, t in zip(runs, t95)]
    return {
        "name": runs[0].sampler,
        "trials_to_95pct": t95,
        "median_trials_to_95pct": _median(t95, budget),
        "reached_95pct": sum(x is not None for x in t95),
        "users_at_15": [r.best_at(15) for r in runs],
        "users_at_30": [r.best_at(30) for r in runs],
        "best_users": [r.best_at(budget) for r in runs],
        "launched": [len(r.launched) for r in runs],
        "prescreened": [r.prescreened for r in runs],
        "infeasible_not_launched": [r.infeasible for r in runs],
        "duplicates": [r.duplicates for r in runs],
        "study_trials": study.trials,
        "gpu_hours": [round(g, 1) for g in gpu_h],
        "median_gpu_hours": round(statistics.median(gpu_h), 1),
        "gpu_hours_to_95pct": gpu_h95,
    }


def bench_search(name: str, *, seeds: int = 5, budget: int = 60, samplers: tuple[str, ...] = BENCH_SAMPLERS,
                 space: str | None = None, results_dir: Path = RESULTS_DIR, workers: int | None = None,
                 quiet: bool = False, warm_start_k: int = 0) -> dict:
    t0 = time.time()
    study, note = resolve_study(name, space)
    bs = setup(study, results_dir=results_dir, workers=workers, quiet=quiet)
    table_s = time.time() - t0
    opt, opt_cfg = grid_optimum(bs)
    target = 0.95 * opt
    base = require_entry(bs.table, bs.baseline)
    out_samplers = []
    t1 = time.time()
    for name_ in samplers:
        runs = [run_sampler(bs, name_, study.seed + s, budget) for s in range(seeds)]
        out_samplers.append(summarize(runs, target, budget, bs))
    grid_entries = [require_entry(bs.table, v) for v in bs.grid]
    grid_cost = cost_mod.trials_cost(study, grid_entries, pruned=False)
    grid_cost_pruned = cost_mod.grid_cost_pruned(study, grid_entries)
    warm = None
    if warm_start_k:
        warm = warm_start_bench(bs, k=warm_start_k, seeds=seeds, budget=min(budget, study.trials),
                                sim_trials=study.trials, results_dir=results_dir, workers=workers, quiet=quiet)
    return {
        "warm_start": warm,
        "study": study.name, "model": study.model, "gpu": study.hardware.gpu,
        "gpus": study.hardware.total_gpus, "space": study.space().name, "space_note": note,
        "table": str(bs.table.path), "table_hash": bs.table.hash,
        "grid_points": len(bs.grid),
        "grid_prescreened": sum(1 for e in grid_entries if e["prescreened"]),
        "grid_optimum_users": opt, "grid_optimum_config": opt_cfg,
        "baseline_users": base["capacity_users"],
        "target_users_95pct": target, "seeds": seeds, "budget": budget,
        "samplers": out_samplers,
        "cost": {
            "assumptions": cost_mod.assumptions(study),
            "grid_gpu_hours": round(grid_cost["gpu_hours"], 1),
            "grid_gpu_hours_with_pruning": round(grid_cost_pruned["gpu_hours"], 1),
            "grid_launches": grid_cost["launches"],
        },
        "table_entries": len(bs.table.entries), "table_compute_s": round(bs.table.compute_s, 1),
        "table_load_s": round(table_s, 1),
        "search_s": round(time.time() - t1, 1),
    }


# A 'reality' that differs from the simulator's calibration the way a first real run typically
# does: less of the HBM bandwidth and MoE peak achieved, slower HiCache load-back and collectives.
# (Merged over the GPU's calibration; a dict with an "overhead" key would replace it whole.)
PERTURBED_CALIBRATION = {
    "memory_efficiency": 0.68,
    "compute_efficiency": {"moe": 0.38, "attention": 0.50},
    "host_link_efficiency": 0.25,  # below the measured 0.35 (default.yaml)
    "comm": {"bandwidth_efficiency": 0.55},
}
REALITY_CANDIDATES = 60  # the simulator's best configurations also measured in 'reality'


def top_configs(bs: BenchSetup, run: SamplerRun, k: int) -> list[dict]:
    """The k best distinct configurations a simulated run launched (what the runner enqueues)."""
    rows = [{"params": e["values"], "capacity_users": e["capacity_users"], "status": e["status"]}
            for e in run.launched[1:]]
    return top_k_configs(bs.study, rows, k)


def warm_start_bench(bs: BenchSetup, *, k: int, seeds: int, budget: int, sim_trials: int,
                     calibration: dict | None = None, results_dir: Path = RESULTS_DIR,
                     workers: int | None = None, quiet: bool = False) -> dict:
    """Trials to 95% of a perturbed reality's optimum: cold start vs simulator warm start."""
    reality = with_calibration(bs.study, calibration or PERTURBED_CALIBRATION)
    rtable = Table(reality, Path(results_dir) / f"table-{bs.study.name}-perturbed-{bs.study.space().name}.json.gz")
    rbs = BenchSetup(study=reality, grid=bs.grid, baseline=bs.baseline, table=rtable)
    ranked = sorted(bs.grid, key=lambda v: -require_entry(bs.table, v)["capacity_users"])
    todo = rtable.missing(ranked[:REALITY_CANDIDATES] + [bs.baseline])
    if todo:
        rtable.fill(todo, workers=workers, progress=None if quiet else stderr_progress("reality"))
    cold, warm, enq = [], [], []
    for s in range(seeds):
        seed = bs.study.seed + s
        sim_run = run_sampler(bs, "default", seed, sim_trials)
        top = top_configs(bs, sim_run, k)
        enq.append(top)
        cold.append(run_sampler(rbs, "default", seed, budget, lazy=True))
        warm.append(run_sampler(rbs, "default", seed, budget, enqueue=top, lazy=True))
    full = len(rtable.missing(bs.grid)) == 0
    opt = max(e["capacity_users"] for e in rtable.entries.values())
    target = 0.95 * opt
    c95 = [r.trials_to(target) for r in cold]
    w95 = [r.trials_to(target) for r in warm]
    return {
        "k": k, "sim_trials": sim_trials, "calibration": calibration or PERTURBED_CALIBRATION,
        "reality_optimum_users": opt, "reality_optimum_is_grid_optimum": full,
        "reality_optimum_over": "the whole grid" if full else (
            f"the simulator's {REALITY_CANDIDATES} best grid configurations and every configuration a run launched"),
        "cold_trials_to_95pct": c95, "warm_trials_to_95pct": w95,
        "cold_median_trials_to_95pct": _median(c95, budget), "warm_median_trials_to_95pct": _median(w95, budget),
        "trials_saved_median": _median(c95, budget) - _median(w95, budget),
        "cold_users_at_15": [r.best_at(15) for r in cold], "warm_users_at_15": [r.best_at(15) for r in warm],
        "enqueued": enq[0] if enq else [],
    }


def format_table(doc: dict) -> str:
    lines = [f"study {doc['study']} ({doc['model']} on {doc['gpus']}x {doc['gpu']}), space {doc['space']}: "
             f"{doc['grid_points']} grid points ({doc['grid_prescreened']} screened out by the planner)",
             f"grid optimum {doc['grid_optimum_users']} users, baseline {doc['baseline_users']}; "
             f"95% target {doc['target_users_95pct']:.1f}; {doc['seeds']} seeds x {doc['budget']} trials",
             "",
             f"| {'sampler':<8} | median trials to 95% | trials to 95% (per seed) | users at 15 | users at 30 "
             f"| GPU-h of a {doc['samplers'][0]['study_trials']}-trial study |",
             "|---|---|---|---|---|---|"]
    for s in doc["samplers"]:
        t95 = ", ".join("-" if x is None else str(x) for x in s["trials_to_95pct"])
        lines.append(f"| {s['name']:<8} | {s['median_trials_to_95pct']:g} | {t95} | "
                     f"{', '.join(map(str, s['users_at_15']))} | {', '.join(map(str, s['users_at_30']))} | "
                     f"{s['median_gpu_hours']:g} |")
    c = doc["cost"]
    lines += ["", f"exhaustive grid: {c['grid_launches']} launches, {c['grid_gpu_hours']:,} GPU-hours "
                  f"({c['grid_gpu_hours_with_pruning']:,} with pruning against the running best); "
                  f"simulating it took {doc['table_compute_s']:,.0f} s of wall time"]
    w = doc.get("warm_start")
    if w:
        lines += ["", f"simulator warm start (top {w['k']} of a {w['sim_trials']}-trial simulated study) on a perturbed "
                      f"reality (optimum {w['reality_optimum_users']} users over {w['reality_optimum_over']}):",
                  f"  trials to 95%: cold {w['cold_median_trials_to_95pct']:g} (median; "
                  f"{', '.join('-' if x is None else str(x) for x in w['cold_trials_to_95pct'])}), warm "
                  f"{w['warm_median_trials_to_95pct']:g} ({', '.join('-' if x is None else str(x) for x in w['warm_trials_to_95pct'])})"
                  f"; saved {w['trials_saved_median']:g} trials"]
    if doc.get("space_note"):
        lines.append(doc["space_note"])
    return "\n".join(lines)
