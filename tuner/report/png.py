"""PNG images of the report's charts, rendered by headless Chromium.

The charts are the report's own SVG, so the PNGs look exactly like the HTML. Chromium is driven
through its DevTools protocol over a local websocket (aiohttp, already a dependency): load the
report file, measure each chart's card, capture it clipped. No network is used.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tuner.errors import UserError

# chart element id -> PNG file name
CHARTS = {"chart-history": "best_capacity.png", "chart-compare": "best_vs_baseline.png",
          "chart-ttft": "p90_ttft_vs_users.png", "chart-tpot": "p90_tpot_vs_users.png",
          "chart-importance": "param_importance.png", "chart-parallel": "parallel_coordinates.png"}
FULL_PAGE = "report.png"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
VIEWPORT = {"width": 1360, "height": 1000}
# Flags for a quiet, offline, throw-away browser.
CHROMIUM_FLAGS = ("--headless", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
                  "--mute-audio", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")
TIMEOUT_S = 60


def find_chromium() -> str:
    """Chromium's path: $TUNER_CHROMIUM, else the first of the usual names on PATH."""
    env = os.environ.get("TUNER_CHROMIUM")
    if env:
        if not (Path(env).is_file() and os.access(env, os.X_OK)):
            raise UserError(f"TUNER_CHROMIUM={env} is not an executable file")
        return env
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise UserError("--png needs headless Chromium, which is not installed here: install it "
                    "(Debian/Ubuntu: apt-get install chromium) or set TUNER_CHROMIUM to its path; "
                    "the HTML report itself does not need it")


def render_pngs(report_html: Path, out_dir: Path, chromium: str | None = None) -> list[Path]:
    """Write one PNG per chart (and the whole report page) from ``report_html`` into ``out_dir``."""
    exe = chromium or find_chromium()
    out_dir.mkdir(parents=True, exist_ok=True)
    def job():
        return asyncio.run(asyncio.wait_for(_render(exe, report_html.resolve(), out_dir), TIMEOUT_S))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return job()
    # called from inside an event loop (a notebook, an async caller): render on a thread of its own
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(job).result()


async def _render(exe: str, html: Path, out_dir: Path) -> list[Path]:
    import aiohttp

    with tempfile.TemporaryDirectory(prefix="tuner-chromium-") as profile:
        args = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to start its sandbox as root
        proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            port = await _devtools_port(proc)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = await r.json(content_type=None)
                page = next(t for t in targets if t.get("type") == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = _CDP(ws)
                    return await _capture(cdp, html, out_dir)
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _devtools_port(proc) -> int:
    tail = []
    while True:
        line = await proc.stderr.readline()
        if not line:
            raise UserError("Chromium exited before it was ready: " + " ".join(tail[-5:])[-800:])
        text = line.decode(errors="replace").strip()
        tail.append(text)
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", text)
        if m:
            asyncio.get_running_loop().create_task(_drain(proc.stderr))
            return int(m.group(1))


async def _drain(stream) -> None:
    while await stream.readline():
        pass


class _CDP:
    """Just enough of the DevTools protocol: numbered commands, and waiting for one event."""

    def __init__(self, ws):
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, **params):
        self.next_id += 1
        mid = self.next_id
        await self.ws.send_str(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise UserError(f"Chromium: {method} failed: {msg['error'].get('message')}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    async def wait_event(self, method: str):
        while True:
            for i, e in enumerate(self.events):
                if e["method"] == method:
                    return self.events.pop(i)
            self.events.append(json.loads((await self.ws.receive()).data))


async def _capture(cdp: _CDP, html: Path, out_dir: Path) -> list[Path]:
    await cdp.call("Page.enable")
    await cdp.call("Runtime.enable")
    await cdp.call("Emulation.setDeviceMetricsOverride", width=VIEWPORT["width"], height=VIEWPORT["height"],
                   deviceScaleFactor=2, mobile=False)
    await cdp.call("Page.navigate", url=html.as_uri())
    await cdp.wait_event("Page.loadEventFired")
    errors = [e for e in cdp.events if e["method"] == "Runtime.exceptionThrown"]
    if errors:
        detail = errors[0]["params"]["exceptionDetails"]
        raise UserError(f"the report's script failed in Chromium: {detail.get('exception', {}).get('description') or detail.get('text')}")
    expr = """(() => {
      const rect = (e) => { const r = e.getBoundingClientRect();
        return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; };
      const out = {page: {x: 0, y: 0, width: document.documentElement.scrollWidth,
                          height: document.documentElement.scrollHeight}};
      for (const id of %s) { const c = document.getElementById(id); const card = c && c.closest('.card');
        out[id] = card ? rect(card) : null; }
      return JSON.stringify(out); })()""" % json.dumps(list(CHARTS))
    res = await cdp.call("Runtime.evaluate", expression=expr, returnByValue=True)
    rects = json.loads(res["result"]["value"])
    written = []
    for chart_id, name in [*CHARTS.items(), ("page", FULL_PAGE)]:
        r = rects.get(chart_id)
        if not r or r["width"] <= 0 or r["height"] <= 0:
            continue
        shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                              clip={"x": r["x"], "y": r["y"], "width": r["width"], "height": r["height"], "scale": 1})
        path = out_dir / name
        path.write_bytes(base64.b64decode(shot["data"]))
        written.append(path)
    return written
