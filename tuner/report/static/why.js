// "Why": the binding cause at each trial's capacity, the causes behind it with their figures, and
// each load point's one-sentence diagnosis. Shared by the live dashboard and the static report.
// Every text from the data goes through textContent, never through HTML parsing.
"use strict";

const TunerWhy = (() => {
  const CAUSE_COLORS = {
    kv_capacity: "#b91c1c", routing: "#c2410c", host_link: "#a16207", imbalance: "#7c3aed", client: "#475569",
    gpu_idle: "#0f766e", prefill_interference: "#db2777", prefill_queueing: "#ea580c", prefill_compute: "#2563eb",
    decode_step: "#0891b2", failed_requests: "#991b1b",
  };
  const COVERAGE_TEXT = { measured: "measured", simulated: "simulated", estimated: "estimated",
                          not_measured: "not measured", not_applicable: "n/a" };

  const h = TunerCharts.h;
  const causeTag = (cause, title) => h("span", { class: "why-cause", style: { background: CAUSE_COLORS[cause] || "#6b7280" },
                                                 "data-cause": cause, text: title || cause.replace(/_/g, " ") });

  function create(root) {
    const state = { open: new Set(), data: null };
    const chart = h("div", { class: "chart-box", id: "chart-why" });
    const table = h("table", { class: "trials why-table", id: "why-table" });
    root.replaceChildren(h("section", { class: "card wide why-card" },
      h("h3", { text: "Why: the binding cause at each trial's capacity" }),
      h("p", { class: "help", text: "Each trial's smallest load point above its capacity that misses a target, explained by the " +
        "cause that accounts for most of it, with the figure behind it. Click a trial for every cause at that point " +
        "(how it was observed, its share) and each load point's diagnosis." }),
      chart, h("div", { class: "table-wrap" }, table)));
    return {
      update(data) {
        state.data = data;
        render(state, chart, table);
      },
    };
  }

  function render(state, chart, table) {
    const d = state.data;
    if (!d) return;
    const rows = d.trials.filter((t) => t.bottleneck);
    const counts = {};
    for (const t of rows) {
      const c = t.bottleneck.binding;
      if (c) counts[c] = (counts[c] || 0) + 1;
    }
    const titles = {};
    for (const t of rows) for (const f of ((t.bottleneck.point || {}).findings || [])) titles[f.cause] = f.title;
    TunerCharts.hbars(chart, {
      items: Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([c, n]) => ({ label: titles[c] || c, value: n,
        color: CAUSE_COLORS[c], title: `${titles[c] || c}: binds ${n} trial(s)` })),
      xLabel: "trials bound by each cause", valueFmt: (v) => String(v), empty: "no trial has missed a target yet",
    });
    const head = h("tr", {}, ...["#", "state", "capacity", "bound by", "at its capacity"].map((c) => h("th", { text: c })));
    const body = [];
    for (const t of rows) {
      const b = t.bottleneck;
      const isBest = d.best && t.number === d.best.number;
      const tr = h("tr", { class: "why-row" + (isBest ? " best-row" : ""), "data-trial": t.number, tabindex: "0",
        onclick: () => { if (state.open.has(t.number)) state.open.delete(t.number); else state.open.add(t.number); render(state, chart, table); } },
        h("td", { class: "num" }, String(t.number), t.is_baseline ? h("span", { class: "tag tag-base", text: "baseline" }) : null,
          isBest ? h("span", { class: "tag tag-best", text: "best" }) : null),
        h("td", {}, h("span", { class: `badge st-${t.status}`, text: t.status })),
        h("td", { class: "num" }, t.capacity_users === null ? "–" : String(t.capacity_users)),
        h("td", {}, b.binding ? causeTag(b.binding, titleOf(b)) : h("span", { class: "muted", text: b.bound.replace(/_/g, " ") })),
        h("td", { class: "why-sentence", text: b.sentence }));
      body.push(tr);
      if (state.open.has(t.number)) body.push(detail(t));
    }
    table.replaceChildren(h("thead", {}, head), h("tbody", {}, ...body));
  }

  function titleOf(b) {
    const f = ((b.point || {}).findings || []).find((x) => x.cause === b.binding);
    return f ? f.title : null;
  }

  function detail(t) {
    const b = t.bottleneck;
    const box = h("div", { class: "why-detail" });
    const findings = ((b.point || {}).findings || []).slice().sort((x, y) => (y.share ?? -1) - (x.share ?? -1));
    if (findings.length) {
      const list = h("table", { class: "why-findings" },
        h("thead", {}, h("tr", {}, ...["cause", "observed", "share", "figure"].map((c) => h("th", { text: c })))),
        h("tbody", {}, ...findings.map((f) => h("tr", { class: "why-finding" + (f.cause === b.binding ? " binding" : ""), "data-cause": f.cause },
          h("td", {}, causeTag(f.cause, f.title)),
          h("td", {}, h("span", { class: `why-cov cov-${f.coverage}`, text: COVERAGE_TEXT[f.coverage] || f.coverage })),
          h("td", { class: "num" }, f.share === null || f.share === undefined ? "–" : shareBar(f.share)),
          h("td", { class: "why-text", text: f.text + (f.missing ? ` — not measured: ${f.missing}` : "") })))));
      box.append(h("p", { class: "help", text: `Every cause at ${b.point.users} users:` }), list);
    }
    if (b.not_measured && b.not_measured.length) {
      box.append(h("p", { class: "help", text: "What this trial could not observe:" }),
        h("ul", { class: "why-missing-list" }, ...b.not_measured.map((m) => h("li", {}, h("b", { text: m.title }), ` — ${m.why}`))));
    }
    const pts = (t.measurements || []).filter((m) => m.why).sort((x, y) => x.users - y.users);
    if (pts.length) {
      box.append(h("p", { class: "help", text: "Each load point:" }),
        h("ul", { class: "why-points" }, ...pts.map((m) => h("li", { class: m.meets_slo ? "pass" : "miss", "data-users": m.users },
          h("b", { text: `${m.users} users` }), ` — ${m.why}`))));
    }
    return h("tr", { class: "why-detail-row", "data-trial": t.number }, h("td", { colspan: "5" }, box));
  }

  function shareBar(v) {
    const pct = Math.max(0, Math.min(1, v)) * 100;
    return h("span", { class: "why-share", title: `${pct.toFixed(0)} %` },
      h("span", { class: "why-share-fill", style: { width: `${pct.toFixed(1)}%` } }), h("span", { class: "why-share-text", text: `${pct.toFixed(0)} %` }));
  }

  return { create, CAUSE_COLORS };
})();
