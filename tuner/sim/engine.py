"""The simulator core: SGLang's scheduler for the attention-DP ranks of one model replica.

One engine runs behind both ``tuner simulate`` (offline, ``tuner.sim.simulate``: virtual time,
runs of identical decode steps jumped over as one event) and ``tuner serve-sim`` (online,
``tuner.sim.online``: one step at a time in real time, tokens streamed as they are produced). Every
rule follows SGLang's scheduler (rules and citations in ``tuner.sim.scheduler`` and
docs/calibration.md):

* a prefill batch runs whenever one can be formed (``get_next_batch_to_run``: "run prefill first if
  possible"); a rank that runs a prefill batch does not decode in that step unless
  ``enable-mixed-chunk``; while a request is being chunked its next chunk comes first;
* admission is SGLang's ``PrefillAdder``: a request fits when its new tokens plus its (clipped)
  output plus a page are below free + evictable KV minus what the running requests are expected
  to still need (remaining output x ``new_token_ratio``); the first misfit stops the round and
  marks the batch full until a running request leaves; the last admitted request is chunked at
  the chunk budget;
* a decode step needs a KV slot per request; when the pool cannot give them even after eviction,
  requests are retracted (fewest output tokens first, ties: longest input), their KV freed, and
  ``new_token_ratio`` re-estimated; otherwise the ratio decays by one step;
* with the overlap scheduler a finished request leaves the batch (and frees its KV) one step after
  its last token, and the CPU scheduling time is hidden behind the GPU step;
* all ranks of a replica step together (the MoE layer synchronises them), so a step lasts as long
  as the slowest rank plus the shared MoE time.

Runs of identical decode steps (offline only) are one event: the replica advances k steps at once,
k = steps until the next request leaves, the next arrival, the KV pool fills, or ``max_jump``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

from .scheduler import LPM_MAX_QUEUE, AddResult, NewTokenRatio, Policy, SchedulerRules
from .steptime import RankWork, StepTimeModel
from .warmup import KernelWarmup

MAX_JUMP_STEPS = 256


class Req:
    __slots__ = ("user", "session", "turn", "arrival", "input_len", "output_len", "rank", "prefill_len",
                 "done", "generated", "first_t", "join_step", "finish_step", "release_step", "alloc", "ctx0",
                 "cached", "loaded", "active", "ignore_eos", "retractions", "tokens", "chain", "route_chain",
                 "lock_len", "handle", "error", "rid", "sched_t", "chunk_end_t", "host_pending", "prefill_end_t")

    def __init__(self, user, session, turn, arrival, input_len, output_len, ignore_eos=True):
        self.user, self.session, self.turn = user, session, turn
        self.arrival, self.input_len, self.output_len = arrival, input_len, output_len
        self.ignore_eos = ignore_eos
        self.rank = -1
        self.prefill_len = input_len  # tokens that must be in KV before decoding (input + output so far)
        self.done = 0  # of prefill_len: tokens already in KV (cached or computed)
        self.generated = 0
        self.first_t = None
        self.join_step = 0
        self.finish_step = 0
        self.release_step = 0
        self.alloc = 0  # tokens this request holds outside the radix tree
        self.ctx0 = 0
        self.cached = None  # prefix tokens found cached at its first admission
        self.loaded = 0
        self.active = False
        self.retractions = 0
        self.tokens = None  # token ids (online engine only)
        self.chain = []
        self.route_chain = ()
        self.lock_len = 0
        self.handle = None  # the online server's per-request stream
        self.error = None
        self.rid = None
        self.sched_t = None  # when the scheduler first put it into a prefill batch
        self.chunk_end_t = None  # when its last chunk before the final one finished (chunked prefill)
        self.host_pending = 0  # tokens backed up to the host since its last charged insert (HiCache)
        self.prefill_end_t = None  # when its first prefill ended (before the backups its first token waits for)


class Rank:
    """One attention-DP rank: one KV pool, one scheduler."""

    def __init__(self, cache, rules: SchedulerRules):
        self.cache = cache
        self.rules = rules
        self.ratio = NewTokenRatio(rules)
        self.waiting: list[Req] = []
        self.chunked: Req | None = None
        self.prefilling: list[tuple[Req, int]] = []  # this step's prefill items (req, tokens)
        self.heap: list[tuple[int, int, Req]] = []  # (release decode step, seq, req)
        self.running: dict[int, Req] = {}
        self.batch_is_full = False
        self.steps = 0  # decode steps this rank has run
        self.ctx_off = 0  # sum(ctx0 - join_step) over running requests
        self.ctx_hi_off = self.ctx_lo_off = 0  # max and min of (ctx0 - join_step) over them
        self.ctx_ext_stale = False  # a request at one of the two left: recompute when next needed
        self.fin_sum = 0  # sum(finish_step) over running requests (remaining output = fin_sum - n*steps)
        self.fin_long = 0  # running requests whose output exceeds the clip (reservation summed exactly)
        self.n_eos = 0  # running requests without ignore_eos (0.5.23 reserves those at the ratio)
        self.inflight = 0
        self.inflight_tokens = 0
        self.stall_s = 0.0  # time decode requests waited for prefill steps since their last token
        self.retracted = False  # the last decode-memory check retracted requests
        self.window = RankWindow()
        self.work = RankWork()  # this step's work, cleared by every step (not rebuilt)

    @property
    def n_run(self) -> int:
        return len(self.running)

    def ctx_sum(self) -> int:
        return self.ctx_off + len(self.running) * self.steps

    def ctx_extremes(self) -> tuple[int, int]:
        """The longest and shortest running context now."""
        if self.ctx_ext_stale:
            offs = [q.ctx0 - q.join_step for q in self.running.values()]
            self.ctx_hi_off, self.ctx_lo_off = (max(offs), min(offs)) if offs else (0, 0)
            self.ctx_ext_stale = False
        return self.ctx_hi_off + self.steps, self.ctx_lo_off + self.steps

    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.chunked)

    def reserved_output(self) -> float:
        """What the running requests are expected to still need (``PrefillAdder`` offset)."""
        rules = self.rules
        ratio = 1.0 if rules.ignore_eos_full_reserve else self.ratio.current
        if not self.fin_long and (not rules.ignore_eos_full_reserve or not self.n_eos):
            remaining = max(0, self.fin_sum - len(self.running) * self.steps)
            return remaining * ratio
        total = 0.0
        clip = rules.clip_max_new_tokens
        for r in self.running.values():
            rem = min(max(0, r.finish_step - self.steps), clip)
            total += rem * (1.0 if rules.ignore_eos_full_reserve and r.ignore_eos else self.ratio.current)
        return total


class Stats:
    def __init__(self):
        self.reprefill_tokens = 0
        self.hicache_load_tokens = 0
        self.hicache_loads = 0
        self.retractions = 0
        self.aborts = 0
        self.prefill_tokens = 0
        self.steps = 0
        self.events = 0
        self.stalls = 0  # fresh-server stalls simulated (tuner.sim.warmup)
        self.stall_s = 0.0
        self.window_stalls = 0  # ... of them inside the measurement window
        self.itl = {}  # gap (0.1 ms buckets) -> token count
        self.window = WindowStats()


@dataclass
class WindowStats:
    """What happened inside the measurement window, for attributing a load point's latencies
    (tuner.explain): requests are counted by arrival in the window, steps by their start in it.
    Bookkeeping only: nothing here feeds back into scheduling or timing."""

    prefill_tokens: int = 0  # computed by prefill chunks of requests that arrived in the window
    reprefill_tokens: int = 0  # of those, earlier context of the session computed again (offline only)
    hicache_load_tokens: int = 0
    queue_s: float = 0.0  # arrival to first admission, summed over requests
    queued: int = 0
    prefill_steps: int = 0
    prefill_step_s: float = 0.0  # wall time of steps that ran a prefill batch (replicas summed)
    decode_steps: int = 0
    decode_step_s: float = 0.0  # wall time of decode-only steps (replicas summed)
    token_s: float = 0.0  # sum over decode tokens of their step's time
    tokens: int = 0
    stall_token_s: float = 0.0  # sum over decode tokens of the prefill steps they waited behind


@dataclass
class RankWindow:
    """One rank's share of the window: decode steps, sums of k x batch and k x context tokens,
    prefill tokens computed and requests admitted."""

    steps: int = 0
    batch: int = 0
    ctx: float = 0.0
    ctx_longest: float = 0.0  # sum of k x the longest running context (the decode kernel waits for it)
    ctx_shortest: float = 0.0
    prefill: int = 0
    requests: int = 0


def _charged(extend_paged: int, max_new: int, page: int, offset_total, offset_cur, rem_input: int,
             rem_chunk: int | None):
    """``PrefillAdder._update_prefill_budget``: the round's budgets after admitting ``extend_paged``
    tokens that may yet generate ``max_new``."""
    return (offset_total + (extend_paged + max_new + page), offset_cur + (extend_paged + page),
            rem_input - extend_paged, None if rem_chunk is None else rem_chunk - extend_paged)


class ReplicaEngine:
    """Attention-DP ranks of one model replica sharing a clock."""

    def __init__(self, ranks: list[Rank], model: StepTimeModel, rules: SchedulerRules, *, stats: Stats,
                 on_finish: Callable, window: tuple[float, float] = (0.0, math.inf),
                 computed_len: dict | None = None, on_token: Callable | None = None,
                 max_jump: int = MAX_JUMP_STEPS, stalls: list[tuple[float, float]] | None = None,
                 kernels: KernelWarmup | None = None):
        self.ranks = ranks
        self.model = model
        self.rules = rules
        self.stats = stats
        self.on_finish = on_finish
        self.on_token = on_token  # online: called per produced token (then max_jump must be 1)
        self.clock = 0.0
        self.window = window
        self.computed_len = {} if computed_len is None else computed_len
        self.max_jump = 1 if on_token is not None else max_jump
        self.release_delay = 1 if rules.overlap else 0
        self._seq = 0
        # the overlap scheduler forms the next batch while the GPU runs the current one: at a step
        # boundary it has only seen requests that arrived before the step that just ended began
        self.last_step_start = -math.inf
        self.last_step_end = -math.inf
        # a fresh server's stalls (time, length), each on the first prefill step starting at or
        # after its time (tuner.sim.warmup)
        self.stalls = sorted(stalls or [])
        # ... or: a prefill step running a fused-MoE kernel variant for the first time compiles it
        self.kernels = kernels
        # scheduler CPU time (HiCache write-through copies) not yet charged to a step: the step
        # already launched behind it lasts at least this long, or this much longer without overlap
        self.cpu_hold_s = 0.0
        # a prefill's backups and the first tokens waiting behind them, per rank: (tokens, reqs,
        # step end). With overlap they are issued after the next step is launched, which decides
        # when their copies may start (StepTimeModel.write_gate_s): settled once that step is known
        self._writes: list[tuple[int, list[Req], float]] = []

    def has_work(self) -> bool:
        for r in self.ranks:  # Rank.busy() inlined: asked before every event
            if r.running or r.waiting or r.chunked:
                return True
        return False

    # ---- admission (PrefillAdder) -----------------------------------------------------------
    def _order(self, rank: Rank, cutoff: float):
        if self.rules.policy is not Policy.LPM:  # FCFS, lazily: admission usually stops after a few
            return rank.waiting if cutoff == math.inf else (q for q in rank.waiting if q.arrival <= cutoff)
        waiting = rank.waiting if cutoff == math.inf else [q for q in rank.waiting if q.arrival <= cutoff]
        if 1 < len(waiting) <= LPM_MAX_QUEUE:
            cache = rank.cache
            return sorted(waiting, key=lambda q: -sum(cache.match(q)))
        return waiting

    def seen_cutoff(self) -> float:
        """Arrivals the scheduler has received when it forms the next batch: with the overlap
        scheduler (``Scheduler.event_loop_overlap``: receive, schedule and launch batch k+1, then
        wait for batch k) those that came before the step that just ended began; after an idle
        loop, or without overlap, every arrival so far."""
        if self.rules.overlap and self.clock <= self.last_step_end:
            return self.last_step_start
        return math.inf

    def _schedule_prefill(self, rank: Rank, work: RankWork, cutoff: float = math.inf) -> None:
        rules = self.rules
        if (rank.batch_is_full or not rank.waiting) and rank.chunked is None:
            return
        running_bs = len(rank.running)
        if running_bs >= rules.max_running_requests and rank.chunked is None:
            rank.batch_is_full = True
            return
        cache = rank.cache
        page = rules.page_size
        clip = rules.clip_max_new_tokens
        offset_total = rank.reserved_output()
        offset_cur = 0.0
        rem_input = rules.max_prefill_tokens
        rem_chunk = rules.chunked_prefill_size  # None: chunked prefill disabled
        items = rank.prefilling
        loads = 0
        # room is cache.free() + cache.evictable, asked afresh: allocations happen after the round,
        # load-backs allocate at once (as in SGLang)

        new_chunked = None
        if rank.chunked is not None:  # add_chunked_req
            req = rank.chunked
            left = req.prefill_len - req.done
            cap = int(cache.free() + cache.evictable - offset_total)
            cap = min(rem_chunk, cap) if rem_chunk is not None else cap
            if cap <= 0:
                cap = rem_chunk if rem_chunk is not None else left
            c = min(left, cap)
            truncated = c < left
            offset_total, offset_cur, rem_input, rem_chunk = _charged(
                rules.ceil_page(c), 0 if truncated else min(req.output_len, clip), page,
                offset_total, offset_cur, rem_input, rem_chunk)
            items.append((req, c))
            new_chunked = req if truncated else None

        admitted = []
        for req in self._order(rank, cutoff):
            if len(items) >= rules.max_running_requests - running_bs:
                rank.batch_is_full = True
                break
            res, c, chunked = self._add_one(rank, req, items, offset_total, rem_input, rem_chunk)
            if c:
                offset_total, offset_cur, rem_input, rem_chunk = _charged(
                    rules.ceil_page(c), 0 if chunked else min(req.output_len, clip), page,
                    offset_total, offset_cur, rem_input, rem_chunk)
                items.append((req, c))
                admitted.append(req)
                loads += req.loaded
                if chunked:
                    new_chunked = req
                a = cache.free() + cache.evictable
                if a - offset_total <= 0 or a - offset_cur <= 0:
                    res = AddResult.NO_TOKEN
                elif rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                    res = AddResult.OTHER
                else:
                    res = AddResult.CONTINUE
            if res is AddResult.NO_TOKEN:
                rank.batch_is_full = (bool(items) or bool(rank.running)) if rules.hierarchical_cache else True
                break
            if res is AddResult.OTHER:
                break
        if admitted:
            gone = set(map(id, admitted))
            rank.waiting = [q for q in rank.waiting if id(q) not in gone]
        rank.chunked = new_chunked
        # allocate the extend tokens (``alloc_for_extend`` evicts the shortfall)
        extend = []
        for req, c in items:
            cache.ensure_free(c)
            cache.alloc_tokens += c
            req.alloc += c
            work.prefill_tokens += c
            work.prefill_ctx_units += c * (req.done + c / 2)
            extend.append((c, req.done))
            if req.done + c >= req.prefill_len:
                work.prefill_seqs += 1
        work.extend_items = tuple(extend)
        work.load_tokens += loads

    def _add_one(self, rank: Rank, req: Req, items, offset_total: float, rem_input: int,
                 rem_chunk: int | None) -> tuple[AddResult, int, bool]:
        """``PrefillAdder.add_one_req``: (result, tokens to compute this step, chunked)."""
        rules = self.rules
        cache = rank.cache
        page = rules.page_size
        dev, host = cache.match(req)
        if host < rules.hicache_load_back_threshold:
            host = 0  # HiRadixCache.load_back recomputes short host hits
        max_new = min(max(req.output_len - req.generated, 0), rules.clip_max_new_tokens)
        extend = req.prefill_len - dev
        total = extend + max_new + page
        if total >= cache.free() + cache.evictable - offset_total:
            return AddResult.NO_TOKEN, 0, False
        if rem_chunk is None and items and rules.ceil_page(extend - host) >= rem_input:
            return AddResult.OTHER, 0, False
        cache.lock(req)
        if total >= cache.free() + cache.evictable - offset_total:  # the lock made the matched prefix unevictable
            cache.unlock(req)
            return AddResult.NO_TOKEN, 0, False
        loaded = 0
        if host and cache.load_back(req, host):
            loaded = host
        input_tokens = rules.ceil_page(req.prefill_len - dev - loaded)
        if rem_chunk is None and items and input_tokens >= rem_input:
            cache.unlock(req)
            return AddResult.OTHER, 0, False
        prefix = dev + loaded
        left = req.prefill_len - prefix
        chunked = False
        if rem_chunk is None or input_tokens <= rem_chunk:
            c = left
        else:
            trunc = rem_chunk // page * page
            trunc = (trunc + prefix) // page * page - prefix
            if trunc <= 0:
                cache.unlock(req)
                return AddResult.OTHER, 0, False
            c, chunked = trunc, True
        req.done = prefix
        req.loaded = loaded
        if req.sched_t is None:
            req.sched_t = min(self.clock, self.seen_cutoff())  # the batch is formed behind the running step
        stats = self.stats
        in_window = self.window[0] <= req.arrival < self.window[1]
        win = stats.window
        if loaded:
            stats.hicache_loads += 1
            stats.hicache_load_tokens += loaded
            if in_window:
                win.hicache_load_tokens += loaded
        if req.cached is None:  # first admission of this request
            req.cached = prefix
            if in_window:
                win.queue_s += max(0.0, self.clock - req.arrival)
                win.queued += 1
                rank.window.requests += 1
            if req.session is not None:  # offline only: online requests carry no session
                before = min(self.computed_len.get(req.session, 0), req.prefill_len)
                stats.reprefill_tokens += max(0, before - prefix)
                if in_window:
                    win.reprefill_tokens += max(0, before - prefix)
        return AddResult.CONTINUE, c, chunked

    # ---- decode bookkeeping ----------------------------------------------------------------
    def _join(self, rank: Rank, req: Req, t: float) -> None:
        remaining = req.output_len - req.generated
        if remaining <= 0:
            self._release(rank, req, joined=False)
            self.on_finish(req, t)
            return
        req.join_step = rank.steps
        req.finish_step = rank.steps + remaining
        req.release_step = req.finish_step + self.release_delay
        req.ctx0 = req.prefill_len
        req.active = True
        off = req.ctx0 - req.join_step
        if not rank.running:
            rank.ctx_hi_off = rank.ctx_lo_off = off
            rank.ctx_ext_stale = False
        elif not rank.ctx_ext_stale:
            if off > rank.ctx_hi_off:
                rank.ctx_hi_off = off
            elif off < rank.ctx_lo_off:
                rank.ctx_lo_off = off
        rank.running[id(req)] = req
        rank.ctx_off += off
        rank.fin_sum += req.finish_step
        if remaining > self.rules.clip_max_new_tokens:
            rank.fin_long += 1
        if not req.ignore_eos:
            rank.n_eos += 1
        self._seq += 1
        heapq.heappush(rank.heap, (req.release_step, self._seq, req))

    def _leave(self, rank: Rank, req: Req) -> int:
        """Remove a running request; returns its decode steps so far (capped at its output)."""
        del rank.running[id(req)]
        steps = min(rank.steps, req.finish_step) - req.join_step
        off = req.ctx0 - req.join_step
        rank.ctx_off -= off
        if off >= rank.ctx_hi_off or off <= rank.ctx_lo_off:
            rank.ctx_ext_stale = True
        rank.fin_sum -= req.finish_step
        if req.finish_step - req.join_step > self.rules.clip_max_new_tokens:
            rank.fin_long -= 1
        if not req.ignore_eos:
            rank.n_eos -= 1
        req.active = False
        return steps

    def _release(self, rank: Rank, req: Req, joined: bool = True) -> None:
        """A finished request's KV goes into the tree (page-aligned) or back to the free list."""
        cache = rank.cache
        total = req.prefill_len
        held = req.alloc
        if joined:
            held += rank.steps - req.join_step  # one KV slot per decode step, kept in aggregate
            steps = self._leave(rank, req)
            req.generated += steps
            total = req.ctx0 + steps
        written = cache.host_written
        cache.insert(req, total)
        if cache.host_written > written:  # cache_finished_req backs the output up too
            self.cpu_hold_s += self.model.host_write_cpu_s(cache.host_written - written)
        cache.alloc_tokens -= held
        req.alloc = 0
        cache.unlock(req)
        if req.session is not None and self.computed_len.get(req.session, 0) < total:
            self.computed_len[req.session] = total
        rank.inflight -= 1
        rank.inflight_tokens -= req.input_len
        rank.batch_is_full = False

    def _retract(self, rank: Rank) -> None:
        """``ScheduleBatch.retract_decode``: free the least-advanced requests until the next
        decode step fits; the last request left running is aborted if even it does not fit."""
        cache = rank.cache
        order = sorted(rank.running.values(), key=lambda q: (q.generated + rank.steps - q.join_step, -q.input_len),
                       reverse=True)
        first = True
        n_needed = len(order)
        while first or not cache.ensure_free(n_needed):
            if len(order) == 1:
                break
            first = False
            victim = order.pop()
            held = victim.alloc + rank.steps - victim.join_step
            steps = self._leave(rank, victim)
            victim.generated += steps
            cache.alloc_tokens -= held
            victim.alloc = 0
            cache.unlock(victim)
            # the freed KV is used at once: evict the shortfall of 20 decode steps of the rest
            short = len(order) * self.rules.retract_decode_steps - cache.free()
            if short > 0:
                cache.evict(short)
            victim.prefill_len = victim.input_len + victim.generated
            victim.done = 0
            victim.retractions += 1
            rank.waiting.append(victim)
            self.stats.retractions += 1
            n_needed = len(order)
        if len(order) == 1 and not cache.ensure_free(1):
            last = order.pop()
            held = last.alloc + rank.steps - last.join_step
            self._leave(rank, last)
            cache.alloc_tokens -= held
            last.alloc = 0
            cache.unlock(last)
            last.error = "aborted: out of memory even after retracting all other requests"
            self.stats.aborts += 1
            rank.inflight -= 1
            rank.inflight_tokens -= last.input_len
            self.on_finish(last, self.clock)
        decoded = sum(rank.steps - q.join_step + q.generated for q in rank.running.values())
        wanted = sum(q.output_len for q in rank.running.values())
        rank.ratio.after_retract(decoded, wanted, len(rank.running))
        rank.batch_is_full = False

    def _check_decode_mem(self, rank: Rank) -> bool:
        """``update_running_batch``: one KV slot per running request (``check_decode_mem``), else
        retract (which re-estimates the ratio); without a retraction the ratio decays one step.
        True if the rank still has requests to decode."""
        if not rank.cache.ensure_free(len(rank.running)):
            self._retract(rank)
            rank.retracted = True
            return bool(rank.running)
        rank.retracted = False
        return True

    # ---- one event ---------------------------------------------------------------------------
    def step(self, horizon: float = math.inf) -> float:
        """Advance by one prefill step or one run of decode steps (not past ``horizon`` when
        only decoding). Returns the simulated seconds it took (0 when idle)."""
        model = self.model
        works = []
        any_prefill = False
        cutoff = self.seen_cutoff()
        unseen = False  # requests that arrived during the step that just ended
        for rank in self.ranks:
            w = rank.work
            w.decode_reqs = w.decode_ctx_tokens = w.prefill_tokens = w.prefill_seqs = w.load_tokens = 0
            w.decode_max_ctx_tokens = w.decode_min_ctx_tokens = 0
            w.prefill_ctx_units = 0.0
            w.extend_items = ()
            works.append(w)
            if rank.waiting or rank.chunked is not None:
                rank.prefilling = []
                self._schedule_prefill(rank, w, cutoff)
                if w.prefill_tokens:
                    any_prefill = True
                elif cutoff != math.inf and any(q.arrival > cutoff for q in rank.waiting):
                    unseen = True
        if unseen and not any_prefill and not any(r.running for r in self.ranks):
            # nothing was launched behind the last step: the idle loop receives them at once
            self.last_step_end = -math.inf
            return self.step(horizon)
        t0 = self.clock
        self.stats.events += 1
        if any_prefill:
            dt = self._prefill_step(works, t0)
            self.last_step_start, self.last_step_end = t0, t0 + dt
            return dt
        active = [r for r in self.ranks if r.running]
        if len(active) < len(self.ranks):
            for rank in self.ranks:
                if not rank.running and not rank.waiting and rank.chunked is None:  # on_idle
                    rank.ratio.current = rank.ratio.init
                    rank.batch_is_full = False
        if not active:
            if self._writes:  # nothing launched behind them: issued at once
                self._settle_writes(0.0)
            self.cpu_hold_s = 0.0  # done while the GPU is idle
            if not math.isfinite(horizon):
                return 0.0
            self.clock = max(self.clock, horizon)
            return 0.0
        k = self.max_jump
        decoded = []
        running = 0
        for rank, w in zip(self.ranks, works):
            if not rank.running:
                continue
            cache = rank.cache
            n = len(rank.running)
            room = cache.capacity - cache.tree_tokens - cache.alloc_tokens
            if room < n:  # check_decode_mem: evict the shortfall, else retract
                if not self._check_decode_mem(rank):
                    continue
                n = len(rank.running)
                room = cache.free()
            else:
                rank.retracted = False
            steps_left = rank.heap[0][0] - rank.steps
            if room // n < k:  # the free slots alone do not last k steps: count the evictable too
                room += cache.evictable
                if room // n < k:
                    k = room // n
            if steps_left < k:
                k = steps_left
            decoded.append(rank)
            w.decode_reqs = n
            w.decode_ctx_tokens = rank.ctx_off + n * rank.steps
            w.decode_max_ctx_tokens, w.decode_min_ctx_tokens = rank.ctx_extremes()
            running += n
        k = 1 if unseen else max(1, k)
        if not running:
            if self._writes:
                self._settle_writes(0.0)
            return 0.0
        dt = model.step_time(works, running, overlap=self.rules.overlap)
        if self._writes:
            self.cpu_hold_s += self._settle_writes(model.write_gate_s(works, dt))
        extra = self._take_hold(dt) if self.cpu_hold_s else 0.0
        if extra:
            k = 1
            dt += extra
        if k > 1 and math.isfinite(horizon):
            k = max(1, min(k, math.ceil((horizon - t0) / dt))) if horizon > t0 else 1
        if k > 1:
            half = (k - 1) // 2
            for w in works:
                if w.decode_reqs:
                    w.decode_ctx_tokens += w.decode_reqs * half
                    w.decode_max_ctx_tokens += half
                    w.decode_min_ctx_tokens += half
            dt = model.step_time(works, running, overlap=self.rules.overlap)
        self.stats.steps += k
        if self.window[0] <= t0 <= self.window[1]:
            self.stats.window.decode_steps += k
            self.stats.window.decode_step_s += k * dt
        self._decode(decoded, k, dt, t0, k, k - 1)
        self.clock = t0 + k * dt
        self.last_step_start, self.last_step_end = self.clock - dt, self.clock
        return k * dt

    def _prefill_step(self, works: list[RankWork], t0: float) -> float:
        decoding = []
        stalled = []
        mixed = self.rules.mixed_chunk
        running = 0
        for rank, w in zip(self.ranks, works):
            if not rank.running:
                continue
            if mixed or not w.prefill_tokens:
                cache = rank.cache
                if len(rank.running) <= cache.capacity - cache.tree_tokens - cache.alloc_tokens:
                    rank.retracted = False  # _check_decode_mem's fast path: a slot each is free
                    ok = True
                else:
                    ok = self._check_decode_mem(rank)  # evicts the shortfall of this one step
                if ok:
                    n = w.decode_reqs = len(rank.running)
                    w.decode_ctx_tokens = rank.ctx_off + n * rank.steps
                    w.decode_max_ctx_tokens, w.decode_min_ctx_tokens = rank.ctx_extremes()
                    decoding.append(rank)
                elif rank.running:
                    stalled.append(rank)
            else:
                stalled.append(rank)
            running += len(rank.running)
        dt = self.model.step_time(works, running, overlap=self.rules.overlap)
        if self._writes:
            self.cpu_hold_s += self._settle_writes(self.model.write_gate_s(works, dt))
        if self.cpu_hold_s:
            dt += self._take_hold(dt)
        stall = 0.0
        if self.kernels is not None:  # the MoE runs every rank's tokens of the step
            stall = self.kernels.prefill_stall(sum(w.prefill_tokens + (w.decode_reqs if mixed else 0) for w in works))
        elif self.stalls and self.stalls[0][0] <= t0:
            _, stall = self.stalls.pop(0)
        if stall > 0:
            dt += stall
            self.stats.stalls += 1
            self.stats.stall_s += stall
            if self.window[0] <= t0 < self.window[1]:
                self.stats.window_stalls += 1
        t1 = t0 + dt
        self.clock = t1
        self.stats.steps += 1
        win = self.stats.window
        if self.window[0] <= t0 <= self.window[1]:
            win.prefill_steps += 1
            win.prefill_step_s += dt
        for rank in stalled:
            rank.stall_s += dt
        self._decode(decoding, 1, dt, t0, None if mixed else 1, None)
        at_first_token = []  # requests that finish at their first token
        for rank in self.ranks:
            if not rank.prefilling:
                continue
            cache = rank.cache
            done = []
            write_tokens = 0
            for req, c in rank.prefilling:
                req.done += c
                self.stats.prefill_tokens += c
                if self.window[0] <= req.arrival < self.window[1]:
                    win.prefill_tokens += c
                    rank.window.prefill += c
                # the request's KV so far goes into the tree, locked (cache_unfinished_req)
                written = cache.host_written
                covered = cache.insert(req, req.done)
                req.host_pending += cache.host_written - written
                keep = max(0, req.done - covered)
                cache.alloc_tokens -= req.alloc - keep
                req.alloc = keep
                if req.done >= req.prefill_len:
                    # a chunk's blocks are backed up when its last chunk is inserted (a chunked
                    # insert skips HiRadixCache._inc_hit_count)
                    write_tokens += req.host_pending
                    req.host_pending = 0
                    done.append(req)
                    if req.prefill_end_t is None:
                        req.prefill_end_t = t1
                else:
                    req.chunk_end_t = t1
            rank.prefilling = []
            if not write_tokens:
                for req in done:
                    self._prefill_done(rank, req, t1)
                continue
            # process_batch_result_prefill inserts every request (backing it up), then streams
            # their first tokens: they join the running batch now and are stamped once settled
            waiting = []
            for req in done:
                if req.output_len - req.generated <= 1:
                    at_first_token.append((rank, req))
                else:
                    req.generated += 1  # the prefill's forward samples the next token
                    self._join(rank, req, t1)
                    waiting.append(req)
            self._writes.append((write_tokens, waiting, t1))
        if self._writes and (at_first_token or not self.rules.overlap):
            # without overlap nothing is launched before them (nor, simplified, for a request
            # that ends at its first token)
            hold = self._settle_writes(0.0)
            for rank, req in at_first_token:
                self._prefill_done(rank, req, t1 + hold)
            self.cpu_hold_s += hold
        return dt

    def _settle_writes(self, gate_s: float) -> float:
        """Issue the pending backups behind a write stream gated for ``gate_s``: stamp the first
        tokens waiting for them and return the longest scheduler hold."""
        hold = 0.0
        for tokens, reqs, t1 in self._writes:
            write_s = self.model.host_write_cpu_s(tokens, gate_s)
            for req in reqs:
                self._first_token(req, t1 + write_s)
            hold = max(hold, write_s)
        self._writes = []
        return hold

    def _take_hold(self, dt: float) -> float:
        """How much longer than ``dt`` the step behind pending scheduler CPU time lasts: the
        overlap scheduler launched it before that work and launches the next one after it."""
        hold, self.cpu_hold_s = self.cpu_hold_s, 0.0
        return max(0.0, hold - dt) if self.rules.overlap else hold

    def _decode(self, ranks: list[Rank], k: int, dt: float, t0: float, decay: int | None,
                decay_retracted: int | None) -> None:
        """``k`` decode steps of each of ``ranks``, one rank after the other: KV slots (evicting
        the shortfall), window counters, finished requests released; then each rank's token ratio
        decays by ``decay`` steps, ``decay_retracted`` where its memory check retracted (None: no
        decay). The innermost work of every step, so what all ranks share is read once."""
        lo, hi = self.window
        in_window = lo <= t0 <= hi
        stats = self.stats
        itl = stats.itl
        win = stats.window
        # the window's token sums, accumulated rank by rank in the same order as before
        tokens, token_s, stall_token_s = win.tokens, win.token_s, win.stall_token_s
        plain = 0  # tokens whose gap is the step itself
        key = int(dt * 1e4 + 0.5)  # 0.1 ms buckets
        on_token = self.on_token
        on_finish = self.on_finish
        for rank in ranks:
            cache = rank.cache
            n = len(rank.running)
            need = n * k
            if need > cache.capacity - cache.tree_tokens - cache.alloc_tokens:  # ensure_free's fast path
                cache.ensure_free(need)
            start = rank.steps
            stall_s = rank.stall_s
            if in_window and n:
                if stall_s:  # the first token's gap includes the prefill steps it waited behind
                    plain += need - n
                    first = int((dt + stall_s) * 1e4 + 0.5)
                    itl[first] = itl.get(first, 0) + n
                    stall_token_s += n * stall_s
                else:
                    plain += need
                tokens += need
                token_s += need * dt
                rw = rank.window
                rw.steps += k
                rw.batch += need
                rw.ctx += k * (rank.ctx_off + n * start + n * (k - 1) / 2)  # ctx_sum() inlined
                hi, lo = rank.ctx_extremes()
                rw.ctx_longest += k * (hi + (k - 1) / 2)
                rw.ctx_shortest += k * (lo + (k - 1) / 2)
            if stall_s:
                rank.stall_s = 0.0
            if on_token is not None:
                t = t0 + dt
                for req in rank.running.values():
                    if start < req.finish_step:
                        on_token(req, t)
            cache.alloc_tokens += need
            steps = rank.steps = start + k
            heap = rank.heap
            while heap and heap[0][0] <= steps:
                _, _, req = heapq.heappop(heap)
                if not req.active or req.release_step > steps:
                    continue  # retracted earlier (and possibly running again)
                t_last = t0 + (req.finish_step - start) * dt
                self._release(rank, req)
                on_finish(req, t_last)
            d = decay_retracted if rank.retracted else decay
            ratio = rank.ratio
            if d is not None and ratio.current != ratio.min:  # at its floor the decay leaves it there
                ratio.decay_steps(d)
        if plain:
            itl[key] = itl.get(key, 0) + plain
        win.tokens, win.token_s, win.stall_token_s = tokens, token_s, stall_token_s

    def _prefill_done(self, rank: Rank, req: Req, t: float) -> None:
        req.generated += 1  # the prefill's forward samples the next token
        self._first_token(req, t)
        self._join(rank, req, t)

    def _first_token(self, req: Req, t: float) -> None:
        """A prefill's token streams at ``t`` (the first one, unless a retraction re-prefilled it)."""
        if req.first_t is None:
            req.first_t = t
        if self.on_token is not None:
            self.on_token(req, t)
