// Live dashboard: polls the read-only JSON API and redraws what changed.
"use strict";

(() => {
  const POLL_MS = 3000;
  const $ = (id) => document.getElementById(id);
  const etags = {};
  let current = null, view = null, importanceKey = null, lastData = null;

  async function getJSON(url) {
    const headers = etags[url] ? { "If-None-Match": etags[url].tag } : {};
    const r = await fetch(url, { headers, cache: "no-cache" });
    if (r.status === 304) return { changed: false, body: etags[url].body };
    if (!r.ok) {
      let msg = `${r.status} ${r.statusText}`;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    const body = await r.json();
    const tag = r.headers.get("ETag");
    if (tag) etags[url] = { tag, body };
    return { changed: true, body };
  }

  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const dash = (v) => (v === null || v === undefined ? "–" : String(v));

  function setStatus(text, bad) {
    const el = $("conn");
    el.textContent = text;
    el.className = bad ? "conn bad" : "conn";
  }

  function renderStudies(rows) {
    const table = $("studies");
    const head = h("tr", {}, ...["study", "backend", "state", "trials done", "best (users)", "baseline (users)", "target (users)"].map((c) => h("th", { text: c })));
    const body = rows.map((r) => {
      const link = h("a", { href: `#study=${encodeURIComponent(r.name)}`, text: r.name });
      const running = (r.counts && r.counts.running) || 0;
      return h("tr", { class: r.name === current ? "selected" : "", "data-study": r.name },
        h("td", {}, link), h("td", { text: r.backend_kind }),
        h("td", {}, h("span", { class: `badge st-${r.status === "running" ? "running" : "complete"}`, text: r.status + (running ? ` · ${running} running` : "") })),
        h("td", { class: "num", text: `${r.trials_launched} / ${r.trials_budget}` }),
        h("td", { class: "num strong", text: dash(r.best_capacity_users) }),
        h("td", { class: "num", text: dash(r.baseline_capacity_users) }),
        h("td", { class: "num", text: dash(r.target_users) }));
    });
    table.replaceChildren(h("thead", {}, head), h("tbody", {}, ...body));
    $("no-studies").hidden = rows.length > 0;
    if (!current && rows.length && !location.hash) location.hash = `study=${encodeURIComponent(rows[rows.length - 1].name)}`;
  }

  function selected() {
    const m = /^#study=(.+)$/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }

  async function refreshStudy() {
    if (!current) return;
    const base = `api/studies/${encodeURIComponent(current)}`;
    const { changed, body } = await getJSON(base);
    if (!changed && view) return;
    lastData = body;
    $("study-title").textContent = `Study ${body.name}`;
    const sum = $("summary");
    // summary_html is built server-side with every database value HTML-escaped (tuner.report.html).
    sum.innerHTML = body.summary_html;
    // the simulator-against-measurements section, escaped server-side too (tuner.report.ledger)
    $("ledger").innerHTML = body.ledger_html || "";
    if (!view) view = TunerView.create($("study-view"), { logUrl: (t) => (t.log_available ? `${base}/trials/${t.number}/log` : null) });
    const key = `${current}:${body.trials.filter((t) => t.status !== "running").length}`;
    view.update(body);
    if (key !== importanceKey) {
      importanceKey = key;
      const imp = await getJSON(`${base}/importance`);
      view.update(lastData, imp.body);
    }
  }

  async function tick() {
    try {
      const { body } = await getJSON("api/studies");
      const want = selected();
      if (want !== current) { current = want; view = null; importanceKey = null; $("study-view").replaceChildren(); $("summary").replaceChildren(); $("ledger").replaceChildren(); }
      renderStudies(body.studies);
      $("study").hidden = !current;
      await refreshStudy();
      setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
    } catch (e) {
      setStatus(`cannot refresh: ${e.message}`, true);
    }
  }

  window.addEventListener("hashchange", tick);
  const loop = async () => { await tick(); setTimeout(loop, POLL_MS); };
  loop();
})();
