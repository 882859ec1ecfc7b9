"""The comparison as one self-contained HTML file: a table of the studies side by side, bars of
capacity per node and per GPU, KV capacity and cost per user-hour, and each study's capacity
against its SLO target scaled (drawn by the report's own SVG charts, tuner/report/static)."""

from __future__ import annotations

import time
from html import escape
from importlib import resources

from tuner import __version__
from tuner.report.html import REPORT_CSP, _json_for_script, static_text


def _esc(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def _own(name: str) -> str:
    return resources.files("tuner.compare").joinpath("static", name).read_text(encoding="utf-8")


def render_html(doc: dict) -> str:
    css = static_text("style.css") + static_text("why.css") + _own("compare.css")
    boot = ("(()=>{const d=JSON.parse(document.getElementById('compare-data').textContent);"
            "TunerCompare.render(document.getElementById('compare-view'),d);})();")
    notes = "".join(f"<li>{_esc(n)}</li>" for n in doc.get("notes") or [])
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tuner compare · {_esc(doc['comparison'])}</title>
<style>{css}</style>
</head>
<body class="report">
<header class="top"><h1>tuner</h1><span class="sub">comparison · {_esc(doc['comparison'])} · generated {_esc(time.strftime('%Y-%m-%d %H:%M'))} by tuner {_esc(__version__)}</span></header>
<main>
<h2>{_esc(doc['comparison'])}</h2>
<p class="help">{_esc(doc.get('description'))} Workload: {_esc((doc.get('workload') or {}).get('name'))}.</p>
{f'<ul class="help compare-notes">{notes}</ul>' if notes else ''}
<div id="compare-view"><noscript><p>The comparison's table and charts need JavaScript.</p></noscript></div>
</main>
<script type="application/json" id="compare-data">{_json_for_script(doc)}</script>
<script>{static_text("charts.js")}</script>
<script>{static_text("why.js")}</script>
<script>{_own("compare.js")}</script>
<script>{boot}</script>
</body>
</html>
"""
