"""Minimal HTTP/1.1 POST-and-stream transport on raw asyncio protocols (plain http only).

Why: with aiohttp every received chunk wakes a coroutine and walks its flow control, which
costs more than the replay can afford at tens of thousands of chunks per second. Here the
response body is de-chunked and handed to the SSE parser inside ``data_received``, and the
waiting coroutine wakes once, when the response ends. Keep-alive connections are pooled.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop: uvloop's where it is installed (much cheaper per callback)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class HttpStatusError(Exception):
    pass


class _Conn(asyncio.Protocol):
    def __init__(self):
        self.transport = None
        self.closed = False
        self.reset(None, None)

    def reset(self, sink, fut):
        self.sink, self.fut = sink, fut
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.mode = None  # "chunked" | "length" | "eof"
        self.remaining = 0  # bytes left of the current chunk / the body
        self.in_chunk = False
        self.keep_alive = True
        self.error_body = bytearray()
        self.got_bytes = False

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        fut = self.fut
        if fut is not None and not fut.done():
            if self.head_done and self.mode == "eof":
                self._complete()
            else:
                fut.set_exception(ConnectionResetError("connection closed before the response ended"))

    def data_received(self, data):
        if self.fut is None:
            return
        self.got_bytes = True
        now = time.perf_counter()
        buf = self.buf + data if self.buf else data
        if not self.head_done:
            buf = buf.lstrip(b"\r\n")  # a CRLF left over from the previous chunked response
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                self.buf = buf
                return
            self._parse_head(buf[:i])
            buf = buf[i + 4:]
            if self.fut is None:
                return
        if self.mode == "chunked":
            try:
                self._chunked(buf, now)
            except ValueError:
                self._fail(HttpStatusError("malformed chunked response"))
                self.transport.abort()
        elif self.mode == "length":
            take = buf[: self.remaining]
            self.remaining -= len(take)
            self.buf = b""
            self._emit(take, now)
            if self.remaining <= 0:
                self._complete()
        else:
            self.buf = b""
            self._emit(buf, now)

    def _parse_head(self, head: bytes):
        lines = head.decode("latin-1").split("\r\n")
        try:
            self.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail(HttpStatusError(f"bad HTTP status line {lines[0][:80]!r}"))
            return
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        self.keep_alive = headers.get("connection") != "close"
        if "chunked" in headers.get("transfer-encoding", ""):
            self.mode = "chunked"
        elif "content-length" in headers:
            self.mode, self.remaining = "length", int(headers["content-length"])
        else:
            self.mode, self.keep_alive = "eof", False
        self.head_done = True
        if self.mode == "length" and self.remaining == 0:
            self._complete()

    def _chunked(self, buf: bytes, now: float):
        pos, n = 0, len(buf)
        while pos < n:
            if self.in_chunk:
                take = min(self.remaining, n - pos)
                self._emit(buf[pos:pos + take], now)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.in_chunk = False
                    self.remaining = -2  # the CRLF after the data
                continue
            if self.remaining < 0:  # skip the CRLF that ends a chunk
                skip = min(-self.remaining, n - pos)
                pos += skip
                self.remaining += skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                self.buf = b""
                self._complete()
                return
            self.in_chunk, self.remaining = True, size
        self.buf = buf[pos:] if pos < n else b""

    def _emit(self, data: bytes, now: float):
        if not data:
            return
        if self.status != 200:
            if len(self.error_body) < 4096:
                self.error_body += data
            return
        self.sink.feed(data, now)
        if self.sink.done and self.mode == "eof":
            self._complete()

    def _complete(self):
        fut, self.fut = self.fut, None
        if fut is None or fut.done():
            return
        if self.status != 200:
            text = bytes(self.error_body[:300]).decode("utf-8", errors="replace").strip()
            fut.set_exception(HttpStatusError(f"HTTP {self.status}: {text}"))
        else:
            fut.set_result(None)

    def _fail(self, exc):
        fut, self.fut = self.fut, None
        self.keep_alive = False
        if fut is not None and not fut.done():
            fut.set_exception(exc)


class FastStreamingHTTP:
    """POSTs a body to one URL and feeds the (de-chunked) response into a sink's ``feed``."""

    def __init__(self, url: str):
        u = urlsplit(url)
        if u.scheme != "http":
            raise ValueError("the fast transport speaks plain http only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._idle: list[_Conn] = []
        self._head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                      "Content-Type: application/json\r\nAccept: text/event-stream\r\n").encode()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, self.host, self.port)
        return conn

    async def post(self, body: bytes, sink) -> None:
        request = self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        for attempt in range(2):
            conn = None
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    conn = c
                    break
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            fut = asyncio.get_running_loop().create_future()
            conn.reset(sink, fut)
            conn.transport.write(request)
            try:
                await fut
            except ConnectionResetError:
                conn.closed = True
                if reused and not conn.got_bytes and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: retry once
                raise
            except BaseException:
                conn.closed = True
                if conn.transport is not None:
                    conn.transport.abort()
                raise
            if conn.keep_alive and not conn.closed:
                conn.fut = None
                self._idle.append(conn)
            elif conn.transport is not None:
                conn.transport.close()
            return

    def close(self):
        for c in self._idle:
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()
