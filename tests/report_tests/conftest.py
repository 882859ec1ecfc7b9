import asyncio
import shutil
import threading
import urllib.error
import urllib.request

import pytest

from tests.report_tests.studydb import run_study

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished 12-trial study run by the real driver: (tmp dir, storage URL, runs dir)."""
    tmp = tmp_path_factory.mktemp("report")
    storage, _ = run_study(tmp, trials=12)
    return tmp, storage, tmp / "runs"


class ServerThread:
    """The dashboard app on 127.0.0.1:<free port>, in a thread with its own event loop."""

    def __init__(self, app):
        self.app, self.port, self._ready = app, None, threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())

    def __enter__(self):
        self.thread.start()
        assert self._ready.wait(10), "dashboard did not start"
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def dashboard(finished):
    from tuner.report.dashboard import make_app

    _, storage, runs = finished
    with ServerThread(make_app(storage, runs)) as srv:
        yield srv


def http(method, url, headers=None):
    """(status, headers, body bytes) without raising on 4xx/5xx."""
    req = urllib.request.Request(url, method=method, headers=headers or {},
                                 data=b"x" if method in ("POST", "PUT", "PATCH") else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium through Playwright; skipped with the reason when unavailable.

    Module scope: Playwright's sync API keeps an asyncio loop marked running in the main thread
    while it is open, which would break every later test that calls asyncio.run().
    """
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (CI: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (CI: pip install playwright; never `playwright install`)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()
