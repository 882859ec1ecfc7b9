"""What a study costs on real GPUs, estimated from what it measured (or would measure).

A launched trial holds its GPUs for the server start plus every load point of its capacity
search. Assumptions (per node, cold page cache; override with the module constants):

* weights: each GPU loads its share of the checkpoint (the planner's weights per GPU) from local
  NVMe at ``STORAGE_READ_GB_PER_S`` for the whole node, so load time = weights per GPU x GPUs of
  the node / bandwidth (replicated layers are read once per GPU: the planner's figure counts them);
* CUDA graph capture: ``GRAPH_CAPTURE_S_PER_BATCH`` per captured decode batch size; SGLang
  captures about 4 + max_bs / 8 sizes (1, 2, 4, 8, then every 8 up to --cuda-graph-max-bs);
* ``FIXED_START_S``: process start, NCCL and distributed init, kernel JIT warm-up, weight
  post-processing, health check;
* each load point: the study's warm-up plus its measurement window (x fidelity);
* a configuration screened out by the planner or a constraint costs nothing; one that fails to
  start costs its start time.
"""

from __future__ import annotations

from tuner.catalog import get_gpu, get_model
from tuner.lifecycle import TrialStatus
from tuner.planner import plan_memory
from tuner.config.schema import StudySpec
from tuner.study import space as space_mod
from tuner.study.pruning import replay_pruned

STORAGE_READ_GB_PER_S = 5.0  # local NVMe RAID per node, cold page cache
GRAPH_CAPTURE_S_PER_BATCH = 0.8  # deep MoE models; about 30 s for the default capture list
FIXED_START_S = 90.0


def assumptions(study: StudySpec) -> dict:
    return {"storage_read_gb_per_s": STORAGE_READ_GB_PER_S, "graph_capture_s_per_batch": GRAPH_CAPTURE_S_PER_BATCH,
            "fixed_start_s": FIXED_START_S, "warmup_s": study.measurement.warmup_s,
            "measurement_window_s": study.measurement.duration_s}


def server_start_s(study: StudySpec, flags: dict) -> tuple[float, int]:
    """(seconds from launch to ready, GPUs the server holds) for one configuration."""
    hw = study.hardware
    try:
        plan = plan_memory(get_model(study.model), get_gpu(hw.gpu), hw.gpus_per_node, flags, nodes=hw.nodes,
                           host_memory_gb=hw.host_memory_gb)
    except Exception:  # a model outside the catalog (e.g. a local transformers dir): fixed part only
        return FIXED_START_S, max(1, hw.total_gpus)
    gpus_per_node = min(plan.gpus_used, hw.gpus_per_node) or 1
    load_s = plan.weights_gb_per_gpu * gpus_per_node / STORAGE_READ_GB_PER_S
    capture_s = GRAPH_CAPTURE_S_PER_BATCH * (4 + plan.cuda_graph_max_bs_decode / 8)
    return FIXED_START_S + load_s + capture_s, max(1, plan.gpus_used)


def load_point_s(study: StudySpec, fidelity: float = 1.0) -> float:
    return study.measurement.warmup_s + study.measurement.duration_s * fidelity


def trial_gpu_s(study: StudySpec, flags: dict, load_points: int, *, started: bool = True,
                fidelity: float = 1.0) -> float:
    start_s, gpus = server_start_s(study, flags)
    if not started:
        return 0.0
    return (start_s + load_points * load_point_s(study, fidelity)) * gpus


def trials_cost(study: StudySpec, entries: list[dict], *, pruned: bool = True, baseline_first: bool = True) -> dict:
    """GPU-seconds/hours of launching ``entries`` (benchmark-table entries, in launch order).

    With ``pruned`` each capacity search stops as soon as it cannot beat the best finished so far
    (as the runner does); with ``baseline_first`` the first entry (the baseline) always runs to the end."""
    gpu_s, launches, points, incumbent = 0.0, 0, 0, None
    for i, e in enumerate(entries):
        if e.get("prescreened"):
            continue
        flags, _ = space_mod.split(e["values"], study.space().engine, space_mod.pinned_flags(study))
        steps = e.get("steps") or []
        n = len(steps)
        if pruned and (i > 0 or not baseline_first) and e.get("status") == TrialStatus.COMPLETE:
            n, _, _ = replay_pruned(study, steps, incumbent)
        launches += 1
        points += n
        gpu_s += trial_gpu_s(study, flags, n)
        if e.get("status") == TrialStatus.COMPLETE:
            incumbent = max(incumbent or 0, int(e["capacity_users"]))
    return {"gpu_seconds": gpu_s, "gpu_hours": gpu_s / 3600, "launches": launches, "load_points": points}


def grid_cost_pruned(study: StudySpec, entries: list[dict]) -> dict:
    """The exhaustive grid measured in order with pruning against the running best."""
    return trials_cost(study, entries, pruned=True, baseline_first=False)


def study_cost(study: StudySpec, trials: list[dict]) -> dict:
    """Estimated GPU cost of a recorded study (``tuner.study.summary`` trial dicts)."""
    gpu_s, launched, points = 0.0, 0, 0
    for t in trials:
        if not t.get("launched", True) or t.get("status") == TrialStatus.RUNNING:
            continue
        n = len(t.get("measurements") or [])
        fid = [m.get("fidelity") or 1.0 for m in t.get("measurements") or []]
        start_s, gpus = server_start_s(study, t.get("flags") or {})
        gpu_s += (start_s + sum(load_point_s(study, f) for f in fid)) * gpus
        launched += 1
        points += n
    return {"gpu_hours": round(gpu_s / 3600, 2), "launched_trials": launched, "load_points": points,
            "assumptions": assumptions(study)}
