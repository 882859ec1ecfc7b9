"""Tune SGLang's own kernels for one shape and write the files SGLang reads (GPU; imports sglang).

Per batch size, ascending (each warm-started from the previous one):

fused MoE
  1. *joint*: the Optuna search over SGLang's tile space with one config for both GEMMs (what
     SGLang's tuner and a file without ``_down`` twin give), warm-started with the previous batch
     size's best, SGLang's shipped entry and its default;
  2. *down*: with the joint best as up config, the second GEMM's own config (same BLOCK_SIZE_M, the
     rest free, TMA on or off), as SGLang reads it from the ``_down`` file;
  3. optionally the exhaustive grid of the joint space (``grid=True``), every config timed;
  4. an interleaved re-measurement (3 rounds) of SGLang's default, the shipped files, the joint best,
     the tuned pair and the grid best. The fastest of them is what the file gets for that batch size.
fp8 block GEMM
  the same without the down stage, over SGLang's GEMM space.

Each finished batch size is appended to ``OUT/state/<tag>.jsonl``; a rerun skips those (so a long
list can be spread over several calls with ``deadline_s``), and the config files and the report
``OUT/reports/<tag>.json`` are rewritten from every finished batch size at the end of each call.

``shape_time_s`` caps a shape's device time over all its calls: what is left (less the finished batch
sizes' wall time and this call's so far) is shared evenly over the batch sizes still to tune, and
each search stops at its part of the share (``time_share``), after its warm-start round at least.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from tuner.errors import ConfigError
from tuner.kernels.benchmark import json_safe, round_us
from tuner.kernels.configfile import moe_config_filename, write_configs
from tuner.kernels.convergence import timings_path
from tuner.kernels.gemm_shapes import GemmShape
from tuner.kernels.search import search_batch_size
from tuner.kernels.sglang_env import Found, Lookup, shipped_down_configs, shipped_gemm_configs, shipped_moe_configs
from tuner.kernels.sglang_layout import gemm_config_filename
from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import (DOWN_PARAM_VALUES, GEMM_PARAM_VALUES, DownTileConfig, TileConfig,
                                 default_config, down_space, feasible_space, gemm_default_config,
                                 gemm_feasible_space, gemm_search_space, search_space_for)
from tuner.kernels.time_budget import TimeShare, time_share

Log = Callable[[str], None]


def _stamp(msg: str) -> None:
    import sys

    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def moe_budgets(shape: MoEShape) -> tuple[int, int]:
    """(joint, down) evaluations per batch size: 10% of each space on Hopper."""
    joint = math.ceil(0.1 * len(search_space_for(shape.dtype, shape.block_shape)))
    down = math.ceil(0.1 * len(down_space(64, shape.dtype, shape.block_shape, 10 ** 9)))
    return joint, down


def gemm_budget(shape: GemmShape) -> int:
    return math.ceil(0.1 * len(gemm_search_space(shape.block_shape)))


class _State:
    """Finished batch sizes of one shape (``OUT/state/<tag>.jsonl``)."""

    def __init__(self, out_dir: Path, tag: str, identity: dict):
        self.path = out_dir / "state" / f"{tag}.jsonl"
        identity = json.loads(json.dumps(json_safe(identity)))  # compared with what JSON gives back
        self.identity = identity
        self.rows: dict[int, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if not line.strip():
                    continue
                r = json.loads(line)
                if r.get("identity") != identity:
                    # this shape's file in OUT was tuned with other settings: rewriting it from this
                    # call's rows would throw those away (one OUT per GPU and SGLang version)
                    raise ConfigError(f"{self.path} holds {tag} tuned with other settings "
                                      f"({_identity_diff(r.get('identity') or {}, identity)}); rerun with "
                                      "those, or tune into another -o directory", file=str(self.path))
                self.rows[int(r["batch_size"])] = r

    def add(self, row: dict) -> None:
        row = {**json_safe(row), "identity": self.identity}
        self.rows[int(row["batch_size"])] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _share_now(shape_time_s: float | None, spent_before: float, t_start: float, remaining: int, *,
               down: bool) -> tuple[float, TimeShare | None]:
    """As a batch size starts: this call's time so far (at the first, its start-up) and the batch
    size's share of the shape's time budget."""
    now = time.monotonic()
    return now - t_start, time_share(shape_time_s, spent_before + now - t_start, remaining, now, down=down)


def _spent_before(rows: dict) -> float:
    """The device time of a shape's finished batch sizes, earlier calls' included: each one's wall time
    and, on the first row of each call, that call's start-up before it (compile processes, the problem)."""
    return sum(float(r.get("wall_s") or 0.0) + float(r.get("call_setup_s") or 0.0) for r in rows.values())


def _identity_diff(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new), key=str)
    return ", ".join(f"{k} {old.get(k)!r} there, {new.get(k)!r} now" for k in keys if old.get(k) != new.get(k))


def _phase_mark(timer, pool) -> dict:
    return {**timer.wall_snapshot(), "compile": pool.compile_wall_s}


def _phase_breakdown(timer, pool, mark: dict, wall_s: float) -> dict:
    """Where one batch size's wall time went: waiting for the compile pool, the timer's eager first
    launches, graph captures and replays, and the rest (the search itself, the CPU side)."""
    now = _phase_mark(timer, pool)
    out = {k: round(now[k] - mark[k], 2) for k in ("compile", "eager", "capture", "replay")}
    out["other"] = round(max(0.0, wall_s - sum(out.values())), 2)
    out["measured"] = now["measured"] - mark["measured"]
    out["compiled_here"] = now.get("compiled_here", 0) - mark.get("compiled_here", 0)
    return out


def _fmt_breakdown(b: dict) -> str:
    return (f"compile {b['compile']:.0f}, eager launches {b['eager']:.0f} ({b.get('compiled_here', 0)} binaries "
            f"compiled there), capture {b['capture']:.0f}, replays {b['replay']:.0f}, other {b['other']:.0f} s "
            f"over {b['measured']} timings")


def _remeasure(timer, M: int, cands: dict, rounds: int = 3) -> dict[str, float]:
    from tuner.kernels.timing import time_or_inf

    samples: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(rounds):
        for k, c in cands.items():
            samples[k].append(time_or_inf(timer, M, c, replays=10))
    return {k: statistics.median(v) for k, v in samples.items()}


#: the search's leaders re-timed side by side with its pick: configs a few % apart are not told apart
#: by the one timing each got during the search (the o_proj GEMM's M=512 pick was 3.2% off the grid best)
RETIMED_SEARCH_LEADERS = 3


def _add_leaders(cands: dict, key: str, leaders: list) -> None:
    """Add the search's runners-up (``leaders`` best first, the pick itself first) as ``key_2``, ``key_3``."""
    others = [c for c in leaders if c != cands[key]][:RETIMED_SEARCH_LEADERS - 1]
    for i, c in enumerate(others, 2):
        cands[f"{key}_{i}"] = c


def _best_leader(med: dict[str, float], key: str) -> str:
    """Of the search's pick and its re-timed runners-up, the key that re-timed fastest."""
    keys = [k for k in med if k == key or (k.startswith(key + "_") and k[len(key) + 1:].isdigit())]
    return min(keys, key=lambda k: med[k])


def _evaluator(timer, pool, M: int, wrap=lambda c: c, log_rows: list | None = None):
    """configs -> us, compiling new (M, config) pairs in parallel first."""
    from tuner.kernels.timing import time_or_inf

    def evaluate(configs):
        full = [wrap(c) for c in configs]
        pool.ensure([(M, f) for f in full])
        out = []
        for c, f in zip(configs, full):
            us = math.inf if pool.failed(M, f) else time_or_inf(timer, M, f)
            if log_rows is not None:
                log_rows.append({"batch_size": M, "config": describe_config(f), "us": round_us(us)})
            out.append(us)
        return out

    return evaluate


def describe_config(cfg) -> dict:
    if isinstance(cfg, tuple):
        up, down = cfg
        return {"up": up.as_dict(), "down": down.as_dict() if down is not None else None}
    return cfg.as_dict()


def _grid(timer, pool, M: int, space, first, deadline: float | None, log_rows: list) -> dict:
    """Time every config of ``space`` at M (``first`` configs first); stops at ``deadline``."""
    from tuner.kernels.timing import time_or_inf

    order = list(dict.fromkeys([*first, *space]))
    pool.ensure([(M, c) for c in order])
    times, best, stopped = {}, math.inf, False
    for i, cfg in enumerate(order):
        if deadline is not None and time.monotonic() > deadline:
            stopped = True
            break
        if pool.failed(M, cfg):
            us = math.inf
        else:
            us = time_or_inf(timer, M, cfg, cutoff_us=None if i < len(first) else 1.3 * best)
        times[cfg] = us
        best = min(best, us)
        log_rows.append({"batch_size": M, "config": cfg.as_dict(), "us": round_us(us), "pass": "grid"})
    ok = {c: t for c, t in times.items() if math.isfinite(t)}
    space_set = set(space)
    res = {"complete": not stopped and all(c in times for c in space_set), "visited": len(times),
           "grid_size": len(space_set), "timed": len(ok)}
    if ok:
        best_cfg = min(ok, key=lambda c: (ok[c], str(c)))
        res.update(best=best_cfg, best_us=ok[best_cfg])
    return res


def pair_at(up: Lookup, down: Lookup, M: int) -> tuple[TileConfig, DownTileConfig | None] | None:
    """The (up, down) tiles SGLang reads at M from a file and its ``_down`` twin: each file's nearest
    key, the down tile at the up tile's BLOCK_SIZE_M (None: no down file; None for both: no file)."""
    entry = up.nearest(M)
    if entry is None:
        return None
    up_cfg = TileConfig.from_dict(entry, where=str(up.path))
    d = down.nearest(M) if down.found in (Found.EXACT, Found.FALLBACK) else None
    if d is None:
        return up_cfg, None
    return up_cfg, DownTileConfig.from_dict({**d, "BLOCK_SIZE_M": up_cfg.BLOCK_SIZE_M}, where=str(down.path))


def tune_moe(shape: MoEShape, batch_sizes: list[int], out_dir: Path, *, budget: int | None = None,
             down_budget: int | None = None, routing: str = "sglang-tuner", grid: bool = False,
             deadline_s: float | None = None, seed: int = 0, log: Log = _stamp,
             routed_pool: int | None = None, shape_time_s: float | None = None) -> dict:
    import torch
    import triton

    from tuner.kernels.sglang_compile import SGLangCompilePool, moe_stand_in_bytes, workers_for
    from tuner.kernels.sglang_kernels import SGLangMoE, runtime
    from tuner.kernels.timing import GraphTimer, device_facts

    t_start = time.monotonic()
    deadline = t_start + deadline_s if deadline_s else None
    rt = runtime()
    facts = device_facts()
    limit = facts["smem_limit_bytes"]
    vdir = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    j_budget, d_budget = moe_budgets(shape)
    budget, down_budget = budget or j_budget, down_budget if down_budget is not None else d_budget
    do_down = rt.layout.reads_down_files and down_budget > 0
    up_name = moe_config_filename(shape.num_experts, shape.intermediate, facts["device_name"],
                                  shape.config_dtype, shape.block_shape)
    down_name = moe_config_filename(shape.num_experts, shape.intermediate, facts["device_name"],
                                    shape.config_dtype, shape.block_shape, down=True)
    shipped_up = shipped_moe_configs(rt.installed.moe_config_root, up_name, vdir)
    shipped_dn = shipped_down_configs(rt.installed.moe_config_root, up_name, down_name, vdir)
    space = search_space_for(shape.dtype, shape.block_shape)
    feasible = feasible_space(shape.dtype, shape.block_shape, limit)
    identity = {"kind": "moe", "shape": shape.to_dict(), "routing": str(routing), "budget": budget,
                "down_budget": down_budget if do_down else 0, "grid": grid, "device": facts["device_name"],
                "triton": triton.__version__, "sglang": rt.version, "seed": seed}
    if routed_pool is not None:  # only then: a directory tuned before the collapsed routing keeps its identity
        identity["routed_pool"] = routed_pool
    state = _State(out_dir, shape.tag, identity)
    log(f"MoE {shape.tag}: SGLang {rt.version}, {facts['device_name']}, triton {triton.__version__}; "
        f"shipped up {shipped_up.found.value} ({shipped_up.path.name if shipped_up.path else '-'}), "
        f"down {shipped_dn.found.value}; budget {budget} joint + {down_budget if do_down else 0} down"
        f"{' + grid ' + str(len(space)) if grid else ''}; {len(state.rows)} batch size(s) already done")
    problem = SGLangMoE(shape, routing=routing, seed=seed, routed_pool=routed_pool)
    todo = [M for M in sorted(set(batch_sizes)) if M not in state.rows]
    shape_time_s = None if grid else shape_time_s  # a grid times everything, whatever it costs
    spent_before = _spent_before(state.rows)
    _log_time_budget(log, shape_time_s, spent_before, len(todo))
    act_bytes = max(batch_sizes) * shape.topk * max(2 * shape.intermediate, shape.hidden) * 2 * 3
    # a compile process holds a stand-in with fewer experts where that builds the same binaries
    workers = workers_for(moe_stand_in_bytes(shape, todo or batch_sizes) + act_bytes)
    timer = GraphTimer(problem)
    tried: list[dict] = []
    prev_joint: list[TileConfig] = []
    prev_down: DownTileConfig | None = None
    if state.rows:
        last = state.rows[max(state.rows)]
        prev_joint = [TileConfig.from_dict(last["joint_config"])]
    stopped = False
    compile_wall = 0.0
    try:
        with SGLangCompilePool("moe", shape, routing=str(routing), workers=workers,
                               routed_pool=routed_pool) as pool:
            log(f"{workers} compile process(es)")
            for i, M in enumerate(todo):
                if _stop_before(M, deadline, state.rows, log):
                    stopped = True
                    break
                tm, mark = time.perf_counter(), _phase_mark(timer, pool)
                elapsed, ts = _share_now(shape_time_s, spent_before, t_start, len(todo) - i, down=do_down)
                dflt = default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                      shape.config_dtype, shape.block_shape)
                ship = pair_at(shipped_up, shipped_dn, M)
                warm = prev_joint[:4] + ([ship[0]] if ship else []) + [dflt]
                joint = search_batch_size(_evaluator(timer, pool, M, log_rows=tried), feasible, budget,
                                          warm_start=warm, seed=seed + M, batch=max(8, workers),
                                          deadline=ts.joint_deadline if ts else None)
                best_up = joint.best
                down_res = None
                if do_down:
                    bm = best_up.BLOCK_SIZE_M
                    dspace = down_space(bm, shape.dtype, shape.block_shape, limit, tma=rt.tma_supported)
                    pv = dict(DOWN_PARAM_VALUES)
                    if not rt.tma_supported:
                        pv["USE_TMA"] = (False,)
                    dwarm = [DownTileConfig.from_tile(best_up)]
                    for cand in ([prev_down] if prev_down else []) + ([ship[1]] if ship and ship[1] else []):
                        dwarm.append(DownTileConfig(**{**cand.as_dict(), "BLOCK_SIZE_M": bm}))
                    down_res = search_batch_size(
                        _evaluator(timer, pool, M, wrap=lambda d, up=best_up: (up, d), log_rows=tried),
                        dspace, down_budget, warm_start=dwarm, seed=seed + 7919 + M, batch=max(8, workers),
                        param_values=pv, make=lambda p, bm=bm: DownTileConfig(BLOCK_SIZE_M=bm, **p),
                        deadline=ts.down_deadline if ts else None)
                grid_res = None
                if grid:
                    grid_res = _grid(timer, pool, M, space, [best_up, dflt] + ([ship[0]] if ship else []),
                                     deadline, tried)
                cands = {"default": dflt, "joint": best_up}
                _add_leaders(cands, "joint", joint.top(RETIMED_SEARCH_LEADERS))
                if ship:
                    cands["shipped"] = ship if ship[1] is not None else ship[0]
                if down_res is not None:
                    cands["tuned"] = (best_up, down_res.best)
                if grid_res and grid_res.get("best") is not None:
                    cands["grid_best"] = grid_res["best"]
                pool.ensure([(M, c) for c in cands.values()])
                med = _remeasure(timer, M, cands)
                searched = _best_leader(med, "joint")
                pick = min((k for k in cands if math.isfinite(med[k]) and k != "grid_best"),
                           key=lambda k: med[k], default="default")
                chosen = cands[pick]
                chosen_up, chosen_down = (chosen if isinstance(chosen, tuple) else (chosen, None))
                if chosen_down is None:
                    chosen_down = DownTileConfig.from_tile(chosen_up)
                base_key = "shipped" if "shipped" in cands else "default"
                row = {"batch_size": M, "default_us": med["default"], "shipped_us": med.get("shipped"),
                       "joint_us": med["joint"], "search_best": searched, "search_best_us": med[searched],
                       "search_best_config": cands[searched].as_dict(), "tuned_us": med.get("tuned"), "grid_best_us": med.get("grid_best"),
                       "chosen": pick, "chosen_us": med[pick], "baseline": base_key,
                       "speedup_vs_baseline": (med[base_key] / med[pick]) if med[pick] > 0 else None,
                       "speedup_vs_default": (med["default"] / med[pick]) if med[pick] > 0 else None,
                       "evaluations_joint": joint.evaluations,
                       "evaluations_down": down_res.evaluations if down_res else 0,
                       "time_share_s": round(ts.share_s, 1) if ts else None,
                       "stopped_by_time": joint.stopped_by_deadline or bool(down_res and down_res.stopped_by_deadline),
                       "call_setup_s": round(elapsed, 1) if i == 0 else 0.0,
                       "default_config": dflt.as_dict(), "joint_config": best_up.as_dict(),
                       "down_config": down_res.best.as_dict() if down_res else None,
                       "shipped_config": describe_config(cands["shipped"]) if "shipped" in cands else None,
                       "up_config": chosen_up.as_dict(), "down_file_config": chosen_down.as_dict(),
                       "wall_s": round(time.perf_counter() - tm, 1),
                       "wall_breakdown_s": _phase_breakdown(timer, pool, mark, time.perf_counter() - tm)}
                _keep_row(state, row, grid_res, med, "joint", timer, pool, log)
                prev_joint = joint.top(4)
                prev_down = down_res.best if down_res else None
                problem.drop_batch(M)
                log(f"M={M}: default {_fmt(med['default'])}, shipped {_fmt(med.get('shipped'))}, joint "
                    f"{_fmt(med['joint'])}, tuned {_fmt(med.get('tuned'))}"
                    f"{', grid ' + _fmt(med.get('grid_best')) if grid else ''} us -> {pick} ({row['wall_s']} s: "
                    f"{_fmt_breakdown(row['wall_breakdown_s'])}; {_fmt_effort(row)})")
            compile_wall = pool.compile_wall_s
    except KeyboardInterrupt:  # the call's backstop: keep and write what is finished
        stopped = True
        log("interrupted: the finished batch sizes are kept and written; rerun the same command "
            "to continue")
    if timer.first_failure:
        log(f"first config failure seen: {timer.first_failure}")
    files = _write_moe_files(out_dir, vdir, up_name, down_name, state.rows, do_down)
    report = {"kind": "moe", "shape": shape.to_dict(), "tag": shape.tag, "sglang_version": rt.version,
              **facts, "routing": str(routing), "routed_pool": routed_pool, "budget": budget, "down_budget": down_budget if do_down else 0,
              "joint_space": len(space), "feasible": len(feasible), "grid": grid,
              "shipped_up": {"found": shipped_up.found.value, "path": str(shipped_up.path) if shipped_up.path else None},
              "shipped_down": {"found": shipped_dn.found.value,
                               "path": str(shipped_dn.path) if shipped_dn.path else None},
              "batch_sizes_requested": (requested := _requested(out_dir, shape.tag, batch_sizes)),
              "complete": not stopped and all(M in state.rows for M in requested),
              "this_call_wall_s": round(time.monotonic() - t_start, 1), "this_call_compile_wall_s": round(compile_wall, 1),
              "compile_workers": workers, "files": files, **_time_budget_report(shape_time_s, state.rows),
              "rows": _rows(state)}
    _write_report(out_dir, shape.tag, report, tried)
    return json_safe(report)


def _rows(state: _State) -> list[dict]:
    """Every batch size the shape's state holds: a call that tunes a few more keeps the others in the
    report (the tile files hold them all too)."""
    return [{k: v for k, v in state.rows[M].items() if k != "identity"} for M in sorted(state.rows)]


def _requested(out_dir: Path, tag: str, batch_sizes) -> list[int]:
    """This call's batch sizes and those an earlier call's report asked for: the report is complete
    only when every one of them is tuned."""
    try:
        before = json.loads((out_dir / "reports" / f"{tag}.json").read_text()).get("batch_sizes_requested") or []
    except (OSError, ValueError, AttributeError):
        before = []
    return sorted({int(M) for M in before} | {int(M) for M in batch_sizes})


def tune_gemm(shape: GemmShape, batch_sizes: list[int], out_dir: Path, *, budget: int | None = None,
              grid: bool = False, deadline_s: float | None = None, seed: int = 0, log: Log = _stamp,
              shape_time_s: float | None = None) -> dict:
    import triton

    from tuner.kernels.sglang_compile import SGLangCompilePool, workers_for
    from tuner.kernels.sglang_kernels import SGLangBlockGemm, runtime
    from tuner.kernels.timing import GraphTimer, device_facts

    t_start = time.monotonic()
    deadline = t_start + deadline_s if deadline_s else None
    rt = runtime()
    facts = device_facts()
    budget = budget or gemm_budget(shape)
    space = gemm_search_space(shape.block_shape)
    feasible = gemm_feasible_space(shape.block_shape, facts["smem_limit_bytes"])
    name = gemm_config_filename(shape.N, shape.K, facts["device_name"], shape.block_shape)
    shipped = shipped_gemm_configs(rt.installed.gemm_config_dir, shape.N, shape.K, facts["device_name"],
                                   shape.block_shape)
    identity = {"kind": "gemm", "shape": shape.to_dict(), "budget": budget, "grid": grid,
                "device": facts["device_name"], "triton": triton.__version__, "sglang": rt.version, "seed": seed}
    state = _State(out_dir, shape.tag, identity)
    log(f"GEMM {shape.tag}: shipped {shipped.found.value}; budget {budget}; {len(state.rows)} done")
    todo = [M for M in sorted(set(batch_sizes)) if M not in state.rows]
    shape_time_s = None if grid else shape_time_s
    spent_before = _spent_before(state.rows)
    _log_time_budget(log, shape_time_s, spent_before, len(todo))
    problem = SGLangBlockGemm(shape, seed=seed)
    workers = workers_for(shape.N * shape.K * 2 + max(batch_sizes) * (shape.K + 2 * shape.N) * 4)
    timer = GraphTimer(problem)
    tried: list[dict] = []
    prev: list[TileConfig] = []
    stopped = False
    compile_wall, compile_reused = 0.0, 0
    try:
        with SGLangCompilePool("gemm", shape, workers=workers) as pool:
            for i, M in enumerate(todo):
                if _stop_before(M, deadline, state.rows, log):
                    stopped = True
                    break
                tm, mark = time.perf_counter(), _phase_mark(timer, pool)
                elapsed, ts = _share_now(shape_time_s, spent_before, t_start, len(todo) - i, down=False)
                dflt = gemm_default_config(shape.block_shape)
                ship_d = shipped.nearest(M)
                ship = TileConfig.from_dict(ship_d, where="shipped") if ship_d else None
                res = search_batch_size(_evaluator(timer, pool, M, log_rows=tried), feasible, budget,
                                        warm_start=prev[:4] + ([ship] if ship else []) + [dflt], seed=seed + M,
                                        batch=max(8, workers), param_values=GEMM_PARAM_VALUES,
                                        deadline=ts.joint_deadline if ts else None)
                grid_res = _grid(timer, pool, M, space, [res.best, dflt], deadline, tried) if grid else None
                cands = {"default": dflt, "found": res.best}
                _add_leaders(cands, "found", res.top(RETIMED_SEARCH_LEADERS))
                if ship:
                    cands["shipped"] = ship
                if grid_res and grid_res.get("best") is not None:
                    cands["grid_best"] = grid_res["best"]
                pool.ensure([(M, c) for c in cands.values()])
                med = _remeasure(timer, M, cands)
                searched = _best_leader(med, "found")
                pick = min((k for k in cands if math.isfinite(med[k]) and k != "grid_best"), key=lambda k: med[k],
                           default="default")
                base_key = "shipped" if ship else "default"
                row = {"batch_size": M, "default_us": med["default"], "shipped_us": med.get("shipped"),
                       "found_us": med["found"], "search_best": searched, "search_best_us": med[searched],
                       "search_best_config": cands[searched].as_dict(),
                       "grid_best_us": med.get("grid_best"), "chosen": pick,
                       "chosen_us": med[pick], "baseline": base_key,
                       "speedup_vs_baseline": med[base_key] / med[pick] if med[pick] > 0 else None,
                       "speedup_vs_default": med["default"] / med[pick] if med[pick] > 0 else None,
                       "evaluations": res.evaluations, "default_config": dflt.as_dict(),
                       "time_share_s": round(ts.share_s, 1) if ts else None, "stopped_by_time": res.stopped_by_deadline,
                       "call_setup_s": round(elapsed, 1) if i == 0 else 0.0,
                       "found_config": res.best.as_dict(), "shipped_config": ship.as_dict() if ship else None,
                       "config": cands[pick].as_dict(), "wall_s": round(time.perf_counter() - tm, 1),
                       "wall_breakdown_s": _phase_breakdown(timer, pool, mark, time.perf_counter() - tm)}
                _keep_row(state, row, grid_res, med, "found", timer, pool, log)
                prev = res.top(4)
                problem.drop_batch(M)
                log(f"M={M}: default {_fmt(med['default'])}, shipped {_fmt(med.get('shipped'))}, found "
                    f"{_fmt(med['found'])} us{', grid ' + _fmt(med.get('grid_best')) if grid else ''} -> {pick} "
                    f"({row['wall_s']} s: {_fmt_breakdown(row['wall_breakdown_s'])}; {_fmt_effort(row)})")
            compile_wall, compile_reused = pool.compile_wall_s, pool.reused
    except KeyboardInterrupt:  # the call's backstop: keep and write what is finished
        stopped = True
        log("interrupted: the finished batch sizes are kept and written; rerun the same command "
            "to continue")
    path = out_dir / "gemm_configs" / name
    files = []
    if state.rows:
        write_configs(path, {M: r["config"] for M, r in state.rows.items()})
        files.append(str(path.relative_to(out_dir)))
    report = {"kind": "gemm", "shape": shape.to_dict(), "tag": shape.tag, "sglang_version": rt.version, **facts,
              "budget": budget, "space": len(space), "feasible": len(feasible), "grid": grid,
              "shipped": {"found": shipped.found.value, "path": str(shipped.path) if shipped.path else None},
              "batch_sizes_requested": (requested := _requested(out_dir, shape.tag, batch_sizes)),
              "complete": not stopped and all(M in state.rows for M in requested),
              "this_call_wall_s": round(time.monotonic() - t_start, 1),
              "this_call_compile_wall_s": round(compile_wall, 1), "compile_workers": workers,
              "this_call_compiles_reused": compile_reused, "files": files,
              **_time_budget_report(shape_time_s, state.rows), "rows": _rows(state)}
    _write_report(out_dir, shape.tag, report, tried)
    return json_safe(report)


def _log_compiled_here(timer, pool, log: Log) -> None:
    """Name the first configs the timer had to compile although the pool had (what the pool says of them)."""
    first = getattr(timer, "compiled_here_first", None)
    if not first:
        return
    from tuner.kernels.triton_cache import twin_diff

    for i, (M, cfg, built, names, before) in enumerate(first):
        res = pool.results.get((M, cfg)) if hasattr(pool, "results") else None
        said = "not asked" if res is None else (f"ok in {res.seconds:.1f} s" if res.ok else f"failed: {res.error}")
        log(f"  compiled by the timer ({built} entries) at M={M}: {describe_config(cfg)}; the pool: {said}")
        if i == 0:  # what differs from the pool's entry of the same kernel (the cache as it was before)
            for name in names:
                for line in twin_diff(timer.cache_dir, name, before):
                    log("    " + line)
    first.clear()


def _expected_wall_s(rows: dict) -> float:
    """How long the next batch size may take: the wall time of the largest one finished (larger
    batch sizes compile fewer new configs, so this rarely underestimates); 0 when none is."""
    if not rows:
        return 0.0
    return float(rows[max(rows)].get("wall_s") or 0.0)


def _past_deadline(deadline: float | None, expected_s: float) -> bool:
    """True when a batch size started now, taking ``expected_s``, would end after ``deadline``."""
    return deadline is not None and time.monotonic() + expected_s > deadline


def _keep_row(state, row: dict, grid_res: dict | None, med: dict, searched: str, timer, pool, log: Log) -> None:
    """Record a finished batch size (with the grid's figures, if a grid ran) and what the timer compiled."""
    if grid_res:
        _add_grid(row, grid_res, med, searched)
    state.add(row)
    _log_compiled_here(timer, pool, log)


def _add_grid(row: dict, grid_res: dict, med: dict, searched: str) -> None:
    """The grid's figures on a batch size's row, and the search's pick (key ``searched``) and the best of
    its re-timed leaders against the grid's best."""
    row.update(grid_complete=grid_res["complete"], grid_visited=grid_res["visited"],
               grid_size=grid_res["grid_size"], grid_timed=grid_res.get("timed"),
               grid_best_config=grid_res["best"].as_dict() if grid_res.get("best") else None)
    if med.get("grid_best") and math.isfinite(med[searched]):
        row[f"{searched}_fraction_of_grid_best"] = med["grid_best"] / med[searched]
    best = _best_leader(med, searched)  # what the search delivers: its pick or a re-timed runner-up
    if med.get("grid_best") and math.isfinite(med[best]):
        row["search_fraction_of_grid_best"] = med["grid_best"] / med[best]


def _stop_before(M: int, deadline: float | None, rows: dict, log: Log) -> bool:
    """Whether batch size M must wait for the next call (said in the log)."""
    expected = _expected_wall_s(rows)
    if not _past_deadline(deadline, expected):
        return False
    log(f"deadline: batch size {M} would not end before it (the last one took {expected:.0f} s); rerun the "
        "same command to continue")
    return True


def _log_time_budget(log: Log, shape_time_s: float | None, spent_s: float, todo: int) -> None:
    if shape_time_s and todo:
        left = max(0.0, shape_time_s - spent_s)
        log(f"time budget {shape_time_s:.0f} s for the shape: {spent_s:.0f} s spent by finished batch sizes, "
            f"{todo} to tune, about {left / todo:.0f} s each")


def _time_budget_report(shape_time_s: float | None, rows: dict) -> dict:
    """The budget and the shape's device time so far (batch sizes and the calls' start-ups)."""
    return {"shape_time_s": shape_time_s, "shape_device_s": round(_spent_before(rows), 1)}


def _fmt_effort(row: dict) -> str:
    """The evaluations a batch size made and, under a time budget, its share and whether it cut a search."""
    evals = (f"{row['evaluations_joint']}+{row['evaluations_down']}" if "evaluations_joint" in row
             else str(row.get("evaluations")))
    share = row.get("time_share_s")
    return f"{evals} evaluations" + ("" if share is None else
                                     f", share {share:.0f} s{' (cut by time)' if row.get('stopped_by_time') else ''}")


def _fmt(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.1f}"


def _write_moe_files(out_dir: Path, vdir: str, up_name: str, down_name: str, rows: dict, do_down: bool) -> list[str]:
    if not rows:
        return []
    base = out_dir / "configs" / vdir
    files = [write_configs(base / up_name, {M: r["up_config"] for M, r in rows.items()})]
    if do_down:
        files.append(write_configs(base / down_name, {M: r["down_file_config"] for M, r in rows.items()}))
    return [str(p.relative_to(out_dir)) for p in files]


def _write_report(out_dir: Path, tag: str, report: dict, tried: list[dict]) -> None:
    rep = out_dir / "reports" / f"{tag}.json"
    rep.parent.mkdir(parents=True, exist_ok=True)
    tmp = rep.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    os.replace(tmp, rep)
    with gzip.open(timings_path(out_dir / "reports", tag), "at") as f:  # one gzip member per report
        for r in tried:
            f.write(json.dumps(r) + "\n")
