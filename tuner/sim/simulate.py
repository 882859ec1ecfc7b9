"""Simulated measurement of one load point: closed-loop users replaying ``generate_sessions``
sessions against the simulated scheduler, aggregated exactly like a real replay.

Users follow the replay client (tuner.workload.replay): user u starts at u/users x warmup/2, runs
sessions u, u + users, u + 2 users, ... one at a time, and waits each turn's think time after the
response (the next session starts right after the last turn). Requests that start inside the measurement window
[warmup_s, warmup_s + duration_s) count, and so do the warm-up's still waiting for their first token
when it opens (``counted_in_window``, as the replay client counts them); after the window no new
request starts and the ones in flight are drained (a request still running ``DRAIN_LIMIT_S`` after
the window ends counts as a timeout error).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner.catalog import GPUDescription, ModelDescription, get_gpu, get_model
from tuner.errors import ConfigError, TrialError
from tuner.lifecycle import FailureClass
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.planner.memory import captured_token_counts, speculative_draft_layers
from tuner.planner.parallel import flag_bool
from tuner.workload.metrics import LoadPointMetrics, RequestRecord, aggregate, counted_in_window
from tuner.workload.session import Session, WorkloadProfile, generate_session

from .breakdown import window_report
from .cache import SessionPrefixCache
from .calibrate import calibration_context, load_calibration
from .engine import Rank, ReplicaEngine, Req, Stats
from .optable import profiles_fingerprint
from .router import Router, SessionIndex, routing_policy
from .scheduler import SchedulerRules, check_version
from .steptime import StepTimeModel
from .warmup import CachedKernels, kernel_warmup, stall_schedule

DRAIN_LIMIT_S = 600.0
MULTI_REPLICA_JUMP_S = 0.05

__all__ = ["build_step_model", "routing_policy", "scheduler_rules", "simulate_load_point"]


def build_step_model(model: ModelDescription, gpu: GPUDescription, plan, layout, flags: dict, knobs: dict, cal: dict,
                     gpus_per_node: int, sglang_version: str | None = None, op_tables=None) -> StepTimeModel:
    tiles = (knobs or {}).get("moe-tile-configs") or "default"
    if tiles not in ("default", "tuned"):
        raise ConfigError(f"unknown value {tiles!r}; valid: default, tuned", key="moe-tile-configs")
    decode_graph = not (flag_bool(flags, "disable-cuda-graph") or flag_bool(flags, "disable-decode-cuda-graph")
                        or flags.get("cuda-graph-backend-decode") == "disabled")
    return StepTimeModel(model, gpu, resolve_checkpoint(model, flags.get("quantization")), layout,
                         plan.bytes_per_token, cal, gpus_per_node=gpus_per_node, moe_tiles=tiles,
                         cuda_graph_max_bs=plan.cuda_graph_max_bs_decode, decode_graph=decode_graph,
                         with_mtp=speculative_draft_layers(model, flags) > 0, kv_cache_dtype=plan.kv_cache_dtype,
                         sglang_version=check_version(sglang_version), flags=flags, op_tables=op_tables)


def scheduler_rules(plan, layout, flags: dict, sglang_version: str | None = None) -> SchedulerRules:
    """The scheduler rules of one rank of this configuration (shared by simulate and serve-sim)."""
    return SchedulerRules.for_version(
        sglang_version, page_size=plan.page_size, chunked_prefill_size=plan.chunked_prefill_size,
        max_running_requests=plan.max_running_requests_per_dp_rank, attn_dp=layout.attn_dp, flags=flags,
        hierarchical_cache=plan.hierarchical_cache)


_SESSIONS: dict = {}  # (profile, seed) -> (sessions, prompt lengths), shared by the load points of a search


class _SessionSource:
    """User u's k-th session is session ``u + k * users`` (as the replay client draws them).

    Session i depends only on (profile, seed, i) and is immutable, so the sessions (and their
    prompt lengths) are kept for the next load point of the same workload."""

    def __init__(self, profile: WorkloadProfile, users: int, seed: int):
        self.profile, self.users, self.seed = profile, users, seed
        key = (profile, seed)
        hit = _SESSIONS.get(key)
        if hit is None:
            if len(_SESSIONS) >= 8:
                _SESSIONS.clear()
            hit = _SESSIONS[key] = ({}, {})
        self.sessions: dict[int, Session] = hit[0]
        self.prompts: dict[int, list[int]] = hit[1]

    def get(self, idx: int) -> Session:
        s = self.sessions.get(idx)
        if s is None:
            s = self.sessions[idx] = generate_session(self.profile, idx, self.seed)
        return s

    def prompt_len(self, idx: int, turn: int) -> int:
        lens = self.prompts.get(idx)
        if lens is None:
            s = self.get(idx)
            lens, total = [], s.system_prefix_tokens
            for t in s.turns:
                total += t.new_tokens
                lens.append(total)
                total += t.output_tokens
            self.prompts[idx] = lens
        return lens[turn]


_PREPARED: dict = {}


def _prepare(model, gpu, gpus, flags, knobs, nodes, host_memory_gb, calibration, version):
    """Plan, layout, calibration and step-time model of a configuration; memoised so a capacity
    search re-uses the step-time model's caches across load points."""
    key = None
    if calibration is None or isinstance(calibration, (str, Path)):
        key = (model.name, gpu.name, gpus, nodes, host_memory_gb, repr(sorted(flags.items())),
               repr(sorted(knobs.items())), str(calibration), version, profiles_fingerprint(gpu.name))
        hit = _PREPARED.get(key)
        if hit is not None:
            return hit
    try:
        plan = plan_memory(model, gpu, gpus, flags, nodes=nodes, host_memory_gb=host_memory_gb,
                           sglang_version=version)
    except ConfigError as exc:
        raise TrialError(FailureClass.INFEASIBLE, str(exc)) from None
    if not plan.fits:
        raise TrialError(plan.failure_class, plan.reason)
    layout = parse_layout(model, flags, gpus * nodes)
    cal = calibration if isinstance(calibration, dict) and "overhead" in calibration else load_calibration(
        gpu.name, calibration, context=calibration_context(model, gpu, flags, version))
    step_model = build_step_model(model, gpu, plan, layout, flags, knobs, cal, gpus, version)
    out = (plan, layout, cal, step_model)
    if key is not None:
        if len(_PREPARED) > 64:
            _PREPARED.clear()
        _PREPARED[key] = out
    return out


def simulate_load_point(
    model: ModelDescription | str,
    gpu: GPUDescription | str,
    gpus: int,
    flags: dict[str, Any],
    knobs: dict[str, Any] | None,
    profile: WorkloadProfile,
    users: int,
    *,
    warmup_s: float,
    duration_s: float,
    seed: int = 0,
    nodes: int = 1,
    host_memory_gb: float | None = None,
    calibration: dict | str | None = None,
    sglang_version: str | None = None,
    fresh_server: bool = False,
    cached_kernels: CachedKernels | None = None,
) -> LoadPointMetrics:
    """Predict what a replay of ``users`` closed-loop users would measure on this configuration.

    This signature is stable: it is what callers use to store the simulator's prediction beside a
    real trial (same configuration, workload, user count and window). ``sglang_version`` selects
    the scheduler rules and memory defaults of that SGLang release (default 0.5.23).
    ``fresh_server``: the load point is the first traffic of a newly started server, which goes
    through the calibration's fresh-server stalls (``tuner.sim.warmup``; none where none were measured).
    ``cached_kernels``: the per-M kernels that fresh server finds built in its Triton cache (earlier
    servers of the same kernel set ran them: ``tuner.evaluation.kernel_ledger``); none by default.
    """
    model = get_model(model)
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    knobs = dict(knobs or {})
    if users < 1:
        raise ConfigError(f"users must be >= 1, got {users}", key="users")
    version = check_version(sglang_version)
    plan, layout, cal, step_model = _prepare(model, gpu, gpus, flags, knobs, nodes, host_memory_gb, calibration,
                                             version)
    rules = scheduler_rules(plan, layout, flags, version)

    sys_prefix = int(round(profile.system_prefix_tokens * profile.scale))
    radix = rules.radix_cache
    capacity = plan.kv_capacity_tokens_per_gpu
    stats = Stats()
    window = (warmup_s, warmup_s + duration_s)
    records: list[RequestRecord] = []
    arrivals: list[tuple[float, int, int]] = []  # (time, seq, user)
    source = _SessionSource(profile, users, seed)
    user_session = list(range(users))
    user_turn = [0] * users
    for u in range(users):  # staggered over the first half of the warm-up, as the replay client does
        heapq.heappush(arrivals, (u / users * warmup_s * 0.5, u, u))
    seq = users
    end_t = window[1]
    computed_len: dict[int, int] = {}
    pending_in_window = 0

    stages = [0, 0.0, 0.0, 0.0]  # requests, queue, prefill forward, TTFT (every request, as SGLang counts)

    def on_finish(req: Req, t: float) -> None:
        nonlocal seq, pending_in_window
        error = req.error
        if not error and req.first_t is not None and req.sched_t is not None:
            stages[0] += 1
            stages[1] += req.sched_t - req.arrival
            # SGLang observes prefill_forward from the first chunk's batch to the end, and each
            # earlier chunk again as chunked_prefill, into the same histogram (17:
            # observability/req_time_stats.py::set_prefill_finished_time, set_last_chunked_prefill_finish_time);
            # the end is stamped before the request's own HiCache backup (process_batch_result_prefill)
            stages[2] += (req.prefill_end_t if req.prefill_end_t is not None else req.first_t) - req.sched_t
            if req.chunk_end_t is not None:
                stages[2] += req.chunk_end_t - req.sched_t
            stages[3] += req.first_t - req.arrival
        if req.arrival < window[1]:
            pending_in_window -= 1
        if counted_in_window(req.arrival, t if req.first_t is None else req.first_t, window):
            carried = req.arrival < window[0]
            if error:
                records.append(RequestRecord(
                    session_id=req.session, turn=req.turn, start_s=req.arrival, input_tokens=req.input_len,
                    output_tokens=0, ttft_s=None, end_s=None, error=error, carried_in=carried))
            else:
                records.append(RequestRecord(
                    session_id=req.session, turn=req.turn, start_s=req.arrival, input_tokens=req.input_len,
                    output_tokens=req.output_len, ttft_s=req.first_t - req.arrival, end_s=t,
                    cached_tokens=req.cached or 0,
                    reusable_tokens=source.get(user_session[req.user]).reusable_prefix_tokens(req.turn),
                    carried_in=carried))
        u = req.user
        session = source.get(user_session[u])
        if req.turn + 1 < session.num_turns:
            user_turn[u] = req.turn + 1
            nxt = t + session.turns[req.turn].think_time_s
        else:  # next session right away
            user_session[u] += users
            user_turn[u] = 0
            nxt = t
        if nxt < end_t:
            seq += 1
            heapq.heappush(arrivals, (nxt, seq, u))

    stalls = stall_schedule(cal, fresh_server)
    weight_format = resolve_checkpoint(model, flags.get("quantization")).weight_format
    host_tokens = plan.hicache_host_tokens_per_pool if rules.hierarchical_cache else 0
    replicas = []
    all_ranks: list[Rank] = []
    for _ in range(layout.dp):
        ranks = []
        for _ in range(layout.attn_dp):
            cache = SessionPrefixCache(capacity, plan.page_size, sys_prefix if radix else 1 << 60, host_tokens)
            ranks.append(Rank(cache, rules))
        all_ranks.extend(ranks)
        replicas.append(ReplicaEngine(ranks, step_model, rules, stats=stats, on_finish=on_finish, window=window,
                                      computed_len=computed_len, stalls=stalls,  # each replica compiles its own
                                      kernels=kernel_warmup(cal, fresh_server, model, weight_format, layout.tp,
                                                            layout.ep, flags, gpu.device_name, version,
                                                            captured_token_counts(model, flags, plan),
                                                            cached_kernels, step_model.moe_tiles)))
    rank_replica = {id(r): rep for rep in replicas for r in rep.ranks}
    router = Router(routing_policy(flags, knobs), len(all_ranks), SessionIndex(len(all_ranks), sys_prefix),
                    seed=seed)

    def deliver(t_arr: float, u: int) -> None:
        nonlocal pending_in_window
        idx, turn = user_session[u], user_turn[u]
        session = source.get(idx)
        prompt = source.prompt_len(idx, turn)
        out = rules.clamp_max_new_tokens(prompt, session.turns[turn].output_tokens, capacity, plan.context_length)
        req = Req(u, idx, turn, t_arr, prompt, out)
        if not radix:
            req.session = -1 - seq  # nothing is ever matched
        if t_arr < window[1]:  # drained after the window: the warm-up's may be carried into it
            pending_in_window += 1
        if prompt > plan.max_req_input_len:
            # SGLang rejects a prompt longer than max_req_input_len (KV pool or context length)
            req.error = f"input {prompt} tokens exceeds max_req_input_len {plan.max_req_input_len}"
            on_finish(req, t_arr)
            return
        loads = [r.inflight for r in all_ranks]
        toks = [r.inflight_tokens for r in all_ranks]
        target = router.route(req, loads, toks)
        rank = all_ranks[target]
        rank.inflight += 1
        rank.inflight_tokens += prompt
        rank.waiting.append(req)
        rep = rank_replica[id(rank)]
        if not rep.has_work() or rep.clock < t_arr:
            rep.clock = max(rep.clock, t_arr)

    hard_stop = end_t + DRAIN_LIMIT_S
    while True:
        busy = [rep for rep in replicas if rep.has_work()] if len(replicas) > 1 else \
            (replicas if replicas[0].has_work() else [])
        t_next = arrivals[0][0] if arrivals else float("inf")
        if not busy:
            if not arrivals:
                break
            t_arr, _, u = heapq.heappop(arrivals)
            deliver(t_arr, u)
            continue
        rep = busy[0] if len(busy) == 1 else min(busy, key=lambda r: r.clock)
        if t_next <= rep.clock:
            t_arr, _, u = heapq.heappop(arrivals)
            deliver(t_arr, u)
            continue
        if rep.clock > hard_stop or (rep.clock > end_t and pending_in_window <= 0):
            break
        horizon = t_next
        if len(busy) > 1:
            others = min(r.clock for r in busy if r is not rep)
            horizon = min(horizon, max(others, rep.clock) + MULTI_REPLICA_JUMP_S)
        before = rep.clock
        if rep.step(horizon) <= 0 and rep.clock == before and not math.isfinite(horizon):
            # nothing runs and nothing more arrives: a waiting request SGLang can never admit (its
            # paged prompt and a page fill the pool: Scheduler.init_req_max_new_tokens clamps its
            # output to 0, PrefillAdder.add_one_req still answers NO_TOKEN) blocks its rank's
            # queue for good; what is left times out, as the client's requests would
            break

    # requests of the window still unfinished: timeouts
    for rank in all_ranks:
        stuck = list(rank.waiting) + list(rank.running.values()) + ([rank.chunked] if rank.chunked else [])
        for req in stuck:
            if counted_in_window(req.arrival, req.first_t, window):
                records.append(RequestRecord(
                    session_id=req.session, turn=req.turn, start_s=req.arrival, input_tokens=req.input_len,
                    output_tokens=req.generated, ttft_s=None if req.first_t is None else req.first_t - req.arrival,
                    end_s=None, error="timeout: not finished when the simulation stopped",
                    carried_in=req.arrival < window[0]))

    evicted = sum(r.cache.evicted_tokens for r in all_ranks)
    extra = {
        "backend": "simulator",
        "sglang_version": version,
        "step_time_source": step_model.source_summary(),
        "calibration_applied": list(cal.get("fitted_applied") or []),
        "calibration_fitted_trials": list(cal.get("fitted_trials") or []),
        "calibration_fitted_on": cal.get("fitted_on"),  # another GPU of the same architecture, or None
        "evicted_tokens": evicted,
        "reprefill_tokens": stats.reprefill_tokens,
        "hicache_loads": stats.hicache_loads,
        "hicache_load_tokens": stats.hicache_load_tokens,
        "retractions": stats.retractions,
        "aborts": stats.aborts,
        "prefill_tokens": stats.prefill_tokens,
        "sim_steps": stats.steps,
        "sim_events": stats.events,
        "kv_capacity_tokens_per_pool": capacity,
        "fresh_server": {"fresh": fresh_server, "stalls": stats.stalls, "stall_s": round(stats.stall_s, 3),
                         "in_window": stats.window_stalls,
                         "cached_prefill_sizes": len(cached_kernels.prefill_tokens) if cached_kernels else 0},
        "kv_pools": len(all_ranks),
        "router_policy": router.policy,
        # SGLang's own per-request stages over the whole load point (warm-up and drain included),
        # comparable with its /metrics: queue_time, per_stage_req_latency (prefill_forward), TTFT
        "server_stage_means": {"requests": stages[0], "queue_s": stages[1] / max(1, stages[0]),
                               "prefill_forward_s": stages[2] / max(1, stages[0]),
                               "ttft_s": stages[3] / max(1, stages[0])},
    }
    # what the window's latencies are attributed to (tuner.explain); bookkeeping, no effect on results
    extra["explain"] = window_report(step_model, all_ranks, stats.window, rules.overlap, duration_s, len(replicas))
    ttfts = [r.ttft_s for r in records if r.ok]
    extra["explain"]["mean_ttft_s"] = sum(ttfts) / len(ttfts) if ttfts else None
    metrics = aggregate(records, users=users, duration_s=duration_s,
                        kv_capacity_tokens_total=plan.kv_capacity_tokens_total, extra=extra)
    itl = _weighted_percentiles(stats.itl, (50, 90, 99))
    return replace(metrics, p50_itl_s=itl[0], p90_itl_s=itl[1], p99_itl_s=itl[2])


def _weighted_percentiles(hist: dict[float, int], qs) -> list[float | None]:
    items = sorted((g, c) for g, c in hist.items() if c > 0)
    if not items:
        return [None] * len(qs)
    gaps = np.array([g for g, _ in items]) / 1e4  # keys are 0.1 ms buckets
    cum = np.cumsum([c for _, c in items])
    out = []
    for q in qs:
        i = int(np.searchsorted(cum, q / 100 * cum[-1], side="left"))
        out.append(float(gaps[min(i, len(gaps) - 1)]))
    return out
