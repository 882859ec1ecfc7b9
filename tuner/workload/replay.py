"""Closed-loop replay of a workload profile against a streaming server: one load point.

U users each run sessions back to back; user u takes sessions u, u+U, u+2U, ... of the profile's
deterministic session list, and between turns waits the turn's think time (times ``time_scale``).
Users start staggered over the first half of the warm-up so they do not all send turn 0 at once.
Requests that *start* inside [warm-up, warm-up + duration) are measured, and so are those started
in the warm-up that were still waiting for their first token when the window opened
(``metrics.counted_in_window``); requests still running when the window closes are awaited (up to
the request timeout) so slow ones count, never vanish.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tuner.workload.client import StreamingClient, StreamResult
from tuner.workload.fasthttp import new_event_loop
from tuner.workload.metrics import LoadPointMetrics, RequestRecord, aggregate, counted_in_window
from tuner.workload.session import PromptBuilder, Session, TokenSpace, WorkloadProfile, generate_session

log = logging.getLogger(__name__)

LAG_PROBE_INTERVAL_S = 0.05
CLIENT_BOUND_LAG_P99_S = 0.010  # event-loop lag above this means the client delays what it measures
CLIENT_BOUND_CPU_FRACTION = 0.85  # of one core
ERROR_BACKOFF_S = 0.05


@dataclass
class ReplayResult:
    metrics: LoadPointMetrics
    records: list[RequestRecord] = field(default_factory=list)  # measured requests only
    all_requests: int = 0
    max_in_flight: int = 0


class _LagMonitor:
    """Samples how late the event loop wakes a sleeping task: the client's own saturation."""

    def __init__(self):
        self.lags: list[float] = []
        self._task = None

    async def _run(self):
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            self.lags.append(max(0.0, loop.time() - t - LAG_PROBE_INTERVAL_S))

    def start(self):
        self._task = asyncio.ensure_future(self._run())

    def stop(self):
        if self._task:
            self._task.cancel()


class _SessionPrompts:
    """Serialized prompt of one session, grown turn by turn (no re-serializing the prefix)."""

    def __init__(self, session: Session, space: TokenSpace, client: StreamingClient, prefix_json: str):
        self.builder = PromptBuilder(session, space)
        self.client = client
        self.parts: list[str] = [prefix_json] if prefix_json else []
        self.session = session

    def prompt_json(self, turn: int) -> tuple[str, int]:
        s = self.session
        self.parts.append(_ids_json(self.builder.space.new_ids(s.session_id, turn, s.turns[turn].new_tokens)))
        if self.client.prompt_format == "text":
            ids = self.builder.prompt(turn)
            return self.client.prompt_json(ids), len(ids)
        return "[" + ",".join(p for p in self.parts if p) + "]", s.prompt_tokens(turn)

    def add_output(self, turn: int, received_ids: list[int] | None):
        out = self.builder.output_for(turn, received_ids)
        self.parts.append(_ids_json(out))


def _ids_json(ids) -> str:
    return ",".join(map(str, np.asarray(ids).tolist()))


async def replay_closed_loop(
    base_url: str,
    profile: WorkloadProfile,
    users: int,
    *,
    warmup_s: float,
    duration_s: float,
    seed: int = 0,
    api: str = "completions",
    model: str | None = None,
    vocab_size: int = 32000,
    reserved_ids=(),
    send_ignore_eos: bool = True,
    prompt_format: str = "ids",
    use_server_output_ids: bool = False,
    request_timeout_s: float = 600,
    max_error_rate: float = 0.05,
    time_scale: float = 1.0,
    transport: str = "auto",
) -> ReplayResult:
    if users < 1:
        raise ValueError("users must be >= 1")
    space = TokenSpace(vocab_size=vocab_size, seed=seed, reserved_ids=frozenset(reserved_ids))
    loop = asyncio.get_running_loop()
    results: list[tuple[int, int, StreamResult, int, int, float]] = []  # ..., when it came back
    in_flight = 0
    max_in_flight = 0
    cpu0 = time.process_time()
    async with StreamingClient(base_url, api=api, model=model, send_ignore_eos=send_ignore_eos,
                               prompt_format=prompt_format, request_timeout_s=request_timeout_s,
                               transport=transport) as client:
        prefix_cache: dict[int, str] = {}

        def prefix_json(n: int) -> str:
            if n not in prefix_cache:
                prefix_cache[n] = _ids_json(space.system_prefix_ids(n))
            return prefix_cache[n]

        t0 = time.perf_counter()
        window_start = t0 + warmup_s
        window_end = window_start + duration_s
        stop = asyncio.Event()
        measured: list[asyncio.Task] = []
        early: list[asyncio.Task] = []  # started in the warm-up: awaited if they may be carried in
        all_tasks: list[asyncio.Task] = []

        async def one_request(session: Session, turn: int, prompts: _SessionPrompts) -> StreamResult:
            nonlocal in_flight, max_in_flight
            pj, n_in = prompts.prompt_json(turn)
            body = client.body(pj, session.turns[turn].output_tokens)
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            try:
                res = await client.stream(body)
            finally:
                in_flight -= 1
            results.append((session.session_id, turn, res, n_in, session.reusable_prefix_tokens(turn),
                            time.perf_counter()))
            return res

        async def user(u: int):
            await asyncio.sleep(u / users * warmup_s * 0.5)
            k = 0
            while not stop.is_set():
                session = generate_session(profile, u + k * users, seed)
                k += 1
                prompts = _SessionPrompts(session, space, client, prefix_json(session.system_prefix_tokens))
                for turn in range(session.num_turns):
                    if stop.is_set():
                        return
                    start = time.perf_counter()
                    task = asyncio.ensure_future(one_request(session, turn, prompts))
                    all_tasks.append(task)
                    if window_start <= start < window_end:
                        measured.append(task)
                    elif start < window_start:
                        early.append(task)
                    res = await asyncio.shield(task)
                    prompts.add_output(turn, res.output_ids if use_server_output_ids else None)
                    if res.error is not None:
                        await asyncio.sleep(ERROR_BACKOFF_S)  # a dead server must not become a busy loop
                    if turn + 1 < session.num_turns:
                        await asyncio.sleep(session.turns[turn].think_time_s * time_scale)

        lag = _LagMonitor()
        lag.start()
        tasks = [asyncio.ensure_future(user(u)) for u in range(users)]
        await asyncio.sleep(max(0.0, window_end - time.perf_counter()))
        stop.set()
        # Users waiting (think time, stagger) stop now; requests started in the window finish, and
        # so do the warm-up's still running (the ones carried into the window are told apart below).
        awaited = measured + [t for t in early if not t.done()]
        if awaited:
            await asyncio.wait(awaited, timeout=request_timeout_s + 5)
        for t in tasks + all_tasks:
            t.cancel()  # unmeasured requests still running are abandoned
        await asyncio.gather(*tasks, *all_tasks, return_exceptions=True)
        lag.stop()
    wall = time.perf_counter() - t0
    cpu_fraction = (time.process_time() - cpu0) / wall if wall > 0 else 0.0

    records = []
    for sid, turn, res, n_in, reusable, done in results:
        waited_until = res.token_times[0] if res.token_times else done
        if not counted_in_window(res.start, waited_until, (window_start, window_end)):
            continue
        records.append(_record(sid, turn, res, n_in, t0, reusable, carried_in=res.start < window_start))
    lag_p99 = float(np.percentile(lag.lags, 99)) if lag.lags else 0.0
    client_bound = lag_p99 > CLIENT_BOUND_LAG_P99_S or cpu_fraction > CLIENT_BOUND_CPU_FRACTION
    if client_bound:
        log.warning("replay client near its own limit (event-loop lag p99 %.1f ms, CPU %.0f%% of a core): "
                    "latencies include client delay", lag_p99 * 1e3, cpu_fraction * 100)
    extra = {
        "client_bound": client_bound,
        "event_loop_lag_p99_s": lag_p99,
        "client_cpu_fraction": cpu_fraction,
        "max_in_flight": max_in_flight,
        "requests_sent": len(results),
        "api": api,
        "time_scale": time_scale,
    }
    metrics = aggregate(records, users=users, duration_s=duration_s, max_error_rate=max_error_rate, extra=extra)
    return ReplayResult(metrics, records, len(results), max_in_flight)


def _record(sid: int, turn: int, res: StreamResult, n_in: int, t0: float, reusable: int | None = None,
            carried_in: bool = False) -> RequestRecord:
    ok = res.ok
    error = res.error if res.error else (None if ok else "no tokens received")
    return RequestRecord(
        session_id=sid,
        turn=turn,
        start_s=res.start - t0,
        input_tokens=res.prompt_tokens if res.prompt_tokens is not None else n_in,
        output_tokens=res.output_tokens if ok else len(res.token_times),
        ttft_s=res.ttft_s if ok else None,
        end_s=(res.end - t0) if ok and res.end is not None else None,
        itl_s=res.itl_s if ok else (),
        cached_tokens=res.cached_tokens,
        error=error,
        reusable_tokens=reusable,
        carried_in=carried_in,
    )


def run_load_point(
    base_url: str,
    profile: WorkloadProfile,
    users: int,
    *,
    warmup_s: float,
    duration_s: float,
    seed: int = 0,
    api: str = "completions",
    model: str | None = None,
    vocab_size: int = 32000,
    send_ignore_eos: bool = True,
    request_timeout_s: float = 600,
    max_error_rate: float = 0.05,
    time_scale: float = 1.0,
    reserved_ids=(),
    prompt_format: str = "ids",
    use_server_output_ids: bool = False,
    transport: str = "auto",
) -> LoadPointMetrics:
    """Measure one load point: ``users`` closed-loop users for ``duration_s`` after ``warmup_s``."""
    coro_kwargs = dict(
        warmup_s=warmup_s, duration_s=duration_s, seed=seed, api=api, model=model, vocab_size=vocab_size,
        reserved_ids=reserved_ids, send_ignore_eos=send_ignore_eos, prompt_format=prompt_format,
        use_server_output_ids=use_server_output_ids, request_timeout_s=request_timeout_s,
        max_error_rate=max_error_rate, time_scale=time_scale, transport=transport,
    )
    return run_sync(replay_closed_loop(base_url, profile, users, **coro_kwargs)).metrics


def run_sync(coro):
    """Run ``coro`` on a fresh event loop (uvloop where installed), also from inside a running loop."""
    def run():
        loop = new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    box = {}

    def target():
        try:
            box["value"] = run()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    th = threading.Thread(target=target, name="tuner-replay")
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
