"""Real-time engine behind ``tuner serve-sim``: the simulator core (``tuner.sim.engine``) run one
step at a time against live requests, each step sleeping for the step-time model's duration
(divided by ``time_scale``), tokens streamed as they are produced.

It is the same scheduler, router and step-time model as ``tuner simulate``; only the prefix cache
differs: prompts here are arbitrary token lists, so the cache is content-addressed
(``ContentPrefixCache``), and the router's tree holds content blocks (``ContentIndex``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

from .cache import ContentPrefixCache
from .engine import Rank, ReplicaEngine, Req, Stats
from .router import ContentIndex, Router
from .scheduler import SchedulerRules
from .steptime import StepTimeModel
from tuner.catalog import get_gpu, get_model
from tuner.planner import parse_layout, plan_memory
from .calibrate import calibration_context, load_calibration
from .router import routing_policy
from .scheduler import check_version
from .simulate import build_step_model, scheduler_rules

ROUTE_BLOCKS = 4096  # prompt blocks the router's tree keys on (64k tokens of 16)


class OnlineEngine:
    def __init__(self, step_model: StepTimeModel, rules: SchedulerRules, *, replicas: int, pools_per_replica: int,
                 capacity_tokens: int, host_capacity_tokens: int = 0, vocab_size: int, context_len: int,
                 router_policy: str = "round_robin", time_scale: float = 1.0, seed: int = 0):
        self.model = step_model
        self.rules = rules
        self.vocab = vocab_size
        self.context_len = context_len
        self.time_scale = time_scale
        self.capacity_tokens = capacity_tokens
        self.stats = Stats()
        self.hung = False
        self.ids = itertools.count()
        self.last_gen_throughput = 0.0
        self.steps = 0
        self._produced = 0
        self._pending: list[tuple[Req, int | None, float]] = []  # (request, token or None at its end, when)
        # per replica: what a step produced for a time after the step's end (a prefill's first tokens
        # stream after its HiCache write-through backups), delivered when due
        self._deferred: dict[int, list[tuple[float, int, Req, int | None]]] = {}
        self._deferred_seq = itertools.count()
        self.replicas: list[ReplicaEngine] = []
        self.ranks: list[Rank] = []
        for _ in range(replicas):
            ranks = [Rank(ContentPrefixCache(capacity_tokens, rules.page_size, host_capacity_tokens), rules)
                     for _ in range(pools_per_replica)]
            self.ranks.extend(ranks)
            self.replicas.append(ReplicaEngine(ranks, step_model, rules, stats=self.stats, on_finish=self._finished,
                                               on_token=self._token))
        self.block = self.ranks[0].cache.block
        self.rank_replica = {id(r): i for i, rep in enumerate(self.replicas) for r in rep.ranks}
        self.router = Router(router_policy, len(self.ranks), ContentIndex(len(self.ranks), self.block), seed=seed)
        self.wake = [asyncio.Event() for _ in self.replicas]
        self._t0 = time.monotonic()

    @property
    def caches(self):
        return [r.cache for r in self.ranks]

    def now(self) -> float:
        """Simulated seconds since start."""
        return (time.monotonic() - self._t0) * self.time_scale

    def submit(self, input_ids: list[int], max_new_tokens: int, ignore_eos: bool = True) -> Req:
        ids = list(input_ids) or [0]
        out = self.rules.clamp_max_new_tokens(len(ids), max(1, max_new_tokens), self.capacity_tokens,
                                              self.context_len)
        req = Req(0, None, 0, self.now(), len(ids), max(1, out), ignore_eos=ignore_eos)
        req.tokens = ids
        req.handle = asyncio.Queue()  # token ids, then None at the end
        req.chain = []
        req.route_chain = tuple(ContentPrefixCache.chain(ids[:ROUTE_BLOCKS * self.block], self.block))
        req.rid = f"req-{next(self.ids)}"
        loads = [r.inflight for r in self.ranks]
        toks = [r.inflight_tokens for r in self.ranks]
        target = self.router.route(req, loads, toks)
        rank = self.ranks[target]
        req.rank = target
        rank.inflight += 1
        rank.inflight_tokens += req.input_len
        rank.waiting.append(req)
        self.wake[self.rank_replica[id(rank)]].set()
        return req

    # ---- engine callbacks (called inside a step; delivered after the step's sleep) -------------
    def _token(self, req: Req, t: float) -> None:
        tok = (hash((req.rid, len(req.tokens))) % (self.vocab - 10)) + 10
        req.tokens.append(tok)
        self._pending.append((req, tok, t))
        self._produced += 1

    def _finished(self, req: Req, t: float) -> None:
        self._pending.append((req, None, t))

    def _flush(self, i: int, upto: float) -> None:
        """Deliver replica ``i``'s deferred tokens due by simulated time ``upto``, in time order,
        and wake up again for the next one (the replica may sit idle until then)."""
        queue = self._deferred.get(i)
        while queue and queue[0][0] <= upto:
            _, _, req, tok = heapq.heappop(queue)
            req.handle.put_nowait(tok)
        if queue:
            due = queue[0][0]
            asyncio.get_running_loop().call_later((due - upto) / self.time_scale, self._flush, i, due)

    async def run(self) -> None:
        await asyncio.gather(*(self._run_replica(i) for i in range(len(self.replicas))))

    async def _run_replica(self, i: int) -> None:
        rep, wake = self.replicas[i], self.wake[i]
        while True:
            if self.hung:
                await asyncio.sleep(3600)
                continue
            if not rep.has_work():
                wake.clear()
                await wake.wait()
                continue
            rep.clock = max(rep.clock, self.now())
            self._pending = []
            self._produced = 0
            dt = rep.step()
            pending, produced = self._pending, self._produced
            self._pending = []
            if dt <= 0 and not pending:
                # nothing could run (a prompt SGLang never admits blocks its rank): wait for a request
                wake.clear()
                await wake.wait()
                continue
            await asyncio.sleep(dt / self.time_scale)
            self.steps += 1
            end = rep.clock
            queue = self._deferred.setdefault(i, [])
            for req, tok, t in pending:
                if t > end + 1e-9:
                    heapq.heappush(queue, (t, next(self._deferred_seq), req, tok))
            self._flush(i, end)  # what fell due during the step first, then the step's own tokens
            for req, tok, t in pending:
                if t <= end + 1e-9:
                    req.handle.put_nowait(tok)
            self.last_gen_throughput = produced / max(dt, 1e-9)


def build_online_engine(model, gpu, gpus: int, flags: dict, knobs: dict | None, *, sglang_version: str | None = None,
                        time_scale: float = 1.0, calibration=None, plan=None):
    """The online engine of a configuration, built exactly as ``simulate_load_point`` builds its
    replicas (same plan, scheduler rules, step-time model and routing policy). Returns
    ``(engine, plan)``."""


    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    version = check_version(sglang_version)
    plan = plan or plan_memory(m, g, gpus, flags, sglang_version=version)
    layout = parse_layout(m, flags, gpus)
    cal = calibration if isinstance(calibration, dict) and "overhead" in calibration else load_calibration(
        g.name, calibration, context=calibration_context(m, g, flags, version))
    step_model = build_step_model(m, g, plan, layout, flags, knobs or {}, cal, gpus, version)
    engine = OnlineEngine(step_model, scheduler_rules(plan, layout, flags, version), replicas=layout.dp,
                          pools_per_replica=layout.attn_dp, capacity_tokens=plan.kv_capacity_tokens_per_gpu,
                          host_capacity_tokens=plan.hicache_host_tokens_per_pool if plan.hierarchical_cache else 0,
                          vocab_size=m.vocab_size, context_len=plan.context_length,
                          router_policy=routing_policy(flags, knobs), time_scale=time_scale)
    return engine, plan
