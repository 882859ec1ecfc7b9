"""The "why" parts of the study summary (server-rendered, shared by the dashboard and the report):
what bounds the best trial and the baseline, in one sentence each with its figure, and which
causes the best trial could not observe. Every database value goes through ``esc``."""

from __future__ import annotations

from html import escape


def _esc(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def _line(label: str, trial: dict | None) -> str:
    b = (trial or {}).get("bottleneck") or {}
    if not b.get("sentence"):
        return ""
    cause = b.get("binding")
    tag = f' <span class="why-cause why-{_esc(cause)}">{_esc(cause.replace("_", " "))}</span>' if cause else ""
    return (f'<p class="why-line"><b>{_esc(label)} (trial {_esc(trial["number"])})</b>{tag}: '
            f'{_esc(b["sentence"])}</p>')


def why_html(s: dict) -> str:
    best, base = s.get("best"), s.get("baseline")
    lines = [_line("best", best)]
    if base is not None and (best is None or base["number"] != best["number"]):
        lines.append(_line("baseline", base))
    lines = [x for x in lines if x]
    if not lines:
        return ""
    missing = ((best or {}).get("bottleneck") or {}).get("not_measured") or []
    note = ""
    if missing:
        items = "".join(f"<li><b>{_esc(m['title'])}</b>: {_esc(m['why'])}</li>" for m in missing)
        note = f'<details class="why-missing"><summary>not measured for trial {_esc(best["number"])} ' \
               f'({len(missing)})</summary><ul>{items}</ul></details>'
    return f'<div class="why-summary"><h3>Why</h3>{"".join(lines)}{note}</div>'
