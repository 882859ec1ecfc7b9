"""The report's and dashboard's "simulator against measurements" section: for every real load
point of the study, what the simulator predicted beside what was measured, and the study's
running fidelity (``tuner.study.trust``). Built server-side with every value escaped."""

from __future__ import annotations

from html import escape

from tuner.sim.measured import METRICS, format_metric
from tuner.study.trust import TARGETS
from tuner.vocabulary import BackendKind


def esc(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def _err(v) -> str:
    return "" if v is None else f' <span class="muted">({v:+.0%})</span>'


def _cell(r: dict, metric: str) -> str:
    """Predicted / measured ``metric`` of ledger row ``r``; the hit rate without its error."""
    pred, meas = r["predicted"][metric], r["measured"][metric]
    pair = f"{esc(format_metric(pred, metric, '–'))} / {esc(format_metric(meas, metric, '–'))}"
    err = "" if metric == "prefix_cache_hit_rate" else _err(r["rel_error"][metric])
    return f'<td class="num">{pair}{err}</td>'


def _decided(d: dict) -> str:
    """The agreement on the points whose own window decides the measured verdict, where some do not."""
    if not d.get("marginal_points") or not d.get("points"):
        return ""
    return (f', and on {esc(_pct(d.get("agreement")))} of the {esc(d["points"])} whose own window decides the '
            f'measured verdict ({esc(d["marginal_points"])} marginal: an SLO limit inside a P90\'s 90% interval)')


def ledger_html(s: dict) -> str:
    """The section for ``s`` (a study summary with ``simulator_ledger`` and ``simulator_fidelity``)."""
    rows = s.get("simulator_ledger") or []
    fid = s.get("simulator_fidelity") or {}
    head = '<section class="card wide ledger"><h3>Simulator against this study\'s measurements</h3>'
    if s.get("backend_kind") == BackendKind.SIMULATOR.value:
        return head + ('<p class="help">This study ran on the simulator: there is nothing real to check it '
                       'against here. Real studies keep the simulator\'s prediction beside every load point.</p>'
                       '</section>')
    if not rows:
        return head + ('<p class="help">No load point of this study carries the simulator\'s prediction yet '
                       '(it is stored with every real measurement; for one measured before that, '
                       '<code>tuner db predict --storage URL</code> adds it).</p></section>')
    m = fid.get("mape") or {}
    verdict = fid.get("verdict_agreement")
    within = fid.get("within_targets")
    lead = (f'<p>Over {esc(fid.get("load_points"))} real load points so far: P90 TTFT MAPE '
            f'<span class="strong">{esc(_pct(m.get("p90_ttft_s")))}</span> (target ≤ {TARGETS["p90_ttft_s"]:.0%}), '
            f'P90 TPOT MAPE <span class="strong">{esc(_pct(m.get("p90_tpot_s")))}</span> '
            f'(≤ {TARGETS["p90_tpot_s"]:.0%}), throughput {esc(_pct(m.get("throughput_tokens_per_s")))}, '
            f'prefix hit rate {esc(_pct(m.get("prefix_cache_hit_rate")))}; SLO verdicts agree on '
            f'<span class="strong">{esc(_pct(verdict))}</span> (≥ {TARGETS["verdict_agreement"]:.0%})'
            + _decided(fid.get("verdicts_decided") or {})
            + ("" if within is None else (' — <span class="pass">within the targets</span>' if within
                                          else ' — <span class="miss">outside the targets</span>'))
            + ".</p>")
    cal = sorted({c for r in rows for c in r.get("calibration") or []})
    note = ('<p class="help">Calibration used: ' + esc(", ".join(cal)) + '. </p>') if cal else (
        '<p class="help">The simulator had no calibration fitted to real servers for this configuration '
        '(rooflines with UNVERIFIED efficiencies, docs/calibration.md).</p>')
    cols = ("trial", "users", "P50 TTFT s", "P90 TTFT s", "P90 TPOT ms", "tok/s", "hit rate", "SLO")
    out = [head, lead, note, '<div class="table-wrap"><table class="ledger"><thead><tr>',
           "".join(f"<th>{esc(c)}</th>" for c in cols), "</tr><tr>",
           "".join(f'<th class="muted">{"" if i < 2 else "pred / meas"}</th>' for i in range(len(cols))),
           "</tr></thead><tbody>"]
    yn = lambda v: "–" if v is None else ("met" if v else "miss")
    for r in rows:
        if r.get("error"):
            out.append(f'<tr><td class="num">{esc(r["trial"])}</td><td class="num">{esc(r["users"])}</td>'
                       f'<td colspan="6">no prediction: {esc(r["error"])}</td></tr>')
            continue
        agree = r["predicted_meets"] == r["measured_meets"]
        out.append(
            f'<tr><td class="num">{esc(r["trial"])}</td><td class="num">{esc(r["users"])}</td>'
            + "".join(_cell(r, m) for m in METRICS) +
            f'<td class="{"pass" if agree else "miss"}">{esc(yn(r["predicted_meets"]))} / '
            f'{esc(yn(r["measured_meets"]))}'
            + (' <span class="muted" title="an SLO limit lies inside the 90% interval of a measured P90: '
               'another window could call it the other way">(marginal)</span>' if r.get("measured_marginal") else "")
            + '</td></tr>')
    out.append("</tbody></table></div></section>")
    return "".join(out)
