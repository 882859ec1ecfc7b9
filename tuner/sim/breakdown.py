"""Where a simulated load point's time went: the decode step split into attention, MoE, dense,
communication and overhead, and what the measurement window's counters say (queueing, re-prefill,
HiCache load-back, per-rank balance, busy time).

It reads the engine's window counters (``engine.WindowStats``) after a run and asks the step-time
model for the parts of one decode step at the window's mean per-rank batch, context and longest and
shortest context. The parts
are the model's own operator times; whatever the step time holds beyond them (fixed per-step GPU
time, CPU scheduling not hidden by the overlap scheduler, eager launches) is ``overhead``, so the
parts always add up to the model's step time. The split is then scaled to the window's measured
mean decode inter-token time. Nothing here changes what the simulator predicts: the model's
provenance counters are restored after the extra lookups.
"""

from __future__ import annotations

import copy

from .steptime import RankWork, StepTimeModel

DECODE_PARTS = ("attention", "moe", "dense", "communication", "overhead")


def decode_step_parts(model: StepTimeModel, works: list[RankWork], running: int, overlap: bool) -> dict[str, float]:
    """Seconds of one decode step by part (``DECODE_PARTS``), adding up to ``model.step_time``."""
    active = [w for w in works if w.decode_reqs]
    if not active:
        return {p: 0.0 for p in DECODE_PARTS}
    worst = max(active, key=model.rank_time)  # the step lasts as long as the slowest rank
    tokens = sum(w.tokens for w in works)
    dense = model.linear_time(worst.tokens, worst.decode_reqs) + model.layer_misc_time(worst.tokens)
    attention = model.decode_attention_time(worst.decode_reqs, worst.decode_ctx_tokens, worst.decode_max_ctx_tokens,
                                            worst.decode_min_ctx_tokens)
    attn_tp_comm = max(0.0, model.rank_time(worst) - dense - attention)
    moe_comm = model.moe_comm_time(tokens)
    moe = max(0.0, model.moe_time(tokens) - moe_comm)
    dense += model.sampling_time(max(w.decode_reqs for w in active))
    step = model.step_time(works, running, overlap=overlap)
    parts = {"attention": attention, "moe": moe, "dense": dense, "communication": attn_tp_comm + moe_comm}
    known = sum(parts.values())
    if known > step > 0:  # a term the model no longer adds this way: scale down, keep the shares
        parts = {k: v * step / known for k, v in parts.items()}
        known = step
    parts["overhead"] = max(0.0, step - known)
    return parts


CACHES = ("_decode_cache", "_moe_cache", "_linear_cache")


def window_report(model: StepTimeModel, ranks: list, window, overlap: bool, duration_s: float,
                  replicas: int) -> dict:
    """The measurement window's attribution figures (JSON-ready) for ``extra["explain"]``.

    The step-time model is memoised across load points and its decode cache keeps the first value
    of each context bucket, so these lookups run against empty caches (set aside, then put back)
    and leave its provenance counters as they were: later load points are simulated exactly as
    without this report."""
    saved_src, saved_files = copy.deepcopy(model._src), set(model._files)
    saved_caches = {name: getattr(model, name) for name in CACHES}
    for name in CACHES:
        setattr(model, name, {})
    try:
        return _report(model, ranks, window, overlap, duration_s, replicas)
    finally:
        model._src, model._files = saved_src, saved_files
        for name, cache in saved_caches.items():
            setattr(model, name, cache)


def _report(model: StepTimeModel, ranks: list, w, overlap: bool, duration_s: float, replicas: int) -> dict:
    batch = [r.window.batch for r in ranks]
    works = []
    for r in ranks:
        rw = r.window
        s = rw.steps
        n = round(rw.batch / s) if s else 0
        works.append(RankWork(decode_reqs=n, decode_ctx_tokens=int(rw.ctx / s) if s and n else 0,
                              decode_max_ctx_tokens=int(rw.ctx_longest / s) if s and n else 0,
                              decode_min_ctx_tokens=int(rw.ctx_shortest / s) if s and n else 0))
    running = sum(x.decode_reqs for x in works)
    parts = decode_step_parts(model, works, running, overlap)
    step_model_s = sum(parts.values())
    mean_decode_s = w.token_s / w.tokens if w.tokens else None
    scale = mean_decode_s / step_model_s if mean_decode_s and step_model_s > 0 else 1.0
    gpu_at_mean = model.gpu_time(works) if running else 0.0
    busy_s = w.decode_step_s + w.prefill_step_s
    return {
        "window_s": duration_s,
        "prefill_tokens": w.prefill_tokens,
        "reprefill_tokens": w.reprefill_tokens,
        "hicache_load_tokens": w.hicache_load_tokens,
        "hicache_load_s": w.hicache_load_tokens * model.cell / model.host_bw if model.host_bw > 0 else 0.0,
        "mean_queue_s": w.queue_s / w.queued if w.queued else None,
        "queued_requests": w.queued,
        "prefill_step_s": w.prefill_step_s,
        "decode_step_s": w.decode_step_s,
        "busy_fraction": min(1.0, busy_s / (duration_s * max(1, replicas))) if duration_s > 0 else None,
        "gpu_share_of_decode_step": gpu_at_mean / step_model_s if step_model_s > 0 else None,
        "decode_tokens": w.tokens,
        "mean_decode_itl_s": mean_decode_s,
        "mean_prefill_stall_per_token_s": w.stall_token_s / w.tokens if w.tokens else None,
        "decode_parts_s": {k: v * scale for k, v in parts.items()},
        "mean_batch_per_rank": [x.decode_reqs for x in works],
        # per request, and the longest request's (SGLang's Triton decode kernel waits for it)
        "mean_context_per_rank": [x.decode_ctx_tokens // x.decode_reqs if x.decode_reqs else 0 for x in works],
        "mean_longest_context_per_rank": [x.decode_max_ctx_tokens for x in works],
        "rank_decode_tokens": batch,
        "rank_prefill_tokens": [r.window.prefill for r in ranks],
        "rank_requests": [r.window.requests for r in ranks],
    }
