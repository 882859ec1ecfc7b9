"""Build the committed summary.json from a benchmark run's raw files (CPU only).

    tuner kernels summarize --grid grid.jsonl --search-log bench.log --shape-json shape.json \
        [--extra summary_shape2.json ...] -o results/kernels/h200/summary.json

From the grid's timings (one pass, every config, same timer) at each batch size with a complete grid:
grid_best_us = fastest config; found_us and default_us = the same pass's time of the search's pick and
of SGLang's default, so all three come from one measurement pass. Batch sizes without a complete grid
keep the search's own time and null grid figures.

    tuner kernels summarize --update-from RUN/grid_only_257_256_6144.json -o results/kernels/h200/summary.json

folds the complete batch sizes of a ``benchmark --grid-only`` run into an existing summary.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from tuner.kernels.space import TileConfig, default_config

_SEARCH = re.compile(r"search M=(\d+): ([\d.]+) us after (\d+) evals \(M(\d+)-N(\d+)-K(\d+)-G(\d+)-w(\d+)-s(\d+)\)")
_WALL = re.compile(r"search done in ([\d.]+) s \(compile ([\d.]+) s\)")
_GRIDM = re.compile(r"grid M=(\d+): .*\(([\d.]+) s\)")


def summarize_shape(grid_path: Path, log_path: Path, shape: dict, grid_size: int) -> dict:
    log = log_path.read_text()
    found = {}
    for m in _SEARCH.finditer(log):
        M = int(m.group(1))
        found[M] = (float(m.group(2)), int(m.group(3)), TileConfig(*map(int, m.group(4, 5, 6, 7, 8, 9))))
    wall = _WALL.search(log)
    grid_times = defaultdict(dict)
    for line in grid_path.read_text().splitlines():
        r = json.loads(line)
        grid_times[r["batch_size"]][TileConfig.from_dict(r)] = r["us"]
    rows = []
    for M in sorted(found):
        search_us, evals, cfg = found[M]
        dflt = default_config(M, shape["num_experts"], shape["intermediate"], shape["hidden"], shape["topk"],
                              None if shape["dtype"] == "bf16" else shape["dtype"],
                              tuple(shape["block_shape"]) if shape["block_shape"] else None)
        times = grid_times.get(M, {})
        row = {"batch_size": M, "grid_best_us": None, "found_us": round(search_us, 3), "default_us": None,
               "fraction_of_grid_best": None, "evaluations": evals, "grid_size": grid_size,
               "found_config": cfg.as_dict(), "default_config": dflt.as_dict()}
        if len(times) == grid_size:
            ok = {c: t for c, t in times.items() if t is not None}
            best_cfg = min(ok, key=ok.get)
            row.update(grid_best_us=round(ok[best_cfg], 3), found_us=round(ok[cfg], 3),
                       fraction_of_grid_best=round(ok[best_cfg] / ok[cfg], 4),
                       grid_best_config=best_cfg.as_dict(), grid_timed=len(ok))
            if dflt in ok:
                row["default_us"] = round(ok[dflt], 3)
        rows.append(row)
    grid_walls = [float(g[1]) for g in _GRIDM.findall(log)]
    return {"shape": shape, "grid_size": grid_size,
            "search_wall_s": float(wall.group(1)) if wall else None,
            "search_compile_wall_s": float(wall.group(2)) if wall else None,
            "grid_timing_wall_s_per_batch_size": grid_walls, "batch_sizes": rows}


def update_from_grid_only(doc: dict, grid_only: dict) -> list[int]:
    """Put a grid-only run's complete batch sizes into a summary document (in place).

    Only rows whose grid pass visited the whole space are taken; grid best, found and default all
    come from that pass (as in ``summarize_shape``). The search's evaluation count is kept. Returns
    the batch sizes updated.
    """
    shape = next((sh for sh in doc["shapes"] if sh["shape"] == grid_only["shape"]), None)
    if shape is None:
        raise ValueError(f"summary has no shape {grid_only['shape']}")
    rows = {r["batch_size"]: r for r in shape["batch_sizes"]}
    walls = shape.setdefault("grid_timing_wall_s_per_batch_size", [])
    done = []
    for new in grid_only["batch_sizes"]:
        M = new["batch_size"]
        row = rows.get(M)
        if row is None or not new.get("complete") or new.get("found_config") != row.get("found_config"):
            continue
        row.update(grid_best_us=new["grid_best_us"], found_us=new["found_us"], default_us=new["default_us"],
                   fraction_of_grid_best=round(new["grid_best_us"] / new["found_us"], 4), grid_size=new["grid_size"],
                   default_config=new["default_config"], grid_best_config=new["grid_best_config"],
                   grid_timed=new["grid_timed"])
        walls.append(new["grid_timing_wall_s"])
        done.append(M)
    return done


def run(*, update_from=None, grid=None, search_log=None, shape_json=None, extra=(), device_name="NVIDIA H200",
        triton_version="3.6.0", output) -> str:
    """Write or update the summary at ``output``; returns a one-line message."""
    from tuner.errors import ConfigError

    output = Path(output)
    if update_from is not None:
        if not output.exists():
            raise ConfigError("the summary to update does not exist", file=str(output))
        doc = json.loads(output.read_text())
        try:
            done = update_from_grid_only(doc, json.loads(Path(update_from).read_text()))
        except ValueError as exc:
            raise ConfigError(str(exc), file=str(update_from)) from None
        output.write_text(json.dumps(doc, indent=2) + "\n")
        return f"updated batch sizes {done} in {output}"
    if not (grid and search_log and shape_json):
        raise ConfigError("--grid, --search-log and --shape-json are needed (or --update-from)", key="summarize")
    meta = json.loads(shape_json)
    first = summarize_shape(Path(grid), Path(search_log), meta["shape"], meta["grid_size"])
    first.update(model=meta["model"], tp_size=meta["tp_size"], ep_size=meta["ep_size"])
    shapes = [first] + [json.loads(Path(p).read_text()) for p in extra]
    for sh in shapes[1:]:  # same keys in every row; a shape run without the grid has null grid figures
        for row in sh["batch_sizes"]:
            for key in ("grid_best_us", "fraction_of_grid_best", "default_us"):
                row.setdefault(key, None)
            row.setdefault("grid_size", sh["grid_size"])
    doc = {"device_name": device_name, "triton_version": triton_version, "shapes": shapes}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(doc, indent=2) + "\n")
    return f"wrote {output}"
