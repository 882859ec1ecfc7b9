import asyncio
import json
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tuner.sim.online import build_online_engine
from tuner.sim.server import SimServer

FLAGS = {"tp-size": 8, "attn-dp-size": 2, "quantization": "modelopt_fp4"}


def make_server(time_scale=50.0):
    # cache-aware routing keeps a conversation on the rank that holds it (the default, round robin
    # as SGLang's in-server load balancing, would alternate the two attention-DP ranks)
    engine, plan = build_online_engine("glm-5.1", "h200", 8, FLAGS, {"router-policy": "cache_aware"},
                                       time_scale=time_scale)
    return SimServer(engine, plan, model_name="glm-5.1", server_args={"tp_size": 8}, time_scale=time_scale), plan


async def _stream(client, body):
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    chunks, t0, first = [], time.monotonic(), None
    async for line in resp.content:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        if first is None:
            first = time.monotonic() - t0
        chunks.append(json.loads(line[6:]))
    return chunks, first


def test_streaming_completions_usage_cached_tokens_and_server_info():
    async def run():
        server, plan = make_server()
        async with TestClient(TestServer(server.app())) as client:
            prompt = list(range(100, 4100))
            body = {"model": "glm-5.1", "prompt": prompt, "max_tokens": 20, "stream": True,
                    "stream_options": {"include_usage": True}}
            chunks, ttft_cold = await _stream(client, body)
            tokens = [c for c in chunks if c["choices"]]
            assert len(tokens) == 20
            usage = chunks[-1]["usage"]
            assert usage["prompt_tokens"] == 4000 and usage["completion_tokens"] == 20
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0
            chunks, ttft_warm = await _stream(client, {**body, "prompt": prompt + list(range(5000, 5100))})
            cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == 4000 // 64 * 64  # the first prompt and output, in GLM's 64-token pages
            assert ttft_warm < ttft_cold
            info = await (await client.get("/server_info")).json()
            assert info["max_total_num_tokens"] == plan.kv_capacity_tokens_per_gpu
            assert len(info["internal_states"]) == 2 and info["enable_dp_attention"]
            assert (await client.get("/health")).status == 200
            models = await (await client.get("/v1/models")).json()
            assert models["data"][0]["id"] == "glm-5.1"
            gen = await (await client.post("/generate", json={"text": "hello world",
                                                              "sampling_params": {"max_new_tokens": 3}})).json()
            assert len(gen["output_ids"]) == 3 and gen["meta_info"]["prompt_tokens"] == 2
            bad = await client.post("/v1/completions", json={"prompt": {"x": 1}})
            assert bad.status == 400

    asyncio.run(run())


def test_concurrent_requests_are_batched():
    async def run():
        server, _ = make_server(time_scale=20.0)
        async with TestClient(TestServer(server.app())) as client:
            body = {"prompt": "a b c d", "max_tokens": 30, "stream": True}
            engine = server.engine
            await _stream(client, body)
            one = engine.steps
            await asyncio.gather(*[_stream(client, {**body, "prompt": f"user {i} asks"}) for i in range(8)])
            eight = engine.steps - one
            assert one >= 30 and eight < 2 * one  # continuous batching, not eight sequential requests

    asyncio.run(run())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*extra):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "serve-sim", "--port", str(port), "--time-scale", "50",
                             "--config", json.dumps(FLAGS), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


@pytest.mark.parametrize("fault,needle", [("exit_at_start", "exit_at_start"), ("oom", "CUDA out of memory")])
def test_fault_at_start_exits_with_message(fault, needle):
    proc, _ = _launch("--fault", fault)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and needle in err


def test_fault_crash_after_s_kills_the_server_mid_run():
    proc, port = _launch("--fault", "crash_after_s=50")  # 1 s at time scale 50
    try:
        async def probe():
            async with aiohttp.ClientSession() as s:
                for _ in range(100):
                    try:
                        async with s.get(f"http://127.0.0.1:{port}/health") as r:
                            return r.status
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.1)
        assert asyncio.run(probe()) == 200
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("when", ["starting", "serving a stream"])
def test_sigterm_stops_the_server_promptly(when):
    import signal

    # the parent ignores SIGTERM while it spawns: the child inherits that disposition through exec
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        proc, port = _launch()
    finally:
        signal.signal(signal.SIGTERM, old)
    try:
        if when == "serving a stream":
            async def open_stream():
                s = aiohttp.ClientSession()
                for _ in range(300):
                    try:
                        r = await s.post(f"http://127.0.0.1:{port}/v1/completions",
                                         json={"prompt": list(range(100, 600)), "max_tokens": 100000, "stream": True})
                        await r.content.readline()  # a token has come: the request is in flight
                        return s, r
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.1)
                raise AssertionError("serve-sim never answered")

            loop = asyncio.new_event_loop()
            session, _ = loop.run_until_complete(open_stream())
        else:
            time.sleep(0.3)  # inside its imports
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert time.monotonic() - t0 < 5.0  # aiohttp alone would give the stream 60 s
        if when == "serving a stream":
            loop.run_until_complete(session.close())
            loop.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fault_hang_stops_tokens_and_fails_health():
    async def run():
        server, _ = make_server(time_scale=100.0)
        server.fault = "hang"
        async with TestClient(TestServer(server.app())) as client:
            await asyncio.sleep(0.05)
            assert server.engine.hung
            resp = await client.post("/v1/completions", json={"prompt": "x y", "max_tokens": 4, "stream": True})
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.readline(), timeout=0.5)
            assert (await client.get("/health")).status == 503

    asyncio.run(run())


def test_a_request_that_can_never_run_does_not_keep_the_engine_spinning():
    """A prompt whose paged length and a page fill a rank's KV pool is never admitted (as in
    SGLang); the replica then waits for the next request instead of stepping in a loop."""
    async def run():
        flags = {"tp-size": 8, "attn-dp-size": 8, "quantization": "fp8"}
        engine, plan = build_online_engine("glm-5.1", "h200", 8, flags, {}, time_scale=50.0)
        assert engine.capacity_tokens == 21184
        calls = []
        for rep in engine.replicas:
            step = rep.step
            rep.step = lambda horizon=float("inf"), _step=step: calls.append(1) or _step(horizon)
        task = asyncio.create_task(engine.run())
        req = engine.submit(list(range(21150)), 50)
        await asyncio.sleep(0.5)
        stuck = len(calls)
        assert 1 <= stuck <= 3 and req.first_t is None  # tried, then waited
        engine.submit([1, 2, 3], 5)  # a request routed elsewhere still runs
        await asyncio.sleep(0.5)
        assert len(calls) > stuck
        task.cancel()

    asyncio.run(run())


def test_a_first_token_streams_after_its_hicache_backup_as_in_simulate():
    """With HiCache the scheduler backs a prompt up to the host before it streams the first token
    (tuner.sim.engine): serve-sim delivers that token at the same simulated time ``simulate``
    stamps, after the prefill step has ended."""
    async def run():
        flags = {"tp-size": 1, "enable-hierarchical-cache": True, "kv-cache-dtype": "fp8_e4m3"}
        engine, _ = build_online_engine("qwen3-30b-a3b", "h200", 1, flags, {}, time_scale=10.0)
        write_s = engine.replicas[0].model.host_write_cpu_s(32000)
        assert write_s > 0.1  # 64,000 page copies at the calibrated cost
        task = asyncio.create_task(engine.run())
        req = engine.submit(list(range(32000)), 3)
        first = await asyncio.wait_for(req.handle.get(), timeout=30)
        received = engine.now()
        assert first is not None and req.first_t is not None
        assert received >= req.first_t - 0.05  # not at the prefill's end, write_s earlier
        rest = [await asyncio.wait_for(req.handle.get(), timeout=30) for _ in range(3)]
        assert rest[-1] is None and None not in rest[:-1]  # both later tokens, then the end, in order
        task.cancel()

    asyncio.run(run())
