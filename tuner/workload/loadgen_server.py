"""A fast local streaming server that paces tokens, for testing and benchmarking the client.

It speaks enough HTTP/1.1 (keep-alive, chunked transfer) and enough of the OpenAI
``/v1/completions`` and SGLang ``/generate`` streaming formats for the replay client, and puts
its send time (``time.time()``) in every chunk as ``"t"`` so the client's added latency can be
measured. Tokens of all streams are sent by one scheduler (a heap of due times), not one timer
per stream, so one core sustains tens of thousands of chunks per second.

It also keeps an unlimited prefix cache of 64-token blocks and reports ``cached_tokens``, so
prefix sharing can be checked end to end. Failure injection: ``drop_every`` closes every Nth
stream's connection halfway through; ``reject_ignore_eos`` answers 400 to ``ignore_eos``
(as transformers serve does); ``stall_first`` holds the first N streamed requests' first token back
by ``stall_s`` (the requests a scheduler starves, as SGLang's ``lpm`` can).

Run: ``python -m tuner.workload.loadgen_server --port 0 --token-rate 50`` prints
``LISTENING <port>`` once ready. This entry point stays outside the click CLI on purpose: it is the
child process ``LoadgenProcess`` starts (so the server has a core of its own), not a user
command, and it must start in milliseconds without the CLI's imports.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import itertools
import json
import sys
import time
import select
import subprocess
from dataclasses import dataclass

from tuner.workload.fasthttp import new_event_loop

CACHE_BLOCK_TOKENS = 64


@dataclass(frozen=True)
class ServerConfig:
    token_rate_per_s: float = 50.0  # per stream
    ttft_s: float = 0.02  # fixed time to the first token
    prefill_tokens_per_s: float = 0.0  # > 0: uncached prompt tokens add to the TTFT
    default_max_tokens: int = 16
    drop_every: int = 0  # > 0: every Nth streamed request is cut off halfway
    reject_ignore_eos: bool = False
    stall_first: int = 0  # the first N requests (when streamed) ...
    stall_s: float = 0.0  # ... wait this much longer for their first token


class _PrefixCache:
    """Unlimited radix-like cache of chained 64-token block hashes."""

    def __init__(self):
        self.blocks: set[bytes] = set()

    def match_and_insert(self, ids: list[int]) -> int:
        h = hashlib.blake2b(digest_size=16)
        matched, missing = 0, False
        for start in range(0, len(ids) - len(ids) % CACHE_BLOCK_TOKENS, CACHE_BLOCK_TOKENS):
            h.update(",".join(map(str, ids[start:start + CACHE_BLOCK_TOKENS])).encode())
            key = h.digest()
            if not missing and key in self.blocks:
                matched += CACHE_BLOCK_TOKENS
            else:
                missing = True
                self.blocks.add(key)
        return matched


class _Stream:
    __slots__ = ("proto", "api", "n_tokens", "sent", "prompt_tokens", "cached", "drop_at", "seed")

    def __init__(self, proto, api, n_tokens, prompt_tokens, cached, drop_at):
        self.proto, self.api, self.n_tokens = proto, api, n_tokens
        self.sent, self.prompt_tokens, self.cached, self.drop_at = 0, prompt_tokens, cached, drop_at
        self.seed = prompt_tokens


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_STREAM_HEADERS = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n")


class LoadgenServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.cache = _PrefixCache()
        self._heap: list = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._requests = 0
        self.active_streams = 0
        self.max_active_streams = 0

    # --- scheduling -----------------------------------------------------------------------------

    def schedule(self, due: float, stream: _Stream):
        heapq.heappush(self._heap, (due, next(self._seq), stream))
        if self._wake is not None:
            self._wake.set()

    async def run_scheduler(self):
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        interval = 1.0 / self.config.token_rate_per_s
        heap = self._heap
        while True:
            if not heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            due = heap[0][0]
            if due > now:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), due - now)
                except asyncio.TimeoutError:
                    pass
                continue
            while heap and heap[0][0] <= now:
                due, _, s = heapq.heappop(heap)
                if self._emit(s):
                    heapq.heappush(heap, (due + interval, next(self._seq), s))
            await asyncio.sleep(0)  # let reads and new connections in between bursts

    def _emit(self, s: _Stream) -> bool:
        """Send one token of ``s``; False when the stream has ended."""
        proto = s.proto
        if proto.transport is None or proto.transport.is_closing():
            self._end(s)
            return False
        if s.drop_at is not None and s.sent >= s.drop_at:
            proto.transport.abort()
            self._end(s)
            return False
        s.sent += 1
        last = s.sent >= s.n_tokens
        tok = 1000 + (s.seed * 31 + s.sent) % 20000
        t = time.time()
        if s.api == "completions":
            fin = '"length"' if last else "null"
            out = (f'data: {{"id":"cmpl-loadgen","object":"text_completion","model":"loadgen","choices":'
                   f'[{{"index":0,"text":" w{tok}","logprobs":null,"finish_reason":{fin}}}],"usage":null,"t":{t:.6f}}}\n\n')
            if last:
                usage = (f'{{"prompt_tokens":{s.prompt_tokens},"completion_tokens":{s.sent},'
                         f'"total_tokens":{s.prompt_tokens + s.sent},"prompt_tokens_details":{{"cached_tokens":{s.cached}}}}}')
                out += f'data: {{"id":"cmpl-loadgen","object":"text_completion","model":"loadgen","choices":[],"usage":{usage},"t":{t:.6f}}}\n\n'
        else:
            fin = '{"type":"length","length":%d}' % s.sent if last else "null"
            ids = ",".join(str(1000 + (s.seed * 31 + k) % 20000) for k in range(1, s.sent + 1)) if last else None
            ids_part = f'"output_ids":[{ids}],' if ids is not None else ""
            out = (f'data: {{"text":" w{tok}",{ids_part}"meta_info":{{"prompt_tokens":{s.prompt_tokens},'
                   f'"completion_tokens":{s.sent},"cached_tokens":{s.cached},"finish_reason":{fin}}},"t":{t:.6f}}}\n\n')
        if last:
            out += "data: [DONE]\n\n"
            proto.transport.write(_chunk(out.encode()) + b"0\r\n\r\n")
            self._end(s)
            proto.stream_done()
            return False
        proto.transport.write(_chunk(out.encode()))
        return True

    def _end(self, s: _Stream):
        self.active_streams -= 1

    # --- requests -------------------------------------------------------------------------------

    def handle(self, proto: "_HttpProtocol", method: str, path: str, body: bytes) -> None:
        if method == "GET" and path in ("/health", "/health_generate"):
            return proto.respond(200, b"{}")
        if method == "GET" and path == "/v1/models":
            return proto.respond(200, b'{"object":"list","data":[{"id":"loadgen","object":"model"}]}')
        if method != "POST" or path not in ("/v1/completions", "/generate"):
            return proto.respond(404, b'{"error":{"message":"not found"}}')
        try:
            req = json.loads(body)
        except ValueError:
            return proto.respond(400, b'{"error":{"message":"body is not JSON"}}')
        api = "completions" if path == "/v1/completions" else "generate"
        if api == "completions":
            prompt, params = req.get("prompt"), req
            max_tokens = req.get("max_tokens")
        else:
            prompt = req.get("input_ids", req.get("text"))
            params = req.get("sampling_params") or {}
            max_tokens = params.get("max_new_tokens")
        if self.config.reject_ignore_eos and "ignore_eos" in params:
            return proto.respond(400, b'{"error":{"message":"unknown parameter ignore_eos"}}')
        if isinstance(prompt, str):
            ids = [hash(w) & 0xFFFF for w in prompt.split()]
        elif isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            ids = prompt
        else:
            return proto.respond(400, b'{"error":{"message":"prompt must be a list of token ids or a string"}}')
        n = int(max_tokens or self.config.default_max_tokens)
        cached = self.cache.match_and_insert(ids)
        self._requests += 1
        drop_at = None
        if self.config.drop_every and self._requests % self.config.drop_every == 0:
            drop_at = max(1, n // 2)
        if not req.get("stream"):
            return proto.respond(200, json.dumps({"usage": {"prompt_tokens": len(ids), "completion_tokens": n,
                                                           "prompt_tokens_details": {"cached_tokens": cached}}}).encode())
        proto.transport.write(_STREAM_HEADERS)
        proto.streaming = True
        self.active_streams += 1
        self.max_active_streams = max(self.max_active_streams, self.active_streams)
        s = _Stream(proto, api, max(1, n), len(ids), cached, drop_at)
        delay = self.config.ttft_s
        if self._requests <= self.config.stall_first:
            delay += self.config.stall_s
        if self.config.prefill_tokens_per_s > 0:
            delay += (len(ids) - cached) / self.config.prefill_tokens_per_s
        self.schedule(asyncio.get_running_loop().time() + delay, s)


class _HttpProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1: Content-Length request bodies, keep-alive, one request at a time."""

    def __init__(self, server: LoadgenServer):
        self.server = server
        self.transport = None
        self.buf = bytearray()
        self.streaming = False

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.transport = None

    def data_received(self, data):
        self.buf += data
        self._process()

    def _process(self):
        while not self.streaming and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, path, _ = head[0].split(" ", 2)
            except ValueError:
                self.respond(400, b'{"error":{"message":"bad request line"}}', close=True)
                return
            length = 0
            for h in head[1:]:
                name, _, value = h.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            self.server.handle(self, method, path.split("?", 1)[0], body)

    def respond(self, status: int, body: bytes, close: bool = False):
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
        conn = b"close" if close else b"keep-alive"
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"Connection: %s\r\n\r\n%s" % (status, reason.encode(), len(body), conn, body))
        if close:
            self.transport.close()

    def stream_done(self):
        self.streaming = False
        if self.buf:
            self._process()


async def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 0, ready=None):
    server = LoadgenServer(config)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _HttpProtocol(server), host, port, backlog=4096)
    sched = asyncio.ensure_future(server.run_scheduler())
    actual = srv.sockets[0].getsockname()[1]
    if ready is not None:
        ready(actual)
    try:
        await asyncio.Future()  # run until cancelled
    finally:
        sched.cancel()
        srv.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token-rate", type=float, default=50.0, help="tokens per second per stream")
    ap.add_argument("--ttft-s", type=float, default=0.02)
    ap.add_argument("--prefill-tokens-per-s", type=float, default=0.0)
    ap.add_argument("--drop-every", type=int, default=0)
    ap.add_argument("--reject-ignore-eos", action="store_true")
    ap.add_argument("--stall-first", type=int, default=0, help="the first N streamed requests...")
    ap.add_argument("--stall-s", type=float, default=0.0, help="...wait this much longer for their first token")
    a = ap.parse_args(argv)
    cfg = ServerConfig(token_rate_per_s=a.token_rate, ttft_s=a.ttft_s, prefill_tokens_per_s=a.prefill_tokens_per_s,
                       drop_every=a.drop_every, reject_ignore_eos=a.reject_ignore_eos, stall_first=a.stall_first,
                       stall_s=a.stall_s)

    def ready(port):
        sys.stdout.write(f"LISTENING {port}\n")
        sys.stdout.flush()

    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(cfg, a.host, a.port, ready))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()


class LoadgenProcess:
    """The server in a child process (so it has its own core): ``with LoadgenProcess(cfg) as url:``."""

    def __init__(self, config: ServerConfig = ServerConfig(), startup_timeout_s: float = 20.0):
        self.config = config
        self.startup_timeout_s = startup_timeout_s
        self.proc = None
        self.port = None

    def __enter__(self) -> str:
        c = self.config
        argv = [sys.executable, "-m", "tuner.workload.loadgen_server", "--port", "0",
                "--token-rate", str(c.token_rate_per_s), "--ttft-s", str(c.ttft_s),
                "--prefill-tokens-per-s", str(c.prefill_tokens_per_s), "--drop-every", str(c.drop_every),
                "--stall-first", str(c.stall_first), "--stall-s", str(c.stall_s)]
        if c.reject_ignore_eos:
            argv.append("--reject-ignore-eos")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("LISTENING "):
                    self.port = int(line.split()[1])
                    return f"http://127.0.0.1:{self.port}"
            if self.proc.poll() is not None:
                break
        self.__exit__(None, None, None)
        raise RuntimeError("load-generation server did not start")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()
                self.proc.wait()
