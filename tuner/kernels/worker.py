"""Tune a list of batch sizes on one GPU (imports torch; run in-process or as
``python -m tuner.kernels.worker REQUEST.json RESULT.json`` with CUDA_VISIBLE_DEVICES set).

Progress goes to stdout as JSON lines ({"event": "eval", "n": k} / {"event": "done", "batch_size": M}).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Callable

from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import TileConfig, default_config, feasible_space


def device_facts() -> dict:
    from tuner.kernels.timing import device_facts as facts

    return facts()


def make_evaluator(timer, pool, M: int, log: list | None = None):
    """configs -> us (inf where a config fails), compiling new variants in parallel first."""
    from tuner.kernels.timing import ConfigFailed

    def evaluate(configs: list[TileConfig]) -> list[float]:
        pool.ensure(configs)
        out = []
        for cfg in configs:
            if pool.failed(cfg):
                us = math.inf
            else:
                try:
                    us = timer.measure(M, cfg)
                except ConfigFailed:
                    us = math.inf
            if log is not None:
                log.append({"batch_size": M, "config": cfg.as_dict(), "us": us})
            out.append(us)
        return out

    return evaluate


def tune_batch_sizes(shape: MoEShape, batch_sizes: list[int], budget: int, *, seed: int = 0,
                     compile_workers: int | None = None,
                     progress: Callable[[dict], None] | None = None) -> dict:
    """Search each batch size (ascending, warm-started from the previous one); time SGLang's default too."""
    from tuner.kernels.own_kernel import MoEProblem
    from tuner.kernels.timing import ConfigFailed, GraphTimer as Timer
    from tuner.kernels.compile import CompilePool
    from tuner.kernels.search import search_batch_size
    from tuner.kernels.space import smem_limit_bytes

    facts = device_facts()
    limit = facts["smem_limit_bytes"] or smem_limit_bytes(facts["sm_version"])
    feasible = feasible_space(shape.dtype, shape.block_shape, limit)
    problem = MoEProblem(shape)
    timer = Timer(problem)
    results, prev_top = [], []
    t0 = time.perf_counter()
    with CompilePool(shape, workers=compile_workers) as pool:
        # Compiling the whole feasible space at once keeps every core busy; compiling each small
        # batch of proposals as it comes leaves most cores idle behind the slowest compile.
        pool.ensure(feasible, on_done=(lambda r: progress({"event": "compiled"})) if progress else None)
        for M in sorted(batch_sizes):
            dflt = default_config(M, shape.num_experts, shape.intermediate, shape.hidden, shape.topk,
                                  shape.config_dtype, shape.block_shape)
            evaluate = make_evaluator(timer, pool, M)
            res = search_batch_size(
                evaluate, feasible, budget, warm_start=prev_top + [dflt], seed=seed + M,
                on_eval=(lambda n: progress({"event": "eval", "n": n})) if progress else None)
            pool.ensure([dflt])
            try:
                default_us = math.inf if pool.failed(dflt) else timer.measure(M, dflt)
            except ConfigFailed:
                default_us = math.inf
            results.append({"batch_size": M, "config": res.best.as_dict(), "best_us": res.best_us,
                            "default_config": dflt.as_dict(), "default_us": default_us,
                            "evaluations": res.evaluations, "search_wall_s": round(res.wall_s, 3)})
            prev_top = res.top(4)
            problem.drop_batch(M)
            if progress:
                progress({"event": "done", "batch_size": M})
        compile_wall = pool.compile_wall_s
    return {**facts, "shape": shape.to_dict(), "feasible_configs": len(feasible), "budget": budget,
            "results": results, "wall_s": round(time.perf_counter() - t0, 3),
            "compile_wall_s": round(compile_wall, 3)}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path) as f:
        req = json.load(f)

    def progress(event):
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    out = tune_batch_sizes(MoEShape.from_dict(req["shape"]), req["batch_sizes"], req["budget"],
                           seed=req.get("seed", 0), compile_workers=req.get("compile_workers"), progress=progress)
    with open(result_path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(result_path + ".tmp", result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
