// `tuner compare` report: the studies side by side, their capacity per node and per GPU, KV
// capacity and cost, and capacity against scaled SLO targets. Draws with TunerCharts (charts.js);
// every text from the data goes through textContent.
"use strict";

const TunerCompare = (() => {
  const PALETTE = ["#2563eb", "#db2777", "#0891b2", "#ea580c", "#7c3aed", "#65a30d", "#0d9488", "#c026d3"];
  const MODES = { both: "both targets scaled", ttft: "TTFT target scaled", tpot: "TPOT target scaled" };
  const MODE_DASH = { both: undefined, ttft: "6 4", tpot: "2 3" };
  const COVERAGE = { exact: "measured around it", bracketed: "between two stored points", at_least: "at least (nothing measured above)",
                     fewer_than: "fewer than the smallest stored point", no_points: "no stored points" };
  const fmt = TunerCharts.fmt;

  const h = TunerCharts.h;
  const card = (title, help, ...body) => h("section", { class: "card" }, h("h3", { text: title }),
    help ? h("p", { class: "help", text: help }) : null, ...body);
  const hw = (r) => `${r.hardware.nodes > 1 ? r.hardware.nodes + " x " : ""}${r.hardware.gpus_per_node}x ${r.hardware.gpu.toUpperCase()}`;
  const users = (x) => `${x.at_search_limit ? "≥ " : ""}${x.capacity_users}`;  // a lower bound at the search limit
  const money = (v) => (v === null || v === undefined ? "–" : v < 1 ? v.toFixed(3) : v.toFixed(2));

  function render(root, d) {
    const rows = d.studies;
    const color = (i) => PALETTE[i % PALETTE.length];
    const table = h("table", { class: "trials compare-table", id: "compare-table" });
    const cols = ["study", "hardware", "quantization", "backend", "best (users)", "per node", "per GPU", "KV capacity",
      "cost per user-hour", "bottleneck of the best"];
    const body = rows.flatMap((r, i) => {
      const b = r.best;
      const kv = r.kv_capacity_tokens;
      const cfg = b ? Object.entries(b.changes_from_baseline).map(([k, v]) => h("span", { class: "chip", text: `${k}=${v}` })) : [];
      const neck = r.bottleneck && r.bottleneck.sentence
        ? [r.bottleneck.binding ? h("span", { class: "why-cause", "data-cause": r.bottleneck.binding,
            style: { background: (TunerWhy.CAUSE_COLORS || {})[r.bottleneck.binding] || "#6b7280" }, text: r.bottleneck.binding.replace(/_/g, " ") }) : null,
           h("div", { class: "why-sentence", text: r.bottleneck.sentence })]
        : [h("span", { class: "muted", text: "–" })];
      const row = h("tr", { class: "compare-study", "data-study": r.name },
        h("td", {}, h("span", { class: "swatch", style: { borderColor: color(i) } }), h("b", { text: r.name }),
          h("div", { class: "muted", text: `${r.action}, ${r.trials.launched} trials (budget ${r.trials.budget}` +
            `${r.cross_seeded && r.cross_seeded.length ? `, ${r.cross_seeded.length} cross-seeded` : ""})` })),
        h("td", { text: hw(r) }),
        h("td", { text: r.quantization ? r.quantization.label : "–",
                  title: r.quantizations_searched.length ? `searched: ${r.quantizations_searched.join(", ")}` : null }),
        h("td", { text: r.backend_kind }),
        h("td", { class: "num strong", text: b ? users(b) : "–",
                  title: b && b.at_search_limit ? "meets both targets at the capacity search's largest user count: at least this many" : null }),
        h("td", { class: "num", text: b ? fmt(b.capacity_per_node) : "–" }),
        h("td", { class: "num", text: b && b.capacity_per_gpu !== null ? (+b.capacity_per_gpu.toPrecision(3)).toString() : "–" }),
        h("td", { class: "num", text: kv && kv.total ? `${fmt(kv.total)}${kv.pools > 1 ? ` (${kv.pools} x ${fmt(kv.per_pool)})` : ""}` : "–" }),
        h("td", { class: "num", text: r.cost ? money(r.cost.per_user_hour) : "–",
                  title: r.cost ? `${money(r.cost.per_deployment_hour)} per hour for ${r.hardware.gpus} GPUs` : "no cost given" }),
        h("td", { class: "compare-neck" }, ...neck));
      const config = h("tr", { class: "compare-config", "data-study": r.name },
        h("td", { colspan: String(cols.length) }, h("div", { class: "compare-chips" },
          h("span", { class: "muted", text: b ? `best trial ${b.trial}:` : "" }),
          ...(cfg.length ? cfg : [h("span", { class: "muted", text: b ? "the baseline (SGLang defaults)" : "no completed trial" })]))));
      return [row, config];
    });
    table.replaceChildren(h("thead", {}, h("tr", {}, ...cols.map((c) => h("th", { text: c })))), h("tbody", {}, ...body));

    const sizes = [...new Set(rows.flatMap((r) => r.kv_room_by_attention_dp.map((k) => k.attn_dp_size)))].sort((a, b) => a - b);
    const room = h("table", { class: "trials compare-kv-room", id: "compare-kv-room" },
      h("thead", {}, h("tr", {}, h("th", { text: "study" }), ...sizes.map((n) => h("th", { text: `attention-DP ${n}` })))),
      h("tbody", {}, ...rows.map((r) => h("tr", { "data-study": r.name }, h("td", { text: r.name }), ...sizes.map((n) => {
        const k = r.kv_room_by_attention_dp.find((x) => x.attn_dp_size === n);
        if (!k) return h("td", { class: "muted", text: "–" });
        if (!k.fits) return h("td", { class: "miss", text: "does not fit", title: k.reason || "" });
        return h("td", { class: "num", text: `${fmt(k.kv_tokens_total)}${n > 1 ? ` (${n} x ${fmt(k.kv_tokens_per_pool)})` : ""}` });
      })))));
    const same = sameConfiguration(d.same_configuration || [], rows);
    const bars = h("div", { class: "chart-box", id: "chart-compare-bars" });
    const overview = h("div", { class: "chart-box", id: "chart-capacity-slo" });
    const per = rows.map((r, i) => h("div", { class: "chart-box", id: `chart-slo-${i}`, "data-study": r.name }));
    root.replaceChildren(
      h("section", { class: "card wide" }, h("h3", { text: "Side by side" }), h("div", { class: "table-wrap" }, table)),
      h("section", { class: "card wide" }, h("h3", { text: "KV room by attention-DP size" }),
        h("p", { class: "help", text: "The planner's KV capacity (tokens; pools x tokens per pool) of each study's checkpoint on its hardware at each attention-DP size, expert parallelism across the node, SGLang's defaults otherwise: how much room the weights leave for context. No trial needed." }),
        h("div", { class: "table-wrap" }, room)),
      same ? h("section", { class: "card wide" }, h("h3", { text: "Same configuration across studies" }),
        h("p", { class: "help", text: "Each study's best configuration as the other studies ran it (users served): the hardware compared at one configuration, not only at what each search found. A configuration takes each study's own checkpoint, and a smaller HiCache ratio where the node's host memory needs it; cells say why it cannot run there, or that it was not tried (tuner compare --cross-seed runs it)." }),
        h("div", { class: "table-wrap" }, same)) : null,
      h("div", { class: "grid compare-grid" },
        card("Capacity, KV room and cost", "Best capacity of each study per node and per GPU, the KV capacity of its best configuration, and the cost per served user-hour where costs were given.", bars),
        card("Capacity against the SLO target", "Users the best stored trial serves with both P90 targets scaled from each study's own (1 = the study's targets). From stored load points only: hollow points are not bracketed by them (at least / between / fewer than).", overview)),
      h("div", { class: "grid compare-grid" }, ...rows.map((r, i) => card(`${r.name}: capacity against target`,
        `P90 TTFT ${r.slo.p90_ttft_s} s, P90 TPOT ${+(r.slo.p90_tpot_s * 1000).toPrecision(3)} ms at 1x; each target scaled alone and both together.`, per[i]))));

    const groups = [
      { title: "Capacity per node", unit: "users", items: rows.map((r, i) => ({ label: r.name, value: r.best ? r.best.capacity_per_node : null, color: color(i) })) },
      { title: "Capacity per GPU", unit: "users", items: rows.map((r, i) => ({ label: r.name, value: r.best ? r.best.capacity_per_gpu : null, color: color(i) })), fmt: (v) => (+v.toPrecision(3)).toString() },
      { title: "KV capacity", unit: "tokens", items: rows.map((r, i) => ({ label: r.name, value: r.kv_capacity_tokens ? r.kv_capacity_tokens.total : null, color: color(i) })) },
    ];
    if (rows.some((r) => r.cost && r.cost.per_user_hour)) {
      groups.push({ title: "Cost per user-hour", unit: "per user-hour", items: rows.map((r, i) => ({ label: r.name, value: r.cost ? r.cost.per_user_hour : null, color: color(i) })), fmt: money });
    }
    const short = rows.map((r) => `${r.hardware.gpu.toUpperCase()} ${r.quantization ? r.quantization.label : ""}`.trim());
    const unique = new Set(short).size === short.length;
    for (const g of groups) g.items.forEach((it, i) => { it.label = unique ? short[i] : (it.label.length > 14 ? "…" + it.label.slice(-13) : it.label); });
    TunerCharts.compare(bars, { groups, empty: "no study has a completed trial" });

    const pts = (r, mode) => r.capacity_vs_slo.filter((p) => p.mode === mode).map((p) => ({
      x: p.scale, y: p.capacity_users === null ? (p.coverage === "fewer_than" ? 0 : null) : p.capacity_users,
      marker: p.coverage === "exact" ? undefined : "open",
      title: `${r.name} at ${p.scale}x (P90 TTFT ${+p.p90_ttft_s.toPrecision(3)} s, TPOT ${+(p.p90_tpot_s * 1000).toPrecision(3)} ms): ` +
        `${p.capacity_users === null ? "fewer than " + p.upper_bound_users : p.capacity_users} users — ${COVERAGE[p.coverage] || p.coverage}`,
    }));
    TunerCharts.line(overview, { series: rows.map((r, i) => ({ name: r.name, color: color(i), points: pts(r, "both") })),
      refs: [{ y: 0, label: "", color: "#e5e7eb" }], xLabel: "SLO targets (x the study's)", yLabel: "capacity (users)", yMin: 0,
      empty: "no stored load points" });
    rows.forEach((r, i) => TunerCharts.line(per[i], {
      series: Object.keys(MODES).map((m) => ({ name: MODES[m], color: color(i), dash: MODE_DASH[m], points: pts(r, m) })),
      xLabel: "target (x the study's)", yLabel: "capacity (users)", yMin: 0, empty: "no stored load points" }));
  }

  function sameConfiguration(list, rows) {
    if (!list.length) return null;
    const names = rows.map((r) => r.name);
    const cell = (c) => {
      if (c.trial === null) return h("td", { class: "muted", text: "–", title: c.reason || "", "data-study": c.study });
      const served = c.capacity_users === null ? "–" : users(c);
      const note = c.status === "complete" ? null : h("div", { class: "muted", text: c.status === "pruned" ? "stopped early: at least" : c.status });
      const chips = (c.changed || []).map((k) => h("span", { class: "chip", text: `${k}=${c.params[k]}` }));
      return h("td", { class: "num", "data-study": c.study, title: `trial ${c.trial}` }, h("b", { text: served }), note,
        chips.length ? h("div", { class: "compare-chips" }, ...chips) : null);
    };
    return h("table", { class: "trials compare-same", id: "compare-same" },
      h("thead", {}, h("tr", {}, h("th", { text: "best configuration of" }), ...names.map((n) => h("th", { text: n })))),
      h("tbody", {}, ...list.map((r) => h("tr", { "data-source": r.source },
        h("td", {}, h("b", { text: r.source }), h("div", { class: "muted", text: `trial ${r.source_trial}` })),
        ...names.map((n) => { const c = r.in.find((x) => x.study === n); return c ? cell(c) : h("td", { class: "muted", text: "–" }); })))));
  }

  return { render };
})();
