"""Streaming HTTP client for OpenAI-compatible ``/v1/completions`` and SGLang's ``/generate``.

One aiohttp session with an unlimited connector serves every simulated user. The hot path is
per received read, not per token: a read is split into SSE lines and each ``data:`` line is
timestamped and counted without decoding JSON; only the last payload (usage / meta_info) and
error payloads are parsed. That keeps one core above 50k streamed tokens/s.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from tuner.errors import ConfigError
from tuner.workload.fasthttp import FastStreamingHTTP, HttpStatusError

APIS = ("completions", "generate")
TRANSPORTS = ("auto", "fast", "aiohttp")
PROMPT_FORMATS = ("ids", "text")
_ENDPOINT = {"completions": "/v1/completions", "generate": "/generate"}

# Text prompts: each id maps to one common English word, so a shared id prefix stays a shared
# text prefix and lengths stay close to the id count (about one token per word for BPE vocabularies).
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if can more no out so "
    "said what up its about into than them only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used take "
    "three states himself few house use during without again place around however home small found "
    "thought went say part once general high upon school every don does got united left number course war "
    "until always away something fact though water less public put think almost hand enough far took head"
).split()


def ids_to_text(ids) -> str:
    n = len(_WORDS)
    return " " + " ".join(_WORDS[i % n] for i in ids)


@dataclass
class StreamResult:
    """What one streamed request produced. Times are ``time.perf_counter()`` values."""

    start: float
    end: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per content chunk
    prompt_tokens: int | None = None  # as the server counted them (usage / meta_info)
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    output_ids: list[int] | None = None  # /generate: what the server generated, where it says
    error: str | None = None
    added_latency_s: list[float] | None = None  # receive wall time - server send time ("t" in chunks)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times) and self.end is not None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itl_s(self) -> tuple[float, ...]:
        t = self.token_times
        return tuple(b - a for a, b in zip(t, t[1:]))

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.token_times)


class StreamingClient:
    """Sends streaming requests to one server. Use as ``async with StreamingClient(...) as c``."""

    def __init__(
        self,
        base_url: str,
        *,
        api: str = "completions",
        model: str | None = None,
        send_ignore_eos: bool = True,
        prompt_format: str = "ids",
        request_timeout_s: float = 600,
        record_server_ts: bool = False,
        transport: str = "auto",
    ):
        if api not in APIS:
            raise ConfigError(f"unknown api {api!r}; valid: {', '.join(APIS)}", key="api")
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"unknown prompt format {prompt_format!r}; valid: {', '.join(PROMPT_FORMATS)}",
                              key="prompt_format")
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model
        self.send_ignore_eos = send_ignore_eos
        self.prompt_format = prompt_format
        self.request_timeout_s = request_timeout_s
        self.record_server_ts = record_server_ts
        self.url = self.base_url + _ENDPOINT[api]
        self._session: aiohttp.ClientSession | None = None
        if transport not in TRANSPORTS:
            raise ConfigError(f"unknown transport {transport!r}; valid: {', '.join(TRANSPORTS)}", key="transport")
        # "auto": the raw-protocol transport for plain http (much cheaper per chunk), aiohttp otherwise.
        self.transport = "fast" if transport == "auto" and self.url.startswith("http://") else transport
        if self.transport == "auto":
            self.transport = "aiohttp"
        self._fast = None

    async def __aenter__(self):
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        if self.transport == "fast":
            self._fast = FastStreamingHTTP(self.url)
        if self.model is None and self.api == "completions":
            self.model = await self._discover_model()
        return self

    async def __aexit__(self, *exc):
        if self._fast is not None:
            self._fast.close()
            self._fast = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _discover_model(self) -> str:
        """The first model the server lists; OpenAI-compatible servers want a ``model`` field."""
        try:
            async with self._session.get(self.base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 200:
                    data = (await r.json(content_type=None)).get("data") or []
                    if data and data[0].get("id"):
                        return str(data[0]["id"])
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
            pass
        return "default"

    # --- request bodies -------------------------------------------------------------------------

    def body(self, prompt_json: str, max_tokens: int) -> bytes:
        """Request body; ``prompt_json`` is the prompt already serialized as JSON (list or string)."""
        ignore = ', "ignore_eos": true' if self.send_ignore_eos else ""
        if self.api == "completions":
            model = json.dumps(self.model or "default")
            return (
                f'{{"model": {model}, "prompt": {prompt_json}, "max_tokens": {int(max_tokens)}, '
                f'"temperature": 0, "stream": true, "stream_options": {{"include_usage": true}}{ignore}}}'
            ).encode()
        key = "input_ids" if self.prompt_format == "ids" else "text"
        return (
            f'{{"{key}": {prompt_json}, "sampling_params": {{"max_new_tokens": {int(max_tokens)}, '
            f'"temperature": 0{ignore}}}, "stream": true}}'
        ).encode()

    def prompt_json(self, ids) -> str:
        if self.prompt_format == "text":
            return json.dumps(ids_to_text(ids))
        return "[" + ",".join(map(str, ids)) + "]"

    # --- streaming ------------------------------------------------------------------------------

    async def stream(self, body: bytes) -> StreamResult:
        res = StreamResult(start=time.perf_counter())
        if self.record_server_ts:
            res.added_latency_s = []
        sse = _SSEParser(res)
        try:
            if self._fast is not None:
                await asyncio.wait_for(self._fast.post(body, sse), self.request_timeout_s)
            else:
                await self._post_aiohttp(body, sse)
        except asyncio.TimeoutError:
            res.error = f"timeout after {self.request_timeout_s:g} s"
        except aiohttp.ClientError as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        except (_HttpError, HttpStatusError) as exc:
            res.error = str(exc)
        except (ConnectionError, OSError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        if res.error is None:
            self._finish(sse, res)
        return res

    async def _post_aiohttp(self, body: bytes, sse: "_SSEParser") -> None:
        async with self._session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                text = (await resp.read())[:300].decode("utf-8", errors="replace")
                raise _HttpError(f"HTTP {resp.status}: {text.strip()}")
            read = resp.content.readany
            perf = time.perf_counter
            while not sse.done:
                chunk = await read()
                if not chunk:
                    break
                sse.feed(chunk, perf())

    def _finish(self, sse: "_SSEParser", res: StreamResult) -> None:
        if sse.error is not None:
            res.error = sse.error
            return
        res.end = sse.end or time.perf_counter()
        final = _loads(sse.last)
        usage_only = self._apply_final(final, res)
        if usage_only and res.token_times:
            res.token_times.pop()  # the usage chunk carries no token
            if res.added_latency_s:
                res.added_latency_s.pop()
        if not sse.done and not _finished(final):
            res.error = "stream ended before the response was complete"

    def _apply_final(self, final: dict | None, res: StreamResult) -> bool:
        """Read usage / meta_info from the last payload; True when it carried no token."""
        if not final:
            return False
        if self.api == "completions":
            usage = final.get("usage") or {}
            if usage:
                res.prompt_tokens = usage.get("prompt_tokens")
                res.completion_tokens = usage.get("completion_tokens")
                details = usage.get("prompt_tokens_details") or {}
                res.cached_tokens = details.get("cached_tokens")
            return bool(usage) and not final.get("choices")
        meta = final.get("meta_info") or {}
        res.prompt_tokens = meta.get("prompt_tokens")
        res.completion_tokens = meta.get("completion_tokens")
        res.cached_tokens = meta.get("cached_tokens")
        ids = final.get("output_ids")
        if isinstance(ids, list) and res.completion_tokens is not None and len(ids) == res.completion_tokens:
            res.output_ids = ids  # cumulative ids; incremental streaming would be shorter
        return False


class _HttpError(Exception):
    pass


class _SSEParser:
    """Timestamps and counts ``data:`` events of a server-sent-event body fed in pieces."""

    __slots__ = ("res", "times", "lat", "pending", "last", "done", "error", "end")

    def __init__(self, res: StreamResult):
        self.res = res
        self.times = res.token_times
        self.lat = res.added_latency_s
        self.pending = b""
        self.last = None
        self.done = False
        self.error = None
        self.end = None

    def feed(self, chunk: bytes, now: float) -> None:
        if self.pending:
            chunk = self.pending + chunk
        cut = chunk.rfind(b"\n") + 1
        self.pending = chunk[cut:]
        times, lat = self.times, self.lat
        for line in chunk[:cut].split(b"\n"):
            if line[:5] != b"data:":
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                self.end = now
                return
            if payload.startswith(b'{"error"'):
                self.error = _error_message(payload)
                self.done = True
                return
            times.append(now)
            self.last = payload
            if lat is not None:
                lat.append(time.time() - _server_ts(payload))
        self.end = now


def _loads(payload: bytes | None) -> dict | None:
    if payload is None:
        return None
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _finished(final: dict | None) -> bool:
    if not final:
        return False
    if final.get("usage"):
        return True
    choices = final.get("choices") or []
    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        return True
    meta = final.get("meta_info") or {}
    return bool(meta.get("finish_reason"))


def _error_message(payload: bytes) -> str:
    obj = _loads(payload) or {}
    err = obj.get("error")
    if isinstance(err, dict):
        err = err.get("message") or err
    return f"server error: {str(err)[:300]}"


def _server_ts(payload: bytes) -> float:
    """The ``"t": <unix time>`` the load-generation server puts last in every chunk."""
    i = payload.rfind(b'"t":')
    if i < 0:
        return float("nan")
    try:
        return float(payload[i + 4:payload.index(b"}", i)])
    except ValueError:
        return float("nan")
