// One study's view: charts and the trials table. Shared by the live dashboard and the static report.
// State (sort, filter, trials picked for the latency charts) survives re-renders with new data.
"use strict";

const TunerView = (() => {
  const STATUS_COLORS = { complete: "#2563eb", failed: "#dc2626", infeasible: "#d97706", pruned: "#6b7280",
                          interrupted: "#9333ea", running: "#0891b2" };
  const BEST = "#15803d", BASE = "#6b7280";
  const PALETTE = ["#2563eb", "#db2777", "#0891b2", "#ea580c", "#7c3aed", "#65a30d", "#0d9488", "#c026d3"];
  const fmt = TunerCharts.fmt;

  const h = TunerCharts.h;
  const s = (v) => (v === null || v === undefined ? "–" : v < 1 ? `${+(v).toPrecision(2)} s` : `${+(v).toPrecision(3)} s`);
  const ms = (v) => (v === null || v === undefined ? "–" : `${+(v * 1000).toPrecision(3)} ms`);
  const tokens = (v) => (v === null || v === undefined ? "–" : fmt(v));
  function dur(v) {
    if (v === null || v === undefined) return "–";
    if (v < 60) return `${v.toFixed(1)} s`;
    const m = Math.floor(v / 60);
    return m < 60 ? `${m} min ${Math.round(v - 60 * m)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
  }
  const valStr = (v) => (v === null || v === undefined ? "default" : String(v));

  function create(root, opts) {
    const state = { sort: { key: "number", dir: 1 }, filter: "", status: "", picked: null, data: null, importance: null };
    const ui = build(root, state, opts);
    return {
      update(data, importance) {
        state.data = data;
        if (importance !== undefined) state.importance = importance;
        render(ui, state, opts);
      },
    };
  }

  function card(titleText, help, body) {
    return h("section", { class: "card" }, h("h3", { text: titleText }), help ? h("p", { class: "help", text: help }) : null, body);
  }

  function build(root, state, opts) {
    const ui = {};
    ui.history = h("div", { class: "chart-box", id: "chart-history" });
    ui.ttft = h("div", { class: "chart-box", id: "chart-ttft" });
    ui.tpot = h("div", { class: "chart-box", id: "chart-tpot" });
    ui.importance = h("div", { class: "chart-box", id: "chart-importance" });
    ui.parallel = h("div", { class: "chart-box", id: "chart-parallel" });
    ui.compare = h("div", { class: "chart-box", id: "chart-compare" });
    ui.pickNote = h("p", { class: "help" });
    ui.importanceNote = h("p", { class: "help" });
    ui.parallelNote = h("p", { class: "help" });
    const charts = h("div", { class: "grid" },
      card("Best capacity so far", "Users served within both P90 targets, by trial. Hollow: failed or infeasible (0).", ui.history),
      card("Best vs baseline", "Capacity, and P90 latencies at each configuration's own capacity.", ui.compare),
      card("P90 time to first token", null, h("div", {}, ui.pickNote, ui.ttft)),
      card("P90 time per output token", "Each point is one capacity-search step; the line is the SLO.", ui.tpot),
      card("Parameter importance for capacity", null, h("div", {}, ui.importanceNote, ui.importance)),
      card("Parallel coordinates", "One line per finished trial over the parameters that varied; colour: capacity (grey: failed or infeasible; thick: best).",
        h("div", {}, ui.parallelNote, ui.parallel)));
    ui.filter = h("input", { type: "search", placeholder: "filter: text in configuration, state, failure…", class: "filter",
                             "aria-label": "filter trials", oninput: (e) => { state.filter = e.target.value.toLowerCase(); renderTable(ui, state, opts); } });
    ui.status = h("select", { class: "filter-status", "aria-label": "state",
                              onchange: (e) => { state.status = e.target.value; renderTable(ui, state, opts); } });
    ui.count = h("span", { class: "help" });
    ui.table = h("table", { class: "trials", id: "trials-table" });
    const tableCard = h("section", { class: "card wide" }, h("h3", { text: "Trials" }),
      h("div", { class: "toolbar" }, ui.filter, ui.status, ui.count), h("div", { class: "table-wrap" }, ui.table));
    root.replaceChildren(charts, tableCard);
    return ui;
  }

  function render(ui, state, opts) {
    const d = state.data;
    if (!d) return;
    const trials = d.trials;
    if (state.picked === null) {
      state.picked = new Set(trials.filter((t) => t.is_baseline || (d.best && t.number === d.best.number)).map((t) => t.number));
    }
    renderHistory(ui, d);
    renderCompare(ui, d);
    renderLatency(ui, state, d);
    renderImportance(ui, state);
    renderParallel(ui, state, d);
    const statuses = [...new Set(trials.map((t) => t.status))].sort();
    const cur = state.status;
    ui.status.replaceChildren(h("option", { value: "", text: "all states" }),
      ...statuses.map((st) => h("option", { value: st, text: st, selected: st === cur })));
    renderTable(ui, state, opts);
  }

  function renderHistory(ui, d) {
    const pts = d.best_so_far;
    const cap = pts.map((p) => ({ x: p.number, y: p.capacity_users === null ? 0 : p.capacity_users,
      marker: p.capacity_users === null ? "open" : undefined, color: STATUS_COLORS[p.status],
      title: `trial ${p.number} (${p.status})${p.is_baseline ? ", baseline" : ""}: ${p.capacity_users === null ? "no capacity" : p.capacity_users + " users"}` }));
    const best = pts.filter((p) => p.best_users !== null).map((p) => ({ x: p.number, y: p.best_users, r: 0 }));
    const refs = [{ y: d.target_users, label: `target ${d.target_users} users`, color: "#b91c1c" }];
    if (d.baseline && d.baseline.capacity_users !== null) refs.push({ y: d.baseline.capacity_users, label: `baseline ${d.baseline.capacity_users}`, color: BASE });
    TunerCharts.line(ui.history, {
      series: [{ name: "best so far", color: BEST, points: best, step: true, width: 2.5 },
               { name: "trial capacity", color: "#2563eb", points: cap, noLine: true }],
      refs, xLabel: "trial number", yLabel: "capacity (users)", xInt: true, yMin: 0, empty: "no finished trials yet",
    });
  }

  function atCap(t) { return t && t.at_capacity ? t.at_capacity : null; }

  function renderCompare(ui, d) {
    const b = d.best, base = d.baseline;
    if (!b && !base) { TunerCharts.empty(ui.compare, "no completed trials yet", 160); return; }
    const items = (f) => [
      { label: base ? `baseline #${base.number}` : "baseline", value: base ? f(base) : null, color: BASE },
      { label: b ? `best #${b.number}` : "best", value: b ? f(b) : null, color: BEST }];
    const gain = d.improvement_over_baseline;
    TunerCharts.compare(ui.compare, { groups: [
      { title: "Capacity", unit: "users", items: items((t) => t.capacity_users), note: gain ? `${gain.toFixed(2)}× baseline` : null },
      { title: "P90 TTFT", unit: "s", items: items((t) => (atCap(t) ? atCap(t).p90_ttft_s : null)), fmt: (v) => (+v.toPrecision(3)).toString() },
      { title: "P90 TPOT", unit: "ms", items: items((t) => (atCap(t) ? atCap(t).p90_tpot_s * 1000 : null)), fmt: (v) => (+v.toPrecision(3)).toString() },
      { title: "KV capacity", unit: "tokens", items: items((t) => t.measured_kv_capacity_tokens ?? t.predicted_kv_capacity_tokens) },
    ] });
  }

  function pickedTrials(state, d) {
    return d.trials.filter((t) => state.picked.has(t.number) && t.measurements.length);
  }

  function renderLatency(ui, state, d) {
    const picked = pickedTrials(state, d);
    const color = (t, i) => (d.best && t.number === d.best.number ? BEST : t.is_baseline ? BASE : PALETTE[i % PALETTE.length]);
    const series = (key, scaleBy) => picked.map((t, i) => ({
      name: `#${t.number}${t.is_baseline ? " baseline" : ""}${d.best && t.number === d.best.number ? " best" : ""}`,
      color: color(t, i), dash: t.is_baseline ? "6 4" : undefined,
      points: [...t.measurements].sort((a, b) => a.users - b.users).map((m) => ({
        x: m.users, y: m[key] === null ? null : m[key] * scaleBy, marker: m.meets_slo ? undefined : "open",
        title: `trial ${t.number}, ${m.users} users: P90 TTFT ${s(m.p90_ttft_s)}, P90 TPOT ${ms(m.p90_tpot_s)}${m.meets_slo ? " (meets SLO)" : " (misses SLO)"}` })),
    }));
    ui.pickNote.textContent = picked.length
      ? "Trials shown: tick them in the table's “plot” column. Hollow points miss the SLO."
      : "Tick trials in the table's “plot” column to draw their capacity search.";
    TunerCharts.line(ui.ttft, { series: series("p90_ttft_s", 1), yLog: "auto", xMin: 0,
      refs: [{ y: d.slo.p90_ttft_s, label: `SLO ${d.slo.p90_ttft_s} s` }],
      xLabel: "concurrent users", yLabel: "P90 TTFT (s)", empty: "no measurements for the picked trials" });
    TunerCharts.line(ui.tpot, { series: series("p90_tpot_s", 1000), xMin: 0, yMin: 0,
      refs: [{ y: d.slo.p90_tpot_s * 1000, label: `SLO ${+(d.slo.p90_tpot_s * 1000).toPrecision(3)} ms` }],
      xLabel: "concurrent users", yLabel: "P90 TPOT (ms)", empty: "no measurements for the picked trials" });
  }

  function renderImportance(ui, state) {
    const imp = state.importance;
    if (!imp) { ui.importanceNote.textContent = "computing…"; TunerCharts.empty(ui.importance, "…", 120); return; }
    ui.importanceNote.textContent = imp.note || `Optuna's PED-ANOVA importance over ${imp.trials} completed trials (infeasible ones count as 0 users).`;
    TunerCharts.hbars(ui.importance, { items: imp.importances.map((i) => ({ label: i.param, value: i.importance,
      title: `${i.param}: ${(i.importance * 100).toFixed(1)} %` })), xLabel: "share of capacity variance explained",
      valueFmt: (v) => `${(v * 100).toFixed(0)} %`, empty: imp.note || "not enough trials yet" });
  }

  function capColor(v, hi) {
    // light blue (few users) to dark green (most users)
    const f = hi > 0 ? Math.max(0, Math.min(1, v / hi)) : 0;
    const a = [147, 197, 253], b = [21, 128, 61];
    return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * f)).join(",")})`;
  }

  const MAX_PC_AXES = 7;

  function renderParallel(ui, state, d) {
    const done = d.trials.filter((t) => t.status !== "running");
    // The most important parameters (when importance is known), at most MAX_PC_AXES of them.
    const rank = new Map(((state.importance && state.importance.importances) || []).map((x, i) => [x.param, i]));
    const params = d.varied_params.slice().sort((a, b) => (rank.has(a) ? rank.get(a) : 1e9) - (rank.has(b) ? rank.get(b) : 1e9)).slice(0, MAX_PC_AXES);
    ui.parallelNote.textContent = params.length < d.varied_params.length
      ? `Showing the ${params.length} most important of ${d.varied_params.length} varied parameters.` : "";
    const axes = params.map((p) => {
      const vals = [...new Set(done.map((t) => JSON.stringify(t.params[p] ?? null)))].map((v) => JSON.parse(v));
      const num = vals.every((v) => v === null || typeof v === "number") && vals.filter((v) => v !== null).length > 2;
      const sorted = vals.sort((a, b) => (a === null ? -1 : b === null ? 1 : typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b))));
      return num ? { name: p, kind: "num", values: sorted } : { name: p, kind: "cat", values: sorted };
    });
    const caps = done.map((t) => (t.status === "complete" ? t.capacity_users : 0));
    axes.push({ name: "capacity", label: "capacity (users)", kind: "num", values: caps.concat([0]) });
    const hi = Math.max(...caps, 1);
    const rows = done.map((t) => ({
      values: Object.assign(Object.fromEntries(params.map((p) => [p, t.params[p] ?? null])), { capacity: t.status === "complete" ? t.capacity_users : 0 }),
      color: t.status === "complete" ? capColor(t.capacity_users, hi) : "#d1d5db",
      width: d.best && t.number === d.best.number ? 3.5 : 1.6, opacity: t.status === "complete" ? 0.85 : 0.6,
      title: `trial ${t.number}: ${t.status === "complete" ? t.capacity_users + " users" : t.status}`,
    }));
    rows.sort((a, b) => (a.color === "#d1d5db" ? -1 : 0) - (b.color === "#d1d5db" ? -1 : 0));
    TunerCharts.parallel(ui.parallel, { axes, rows, height: 320, empty: "needs finished trials with differing parameters" });
  }

  const COLUMNS = [
    { key: "plot", label: "plot", sortable: false },
    { key: "number", label: "#" },
    { key: "status", label: "state" },
    { key: "capacity_users", label: "capacity (users)" },
    { key: "config", label: "configuration", sortable: false },
    { key: "steps", label: "P90 TTFT · P90 TPOT at users", sortable: false },
    { key: "kv", label: "KV tokens predicted / measured" },
    { key: "failure", label: "failure" },
    { key: "duration_s", label: "duration" },
  ];

  function sortValue(t, key) {
    if (key === "kv") return t.measured_kv_capacity_tokens ?? t.predicted_kv_capacity_tokens ?? -1;
    if (key === "failure") return t.failure_class || "";
    const v = t[key];
    return v === null || v === undefined ? -Infinity : v;
  }

  function configText(t, d) {
    const keys = d.varied_params.length ? d.varied_params : Object.keys(t.params);
    return keys.filter((k) => t.params[k] !== null && t.params[k] !== undefined).map((k) => `${k}=${t.params[k]}`);
  }

  function renderTable(ui, state, opts) {
    const d = state.data;
    if (!d) return;
    const { key, dir } = state.sort;
    let rows = d.trials.slice();
    if (state.status) rows = rows.filter((t) => t.status === state.status);
    if (state.filter) rows = rows.filter((t) => [configText(t, d).join(" "), t.status, t.failure_class || "", t.failure_reason || "",
      t.is_baseline ? "baseline" : "", `#${t.number}`].join(" ").toLowerCase().includes(state.filter));
    rows.sort((a, b) => { const x = sortValue(a, key), y = sortValue(b, key); return (x < y ? -1 : x > y ? 1 : 0) * dir || a.number - b.number; });
    ui.count.textContent = `${rows.length} of ${d.trials.length} trials`;
    const head = h("tr", {}, ...COLUMNS.map((c) => {
      const arrow = c.key === key ? (dir > 0 ? " ▲" : " ▼") : "";
      return h("th", { class: c.sortable === false ? "" : "sortable", "data-key": c.key, title: c.sortable === false ? null : "sort",
        onclick: c.sortable === false ? null : () => {
          state.sort = { key: c.key, dir: state.sort.key === c.key ? -state.sort.dir : (c.key === "number" ? 1 : -1) };
          renderTable(ui, state, opts);
        } }, c.label + arrow);
    }));
    const body = rows.map((t) => row(t, d, state, ui, opts));
    ui.table.replaceChildren(h("thead", {}, head), h("tbody", {}, ...body));
  }

  function row(t, d, state, ui, opts) {
    const isBest = d.best && t.number === d.best.number;
    const pick = h("input", { type: "checkbox", checked: state.picked.has(t.number), disabled: !t.measurements.length,
      "aria-label": `plot trial ${t.number}`,
      onchange: (e) => { if (e.target.checked) state.picked.add(t.number); else state.picked.delete(t.number); renderLatency(ui, state, d); } });
    const num = h("td", { class: "num" }, String(t.number),
      t.is_baseline ? h("span", { class: "tag tag-base", text: "baseline" }) : null,
      isBest ? h("span", { class: "tag tag-best", text: "best" }) : null);
    const st = h("td", {}, h("span", { class: `badge st-${t.status}`, text: t.status }));
    const cap = h("td", { class: "num" + (isBest ? " strong" : "") }, t.capacity_users === null ? "–" : String(t.capacity_users));
    const cfg = configText(t, d);
    const allCfg = Object.entries(t.params).filter(([, v]) => v !== null).map(([k, v]) => `${k}=${v}`).join("\n");
    const config = h("td", { class: "config", title: allCfg || "all defaults" },
      ...(cfg.length ? cfg.map((c) => h("span", { class: "chip", text: c })) : [h("span", { class: "muted", text: "defaults" })]));
    const steps = h("td", { class: "steps" }, ...[...t.measurements].sort((a, b) => a.users - b.users).map((m) =>
      h("span", { class: "step " + (m.meets_slo ? "pass" : "miss"), title: m.meets_slo ? "meets both P90 targets" : "misses a P90 target" },
        h("b", { text: String(m.users) }), ` ${s(m.p90_ttft_s)} · ${ms(m.p90_tpot_s)}`)));
    if (t.status === "running" && !t.measurements.length) steps.append(h("span", { class: "muted", text: "starting…" }));
    const pk = t.predicted_kv_capacity_tokens, mk = t.measured_kv_capacity_tokens;
    const kv = h("td", { class: "num" }, `${tokens(pk)} / ${tokens(mk)}`,
      pk && mk ? h("span", { class: "muted", text: ` (${Math.round((100 * mk) / pk)} %)` }) : null);
    const fail = h("td", { class: "failure" });
    if (t.failure_class) {
      fail.append(h("span", { class: "fclass", text: t.failure_class }));
      if (t.failure_reason) fail.append(h("div", { class: "reason", title: t.failure_reason, text: t.failure_reason }));
    }
    const logUrl = opts.logUrl ? opts.logUrl(t) : null;
    if (logUrl) fail.append(h("a", { href: logUrl, target: "_blank", rel: "noopener", class: "log-link", text: "server log" }));
    else if (t.log_path && opts.showLogPath) fail.append(h("div", { class: "muted path", text: t.log_path }));
    const duration = h("td", { class: "num" }, t.status === "running" ? "running" : dur(t.duration_s));
    return h("tr", { class: `st-row-${t.status}` + (isBest ? " best-row" : ""), "data-trial": t.number },
      h("td", {}, pick), num, st, cap, config, steps, kv, fail, duration);
  }

  return { create, STATUS_COLORS };
})();
