"""The comparison as one self-contained HTML file: a table of the studies side by side, bars of
capacity per node and per GPU, KV capacity and cost per user-hour, and each study's capacity
against its SLO target scaled (drawn by the report's own SVG charts, tuner/report/static)."""

from __future__ import annotations

from html import escape
from importlib import resources

from tuner.report.html import _json_for_script, page_start, static_text


def _esc(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def _own(name: str) -> str:
    return resources.files("tuner.compare").joinpath("static", name).read_text(encoding="utf-8")


def render_html(doc: dict) -> str:
    css = static_text("style.css") + static_text("why.css") + _own("compare.css")
    boot = ("(()=>{const d=JSON.parse(document.getElementById('compare-data').textContent);"
            "TunerCompare.render(document.getElementById('compare-view'),d);})();")
    notes = "".join(f"<li>{_esc(n)}</li>" for n in doc.get("notes") or [])
    return page_start(f"tuner compare · {doc['comparison']}", f"comparison · {doc['comparison']}", css) + f"""<main>
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
