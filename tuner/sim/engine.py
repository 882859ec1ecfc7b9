"""Discrete-event simulation of SGLang's scheduler for one replica of attention-DP ranks.

Per rank (one KV pool) the scheduler follows SGLang 0.5.23's loop:

* a prefill batch is formed whenever requests wait and fit: the in-progress chunked request first,
  then waiting requests in policy order (fcfs, or lpm = longest cached prefix first while at most
  128 wait), up to ``chunked_prefill_size`` new tokens (the last one is chunked) and
  ``max_running_requests``; a request is admitted only if its new KV tokens plus the reserved
  output room of the running requests (remaining x new_token_ratio) fit in free + evictable KV;
* without ``enable-mixed-chunk`` a rank that runs a prefill batch does not decode in that step
  (decoding requests wait), as in SGLang;
* a decode step adds one token to every running request; if the pool cannot hold them even after
  evicting every unlocked cached branch, the request with the fewest generated tokens is
  retracted: its KV is freed and it re-prefills input + generated tokens later;
* all ranks of a replica step together (the MoE layer synchronises them), so a step lasts as long
  as the slowest rank plus the shared MoE time.

Runs of identical decode steps are simulated as one event: the group advances k steps at once,
k = steps until the next request finishes, the next arrival, the KV pool fills, or 256 steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from .cache import SessionPrefixCache
from .steptime import RankWork, StepTimeModel

MAX_JUMP_STEPS = 256
LPM_MAX_QUEUE = 128


class Req:
    __slots__ = ("user", "session", "turn", "arrival", "input_len", "output_len", "rank", "prefill_len",
                 "done", "generated", "first_t", "join_step", "finish_step", "alloc", "ctx0", "cached",
                 "loaded", "active", "last_token_t")

    def __init__(self, user, session, turn, arrival, input_len, output_len):
        self.user, self.session, self.turn = user, session, turn
        self.arrival, self.input_len, self.output_len = arrival, input_len, output_len
        self.rank = -1
        self.prefill_len = input_len
        self.done = 0
        self.generated = 0
        self.first_t = None
        self.join_step = 0
        self.finish_step = 0
        self.alloc = 0
        self.ctx0 = 0
        self.cached = None
        self.loaded = 0
        self.active = False
        self.last_token_t = 0.0


class Rank:
    def __init__(self, cache: SessionPrefixCache, chunk: int, max_running: int):
        self.cache = cache
        self.chunk = chunk if chunk > 0 else 1 << 40
        self.max_running = max_running
        self.waiting: deque[Req] = deque()
        self.chunked: Req | None = None
        self.prefilling: list[tuple[Req, int]] = []  # this step's prefill items (req, tokens)
        self.heap: list[tuple[int, int, Req]] = []  # (finish decode step, seq, req)
        self.running: dict[int, Req] = {}
        self.steps = 0  # decode steps this rank has run
        self.ctx_off = 0  # sum(ctx0 - join_step) over running requests
        self.fin_sum = 0  # sum(finish_step) over running requests
        self.inflight = 0
        self.inflight_tokens = 0
        self.stall_s = 0.0  # time decode requests waited for prefill steps since their last token

    @property
    def n_run(self) -> int:
        return len(self.running)

    def ctx_sum(self, extra_steps: float = 0.0) -> float:
        return self.ctx_off + self.n_run * (self.steps + extra_steps)

    def remaining_output(self) -> int:
        return self.fin_sum - self.n_run * self.steps


class Stats:
    def __init__(self):
        self.reprefill_tokens = 0
        self.hicache_load_tokens = 0
        self.hicache_loads = 0
        self.retractions = 0
        self.prefill_tokens = 0
        self.steps = 0
        self.events = 0
        self.itl = {}  # gap (rounded to 0.1 ms) -> token count


class ReplicaEngine:
    """Attention-DP ranks of one model replica sharing a clock."""

    def __init__(self, ranks: list[Rank], model: StepTimeModel, *, policy: str, mixed_chunk: bool,
                 new_token_ratio: float, max_prefill_tokens: int, stats: Stats, on_finish,
                 window: tuple[float, float], computed_len: dict[int, int]):
        self.ranks = ranks
        self.model = model
        self.policy = policy
        self.mixed = mixed_chunk
        self.ratio = new_token_ratio
        self.max_prefill = max_prefill_tokens
        self.stats = stats
        self.on_finish = on_finish
        self.clock = 0.0
        self.window = window
        self.computed_len = computed_len  # session -> tokens it had computed anywhere (re-prefill stats)
        self._seq = 0

    def has_work(self) -> bool:
        return any(r.running or r.waiting or r.chunked for r in self.ranks)

    # ---- admission -------------------------------------------------------------------------
    def _order(self, rank: Rank):
        if self.policy == "lpm" and 1 < len(rank.waiting) <= LPM_MAX_QUEUE:
            cache = rank.cache
            ordered = sorted(rank.waiting, key=lambda q: -cache.match(q.session, q.prefill_len)[0])
            return ordered
        return rank.waiting

    def _plan_prefill(self, rank: Rank, work: RankWork) -> None:
        budget = rank.chunk
        input_budget = self.max_prefill
        items = rank.prefilling
        cache = rank.cache
        if rank.chunked is not None:
            req = rank.chunked
            c = min(budget, req.prefill_len - req.done)
            items.append((req, c))
            budget -= c
            input_budget -= c
        if budget > 0 and rank.waiting and len(rank.running) + len(items) < rank.max_running:
            reserve = rank.remaining_output() * self.ratio
            admitted = []
            for req in self._order(rank):
                if budget <= 0 or input_budget <= 0 or len(rank.running) + len(items) >= rank.max_running:
                    break
                dev, host = cache.match(req.session, req.prefill_len)
                extend = req.prefill_len - dev
                out_room = (req.output_len - req.generated) * self.ratio
                own = 0 if req.session in cache.locked else cache.branch.get(req.session, 0)
                if extend + out_room + reserve > cache.free() + cache.evictable - own:
                    break  # FCFS: stop at the first request that does not fit
                cache.lock(req.session)
                if not cache.ensure_free(extend):
                    cache.unlock(req.session)
                    break
                reserve += out_room
                cache.alloc_tokens += extend
                req.alloc = extend
                req.done = dev + host
                req.loaded = host
                if req.cached is None:  # first admission of this request
                    req.cached = dev + host
                    before = min(self.computed_len.get(req.session, 0), req.prefill_len)
                    self.stats.reprefill_tokens += max(0, before - dev - host)
                if host:
                    work.load_tokens += host
                    self.stats.hicache_loads += 1
                    self.stats.hicache_load_tokens += host
                c = min(budget, req.prefill_len - req.done)
                items.append((req, c))
                admitted.append(req)
                budget -= c
                input_budget -= c
            for req in admitted:
                rank.waiting.remove(req)
        for req, c in items:
            work.prefill_tokens += c
            work.prefill_ctx_units += c * (req.done + c / 2)
            if req.done + c >= req.prefill_len:
                work.prefill_seqs += 1

    # ---- decode bookkeeping ----------------------------------------------------------------
    def _join(self, rank: Rank, req: Req, t: float) -> None:
        remaining = req.output_len - req.generated
        if remaining <= 0:
            self._finish(rank, req, t, joined=False)
            return
        req.join_step = rank.steps
        req.finish_step = rank.steps + remaining
        req.ctx0 = req.prefill_len
        req.active = True
        req.last_token_t = t
        rank.running[id(req)] = req
        rank.ctx_off += req.ctx0 - req.join_step
        rank.fin_sum += req.finish_step
        self._seq += 1
        heapq.heappush(rank.heap, (req.finish_step, self._seq, req))

    def _leave(self, rank: Rank, req: Req) -> int:
        """Remove a running request; returns its decode steps so far."""
        del rank.running[id(req)]
        steps = rank.steps - req.join_step
        rank.ctx_off -= req.ctx0 - req.join_step
        rank.fin_sum -= req.finish_step
        req.active = False
        return steps

    def _finish(self, rank: Rank, req: Req, t: float, joined: bool = True) -> None:
        cache = rank.cache
        total = req.prefill_len
        if joined:
            steps = self._leave(rank, req)
            req.generated += steps
            req.alloc += steps
            total = req.ctx0 + steps
        # the request's KV goes into the tree (page-aligned) or back to the free list
        cache.insert(req.session, total)
        cache.alloc_tokens -= req.alloc
        req.alloc = 0
        cache.unlock(req.session)
        self.computed_len[req.session] = max(self.computed_len.get(req.session, 0), total)
        rank.inflight -= 1
        rank.inflight_tokens -= req.input_len
        self.on_finish(req, t)

    def _retract(self, rank: Rank, t: float) -> None:
        victim = max(rank.running.values(), key=lambda q: (q.join_step, q.prefill_len))
        steps = self._leave(rank, victim)
        victim.generated += steps
        rank.cache.alloc_tokens -= victim.alloc + steps
        victim.alloc = 0
        rank.cache.unlock(victim.session)
        victim.prefill_len = victim.input_len + victim.generated
        victim.done = 0
        rank.waiting.appendleft(victim)
        self.stats.retractions += 1

    # ---- one event ---------------------------------------------------------------------------
    def step(self, horizon: float) -> None:
        """Advance by one prefill step or one run of decode steps (not past ``horizon`` when
        only decoding)."""
        model = self.model
        works = []
        any_prefill = False
        for rank in self.ranks:
            w = RankWork()
            rank.prefilling = []
            if rank.waiting or rank.chunked is not None:
                self._plan_prefill(rank, w)
            if w.prefill_tokens:
                any_prefill = True
            works.append(w)
        t0 = self.clock
        self.stats.events += 1
        if any_prefill:
            decoding = []
            for rank, w in zip(self.ranks, works):
                if rank.running and (self.mixed or not w.prefill_tokens):
                    if not self._make_room(rank, 1, t0):
                        continue
                    w.decode_reqs = len(rank.running)
                    w.decode_ctx_tokens = int(rank.ctx_sum())
                    decoding.append(rank)
            running = sum(len(r.running) for r in self.ranks)
            dt = model.step_time(works, running)
            t1 = t0 + dt
            self.clock = t1
            self.stats.steps += 1
            for rank, w in zip(self.ranks, works):
                if rank.running and rank not in decoding:
                    rank.stall_s += dt
            for rank in decoding:
                self._decode(rank, 1, dt, t0)
            for rank in self.ranks:
                for req, c in rank.prefilling:
                    req.done += c
                    self.stats.prefill_tokens += c
                    if req.done >= req.prefill_len:
                        rank.chunked = None if rank.chunked is req else rank.chunked
                        self._prefill_done(rank, req, t1)
                    else:
                        rank.chunked = req
                rank.prefilling = []
            return
        active = [r for r in self.ranks if r.running]
        if not active:
            self.clock = max(self.clock, horizon)
            return
        k = MAX_JUMP_STEPS
        for rank in active:
            cache = rank.cache
            n = len(rank.running)
            room = cache.capacity - cache.tree_tokens - cache.alloc_tokens + cache.evictable
            while n and room < n:
                self._retract(rank, t0)
                n = len(rank.running)
                room = cache.capacity - cache.tree_tokens - cache.alloc_tokens + cache.evictable
            if n:
                k = min(k, room // n, rank.heap[0][0] - rank.steps)
        k = max(1, k)
        running = 0
        for rank, w in zip(self.ranks, works):
            n = len(rank.running)
            if n:
                w.decode_reqs = n
                w.decode_ctx_tokens = rank.ctx_off + n * rank.steps
                running += n
        if not running:
            return
        dt = model.step_time(works, running)
        if math.isfinite(horizon):
            k = max(1, min(k, math.ceil((horizon - t0) / dt))) if horizon > t0 else 1
        if k > 1:
            half = (k - 1) // 2
            for w in works:
                if w.decode_reqs:
                    w.decode_ctx_tokens += w.decode_reqs * half
            dt = model.step_time(works, running)
        self.stats.steps += k
        for rank in self.ranks:
            if rank.running:
                rank.cache.ensure_free(len(rank.running) * k)
                self._decode(rank, k, dt, t0)
        self.clock = t0 + k * dt

    def _make_room(self, rank: Rank, k: int, t: float) -> bool:
        while rank.running and rank.cache.free() + rank.cache.evictable < len(rank.running) * k:
            self._retract(rank, t)
        if not rank.running:
            return False
        rank.cache.ensure_free(len(rank.running) * k)
        return True

    def _decode(self, rank: Rank, k: int, dt: float, t0: float) -> None:
        n = len(rank.running)
        lo, hi = self.window
        if lo <= t0 <= hi and n:
            itl = self.stats.itl
            key = int(dt * 1e4 + 0.5)  # 0.1 ms buckets
            if k > 1:
                itl[key] = itl.get(key, 0) + n * (k - 1)
            first = int((dt + rank.stall_s) * 1e4 + 0.5) if rank.stall_s else key
            itl[first] = itl.get(first, 0) + n
        rank.stall_s = 0.0
        rank.cache.alloc_tokens += n * k
        rank.steps += k
        heap = rank.heap
        while heap and heap[0][0] <= rank.steps:
            fs, _, req = heapq.heappop(heap)
            if not req.active or req.finish_step != fs:
                continue  # retracted earlier
            self._finish(rank, req, t0 + (fs - (rank.steps - k)) * dt)

    def _prefill_done(self, rank: Rank, req: Req, t: float) -> None:
        cache = rank.cache
        before = cache.tree_tokens
        cache.insert(req.session, req.prefill_len)
        moved = cache.tree_tokens - before
        cache.alloc_tokens -= moved
        req.alloc -= moved
        if req.first_t is None:
            req.first_t = t
            req.generated = 1
        self._join(rank, req, t)
