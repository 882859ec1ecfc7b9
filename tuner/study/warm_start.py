"""Simulator-guided warm start: run the study on the simulator first, then launch its best
configurations first on the real backend.

The simulated study is a sibling ``<name>-sim`` in the same database (same spec, simulator
backend), so it stays auditable (`tuner study status NAME-sim`) and is reused -- not rerun -- when
the real study is started again. Its top-k distinct completed configurations are enqueued
(``optuna.Study.enqueue_trial``) right after the real study's baseline; ``space.suggest`` then
returns them through Optuna's fixed parameters.
"""

from __future__ import annotations

from typing import Callable

from tuner.lifecycle import TrialStatus
from tuner.config.schema import StudySpec
from tuner.storage import db, repo
from tuner.study import space as space_mod
from tuner.study.runner import StudyRunner
from tuner.study.summary import study_summary
from tuner.vocabulary import BackendKind

SIM_SUFFIX = "-sim"


def top_k_configs(study: StudySpec, rows: list[dict], k: int) -> list[dict]:
    """The k best distinct completed configurations (``rows``: trial dicts with params, status,
    capacity_users), each as the parameters Optuna should fix (only knobs whose condition holds)."""
    space, env = study.space(), space_mod.env_for(study)
    done = [r for r in rows if r.get("status") == TrialStatus.COMPLETE and r.get("capacity_users") is not None
            and not r.get("is_baseline")]
    done.sort(key=lambda r: -int(r["capacity_users"]))
    out, seen = [], set()
    for r in done:
        params = r["params"]
        fixed = {n: params.get(n) for n in space.params if space_mod.condition_holds(space, n, params, env)}
        key = repr(sorted((n, v) for n, v in fixed.items() if v is not None))
        if key in seen or space_mod.violated_constraints(space, fixed, env):
            continue
        seen.add(key)
        out.append(fixed)
        if len(out) >= k:
            break
    return out


def simulated_top_k(spec: StudySpec, storage_url: str, k: int, *, trials: int | None = None, use_ray: bool = True,
                    ray_address: str | None = None, parallel: int = 1,
                    on_event: Callable[[str, dict], None] | None = None) -> tuple[str, list[dict], bool]:
    """Run (or reuse) the sibling simulated study; returns (its name, top-k configurations, reused?)."""
    sim_name = spec.name + SIM_SUFFIX
    engine = db.get_engine(storage_url)
    reused = db.has_schema(engine) and repo.get_study(engine, sim_name) is not None
    if not reused:
        sim_spec = spec.model_copy(update={"name": sim_name, "backend": BackendKind.SIMULATOR.value})
        runner = StudyRunner(sim_spec, storage_url=storage_url, backend_kind=BackendKind.SIMULATOR,
                             backend_reason="warm start for " + spec.name, parallel=parallel,
                             ray_address=ray_address, use_ray=use_ray, on_event=on_event)
        runner.create()
        runner.run(trials or spec.trials)
    rows = study_summary(storage_url, sim_name)["trials"]
    return sim_name, top_k_configs(spec, rows, k), reused
