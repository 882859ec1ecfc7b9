"""One finding per cause at one load point, from what the load point stored.

Real trials (SGLang): the server's Prometheus counters over the load point (``server_metrics``:
queue time, TTFT and inter-token histograms' sums, uncached prompt tokens, cache tiers, per-rank
tokens, evictions and retractions where the version exports them), the replay client's records
(prefix reuse, event-loop lag, CPU) and the trial's NVML summary. Simulated trials: the
simulator's window report (``extra["explain"]``). Where neither says anything the finding is
``not_measured`` with the reason, never a guess; figures derived with the workload model are
``estimated``.
"""

from __future__ import annotations

from tuner import catalog
from tuner.errors import ConfigError
from tuner.explain import fmt
from tuner.explain.causes import Cause, Coverage, Finding
from tuner.explain.inputs import LoadPoint, StudyContext, TrialFacts
from tuner.explain.workingset import ideal_hit_rate, working_set_tokens

# a route-aware policy keeps a session on the pool that holds its context
CACHE_AWARE_POLICIES = ("cache_aware",)
WORKING_SET_FITS = 0.8  # a working set below this share of the KV pools fits them if routed well
DECODE_PARTS = ("attention", "moe", "dense", "communication", "overhead")
PART_NAMES = {"moe": "MoE"}


def _ratio(num, den) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _sm_mean(sm: dict, name: str) -> float | None:
    """Mean of a Prometheus histogram over the load point (``_sum`` / ``_count`` deltas)."""
    return _ratio(sm.get(f"{name}_sum"), sm.get(f"{name}_count"))


def _source(p: LoadPoint) -> Coverage:
    return Coverage.SIMULATED if p.simulated else Coverage.MEASURED


# ---------------------------------------------------------------------------------- client
def client(p: LoadPoint) -> Finding:
    if p.simulated:
        return Finding(Cause.CLIENT, Coverage.NOT_APPLICABLE,
                       text="no replay client: the simulator replays the users in virtual time")
    ex = p.extra
    if "client_bound" not in ex:
        return Finding(Cause.CLIENT, Coverage.NOT_MEASURED, text="the replay client recorded no lag or CPU figures")
    lag, cpu = ex.get("event_loop_lag_p99_s"), ex.get("client_cpu_fraction")
    figures = {"client_bound": bool(ex["client_bound"]), "event_loop_lag_p99_s": lag, "client_cpu_fraction": cpu}
    detail = f"event-loop lag P99 {fmt.ms(lag)}, client CPU {fmt.pct(cpu)} of a core"
    if ex["client_bound"]:
        return Finding(Cause.CLIENT, Coverage.MEASURED, 1.0, f"the replay client is at its own ceiling ({detail}): "
                       "the latencies include the client's delay", figures)
    return Finding(Cause.CLIENT, Coverage.MEASURED, 0.0, f"the replay client is not at its ceiling ({detail})", figures)


# ------------------------------------------------------------------------------ GPU clocks
GPU_SLOWDOWN_BINDS = 0.1  # 10% below the ceiling: steps that scale with the clock run ~10% longer


def gpu_slowdown(p: LoadPoint) -> Finding:
    """How far the slowest GPU's busy SM clock stayed below its ceiling over the load point (NVML,
    ``extra.gpu_clocks``): a card held back by its power cap or temperature runs every step slower,
    whatever the configuration."""
    if p.simulated:
        return Finding(Cause.GPU_SLOWDOWN, Coverage.NOT_APPLICABLE, text="simulated GPUs run at their ceiling")
    per_gpu = ((p.extra.get("gpu_clocks") or {}).get("per_gpu")) or {}
    rows = []
    for gpu_id, g in per_gpu.items():
        clock, ceiling = g.get("mean_busy_sm_clock_mhz") or g.get("mean_sm_clock_mhz"), g.get("max_sm_clock_mhz")
        if clock and ceiling:
            rows.append((1.0 - clock / ceiling, gpu_id, clock, ceiling, g.get("clock_limit_share") or {}))
    if not rows:
        return Finding(Cause.GPU_SLOWDOWN, Coverage.NOT_MEASURED,
                       text="no GPU clocks were recorded (NVML clocks per load point)")
    loss, gpu_id, clock, ceiling, limits = max(rows)
    loss = max(0.0, loss)
    reasons = ", ".join(f"{name.replace('_', ' ')} in {fmt.pct(share)} of samples"
                        for name, share in sorted(limits.items(), key=lambda x: -x[1]))
    figures = {"gpu": gpu_id, "mean_busy_sm_clock_mhz": clock, "max_sm_clock_mhz": ceiling,
               "clock_loss": loss, "clock_limit_share": limits}
    text = (f"GPU {gpu_id} ran at {clock:,.0f} MHz, {fmt.pct(clock / ceiling)} of its {ceiling:,.0f} MHz ceiling"
            + (f" ({reasons})" if reasons else ""))
    if loss >= GPU_SLOWDOWN_BINDS:
        text += ": every step ran on a slowed card"
    return Finding(Cause.GPU_SLOWDOWN, Coverage.MEASURED, loss, text, figures)



# ------------------------------------------------------------------------------- KV and routing
def _reprefill(p: LoadPoint, ctx: StudyContext) -> tuple[float | None, Coverage, dict]:
    """(share of prefill tokens that re-compute context sent before, how known, figures)."""
    figures: dict = {}
    reuse = p.extra.get("prefix_reuse")
    hit = p.prefix_cache_hit_rate
    if p.simulated and p.sim.get("prefill_tokens"):
        s = p.sim
        figures.update(prefill_tokens=s["prefill_tokens"], reprefill_tokens=s.get("reprefill_tokens", 0))
        share = s.get("reprefill_tokens", 0) / s["prefill_tokens"]
        if reuse and reuse.get("input_tokens"):
            figures["ideal_hit_rate"] = reuse["reusable_tokens"] / reuse["input_tokens"]
        return share, Coverage.SIMULATED, figures
    if reuse and reuse.get("computed_tokens"):
        figures.update(computed_tokens=reuse["computed_tokens"], recomputed_tokens=reuse["recomputed_reusable_tokens"],
                       ideal_hit_rate=reuse["reusable_tokens"] / reuse["input_tokens"])
        return reuse["recomputed_reusable_tokens"] / reuse["computed_tokens"], _source(p), figures
    if hit is not None and ctx.workload is not None and hit < 1:
        ideal = ideal_hit_rate(ctx.workload)
        figures["ideal_hit_rate"] = ideal
        return max(0.0, ideal - hit) / (1 - hit), Coverage.ESTIMATED, figures
    return None, Coverage.NOT_MEASURED, figures


def _evictions(p: LoadPoint) -> tuple[bool | None, dict]:
    """Whether the pool evicted or retracted anything (None: not recorded)."""
    if p.simulated:
        ev, rt = p.extra.get("evicted_tokens"), p.extra.get("retractions")
        if ev is None and rt is None:
            return None, {}
        return bool((ev or 0) > 0 or (rt or 0) > 0), {"evicted_tokens": ev, "retractions": rt}
    sm = p.server_metrics
    keys = ("sglang:evicted_tokens_total", "sglang:num_retracted_requests_total", "sglang:num_retracted_reqs")
    seen = {k.split(":", 1)[1]: sm[k] for k in keys if k in sm}
    if "evicted_tokens_total" not in seen and not any(seen.values()):
        return None, seen  # 0.5.17 exports no eviction counter; retraction gauges alone say little
    return any(v > 0 for v in seen.values()), seen


def pools_of(p: LoadPoint, trial: TrialFacts) -> int:
    if p.simulated and p.extra.get("kv_pools"):
        return int(p.extra["kv_pools"])
    return trial.pools or 1


def router_policy(p: LoadPoint, trial: TrialFacts) -> str:
    policy = p.extra.get("router_policy") or trial.knobs.get("router-policy")
    if policy:
        return str(policy)
    method = str(trial.flags.get("load-balance-method") or "auto")
    return "round_robin" if method in ("auto", "round_robin", "follow_bootstrap_room") else method


def kv_and_routing(p: LoadPoint, trial: TrialFacts, ctx: StudyContext) -> tuple[Finding, Finding]:
    share, coverage, figures = _reprefill(p, ctx)
    pools = pools_of(p, trial)
    pool_total = p.kv_capacity_tokens_total or trial.measured_kv_capacity_tokens or trial.predicted_kv_capacity_tokens
    ws = working_set_tokens(ctx.workload, p.users) if ctx.workload is not None else None
    evicted, ev_figures = _evictions(p)
    policy = router_policy(p, trial)
    hit = p.prefix_cache_hit_rate
    figures.update(ev_figures, kv_pool_tokens_total=pool_total, kv_pools=pools, working_set_tokens=ws,
                   prefix_hit_rate=hit, reprefill_share=share, router_policy=policy if pools > 1 else None)
    ideal = figures.get("ideal_hit_rate")
    if ideal is not None and hit is not None:
        figures["hit_rate_lost"] = max(0.0, ideal - hit)
    if share is None:
        why = "no prefix-cache figures were recorded (hit rate unknown)"
        kv = Finding(Cause.KV_CAPACITY, Coverage.NOT_MEASURED, text=why, figures=figures)
        route = Finding(Cause.ROUTING, Coverage.NOT_APPLICABLE if pools <= 1 else Coverage.NOT_MEASURED,
                        text="one KV pool" if pools <= 1 else why, figures=figures)
        return kv, route
    pool_text = (f"KV pool {fmt.tokens(pool_total)} tokens" if pools <= 1 else
                 f"KV pools {pools} x {fmt.tokens((pool_total or 0) / pools)} tokens")
    ws_text = f", working set {fmt.tokens(ws)}" if ws is not None else ""
    hit_text = (f"; hit rate {fmt.pct(hit)} of a possible {fmt.pct(ideal)}" if hit is not None and ideal is not None
                else "")
    estimated = " (estimated from the hit rate against this workload's re-sent share)" \
        if coverage is Coverage.ESTIMATED else ""
    missing = ("which prefill tokens re-computed context sent before: the replay client did not record "
               "reusable prefixes, so the share is estimated from the hit rate") if coverage is Coverage.ESTIMATED else ""
    if evicted is None and not p.simulated:
        missing = (missing + "; " if missing else "") + "evictions (this SGLang version exports no eviction counter)"
    fits = ws is not None and pool_total and ws < WORKING_SET_FITS * pool_total
    # Several pools that would hold the working set if each session stayed on one: context is
    # re-computed because requests land on a pool that does not hold it (a policy that spreads
    # sessions, or a cache-aware router moving them to balance load).
    routing_bound = pools > 1 and fits
    if routing_bound:
        how = ("moves sessions when ranks are imbalanced" if policy in CACHE_AWARE_POLICIES
               else "spreads each session over the pools")
        route = Finding(Cause.ROUTING, coverage, share,
                        f"{fmt.pct(share)} of prefill tokens re-compute context another KV pool holds "
                        f"({policy} routing over {pools} pools {how}; {pool_text}{ws_text}){estimated}",
                        figures, missing)
        kv = Finding(Cause.KV_CAPACITY, coverage, 0.0,
                     f"the working set ({fmt.tokens(ws)}) fits the KV pools ({fmt.tokens(pool_total)} tokens)", figures)
        return kv, route
    # An estimate alone is not enough to call a pool too small when the working set fits it.
    credible = coverage is not Coverage.ESTIMATED or not fits or evicted is True
    kv_share = share if credible else 0.0
    what = "evicted context" if evicted is not False else "earlier context"
    kv = Finding(Cause.KV_CAPACITY, coverage, kv_share,
                 f"{fmt.pct(share)} of prefill tokens re-compute {what} ({pool_text}{ws_text}{hit_text}){estimated}",
                 figures, missing)
    if pools <= 1:
        route = Finding(Cause.ROUTING, Coverage.NOT_APPLICABLE, text="one KV pool", figures={})
    else:
        route = Finding(Cause.ROUTING, coverage, 0.0, f"{policy} routing over {pools} pools; the working set does "
                        "not fit them however requests are routed" if not fits else f"{policy} routing over {pools} pools",
                        figures)
    return kv, route


# ------------------------------------------------------------------------------ host link
def _bytes_per_token(p: LoadPoint, trial: TrialFacts) -> float | None:
    sm = p.server_metrics
    gb, tokens = sm.get("sglang:kv_cache_memory_usage_gb"), sm.get("sglang:max_total_num_tokens")
    return gb * 1e9 / tokens if gb and tokens else None


def host_link(p: LoadPoint, trial: TrialFacts, ctx: StudyContext) -> Finding:
    if p.simulated:
        s = p.sim
        tokens = s.get("hicache_load_tokens") or 0
        if not trial.hicache and not tokens:
            return Finding(Cause.HOST_LINK, Coverage.NOT_APPLICABLE, text="HiCache is off")
        load_s = s.get("hicache_load_s") or 0.0
        share = _ratio(load_s, s.get("prefill_step_s")) or 0.0
        return Finding(Cause.HOST_LINK, Coverage.SIMULATED, min(1.0, share),
                       f"HiCache loads {fmt.tokens(tokens)} tokens back from host memory ({fmt.seconds(load_s)} over "
                       f"the host link, {fmt.pct(share)} of prefill time)",
                       {"load_tokens": tokens, "load_s": load_s})
    if not trial.hicache:
        return Finding(Cause.HOST_LINK, Coverage.NOT_APPLICABLE, text="HiCache is off")
    sm = p.server_metrics
    key = "sglang:cached_tokens_total{cache_source=host}"
    if key not in sm and "sglang:cached_tokens_total{cache_source=device}" not in sm:
        return Finding(Cause.HOST_LINK, Coverage.NOT_MEASURED,
                       text="host-cache hits are not broken out (cached tokens were summed over cache tiers)")
    tokens = sm.get(key, 0.0)
    ttft_sum = sm.get("sglang:time_to_first_token_seconds_sum")
    load_s, coverage = sm.get("sglang:load_back_duration_seconds_sum"), Coverage.MEASURED
    if load_s is None:
        cell = _bytes_per_token(p, trial)
        try:
            link = catalog.get_gpu(ctx.gpu).host_link_gbps * 1e9 if ctx.gpu else None
        except ConfigError:
            link = None
        load_s = tokens * cell / link if cell and link else None
        coverage = Coverage.ESTIMATED
    share = min(1.0, _ratio(load_s, ttft_sum) or 0.0)
    return Finding(Cause.HOST_LINK, coverage, share,
                   f"HiCache loads {fmt.tokens(tokens)} tokens back from host memory (about {fmt.seconds(load_s)} "
                   f"over the host link, {fmt.pct(share)} of summed TTFT)", {"load_tokens": tokens, "load_s": load_s})


# ------------------------------------------------------------------------------ imbalance
def _spread(values: list[float]) -> float | None:
    """How far the busiest above the mean: 1 - mean/max (0 balanced, -> 1 one rank does it all)."""
    values = [float(v) for v in values]
    if len(values) < 2 or max(values) <= 0:
        return None
    return 1.0 - (sum(values) / len(values)) / max(values)


def imbalance(p: LoadPoint, trial: TrialFacts) -> Finding:
    pools = pools_of(p, trial)
    if pools <= 1:
        return Finding(Cause.IMBALANCE, Coverage.NOT_APPLICABLE, text="one KV pool, one rank")
    if p.simulated and p.sim.get("rank_decode_tokens"):
        decode, prefill = p.sim["rank_decode_tokens"], p.sim.get("rank_prefill_tokens") or []
        coverage = Coverage.SIMULATED
    else:
        sm = p.server_metrics
        per_rank = {k: v for k, v in sm.items() if k.startswith("sglang:realtime_tokens_total{dp_rank=")}
        per_server = [s.get("sglang:realtime_tokens_total") for s in p.extra.get("server_metrics_per_server") or []]
        if len(per_rank) >= 2:
            decode, prefill, coverage = list(per_rank.values()), [], Coverage.MEASURED
        elif len(per_server) >= 2 and all(v is not None for v in per_server):
            decode, prefill, coverage = per_server, [], Coverage.MEASURED
        else:
            return Finding(Cause.IMBALANCE, Coverage.NOT_MEASURED,
                           text=f"{pools} KV pools, but the server's metrics were not broken out per rank")
    d, pf = _spread(decode), _spread(prefill)
    share = max(x for x in (d, pf, 0.0) if x is not None)
    mean = sum(decode) / len(decode) if decode else 0
    top = max(decode) / mean if mean else None
    what = "decodes" if coverage is Coverage.SIMULATED else "processes"
    text = f"the busiest of {len(decode)} ranks {what} {fmt.ratio(top)} the mean"
    if pf is not None and prefill and sum(prefill):
        pmean = sum(prefill) / len(prefill)
        text += f" (prefill {fmt.ratio(max(prefill) / pmean)})"
    return Finding(Cause.IMBALANCE, coverage, share, text,
                   {"rank_work": decode, "rank_prefill_tokens": prefill, "decode_spread": d, "prefill_spread": pf})


# ------------------------------------------------------------------------- TTFT: queue, compute
def queueing(p: LoadPoint) -> tuple[Finding, Finding]:
    """(prefill queueing, prefill compute): the share of TTFT spent waiting for admission, and
    the rest."""
    if p.simulated and p.sim.get("mean_queue_s") is not None and p.sim.get("mean_ttft_s"):
        wait, ttft, coverage = p.sim["mean_queue_s"], p.sim["mean_ttft_s"], Coverage.SIMULATED
        reuse = p.extra.get("prefix_reuse") or {}
        uncached = _ratio(reuse.get("computed_tokens"), reuse.get("requests"))
        busy = (p.sim.get("prefill_step_s") or 0) + (p.sim.get("decode_step_s") or 0)
        prefill_busy = _ratio(p.sim.get("prefill_step_s"), busy)
    else:
        sm = p.server_metrics
        wait, ttft = _sm_mean(sm, "sglang:queue_time_seconds"), _sm_mean(sm, "sglang:time_to_first_token_seconds")
        if wait is None or not ttft:
            why = "the server exported no queue-time and TTFT histograms (--enable-metrics)"
            return (Finding(Cause.PREFILL_QUEUEING, Coverage.NOT_MEASURED, text=why),
                    Finding(Cause.PREFILL_COMPUTE, Coverage.NOT_MEASURED, text=why))
        coverage = Coverage.MEASURED
        uncached = _sm_mean(sm, "sglang:uncached_prompt_tokens_histogram")
        prefill_busy = None
    where = ("" if coverage is Coverage.SIMULATED else
             "server means over the load point, warm-up included: ")
    q = min(1.0, wait / ttft)
    figures = {"mean_queue_s": wait, "mean_ttft_s": ttft, "queue_share": q, "uncached_tokens_per_request": uncached,
               "prefill_share_of_busy_time": prefill_busy}
    queue = Finding(Cause.PREFILL_QUEUEING, coverage, q,
                    f"{fmt.pct(q)} of TTFT is waiting for admission ({where}{fmt.seconds(wait)} of "
                    f"{fmt.seconds(ttft)})", figures)
    detail = [f"{where}{fmt.pct(q)} waiting of {fmt.seconds(ttft)}"]
    if uncached is not None:
        detail.append(f"{fmt.tokens(uncached)} uncached tokens per request")
    if prefill_busy is not None:
        detail.append(f"prefill steps {fmt.pct(prefill_busy)} of busy time")
    compute = Finding(Cause.PREFILL_COMPUTE, coverage, 1.0 - q,
                      f"{fmt.pct(1 - q)} of TTFT is prefill compute ({', '.join(detail)})", figures)
    return queue, compute


# ------------------------------------------------------------------------ TPOT: decode, stalls
def decode(p: LoadPoint) -> tuple[Finding, Finding]:
    """(decode step, prefill interference) for TPOT."""
    if p.simulated and p.sim.get("mean_decode_itl_s"):
        s = p.sim
        itl, stall = s["mean_decode_itl_s"], s.get("mean_prefill_stall_per_token_s") or 0.0
        per_token = itl + stall
        parts = s.get("decode_parts_s") or {}
        total = sum(parts.values()) or itl
        shares = {k: v / total for k, v in parts.items()}
        batch = [b for b in s.get("mean_batch_per_rank") or [] if b]
        order = sorted(shares.items(), key=lambda kv: -kv[1])
        split = split_text(order)
        per_rank = f" at {round(sum(batch) / len(batch))} requests per rank" if batch else ""
        figures = {"mean_decode_step_s": itl, "prefill_stall_per_token_s": stall, "decode_parts_share": shares,
                   "mean_batch_per_rank": batch}
        step = Finding(Cause.DECODE_STEP, Coverage.SIMULATED, itl / per_token,
                       f"decode step {fmt.ms(itl)}{per_rank}: {split}", figures)
        inter = Finding(Cause.PREFILL_INTERFERENCE, Coverage.SIMULATED, stall / per_token,
                        f"decode waits behind prefill batches for {fmt.pct(stall / per_token)} of each token's time "
                        f"({fmt.ms(stall)} of {fmt.ms(per_token)})", figures)
        return step, inter
    sm = p.server_metrics
    itl_sum = sm.get("sglang:inter_token_latency_seconds_sum")
    itl = _sm_mean(sm, "sglang:inter_token_latency_seconds")
    # Little's law over the load point: decoding requests on average = decode time / wall time
    decoding = itl_sum / p.wall_time_s if itl_sum and p.wall_time_s else None
    figures = {"server_mean_itl_s": itl, "p50_itl_s": p.p50_itl_s, "p90_tpot_s": p.p90_tpot_s,
               "mean_decoding_requests": decoding}
    if itl is None and p.p50_itl_s is None:
        why = "no inter-token figures were recorded"
        return (Finding(Cause.DECODE_STEP, Coverage.NOT_MEASURED, text=why),
                Finding(Cause.PREFILL_INTERFERENCE, Coverage.NOT_MEASURED, text=why))
    # The typical gap (P50 inter-token time) is one decode step; P90 TPOT above it is decode
    # waiting behind prefill batches (an estimate: the per-step split is not exported).
    stall_share = None
    if p.p50_itl_s and p.p90_tpot_s:
        stall_share = max(0.0, 1.0 - p.p50_itl_s / p.p90_tpot_s)
    parts = []
    if p.p50_itl_s is not None:
        parts.append(f"P50 inter-token time {fmt.ms(p.p50_itl_s)}")
    if decoding is not None:
        parts.append(f"a mean of {decoding:.0f} decoding requests")
    text = "decode step time: " + " at ".join(parts)
    if itl is not None:
        text += f" (the server's mean inter-token time, prefill pauses included, is {fmt.ms(itl)})"
    missing = ("the decode step's split into attention, MoE, dense, communication and overhead "
               "(the server exports no per-operator times)")
    split = model_split(p)
    if split is not None:
        shares, predicted_s = split
        order = sorted(shares.items(), key=lambda kv: -kv[1])
        text += ("; by the calibrated step-time model at this configuration: "
                 + split_text(order))
        figures.update(decode_parts_share=shares, decode_parts_source="step_time_model",
                       predicted_decode_step_s=predicted_s)
        missing += "; the split shown is the calibrated step-time model's, not a measurement"
    step = Finding(Cause.DECODE_STEP, Coverage.MEASURED, 1.0 - (stall_share or 0.0), text, figures, missing)
    if stall_share is None:
        inter = Finding(Cause.PREFILL_INTERFERENCE, Coverage.NOT_MEASURED, text="no P50 inter-token time recorded")
    else:
        inter = Finding(Cause.PREFILL_INTERFERENCE, Coverage.ESTIMATED, stall_share,
                        f"about {fmt.pct(stall_share)} of P90 TPOT is decode waiting behind prefill batches "
                        f"(P90 TPOT {fmt.ms(p.p90_tpot_s)} against a P50 inter-token time of {fmt.ms(p.p50_itl_s)})",
                        figures)
    return step, inter


def split_text(order: list[tuple[str, float]]) -> str:
    """"MoE 58%, dense 27%, ...": the parts that round to at least 1% of the step."""
    return ", ".join(f"{PART_NAMES.get(k, k)} {fmt.pct(v)}" for k, v in order if v >= 0.005)


def model_split(p: LoadPoint) -> tuple[dict[str, float], float | None] | None:
    """(shares of the decode step by part, the predicted step in s) from the simulator's prediction
    stored beside a real load point, or None when it holds none."""
    pred = p.prediction
    shares = pred.get("decode_step_split") if pred else None
    if not isinstance(shares, dict) or not shares:
        return None
    try:
        shares = {str(k): float(v) for k, v in shares.items() if k in DECODE_PARTS}
    except (TypeError, ValueError):
        return None
    total = sum(shares.values())
    if total <= 0:
        return None
    return {k: v / total for k, v in shares.items()}, pred.get("decode_step_s")


# --------------------------------------------------------------------------- idle GPUs, plateau
PLATEAU_EFFICIENCY = 0.5  # throughput rose by less than half as much (relatively) as the users did
IDLE_UTILIZATION = 0.7


def gpu_idle(p: LoadPoint, prev: LoadPoint | None, trial: TrialFacts) -> Finding:
    if p.simulated:
        s = p.sim
        busy, gpu_share = s.get("busy_fraction"), s.get("gpu_share_of_decode_step")
        util = busy * gpu_share if busy is not None and gpu_share is not None else None
        coverage = Coverage.SIMULATED
        where = "simulated"
        missing = ""
    elif (p.extra.get("gpu_utilization") or {}).get("mean_utilization_pct") is not None:
        util = float(p.extra["gpu_utilization"]["mean_utilization_pct"]) / 100.0
        coverage, where, missing = Coverage.MEASURED, "NVML over the load point, warm-up included", ""
    else:
        util, coverage, where = trial.gpu_mean_utilization, Coverage.MEASURED, "NVML, mean over the trial"
        missing = "GPU utilisation per load point (NVML was summarised over the whole trial)"
    if util is None:
        return Finding(Cause.GPU_IDLE, Coverage.NOT_MEASURED, text="no GPU utilisation was recorded")
    growth = None  # relative rise of throughput over relative rise of users (1: linear, 0: flat)
    if prev is not None and prev.users < p.users and prev.throughput_tokens_per_s > 0:
        growth = (p.throughput_tokens_per_s / prev.throughput_tokens_per_s - 1) / (p.users / prev.users - 1)
    plateau = growth is not None and growth < PLATEAU_EFFICIENCY
    figures = {"gpu_utilization": util, "throughput_growth_per_user_growth": growth,
               "previous_users": prev.users if prev is not None else None}
    if plateau and util < IDLE_UTILIZATION:
        rise = p.throughput_tokens_per_s / prev.throughput_tokens_per_s
        return Finding(Cause.GPU_IDLE, coverage, 1.0 - util,
                       f"throughput grew {rise:.2f}x from {prev.users} to {p.users} users while the GPUs were "
                       f"busy {fmt.pct(util)} of the time ({where}): suspect the MoE kernel tiles, the scheduler "
                       "or the client", figures, missing)
    trend = (f", throughput rose {fmt.pct(growth)} as fast as the users from {prev.users} users"
             if growth is not None else "")
    return Finding(Cause.GPU_IDLE, coverage, 0.0, f"GPUs busy {fmt.pct(util)} ({where}){trend}", figures, missing)


# ------------------------------------------------------------------------------- errors
def failed_requests(p: LoadPoint) -> Finding:
    if p.valid:
        rate = _ratio(p.errors, p.requests) or 0.0
        return Finding(Cause.FAILED_REQUESTS, _source(p), 0.0, f"{p.errors} of {p.requests} requests failed",
                       {"error_rate": rate})
    return Finding(Cause.FAILED_REQUESTS, _source(p), 1.0, p.invalid_reason or "the load point is invalid",
                   {"error_rate": _ratio(p.errors, p.requests), "errors": p.errors, "requests": p.requests})
