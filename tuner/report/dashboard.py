"""The live trial dashboard: a small aiohttp app over the study database, read-only.

Routes (GET/HEAD only; any other method gets 405):
  /                                          the page (static/index.html)
  /static/{charts.js,view.js,app.js,style.css}
  /api/studies                               every study: backend, trials done, best and baseline
  /api/studies/{name}                        one study: summary, trials, measurements, chart series
  /api/studies/{name}/importance             Optuna's parameter importance for capacity
  /api/studies/{name}/trials/{n}/log         a trial's server log, only if inside the study's run directory

The page polls the JSON routes every few seconds; responses carry an ETag so an unchanged study
costs one query and a 304. Database reads run in a thread so a slow query never blocks the loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from functools import partial
from pathlib import Path

from aiohttp import web

from tuner.errors import StorageError, StudyNotFoundError, UserError
from tuner.report import data
from tuner.report.html import static_text, summary_html

log = logging.getLogger(__name__)

STATIC_FILES = {"charts.js": "text/javascript", "view.js": "text/javascript", "app.js": "text/javascript",
                "style.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ALLOWED_METHODS = ("GET", "HEAD")

CONFIG_KEY = web.AppKey("config", dict)


@web.middleware
async def _guard(request: web.Request, handler):
    """Read-only: refuse every method but GET/HEAD, on every path; add security headers."""
    if request.method not in ALLOWED_METHODS:
        resp = web.json_response({"error": f"method {request.method} not allowed; this dashboard is read-only"},
                                 status=405, headers={"Allow": ", ".join(ALLOWED_METHODS)})
    else:
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            resp = exc
        except StudyNotFoundError as exc:
            resp = web.json_response({"error": str(exc)}, status=404)
        except StorageError as exc:  # before UserError, of which it is a kind
            resp = web.json_response({"error": str(exc)}, status=503)
        except UserError as exc:  # e.g. a trial without a servable log
            resp = web.json_response({"error": str(exc)}, status=404)
    for k, v in SECURITY_HEADERS.items():
        resp.headers.setdefault(k, v)
    return resp


async def _blocking(fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, partial(fn, *args, **kwargs))


def _json(request: web.Request, payload) -> web.Response:
    body = json.dumps(payload, default=str, separators=(",", ":")).encode()
    etag = '"' + hashlib.sha1(body).hexdigest() + '"'
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(body=body, content_type="application/json", headers={"ETag": etag})


async def index(request: web.Request) -> web.Response:
    return web.Response(text=static_text("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:  # a fixed list: nothing else from disk is reachable
        raise web.HTTPNotFound()
    return web.Response(text=static_text(name), content_type=STATIC_FILES[name], charset="utf-8")


async def studies(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    try:
        rows = await _blocking(data.studies, cfg["storage"])
    except StudyNotFoundError:  # a database without tuner tables yet: an empty list, not an error
        rows = []
    return _json(request, {"storage": cfg["storage_display"], "studies": rows})


def _study_payload(storage: str, name: str, runs_dir: str) -> dict:
    s = data.study(storage, name, runs_dir)
    s["summary_html"] = summary_html(s)
    s["storage"] = None  # never echo the URL (it may hold credentials)
    for t in s["trials"]:
        t.pop("pids", None)
    return s


async def study(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    payload = await _blocking(_study_payload, cfg["storage"], request.match_info["name"], cfg["runs_dir"])
    return _json(request, payload)


async def importance(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    payload = await _blocking(data.param_importances, cfg["storage"], request.match_info["name"])
    return _json(request, payload)


async def trial_log(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG_KEY]
    try:
        number = int(request.match_info["number"])
    except ValueError:
        raise web.HTTPNotFound() from None
    text, truncated = await _blocking(data.trial_log, cfg["storage"], request.match_info["name"], number,
                                      cfg["runs_dir"])
    if truncated:
        text = f"[showing the last {data.MAX_LOG_BYTES // 1024} KiB]\n" + text
    # text/plain + nosniff + a sandboxing CSP: the browser never runs anything from a log
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"Content-Security-Policy": "sandbox; default-src 'none'"})


def make_app(storage: str, runs_dir: str | Path = data.DEFAULT_RUNS_DIR) -> web.Application:
    from tuner.storage import db

    db.parse_url(storage)
    app = web.Application(middlewares=[_guard])
    app[CONFIG_KEY] = {"storage": storage, "runs_dir": str(runs_dir), "storage_display": _display_url(storage)}
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/studies", studies)
    app.router.add_get("/api/studies/{name}", study)
    app.router.add_get("/api/studies/{name}/importance", importance)
    app.router.add_get("/api/studies/{name}/trials/{number}/log", trial_log)
    return app


def _display_url(storage: str) -> str:
    from tuner.storage import db

    return db.parse_url(storage).render_as_string(hide_password=True)


def serve(storage: str, host: str = "127.0.0.1", port: int = 8080, runs_dir: str | Path = data.DEFAULT_RUNS_DIR,
          print_fn=print) -> None:
    """Run the dashboard until interrupted."""
    app = make_app(storage, runs_dir)
    shown = f"[{host}]" if ":" in host else host
    print_fn(f"tuner dashboard on http://{shown}:{port}/ (read-only; Ctrl-C to stop)")
    web.run_app(app, host=host, port=port, access_log=None, print=None, shutdown_timeout=1.0)
