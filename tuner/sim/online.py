"""Real-time engine behind ``tuner serve-sim``: live requests are batched like SGLang's scheduler
(continuous batching, chunked prefill, one KV pool per attention-DP rank with a paged radix prefix
cache) and every step sleeps for the step-time model's duration (divided by ``time_scale``).

Unlike the offline simulator, prompts here are arbitrary token lists, so the prefix cache is a
real one: pages of ``PAGE`` tokens identified by the hash chain of their content, LRU-evicted
(deepest pages first among equally old ones).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .steptime import RankWork, StepTimeModel

PAGE = 16


class PagedPrefixCache:
    def __init__(self, capacity_tokens: int):
        self.capacity_pages = max(1, capacity_tokens // PAGE)
        self.pages: OrderedDict[int, None] = OrderedDict()  # hash chain id, oldest first
        self.locked: dict[int, int] = {}
        self.alloc_pages = 0

    @staticmethod
    def chain(tokens: list[int]) -> list[int]:
        out, h = [], 0
        for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
            h = hash((h, tuple(tokens[i:i + PAGE])))
            out.append(h)
        return out

    def match(self, chain: list[int]) -> int:
        n = 0
        for h in chain:
            if h not in self.pages:
                break
            n += 1
        return n

    def touch(self, chain: list[int]) -> None:
        for h in chain:
            if h in self.pages:
                self.pages.move_to_end(h)

    def free_pages(self) -> int:
        return self.capacity_pages - len(self.pages) - self.alloc_pages

    def ensure_free(self, pages: int) -> bool:
        if self.free_pages() >= pages:
            return True
        for h in list(self.pages):
            if self.free_pages() >= pages:
                break
            if not self.locked.get(h):
                del self.pages[h]
        return self.free_pages() >= pages

    def insert(self, chain: list[int]) -> None:
        for h in chain:
            if h in self.pages:
                self.pages.move_to_end(h)
            elif self.ensure_free(1):
                self.pages[h] = None

    def lock(self, chain: list[int], delta: int) -> None:
        for h in chain:
            self.locked[h] = self.locked.get(h, 0) + delta
            if self.locked[h] <= 0:
                del self.locked[h]


@dataclass
class LiveRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    arrival: float = field(default_factory=time.monotonic)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then None at the end
    chain: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    done_tokens: int = 0
    generated: int = 0
    alloc_pages: int = 0
    rank: int = 0
    finished: bool = False


class OnlineEngine:
    def __init__(self, step_model: StepTimeModel, *, pools: int, capacity_tokens: int, chunk: int,
                 max_running: int, vocab_size: int, time_scale: float = 1.0):
        self.model = step_model
        self.caches = [PagedPrefixCache(capacity_tokens) for _ in range(pools)]
        self.waiting = [deque() for _ in range(pools)]
        self.running: list[list[LiveRequest]] = [[] for _ in range(pools)]
        self.chunked: list[LiveRequest | None] = [None] * pools
        self.chunk = chunk if chunk > 0 else 1 << 30
        self.max_running = max_running
        self.vocab = vocab_size
        self.time_scale = time_scale
        self.wake = asyncio.Event()
        self.hung = False
        self.ids = itertools.count()
        self.last_gen_throughput = 0.0
        self.capacity_tokens = capacity_tokens
        self.steps = 0

    def submit(self, input_ids: list[int], max_new_tokens: int) -> LiveRequest:
        req = LiveRequest(rid=f"req-{next(self.ids)}", input_ids=list(input_ids) or [0],
                          max_new_tokens=max(1, max_new_tokens))
        req.chain = PagedPrefixCache.chain(req.input_ids)
        # route: the pool with the longest cached prefix, else the least loaded
        loads = [len(w) + len(r) for w, r in zip(self.waiting, self.running)]
        best = max(range(len(self.caches)), key=lambda i: (self.caches[i].match(req.chain), -loads[i]))
        req.rank = best
        self.waiting[best].append(req)
        self.wake.set()
        return req

    def _token(self, req: LiveRequest) -> int:
        return (hash((req.rid, req.generated)) % (self.vocab - 10)) + 10

    def _admit(self, i: int, w: RankWork, items: list) -> None:
        cache, budget = self.caches[i], self.chunk
        if self.chunked[i] is not None:
            req = self.chunked[i]
            c = min(budget, len(req.input_ids) - req.done_tokens)
            items.append((req, c))
            budget -= c
        while budget > 0 and self.waiting[i] and len(self.running[i]) + len(items) < self.max_running:
            req = self.waiting[i][0]
            matched = cache.match(req.chain)
            need = -(-(len(req.input_ids) + req.max_new_tokens) // PAGE) - matched
            cache.lock(req.chain[:matched], +1)
            if not cache.ensure_free(need):
                cache.lock(req.chain[:matched], -1)
                break
            self.waiting[i].popleft()
            cache.touch(req.chain[:matched])
            cache.alloc_pages += need
            req.alloc_pages = need
            req.cached_tokens = min(matched * PAGE, len(req.input_ids) - 1)
            req.done_tokens = req.cached_tokens
            c = min(budget, len(req.input_ids) - req.done_tokens)
            items.append((req, c))
            budget -= c
        for req, c in items:
            w.prefill_tokens += c
            w.prefill_ctx_units += c * (req.done_tokens + c / 2)
            w.prefill_seqs += 1

    def _release(self, i: int, req: LiveRequest) -> None:
        cache = self.caches[i]
        cache.alloc_pages -= req.alloc_pages
        matched = min(len(req.chain), req.cached_tokens // PAGE)
        cache.lock(req.chain[:matched], -1)
        cache.insert(req.chain)
        req.finished = True
        req.queue.put_nowait(None)

    async def run(self) -> None:
        while True:
            if self.hung:
                await asyncio.sleep(3600)
                continue
            works, items_by_rank = [], []
            for i in range(len(self.caches)):
                w, items = RankWork(), []
                if self.waiting[i] or self.chunked[i] is not None:
                    self._admit(i, w, items)
                if self.running[i] and not items:
                    w.decode_reqs = len(self.running[i])
                    w.decode_ctx_tokens = sum(len(r.input_ids) + r.generated for r in self.running[i])
                works.append(w)
                items_by_rank.append(items)
            if not any(w.tokens for w in works):
                self.wake.clear()
                await self.wake.wait()
                continue
            running = sum(len(r) for r in self.running)
            dt = self.model.step_time(works, running)
            await asyncio.sleep(dt / self.time_scale)
            self.steps += 1
            produced = 0
            for i, (w, items) in enumerate(zip(works, items_by_rank)):
                if w.decode_reqs:
                    still = []
                    for req in self.running[i]:
                        req.queue.put_nowait(self._token(req))
                        req.generated += 1
                        produced += 1
                        if req.generated >= req.max_new_tokens:
                            self._release(i, req)
                        else:
                            still.append(req)
                    self.running[i] = still
                self.chunked[i] = None
                for req, c in items:
                    req.done_tokens += c
                    if req.done_tokens >= len(req.input_ids):
                        req.queue.put_nowait(self._token(req))
                        req.generated = 1
                        produced += 1
                        if req.generated >= req.max_new_tokens:
                            self._release(i, req)
                        else:
                            self.running[i].append(req)
                    else:
                        self.chunked[i] = req
            self.last_gen_throughput = produced / max(dt, 1e-9)
