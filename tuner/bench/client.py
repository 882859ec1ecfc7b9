"""How much streaming the replay client itself can take, before it distorts what it measures.

The load-generation server runs in its own process and paces every stream at ``rate`` tokens/s,
stamping each chunk with its send time. For each concurrency step the client opens N streams
(starts spread over one token interval so the streams are out of phase, as real ones are) through
the same :class:`StreamingClient` the replay uses, and measures over the steady part of the run:
tokens received per second and added latency (receive time - send time). A step passes when every
stream completes and the added latency p99 is within the bound; ``max_concurrent_streams`` is the
largest passing step.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

from tuner.workload.client import StreamingClient
from tuner.workload.fasthttp import new_event_loop
from tuner.workload.loadgen_server import LoadgenProcess, ServerConfig


async def _step(url: str, streams: int, rate: float, duration_s: float, ramp_s: float) -> dict:
    n_tokens = max(2, int(rate * (duration_s + ramp_s)))
    async with StreamingClient(url, record_server_ts=True, request_timeout_s=duration_s * 4 + 60) as client:
        body = client.body(client.prompt_json(list(range(1000, 1064))), n_tokens)
        t0 = time.perf_counter()

        async def one(i: int):
            # Spread over the ramp, and within each token interval, so streams are out of phase.
            await asyncio.sleep((i / streams) * ramp_s + (i % 97) / 97 / rate)
            return await client.stream(body)

        cpu0 = time.process_time()
        results = await asyncio.gather(*(one(i) for i in range(streams)))
        cpu = time.process_time() - cpu0
    # Steady window: every stream has started and none has finished.
    w0 = t0 + ramp_s + 1.0 / rate + 0.2
    w1 = min((r.end or t0) for r in results) if all(r.ok for r in results) else t0 + ramp_s + duration_s
    errors = [r.error or "incomplete" for r in results if not r.ok]
    tokens, lat = 0, []
    for r in results:
        times = np.asarray(r.token_times)
        inside = (times >= w0) & (times < w1)
        tokens += int(inside.sum())
        if r.added_latency_s:
            lat.extend(np.asarray(r.added_latency_s)[inside[: len(r.added_latency_s)]].tolist())
    window = max(w1 - w0, 1e-9)
    lat_a = np.asarray([x for x in lat if np.isfinite(x)])
    return {
        "streams": streams,
        "tokens_per_s": tokens / window,
        "added_latency_p50_ms": float(np.percentile(lat_a, 50) * 1e3) if lat_a.size else None,
        "added_latency_p99_ms": float(np.percentile(lat_a, 99) * 1e3) if lat_a.size else None,
        "added_latency_max_ms": float(lat_a.max() * 1e3) if lat_a.size else None,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "window_s": window,
        "client_cpu_fraction": cpu / max(time.perf_counter() - t0, 1e-9),
        # CPU the client spent per received token: its ceiling on one free core is 1e6 / this.
        "client_cpu_us_per_token": cpu / max(sum(len(r.token_times) for r in results), 1) * 1e6,
    }


def bench_client(
    *,
    streams=(250, 500, 1000, 1500, 2000),
    rate: float = 50.0,
    duration_s: float = 6.0,
    ramp_s: float = 2.0,
    max_added_latency_p99_ms: float = 2.0,
    stop_after_failure: bool = True,
) -> dict:
    """Run the concurrency steps against a fresh server process; the `tuner bench client` document."""
    try:
        import uvloop  # noqa: F401

        have_uvloop = True
    except ImportError:
        have_uvloop = False
    steps = []
    with LoadgenProcess(ServerConfig(token_rate_per_s=rate, ttft_s=0.0)) as url:
        for n in streams:
            loop = new_event_loop()
            try:
                step = loop.run_until_complete(_step(url, n, rate, duration_s, ramp_s))
            finally:
                loop.close()
            step["passed"] = step["errors"] == 0 and step["added_latency_p99_ms"] is not None \
                and step["added_latency_p99_ms"] <= max_added_latency_p99_ms
            steps.append(step)
            if not step["passed"] and stop_after_failure:
                break
    passed = [s for s in steps if s["passed"]]
    best = max(passed, key=lambda s: s["streams"]) if passed else None
    return {
        "max_concurrent_streams": best["streams"] if best else 0,
        "tokens_per_s": best["tokens_per_s"] if best else max((s["tokens_per_s"] for s in steps), default=0.0),
        "added_latency_p99_ms": best["added_latency_p99_ms"] if best else None,
        "max_added_latency_p99_ms": max_added_latency_p99_ms,
        "token_rate_per_stream": rate,
        "uvloop": have_uvloop,
        "cpu_count": os.cpu_count(),
        "steps": steps,
    }
