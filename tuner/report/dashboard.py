"""The live trial dashboard: a small aiohttp app over the study database, read-only.

Routes (GET/HEAD only; any other method gets 405):
  /                                          the page (static/index.html)
  /static/{charts.js,view.js,app.js,style.css}
  /api/studies                               every study: backend, trials done, best and baseline
  /api/studies/{name}                        one study: summary, trials, measurements, chart series
  /api/studies/{name}/importance             Optuna's parameter importance for capacity
  /api/studies/{name}/trials/{n}/log         a trial's server log, only if inside the study's run directory

The page polls the JSON routes every few seconds; responses carry an ETag so an unchanged study
costs a 304. Database reads run in a thread so a slow query never blocks the loop, and each JSON
answer is computed (and gzipped) once per ``CACHE_TTL_S`` however many clients ask for it: an
answer older than that is still served, up to ``CACHE_MAX_STALE_S``, while one refresh runs in
the background, so hundreds of open pages cost what one does and no request waits for the
database once the first answer exists.

Nothing internal leaves the process: the storage URL (which may hold a password), the database
file's path, the runs directory and the working directory are replaced in every answer (error
messages and server logs included) by what they stand for; a trial's log path is not sent. Bad
requests (too long, malformed, unknown names) get a 4xx; an unexpected error gets a 500 with one
line in the dashboard's own log, never a traceback in a response.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from aiohttp import web

from tuner.errors import StorageError, StudyNotFoundError, UserError
from tuner.report import data
from tuner.report.html import static_text, summary_html
from tuner.report.ledger import ledger_html
from tuner.workload.loadgen_server import new_event_loop

log = logging.getLogger(__name__)

STATIC_FILES = {"charts.js": "text/javascript", "view.js": "text/javascript", "app.js": "text/javascript",
                "style.css": "text/css", "why.js": "text/javascript", "why.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ALLOWED_METHODS = ("GET", "HEAD")
CACHE_TTL_S = 1.0  # a JSON answer is recomputed at most this often (the page polls every 3 s) ...
CACHE_MAX_STALE_S = 30.0  # ... and served while its refresh runs for at most this long
GZIP_LEVEL = 5
CACHE_MAX_ENTRIES = 256
MAX_NAME_CHARS = 256  # longer study names in a URL are not looked up
MAX_TRIAL_NUMBER = 10**9
LISTEN_BACKLOG = 1024  # hundreds of browsers (or a benchmark) connecting at once are not dropped

CONFIG_KEY = web.AppKey("config", dict)
CACHE_KEY = web.AppKey("cache", object)


class Redactor:
    """Replaces the storage URL, the database path, the runs directory and the working directory
    in text sent to a browser by what they stand for."""

    def __init__(self, storage: str, runs_dir: str | Path):
        from tuner.storage import db

        found: dict[str, str] = {}
        found[storage] = "the study database"
        try:
            url = db.parse_url(storage)
            found[url.render_as_string(hide_password=True)] = "the study database"
            found[url.render_as_string(hide_password=False)] = "the study database"
            if url.password:
                found[str(url.password)] = "***"
        except Exception:  # an unparsable URL is refused elsewhere; redact the text as given
            pass
        try:
            path = db.sqlite_path(storage)
        except Exception:
            path = None
        if path is not None:
            for p in (str(path), os.path.abspath(path), str(Path(path).resolve())):
                found[p] = "the study database"
        for p in (str(runs_dir), os.path.abspath(runs_dir), str(Path(runs_dir).resolve())):
            found[p.rstrip("/")] = "<runs-dir>"
        cwd = os.getcwd()
        if len(cwd) > 1:
            found[cwd] = "."
            found[str(Path(cwd).resolve())] = "."
        # longest first, so a path inside another is replaced whole; very short strings are left alone
        self.pairs = sorted(((k, v) for k, v in found.items() if len(k) >= 4), key=lambda kv: -len(kv[0]))

    def text(self, s: str) -> str:
        for secret, shown in self.pairs:
            if secret in s:
                s = s.replace(secret, shown)
        return s

    def json_body(self, body: str) -> str:
        """``body`` is JSON text: secrets are replaced in their JSON-escaped form."""
        for secret, shown in self.pairs:
            escaped = json.dumps(secret)[1:-1]
            if escaped in body:
                body = body.replace(escaped, json.dumps(shown)[1:-1])
        return body


def _error(request: web.Request, status: int, message: str) -> web.Response:
    cfg = request.app.get(CONFIG_KEY)
    text = cfg["redactor"].text(message) if cfg else message
    return web.json_response({"error": text[:2000]}, status=status)


@web.middleware
async def _guard(request: web.Request, handler):
    """Read-only: refuse every method but GET/HEAD, on every path; add security headers; turn
    every error into a 4xx/5xx JSON answer without internal paths or tracebacks."""
    if request.method not in ALLOWED_METHODS:
        resp = web.json_response({"error": f"method {request.method} not allowed; this dashboard is read-only"},
                                 status=405, headers={"Allow": ", ".join(ALLOWED_METHODS)})
    else:
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # 404 of the router, or ours
            resp = web.json_response({"error": (exc.reason or "error").lower()}, status=exc.status,
                                     headers={k: v for k, v in exc.headers.items() if k in ("Allow", "Location")})
        except StudyNotFoundError as exc:
            resp = _error(request, 404, str(exc))
        except StorageError as exc:  # before UserError, of which it is a kind
            resp = _error(request, 503, str(exc))
        except UserError as exc:  # e.g. a trial without a servable log
            resp = _error(request, 404, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: one line in our log, nothing internal in the answer
            if os.environ.get("TUNER_DEBUG") == "1":
                log.exception("dashboard: error on GET %s", request.rel_url)
            else:
                log.error("dashboard: error on GET %.200s: %s: %.200s", request.rel_url, type(exc).__name__, exc)
            resp = web.json_response({"error": "internal error in the dashboard (see its log)"}, status=500)
    for k, v in SECURITY_HEADERS.items():
        resp.headers.setdefault(k, v)
    return resp


async def _blocking(fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, partial(fn, *args, **kwargs))


@dataclass(frozen=True)
class Answer:
    """One encoded JSON answer: the body, its gzip form and their ETag."""

    body: bytes
    gzipped: bytes
    etag: str
    computed_at: float


def _encode(payload, redactor: Redactor) -> Answer:
    body = redactor.json_body(json.dumps(payload, default=str, separators=(",", ":"))).encode()
    return Answer(body, gzip.compress(body, GZIP_LEVEL, mtime=0), '"' + hashlib.sha1(body).hexdigest() + '"',
                  time.monotonic())


class PayloadCache:
    """Encoded JSON answers by key. Fresh for ``ttl_s``; then served as they are for up to
    ``max_stale_s`` while one refresh runs in the background. Requests that find no usable
    answer wait for the one computation in flight instead of starting their own. Errors are not
    kept: the next request tries again."""

    def __init__(self, redactor: Redactor, ttl_s: float = CACHE_TTL_S, max_stale_s: float = CACHE_MAX_STALE_S,
                 max_entries: int = CACHE_MAX_ENTRIES):
        self.redactor, self.ttl_s, self.max_stale_s, self.max_entries = redactor, ttl_s, max_stale_s, max_entries
        self._entries: dict[tuple, Answer] = {}
        self._inflight: dict[tuple, asyncio.Future] = {}
        self.computations = 0

    async def get(self, key: tuple, compute) -> Answer:
        hit = self._entries.get(key)
        age = None if hit is None else time.monotonic() - hit.computed_at
        if age is not None and age < self.ttl_s:
            return hit
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._compute(key, compute))
            self._inflight[key] = fut
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if no one waits
        if age is not None and age < self.max_stale_s:
            return hit  # the refresh lands for the next request
        return await asyncio.shield(fut)

    async def _compute(self, key: tuple, compute) -> Answer:
        try:
            self.computations += 1
            answer = await _blocking(lambda: _encode(compute(), self.redactor))
            if key not in self._entries and len(self._entries) >= self.max_entries:
                self._entries.pop(min(self._entries, key=lambda k: self._entries[k].computed_at))
            self._entries[key] = answer
            return answer
        except BaseException:
            self._entries.pop(key, None)  # a study that disappeared or a database that broke: not served stale
            raise
        finally:
            self._inflight.pop(key, None)


def _respond(request: web.Request, answer: Answer) -> web.Response:
    if answer.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers={"ETag": answer.etag, "Vary": "Accept-Encoding"})
    headers = {"ETag": answer.etag, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=answer.gzipped, content_type="application/json", headers=headers)
    return web.Response(body=answer.body, content_type="application/json", headers=headers)


async def _cached(request: web.Request, key: tuple, compute) -> web.Response:
    return _respond(request, await request.app[CACHE_KEY].get(key, compute))


def _json(request: web.Request, payload) -> web.Response:
    return _respond(request, _encode(payload, request.app[CONFIG_KEY]["redactor"]))


def _study_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > MAX_NAME_CHARS or any(ord(c) < 32 for c in name):
        raise web.HTTPNotFound(reason="No such study")
    return name


async def index(request: web.Request) -> web.Response:
    return web.Response(text=static_text("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:  # a fixed list: nothing else from disk is reachable
        raise web.HTTPNotFound()
    return web.Response(text=static_text(name), content_type=STATIC_FILES[name], charset="utf-8")


def _studies_payload(storage: str) -> dict:
    try:
        rows = data.studies(storage)
    except StudyNotFoundError:  # a database without tuner tables yet: an empty list, not an error
        rows = []
    return {"studies": rows}  # no storage URL: it may hold credentials


async def studies(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    return await _cached(request, ("studies",), partial(_studies_payload, cfg["storage"]))


def _study_payload(storage: str, name: str, runs_dir: str) -> dict:
    s = data.study(storage, name, runs_dir)
    s["summary_html"] = summary_html(s)
    s["ledger_html"] = ledger_html(s)
    s["storage"] = None  # never echo the URL (it may hold credentials)
    for t in s["trials"]:
        t.pop("pids", None)
        t.pop("log_path", None)  # an internal path; `log_available` says whether the log route serves it
    return s


async def study(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    name = _study_name(request)
    return await _cached(request, ("study", name), partial(_study_payload, cfg["storage"], name, cfg["runs_dir"]))


async def importance(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    name = _study_name(request)
    return await _cached(request, ("importance", name), partial(data.param_importances, cfg["storage"], name))


async def trial_log(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    name = _study_name(request)
    raw = request.match_info["number"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > MAX_TRIAL_NUMBER:
        raise web.HTTPNotFound()
    number = int(raw)
    text, truncated = await _blocking(data.trial_log, cfg["storage"], name, number, cfg["runs_dir"])
    text = cfg["redactor"].text(text)
    if truncated:
        text = f"[showing the last {data.MAX_LOG_BYTES // 1024} KiB]\n" + text
    # text/plain + nosniff + a sandboxing CSP: the browser never runs anything from a log
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"Content-Security-Policy": "sandbox; default-src 'none'"})


def make_app(storage: str, runs_dir: str | Path = data.DEFAULT_RUNS_DIR) -> web.Application:
    from tuner.storage import db

    db.parse_url(storage)
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)  # GET only: no bodies to read
    redactor = Redactor(storage, runs_dir)
    app[CONFIG_KEY] = {"storage": storage, "runs_dir": str(runs_dir), "redactor": redactor}
    app[CACHE_KEY] = PayloadCache(redactor)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/studies", studies)
    app.router.add_get("/api/studies/{name}", study)
    app.router.add_get("/api/studies/{name}/importance", importance)
    app.router.add_get("/api/studies/{name}/trials/{number}/log", trial_log)
    return app


def check_database(storage: str) -> None:
    """Refuse, before serving anything, a storage that cannot be read or a file that is not a
    database (StorageError, exit 2). A database without tuner's tables yet is fine: no studies."""
    from sqlalchemy.exc import SQLAlchemyError

    from tuner.storage import db

    path = db.sqlite_path(storage)
    if path is not None and Path(path).exists() and not Path(path).is_file():
        raise StorageError(f"{path} is not a file; --storage must name an SQLite study database")
    engine = db.get_engine(storage, create=False, readonly=True)
    try:
        db.has_schema(engine)  # reads the schema: a file that is not a database fails here
        db.require_sound(engine)  # damaged pages: refused now, not a 500 on some request later
    except SQLAlchemyError as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        where = path if path is not None else db.parse_url(storage).render_as_string(hide_password=True)
        raise StorageError(f"{where} is not a study database ({why})") from None


class _QuietBadRequests(logging.Filter):
    """aiohttp logs every malformed or oversized request with a traceback: a client's mistake is
    no news to the operator. Those become DEBUG lines; other errors lose their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or os.environ.get("TUNER_DEBUG") == "1":
            return True
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1]
        if isinstance(exc, HttpProcessingError):
            return log.isEnabledFor(logging.DEBUG)
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {first}"
        record.args, record.exc_info, record.exc_text = (), None, None
        return True


async def _serve_until_stopped(app: web.Application, host: str, port: int, print_fn) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = runner.addresses[0][1] if runner.addresses else port  # the real port, also for --port 0
        shown = f"[{host}]" if ":" in host else host
        print_fn(f"tuner dashboard on http://{shown}:{bound}/ (read-only; Ctrl-C to stop)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(storage: str, host: str = "127.0.0.1", port: int = 8080, runs_dir: str | Path = data.DEFAULT_RUNS_DIR,
          print_fn=print) -> None:
    """Run the dashboard until SIGINT, SIGTERM or SIGHUP; prints the address it really listens on."""
    check_database(storage)
    app = make_app(storage, runs_dir)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietBadRequests) for f in server_log.filters):
        server_log.addFilter(_QuietBadRequests())

    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve_until_stopped(app, host, port, print_fn))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
