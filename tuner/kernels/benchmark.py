"""Search vs exhaustive grid vs SGLang's default for our own look-alike kernel, on this machine's GPU.

    tuner kernels benchmark --model glm-5.1 --tp-size 8 --dtype fp8_w8a8 --block-shape 128,128 \
        --batch-sizes 1,16,64,256,1024,4096 -o DIR

(For SGLang's own kernels: ``tuner kernels tune --grid``, in ``sglang_tune.py``.)

Per shape, in a fresh Triton cache: (1) compile every variant of the feasible space in parallel, then
the Optuna search over all batch sizes (wall time includes the compilation); (2) the exhaustive grid over SGLang's space at each batch size (every config compiled,
shared-memory misfits included, each timed; a config whose first replay is 1.5x the best so far is
not timed further); (3) a final interleaved re-measurement of the grid's top 3, the search's pick and
the default. grid_best_us is the fastest of those re-measured grid configs (the search's pick is a
grid config too). Writes DIR/summary.json, the config file and every timing (grid.jsonl).

``--grid-only --found-from SUMMARY.json`` completes the grid at batch sizes whose search already
ran: one timing pass per batch size over the whole space with the search's pick (read from the
summary) and SGLang's default timed first, so grid best, found and default come from the same pass.
Batch sizes run in the order given; DIR/grid_only_<shape>.json is rewritten after each one and
``--deadline-s`` stops the timing cleanly (the unfinished batch size is written as incomplete).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _time_or_inf(timer, M, cfg, **kw) -> float:
    """A config that fails to compile or launch times as infinity (never the best)."""
    from tuner.kernels.timing import ConfigFailed  # needs torch: imported where timing happens

    try:
        return timer.measure(M, cfg, **kw)
    except ConfigFailed:
        return math.inf

def _log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_shape(shape, batch_sizes: list[int], budget: int, out: Path, seed: int = 0, grid: bool = True) -> dict:
    import torch

    from tuner.kernels.own_kernel import MoEProblem
    from tuner.kernels.timing import ConfigFailed, GraphTimer as Timer
    from tuner.kernels.compile import CompilePool
    from tuner.kernels.configfile import config_relpath, write_configs
    from tuner.kernels.search import search_batch_size
    from tuner.kernels.space import default_config, feasible_space, search_space_for, smem_bytes
    from tuner.kernels.worker import device_facts, make_evaluator

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")  # cold: compile time counts
    facts = device_facts()
    limit = facts["smem_limit_bytes"] or 232_448
    space = search_space_for(shape.dtype, shape.block_shape)
    feasible = feasible_space(shape.dtype, shape.block_shape, limit)
    problem = MoEProblem(shape, seed=seed)
    timer = Timer(problem)
    rows = {M: {"batch_size": M} for M in batch_sizes}
    log_f = open(out / f"grid_{shape.num_experts}_{shape.intermediate}_{shape.hidden}.jsonl", "w")

    def safe(M, cfg, timer=timer, **kw):
        return _time_or_inf(timer, M, cfg, **kw)

    with CompilePool(shape) as pool:
        # 1. search: compile every feasible variant up front (all cores busy), then search
        t0 = time.perf_counter()
        pool.ensure(feasible)
        _log(f"compiled {len(pool.results)} variants in {pool.compile_wall_s:.1f} s")
        prev_top, found = [], {}
        for M in sorted(batch_sizes):
            dflt = default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                  shape.config_dtype, shape.block_shape)
            res = search_batch_size(make_evaluator(timer, pool, M), feasible, budget,
                                    warm_start=prev_top + [dflt], seed=seed + M)
            found[M] = res
            prev_top = res.top(4)
            rows[M].update(evaluations=res.evaluations, search_first_us=res.best_us)
            _log(f"search M={M}: {res.best_us:.1f} us after {res.evaluations} evals ({res.best.short()})")
        search_wall = time.perf_counter() - t0
        search_compile = pool.compile_wall_s
        _log(f"search done in {search_wall:.1f} s (compile {search_compile:.1f} s)")

        # 2. grid
        grid_wall = 0.0
        if grid:
            t1 = time.perf_counter()
            pool.ensure(space)
            n_ok = sum(1 for c in space if not pool.failed(c))
            _log(f"grid compile: {n_ok}/{len(space)} configs compile ({time.perf_counter() - t1:.1f} s)")
            grid_timer = Timer(problem, target_ms=8.0, max_replays=6)
            for M in sorted(batch_sizes):
                tm = time.perf_counter()
                best = found[M].best_us
                times = {}
                for cfg in space:
                    us = math.inf if pool.failed(cfg) else safe(M, cfg, cutoff_us=1.3 * best, timer=grid_timer)
                    times[cfg] = us
                    best = min(best, us)
                    log_f.write(json.dumps({"batch_size": M, **cfg.as_dict(), "us": us if math.isfinite(us) else None,
                                            "smem_est": smem_bytes(cfg, shape.dtype)}) + "\n")
                ranked = sorted((t, c) for c, t in times.items() if math.isfinite(t))
                rows[M]["grid_top"] = [c for _, c in ranked[:3]]
                rows[M]["grid_first_us"] = ranked[0][0]
                rows[M]["grid_timed"] = len(ranked)
                _log(f"grid M={M}: best {ranked[0][0]:.1f} us {ranked[0][1].short()} ({time.perf_counter() - tm:.1f} s)")
                log_f.flush()  # a run stopped later keeps every finished batch size
                problem.drop_batch(M)
            grid_wall = time.perf_counter() - t1

        # 3. final re-measurement, interleaved
        for M in sorted(batch_sizes):
            dflt = default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                  shape.config_dtype, shape.block_shape)
            pool.ensure([dflt])
            cands = {"found": found[M].best, "default": dflt}
            for i, c in enumerate(rows[M].get("grid_top", [])):
                cands[f"grid{i}"] = c
            samples = {k: [] for k in cands}
            for _ in range(3):
                for k, c in cands.items():
                    samples[k].append(math.inf if pool.failed(c) else safe(M, c, replays=10))
            med = {k: statistics.median(v) for k, v in samples.items()}
            r = rows[M]
            r["found_us"] = med["found"]
            r["default_us"] = med["default"]
            r["found_config"] = found[M].best.as_dict()
            r["default_config"] = dflt.as_dict()
            if grid:
                grid_keys = [k for k in med if k.startswith("grid")] + ["found"]
                gk = min(grid_keys, key=lambda k: med[k])
                r["grid_best_us"] = med[gk]
                r["grid_best_config"] = cands[gk].as_dict()
                r["fraction_of_grid_best"] = med[gk] / med["found"]
                r["grid_size"] = len(space)
            problem.drop_batch(M)
        compile_stats = [vars(v) for v in pool.results.values()]
    log_f.close()

    configs = {M: found[M].best.as_dict() for M in batch_sizes}
    rel = config_relpath(shape.num_experts, shape.intermediate, facts["device_name"], facts["triton_version"],
                         shape.config_dtype, shape.block_shape)
    cfg_path = write_configs(out / rel, configs)
    ok = [c for c in compile_stats if c["ok"]]
    est_wrong = sum(1 for c in compile_stats if c["ok"] and c["shared_bytes"] and c["shared_bytes"] > limit)
    keep = ("batch_size", "grid_best_us", "found_us", "default_us", "fraction_of_grid_best", "evaluations", "grid_size",
            "found_config", "grid_best_config", "default_config", "grid_timed")
    return {
        "shape": shape.to_dict(),
        "device_name": facts["device_name"], "triton_version": facts["triton_version"],
        "torch_version": facts["torch_version"], "smem_limit_bytes": limit,
        "grid_size": len(space), "feasible_configs": len(feasible), "budget": budget,
        "search_wall_s": round(search_wall, 1), "search_compile_wall_s": round(search_compile, 1),
        "grid_wall_s": round(grid_wall, 1),
        "compiled_variants": len(compile_stats), "compile_failures": len(compile_stats) - len(ok),
        "compile_seconds_mean": round(statistics.mean(c["seconds"] for c in compile_stats), 2) if compile_stats else None,
        "smem_actual_over_limit_but_ran": est_wrong,
        "config_file": str(cfg_path.relative_to(out)),
        "batch_sizes": [{k: round_us(rows[M][k]) for k in keep if k in rows[M]} for M in sorted(batch_sizes)],
    }


def found_configs_from(summary_path: Path, shape) -> dict[int, "TileConfig"]:
    """{batch size: the search's pick} for ``shape`` from a summary.json (committed or a run's)."""
    from tuner.errors import ConfigError
    from tuner.kernels.space import TileConfig

    doc = json.loads(Path(summary_path).read_text())
    want = shape.to_dict()
    same = ("num_experts", "intermediate", "hidden", "dtype", "block_shape")  # what the kernel compiles for
    for sh in doc.get("shapes", [doc]):
        if all((sh.get("shape") or {}).get(k) == want[k] for k in same):
            return {int(r["batch_size"]): TileConfig.from_dict(r["found_config"])
                    for r in sh["batch_sizes"] if r.get("found_config")}
    raise ConfigError(f"{summary_path} has no shape {want}", key="--found-from")


def run_grid_only(shape, batch_sizes: list[int], found: dict, out: Path, seed: int = 0,
                  deadline: float | None = None) -> dict:
    """One timing pass over the whole space per batch size, found and default first (see module doc).

    ``deadline`` is a time.monotonic() value; timing stops there and what is done is kept.
    """
    from tuner.kernels.own_kernel import MoEProblem
    from tuner.kernels.timing import ConfigFailed, GraphTimer as Timer
    from tuner.kernels.compile import CompilePool
    from tuner.kernels.space import default_config, search_space_for, smem_bytes
    from tuner.kernels.worker import device_facts

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    facts = device_facts()
    space = search_space_for(shape.dtype, shape.block_shape)
    missing = [M for M in batch_sizes if M not in found]
    if missing:
        from tuner.errors import ConfigError

        raise ConfigError(f"no found config for batch size(s) {missing}", key="--found-from")
    problem = MoEProblem(shape, seed=seed)
    grid_timer = Timer(problem, target_ms=8.0, max_replays=6)  # the grid pass's timer of run_shape
    tag = f"{shape.num_experts}_{shape.intermediate}_{shape.hidden}"
    log_f = open(out / f"grid_{tag}.jsonl", "a")
    res = {"shape": shape.to_dict(), "device_name": facts["device_name"], "triton_version": facts["triton_version"],
           "torch_version": facts["torch_version"], "grid_size": len(space), "batch_sizes": []}
    summary_path = out / f"grid_only_{tag}.json"

    def write():
        summary_path.write_text(json.dumps(json_safe(res), indent=2) + "\n")

    def timed(M, cfg, **kw):
        return _time_or_inf(grid_timer, M, cfg, **kw)

    with CompilePool(shape) as pool:
        t0 = time.perf_counter()
        pool.ensure(space)
        res["compile_wall_s"] = round(time.perf_counter() - t0, 1)
        res["compile_failures"] = sum(1 for c in space if pool.failed(c))
        _log(f"grid compile: {len(space) - res['compile_failures']}/{len(space)} configs compile "
             f"({res['compile_wall_s']} s)")
        write()
        for M in batch_sizes:
            tm = time.perf_counter()
            dflt = default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                  shape.config_dtype, shape.block_shape)
            pool.ensure([dflt])
            order = list(dict.fromkeys([found[M], dflt, *space]))
            times: dict = {}
            best = math.inf
            stopped = False
            for i, cfg in enumerate(order):
                if deadline is not None and time.monotonic() > deadline:
                    stopped = True
                    break
                if pool.failed(cfg):
                    us = math.inf
                elif i < 2:  # found and default: always timed in full
                    us = timed(M, cfg)
                else:
                    us = timed(M, cfg, cutoff_us=1.3 * best)
                times[cfg] = us
                best = min(best, us)
                role = "found" if i == 0 else "default" if i == 1 else None
                log_f.write(json.dumps({"batch_size": M, **cfg.as_dict(), "us": us if math.isfinite(us) else None,
                                        "smem_est": smem_bytes(cfg, shape.dtype), "role": role,
                                        "pass": "grid_only"}) + "\n")
            log_f.flush()
            wall = round(time.perf_counter() - tm, 1)
            space_set = set(space)
            ok = {c: t for c, t in times.items() if math.isfinite(t)}
            row = {"batch_size": M, "complete": not stopped and sum(c in space_set for c in times) == len(space),
                   "grid_timed": len(ok), "configs_visited": len(times), "grid_size": len(space),
                   "grid_timing_wall_s": wall, "found_config": found[M].as_dict(), "default_config": dflt.as_dict(),
                   "found_us": times.get(found[M]), "default_us": times.get(dflt)}
            if ok:
                best_cfg = min(ok, key=ok.get)
                row.update(grid_best_us=ok[best_cfg], grid_best_config=best_cfg.as_dict())
                if math.isfinite(row["found_us"]):
                    row["fraction_of_grid_best"] = ok[best_cfg] / row["found_us"]
                # interleaved re-measurement of the pass's top 3, found and default (10 replays, 3 rounds)
                cands = {"found": found[M], "default": dflt}
                for j, (_, c) in enumerate(sorted((t, c) for c, t in ok.items())[:3]):
                    cands[f"grid{j}"] = c
                if not stopped:
                    samples = {k: [] for k in cands}
                    for _ in range(3):
                        for k, c in cands.items():
                            samples[k].append(math.inf if pool.failed(c) else timed(M, c, replays=10))
                    row["remeasured_us"] = {k: statistics.median(v) for k, v in samples.items()}
                    row["remeasured_configs"] = {k: c.as_dict() for k, c in cands.items()}
            res["batch_sizes"].append(row)
            write()
            _log(f"grid-only M={M}: {'complete' if row['complete'] else 'STOPPED at deadline'} "
                 f"{len(times)}/{len(space)} visited, best {row.get('grid_best_us', math.inf):.1f} us, "
                 f"found {row['found_us'] or math.inf:.1f} us, default {row['default_us'] or math.inf:.1f} us "
                 f"({wall} s)")
            problem.drop_batch(M)
            if stopped:
                break
    log_f.close()
    return res


def json_safe(obj):
    """JSON-safe copy: non-finite floats become null, floats (µs) are rounded to the nanosecond."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return round_us(obj)


def round_us(v):
    """A time in µs rounded to the nanosecond; a non-finite float becomes None (JSON null)."""
    if isinstance(v, float):
        return round(v, 3) if math.isfinite(v) else None
    return v


def grid_only_table(res: dict) -> list[str]:
    lines = [f"{'M':>6} {'grid_best':>10} {'found':>10} {'default':>10} {'frac':>6} {'complete':>8}"]
    for r in res["batch_sizes"]:
        lines.append(f"{r['batch_size']:>6} {round_us(r.get('grid_best_us'))!s:>10} {round_us(r['found_us'])!s:>10} "
                     f"{round_us(r['default_us'])!s:>10} {r.get('fraction_of_grid_best', 0):>6.3f} {r['complete']!s:>8}")
    return lines


def shape_table(res: dict) -> list[str]:
    lines = [f"{'M':>6} {'grid_best':>10} {'found':>10} {'default':>10} {'frac':>6} {'evals':>6}"]
    for r in res["batch_sizes"]:
        lines.append(f"{r['batch_size']:>6} {r.get('grid_best_us')!s:>10} {r['found_us']!s:>10} "
                     f"{r['default_us']!s:>10} {r.get('fraction_of_grid_best') or 0:>6.3f} {r['evaluations']:>6}")
    lines.append(f"search {res['search_wall_s']} s, grid {res['grid_wall_s']} s")
    return lines
