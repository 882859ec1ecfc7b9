"""The simulator's prediction of a real load point: the same configuration, workload, users,
window, seed and SGLang version, simulated beside the measurement so every real trial carries
what the simulator said it would measure (the ledger of trust: ``tuner.study.trust``)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from tuner.errors import ConfigError, TrialError
from tuner.evaluation.capacity import CapacitySearch
from tuner.sim import simulate_load_point
from tuner.sim.warmup import CachedKernels
from tuner.catalog.routing import random_weight_flags
from tuner.workload.metrics import PREDICTION_KEY

__all__ = ["PREDICTED_METRICS", "PREDICTION_KEY", "decode_step_split", "predict", "predicted_capacity"]
PREDICTED_METRICS = ("p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "p50_tpot_s", "p90_tpot_s",
                     "throughput_tokens_per_s", "prefix_cache_hit_rate")


def predict(study, flags: dict, knobs: dict, users: int, *, warmup_s: float, duration_s: float,
            seed: int, fresh_server: bool = False, cached_kernels: CachedKernels | None = None) -> dict[str, Any]:
    """What the calibrated simulator predicts for this load point (``error`` when it cannot);
    ``fresh_server``: the deployment's first load point (its server's first traffic), on a Triton
    cache holding ``cached_kernels`` (``tuner.evaluation.kernel_ledger``)."""
    hw = study.hardware
    options = getattr(study, "backend_options", None) or {}
    t0 = time.process_time()
    try:
        m = simulate_load_point(study.model, hw.gpu, hw.gpus_per_node, {**random_weight_flags(options), **flags},
                                dict(knobs or {}),
                                study.workload_profile(), users, warmup_s=warmup_s, duration_s=duration_s, seed=seed,
                                nodes=hw.nodes, host_memory_gb=hw.host_memory_gb,
                                calibration=options.get("calibration"), sglang_version=options.get("sglang_version"),
                                fresh_server=fresh_server, cached_kernels=cached_kernels)
    except (TrialError, ConfigError) as exc:
        return {"error": str(exc), "seed": seed}
    out: dict[str, Any] = {k: getattr(m, k) for k in PREDICTED_METRICS}
    slo = study.slo
    out.update({
        "meets_slo": m.meets(slo.p90_ttft_s, slo.p90_tpot_s),
        "seed": seed, "warmup_s": warmup_s, "duration_s": duration_s, "fresh_server": fresh_server,
        "cached_prefill_sizes": len(cached_kernels.prefill_tokens) if fresh_server and cached_kernels else 0,
        "sglang_version": m.extra.get("sglang_version"),
        "step_time_source": (m.extra.get("step_time_source") or {}).get("overall"),
        "calibration": list(m.extra.get("calibration_applied") or []),
        "server_stage_means": m.extra.get("server_stage_means"),
        **decode_step_split(m.extra.get("explain") or {}),
        "cpu_s": round(time.process_time() - t0, 3),
    })
    return out


def decode_step_split(window: dict) -> dict[str, Any]:
    """The step-time model's split of the predicted decode step (attention, MoE, dense,
    communication, overhead) as shares, with the step it splits: what a real trial's decode step
    is made of according to the calibrated model (the server exports no per-operator times)."""
    parts = window.get("decode_parts_s") or {}
    total = sum(parts.values())
    if total <= 0:
        return {}
    batch = [b for b in window.get("mean_batch_per_rank") or [] if b]
    return {"decode_step_s": window.get("mean_decode_itl_s"),
            "decode_step_split": {k: v / total for k, v in parts.items()},
            "decode_batch_per_rank": sum(batch) / len(batch) if batch else None}


def predicted_capacity(study, flags: dict, knobs: dict, *, seed: int) -> tuple[int | None, str]:
    """The simulator's capacity for this configuration: the study's own capacity search (from
    ``capacity.start_users``), each load point simulated with the study's window. Returns (users,
    what it rests on); users is None when the simulator cannot predict this configuration."""
    search = CapacitySearch.for_study(study)
    m = study.measurement
    sources: set[str] = set()
    index = 0
    while not search.done:
        users = search.next_users()
        p = predict(study, flags, knobs, users, warmup_s=m.warmup_for(index), duration_s=m.duration_s, seed=seed,
                    fresh_server=m.fresh_kernels(index))
        index += 1
        if p.get("error"):
            return None, f"the simulator cannot predict it ({p['error']})"
        sources.update(p.get("calibration") or [])
        # the P90s go with the verdict, as a real trial's do: an interpolating bisection reads them
        search.record(users, bool(p["meets_slo"]), point=SimpleNamespace(
            valid=True, requests=1, p90_ttft_s=p["p90_ttft_s"], p90_tpot_s=p["p90_tpot_s"]))
    basis = ", ".join(sorted(sources)) or "uncalibrated step times"
    return search.capacity_users, f"the simulator's capacity for this configuration ({basis})"
