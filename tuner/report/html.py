"""HTML for people: the study summary (shared with the dashboard) and the self-contained static report.

Every value that comes from the database goes through :func:`esc`; the report embeds its data as
JSON with ``<``, ``>`` and ``&`` escaped so nothing in it can close the script element.
"""

from __future__ import annotations

import json
import time
from html import escape
from importlib import resources

from tuner import __version__
from tuner.lifecycle import StudyStatus, TrialStatus
from tuner.report.why import why_html
from tuner.report.ledger import ledger_html

STATIC = "tuner.report"


def esc(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def page_start(title: str, subtitle: str, css: str) -> str:
    """The head and top bar of a self-contained tuner page (the report's CSP, its inline CSS)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{css}</style>
</head>
<body class="report">
<header class="top"><h1>tuner</h1><span class="sub">{esc(subtitle)} · generated {esc(_when(time.time()))} by tuner {esc(__version__)}</span></header>
"""


def static_text(name: str) -> str:
    return resources.files(STATIC).joinpath("static", name).read_text(encoding="utf-8")


def _s(v) -> str:
    return "–" if v is None else (f"{v:.3g} s" if v < 100 else f"{v:.0f} s")


def _ms(v) -> str:
    return "–" if v is None else f"{v * 1000:.3g} ms"


def _tok(v) -> str:
    if v is None:
        return "–"
    return f"{v / 1e6:.3g} M" if v >= 1e6 else f"{v / 1e3:.3g} k" if v >= 1e4 else str(v)


def _val(v) -> str:
    return "default" if v is None else str(v)


def _when(ts) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "–"


def summary_html(s: dict) -> str:
    """The summary a colleague reads first: verdict, best configuration and its latencies, what was
    tried and what failed. ``s`` is :func:`tuner.report.data.study`'s dict."""
    spec, best, base, slo = s.get("spec") or {}, s.get("best"), s.get("baseline"), s["slo"]
    hw = ""
    if spec.get("gpu"):
        nodes = spec.get("nodes") or 1
        hw = f"{esc(spec.get('gpus_per_node'))}× {esc(str(spec['gpu']).upper())}" + (f" × {esc(nodes)} nodes" if nodes > 1 else "")
    facts = [("model", esc(spec.get("model"))), ("hardware", hw or "–"), ("workload", esc(spec.get("workload"))),
             ("search space", esc(spec.get("search_space"))), ("backend", esc(s["backend_kind"])),
             ("state", esc(s["status"])),
             ("trials", f"{esc(s['trials_launched'])} launched of {esc(s['trials_budget'])} budgeted"
                        + _counts(s.get("counts") or {})),
             ("targets", f"{esc(s['target_users'])} users at P90 TTFT ≤ {esc(slo['p90_ttft_s'])} s and "
                         f"P90 TPOT ≤ {esc(round(slo['p90_tpot_s'] * 1000, 3))} ms"),
             ("started", esc(_when(s.get("created_at")))), ("updated", esc(_when(s.get("updated_at"))))]
    left = [f'<p class="help">{esc(spec.get("description"))}</p>' if spec.get("description") else ""]
    left.append(_verdict(s))
    left.append(why_html(s))
    if best:
        left.append(_best_block(best, base))
    right = ['<h3>Study</h3><dl class="kv">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"]
    right.append(_tried_block(s))
    right.append(_failures_block(s))
    return (f'<div class="summary"><section class="card">{"".join(left)}</section>'
            f'<section class="card">{"".join(right)}</section></div>')


def _counts(counts: dict) -> str:
    if not counts:
        return ""
    return " (" + ", ".join(f"{esc(n)} {esc(k)}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")"


def _verdict(s: dict) -> str:
    best, base = s.get("best"), s.get("baseline")
    if not best:
        what = "no trial has completed yet" if s["status"] == StudyStatus.RUNNING else "no trial completed"
        return f'<p class="verdict miss"><span class="big">–</span> {esc(what)}.</p>'
    met = best["capacity_users"] >= s["target_users"]
    parts = [f'<span class="big">{esc(best["capacity_users"])} users</span> with trial {esc(best["number"])}'
             + (" (the baseline)" if best["is_baseline"] else "")]
    parts.append(f"— {'meets' if met else 'below'} the target of {esc(s['target_users'])}")
    if base is not None:
        if s.get("improvement_over_baseline"):
            parts.append(f"— <b>{s['improvement_over_baseline']:.2f}×</b> the baseline's {esc(base['capacity_users'])} users")
        elif base.get("capacity_users") == 0:
            parts.append("— the baseline met the targets for no user count")
        elif base["status"] != TrialStatus.COMPLETE:
            parts.append(f"— the baseline did not complete ({esc(base['status'])})")
    return f'<p class="verdict{"" if met else " miss"}">{" ".join(parts)}.</p>'


def _best_block(best: dict, base: dict | None) -> str:
    base_params = (base or {}).get("params") or {}
    rows = []
    for k, v in (best.get("params") or {}).items():
        differs = base is not None and base_params.get(k) != v
        if v is None and not differs:
            continue
        cls = ' class="diff"' if differs else ""
        was = f' <span class="muted">(baseline: {esc(_val(base_params.get(k)))})</span>' if differs else ""
        rows.append(f"<dt><code>{esc(k)}</code></dt><dd{cls}>{esc(_val(v))}{was}</dd>")
    at = best.get("at_capacity") or {}
    lat = [("P50 / P90 / P99 TTFT", f"{_s(at.get('p50_ttft_s'))} / {_s(at.get('p90_ttft_s'))} / {_s(at.get('p99_ttft_s'))}"),
           ("P50 / P90 / P99 TPOT", f"{_ms(at.get('p50_tpot_s'))} / {_ms(at.get('p90_tpot_s'))} / {_ms(at.get('p99_tpot_s'))}"),
           ("output throughput", "–" if at.get("throughput_tokens_per_s") is None else f"{at['throughput_tokens_per_s']:.0f} tokens/s"),
           ("prefix cache hit rate", "–" if at.get("prefix_cache_hit_rate") is None else f"{at['prefix_cache_hit_rate'] * 100:.0f} %"),
           ("KV capacity predicted / measured", f"{_tok(best.get('predicted_kv_capacity_tokens'))} / "
                                                f"{_tok(best.get('measured_kv_capacity_tokens'))} tokens")]
    if base and base.get("at_capacity"):
        b = base["at_capacity"]
        lat.append((f"baseline at {esc(base['capacity_users'])} users", f"P90 TTFT {_s(b.get('p90_ttft_s'))}, P90 TPOT {_ms(b.get('p90_tpot_s'))}"))
    return (f"<h3>Best configuration (trial {esc(best['number'])})</h3>"
            + ('<dl class="kv">' + "".join(rows) + "</dl>" if rows else '<p class="muted">SGLang defaults.</p>')
            + f"<h3>At {esc(best['capacity_users'])} users</h3>"
            + '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in lat) + "</dl>")


def _tried_block(s: dict) -> str:
    tried = s.get("tried") or {}
    varied = [k for k in s.get("varied_params") or [] if k in tried]
    if not varied:
        return ""
    items = "".join(f"<li><code>{esc(k)}</code>: {', '.join(esc(_val(v)) for v in tried[k])}</li>" for k in varied)
    return f"<h3>What the study tried</h3><ul>{items}</ul>"


def _failures_block(s: dict) -> str:
    groups = s.get("failures") or []
    if not groups:
        return "<h3>What failed</h3><p class=\"muted\">Nothing: every trial completed.</p>" if s.get("trials") else ""
    out = ["<h3>What failed</h3>"]
    for g in groups:
        nums = ", ".join(f"#{esc(t['number'])}" for t in g["trials"][:12]) + (" …" if g["count"] > 12 else "")
        reasons: list[str] = []
        for t in g["trials"]:
            r = (t["reason"] or "").strip()
            if r and r not in reasons:
                reasons.append(r)
        shown = "".join(f'<div class="reason" title="{esc(r)}">{esc(r[:300])}</div>' for r in reasons[:2])
        more = f'<div class="muted">and {len(reasons) - 2} other reason(s)</div>' if len(reasons) > 2 else ""
        out.append(f'<div class="fail-group"><span class="fclass">{esc(g["failure_class"])}</span> '
                   f'× {esc(g["count"])} <span class="muted">({nums})</span>{shown}{more}</div>')
    return "".join(out)


def _json_for_script(obj) -> str:
    """JSON safe to place inside <script type="application/json">."""
    text = json.dumps(obj, default=str, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# No network at all: the report must open on an air-gapped machine and leak nothing.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def render_report(s: dict, importance: dict) -> str:
    """A single HTML file: inline CSS, inline JS, charts drawn as SVG when opened."""
    css, charts, view = static_text("style.css") + static_text("why.css"), static_text("charts.js"), static_text("view.js")
    why = static_text("why.js")
    boot = ("(()=>{const d=JSON.parse(document.getElementById('study-data').textContent);"
            "const v=TunerView.create(document.getElementById('study-view'),{showLogPath:true});"
            "v.update(d.study,d.importance);"
            "TunerWhy.create(document.getElementById('why-view')).update(d.study);})();")
    payload = _json_for_script({"study": s, "importance": importance})
    return page_start(f"tuner report · {s['name']}", f"study report · {s['name']}", css) + f"""<main>
<h2>Study {esc(s['name'])}</h2>
{summary_html(s)}
{ledger_html(s)}
<div id="study-view"><noscript><p>The charts and the trials table need JavaScript.</p></noscript></div>
<div id="why-view"></div>
</main>
<script type="application/json" id="study-data">{payload}</script>
<script>{charts}</script>
<script>{view}</script>
<script>{why}</script>
<script>{boot}</script>
</body>
</html>
"""
