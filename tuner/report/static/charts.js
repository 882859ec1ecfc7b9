// Small SVG charts for the tuner dashboard and reports. No dependencies, no network.
// Every text from the data goes through textContent, never through HTML parsing.
"use strict";

const TunerCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const M = { top: 14, right: 18, bottom: 44, left: 62 };

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    const t = el("text", Object.assign({ x, y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function title(node, s) {
    const t = el("title", {}, node);
    t.textContent = s;
  }
  function svgFor(container, height) {
    container.replaceChildren();
    const width = Math.max(320, Math.round(container.clientWidth || 560));
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", height, class: "chart",
                             role: "img", preserveAspectRatio: "xMidYMid meet" }, container);
    return { svg, width, height };
  }
  function empty(container, message, height) {
    const { svg, width } = svgFor(container, height || 120);
    text(svg, width / 2, (height || 120) / 2, message, { class: "chart-empty", "text-anchor": "middle" });
    return svg;
  }

  // "Nice" tick values for a linear axis.
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const span = hi - lo, raw = span / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= n) || 10 * mag;
    const ticks = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
    return ticks;
  }
  function logTicks(lo, hi) {
    const ticks = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++)
      for (const m of [1, 2, 5]) { const v = m * Math.pow(10, e); if (v >= lo * 0.999 && v <= hi * 1.001) ticks.push(v); }
    return ticks;
  }
  // One element builder for every view: {class, text, style (an object: CSSOM, which the pages' CSP
  // allows), on<event>: handler, any other attribute}, then the children.
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k === "style") Object.assign(e.style, v);  // CSSOM, which the dashboard's CSP allows
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    const trim = (x) => (x.includes(".") ? x.replace(/0+$/, "").replace(/\.$/, "") : x);
    if (a >= 1e6) return trim((v / 1e6).toPrecision(3)) + "M";
    if (a >= 1e4) return trim((v / 1e3).toPrecision(3)) + "k";
    if (a >= 100 || Number.isInteger(v)) return String(Math.round(v));
    return String(+v.toPrecision(3));
  }

  function scale(d0, d1, r0, r1, log) {
    if (log) {
      const l0 = Math.log10(d0), l1 = Math.log10(d1);
      return (v) => r0 + (Math.log10(Math.max(v, d0)) - l0) / (l1 - l0 || 1) * (r1 - r0);
    }
    return (v) => r0 + (v - d0) / ((d1 - d0) || 1) * (r1 - r0);
  }

  function axes(svg, o) {
    const { x0, x1, y0, y1, xt, yt, xs, ys, xLabel, yLabel, yFmt, xFmt } = o;
    const g = el("g", { class: "axes" }, svg);
    for (const v of yt) {
      const y = ys(v);
      el("line", { x1: x0, x2: x1, y1: y, y2: y, class: "grid" }, g);
      text(g, x0 - 6, y + 4, (yFmt || fmt)(v), { "text-anchor": "end", class: "tick" });
    }
    for (const v of xt) {
      const x = xs(v);
      el("line", { x1: x, x2: x, y1: y0, y2: y0 + 4, class: "axis" }, g);
      text(g, x, y0 + 17, (xFmt || fmt)(v), { "text-anchor": "middle", class: "tick" });
    }
    el("line", { x1: x0, x2: x1, y1: y0, y2: y0, class: "axis" }, g);
    el("line", { x1: x0, x2: x0, y1: y0, y2: y1, class: "axis" }, g);
    text(g, (x0 + x1) / 2, y0 + 36, xLabel, { "text-anchor": "middle", class: "axis-label" });
    text(g, 0, 0, yLabel, { "text-anchor": "middle", class: "axis-label",
                            transform: `translate(14 ${(y0 + y1) / 2}) rotate(-90)` });
  }

  // Line/scatter chart. spec: {series:[{name,color,points:[{x,y,marker,title}],dash,step,noLine}],
  //   refs:[{y,label,color}], xLabel, yLabel, yLog, xMin, yMin, height, yFmt}
  function line(container, spec) {
    const pts = spec.series.flatMap((s) => s.points.filter((p) => p.y !== null && p.y !== undefined));
    if (!pts.length) return empty(container, spec.empty || "no data yet", spec.height || 260);
    const H = spec.height || 260;
    const { svg, width } = svgFor(container, H);
    const refs = spec.refs || [];
    const ysAll = pts.map((p) => p.y).concat(refs.map((r) => r.y));
    const xsAll = pts.map((p) => p.x);
    let xlo = spec.xMin !== undefined ? Math.min(spec.xMin, ...xsAll) : Math.min(...xsAll);
    let xhi = Math.max(...xsAll);
    if (xhi === xlo) { xhi = xlo + 1; xlo = Math.max(0, xlo - 1); }
    const positive = ysAll.filter((v) => v > 0);
    const yLog = spec.yLog === "auto" ? positive.length === ysAll.length && Math.max(...positive) / Math.min(...positive) > 80 : !!spec.yLog;
    let ylo, yhi, yt;
    if (yLog) {
      ylo = Math.pow(10, Math.floor(Math.log10(Math.min(...positive))));
      yhi = Math.pow(10, Math.ceil(Math.log10(Math.max(...positive))));
      yt = logTicks(ylo, yhi);
      if (yt.length > 9) yt = yt.filter((v) => Math.abs(Math.log10(v) % 1) < 1e-9);
    } else {
      ylo = spec.yMin !== undefined ? Math.min(spec.yMin, ...ysAll) : Math.min(...ysAll);
      yhi = Math.max(...ysAll) * 1.08;
      if (yhi === ylo) yhi = ylo + 1;
      yt = niceTicks(ylo, yhi, 5);
      yhi = Math.max(yhi, yt[yt.length - 1]);
    }
    const x0 = M.left, x1 = width - M.right, y0 = H - M.bottom, y1 = M.top;
    const xs = scale(xlo, xhi, x0, x1, false), ys = scale(ylo, yhi, y0, y1, yLog);
    const xt = niceTicks(xlo, xhi, Math.max(3, Math.floor((x1 - x0) / 70))).filter((v) => v >= xlo && v <= xhi && (!spec.xInt || Number.isInteger(v)));
    axes(svg, { x0, x1, y0, y1, xt, yt, xs, ys, xLabel: spec.xLabel, yLabel: spec.yLabel, yFmt: spec.yFmt });
    for (const r of refs) {
      const y = ys(r.y);
      el("line", { x1: x0, x2: x1, y1: y, y2: y, class: "ref", stroke: r.color || "#b91c1c" }, svg);
      text(svg, x1 - 4, y - 5, r.label, { "text-anchor": "end", class: "ref-label", fill: r.color || "#b91c1c" });
    }
    for (const s of spec.series) {
      const p = s.points.filter((q) => q.y !== null && q.y !== undefined);
      const g = el("g", { class: "series" }, svg);
      if (p.length > 1 && !s.noLine) {
        let d = "";
        p.forEach((q, i) => {
          const X = xs(q.x), Y = ys(q.y);
          if (i === 0) d += `M${X},${Y}`;
          else d += s.step ? `H${X}V${Y}` : `L${X},${Y}`;
        });
        el("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 2, "stroke-dasharray": s.dash }, g);
      }
      for (const q of p) {
        const open = q.marker === "open";
        const c = el("circle", { cx: xs(q.x), cy: ys(q.y), r: q.r || 4, fill: open ? "#fff" : (q.color || s.color),
                                 stroke: q.color || s.color, "stroke-width": 2, class: "pt" }, g);
        if (q.title) title(c, q.title);
      }
    }
    legend(container, spec.series.filter((s) => s.name));
    return svg;
  }

  function legend(container, series) {
    if (!series.length) return;
    const div = document.createElement("div");
    div.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      item.className = "legend-item";
      const sw = document.createElement("span");
      sw.className = "swatch" + (s.dash ? " dashed" : "");
      sw.style.borderColor = s.color;
      item.append(sw, document.createTextNode(s.name));
      div.appendChild(item);
    }
    container.appendChild(div);
  }

  // Horizontal bars. spec: {items:[{label,value,color,title}], xLabel, valueFmt}
  function hbars(container, spec) {
    const items = spec.items;
    if (!items.length) return empty(container, spec.empty || "no data yet", 120);
    const rowH = 24, H = M.top + items.length * rowH + 40;
    const { svg, width } = svgFor(container, H);
    const labelW = Math.min(200, 12 + 7 * Math.max(...items.map((i) => i.label.length)));
    const x0 = labelW, x1 = width - 60, y0 = M.top;
    const hi = Math.max(...items.map((i) => i.value), 1e-12);
    const xs = scale(0, hi, x0, x1, false);
    items.forEach((it, k) => {
      const y = y0 + k * rowH;
      text(svg, x0 - 8, y + rowH / 2 + 4, it.label, { "text-anchor": "end", class: "tick" });
      const r = el("rect", { x: x0, y: y + 4, width: Math.max(1, xs(it.value) - x0), height: rowH - 8,
                             fill: it.color || "#2563eb", rx: 2, class: "bar" }, svg);
      if (it.title) title(r, it.title);
      text(svg, xs(it.value) + 6, y + rowH / 2 + 4, (spec.valueFmt || fmt)(it.value), { class: "tick" });
    });
    el("line", { x1: x0, x2: x0, y1: y0, y2: y0 + items.length * rowH, class: "axis" }, svg);
    text(svg, (x0 + x1) / 2, y0 + items.length * rowH + 28, spec.xLabel || "", { "text-anchor": "middle", class: "axis-label" });
    return svg;
  }

  // Side-by-side comparison panels. spec: {groups:[{title, unit, fmt, better:"higher"|"lower",
  //   items:[{label,value,color}]}]}
  function compare(container, spec) {
    const groups = spec.groups.filter((g) => g.items.some((i) => i.value !== null && i.value !== undefined));
    if (!groups.length) return empty(container, spec.empty || "no data yet", 160);
    const H = 230;
    const { svg, width } = svgFor(container, H);
    const gw = width / groups.length;
    groups.forEach((g, k) => {
      const gx = k * gw, top = 34, bottom = H - 46;
      text(svg, gx + gw / 2, 16, g.title, { "text-anchor": "middle", class: "panel-title" });
      text(svg, gx + gw / 2, 29, g.unit, { "text-anchor": "middle", class: "tick" });
      const vals = g.items.map((i) => i.value || 0);
      const hi = Math.max(...vals, 1e-12) * 1.15;
      const ys = scale(0, hi, bottom, top, false);
      const bw = Math.min(46, (gw - 30) / g.items.length - 10);
      g.items.forEach((it, j) => {
        const cx = gx + gw / 2 + (j - (g.items.length - 1) / 2) * (bw + 14);
        if (it.value === null || it.value === undefined) {
          text(svg, cx, bottom - 6, "–", { "text-anchor": "middle", class: "tick" });
        } else {
          const r = el("rect", { x: cx - bw / 2, y: ys(it.value), width: bw, height: Math.max(1, bottom - ys(it.value)),
                                 fill: it.color, rx: 2, class: "bar" }, svg);
          title(r, `${it.label}: ${(g.fmt || fmt)(it.value)} ${g.unit}`);
          text(svg, cx, ys(it.value) - 5, (g.fmt || fmt)(it.value), { "text-anchor": "middle", class: "bar-value" });
        }
        // a label wider than its bar's slot goes word by word onto lines of its own
        const words = String(it.label).split(" ");
        const lines = words.length > 1 && String(it.label).length * 6.2 > bw + 12 ? words : [String(it.label)];
        lines.forEach((w, n) => text(svg, cx, bottom + 16 + 12 * n, w, { "text-anchor": "middle", class: "tick" }));
      });
      el("line", { x1: gx + 10, x2: gx + gw - 10, y1: bottom, y2: bottom, class: "axis" }, svg);
      if (g.note) text(svg, gx + gw / 2, bottom + 40, g.note, { "text-anchor": "middle", class: "note" });
    });
    return svg;
  }

  // Parallel coordinates. spec: {axes:[{name, kind:"cat"|"num", values:[...]}], rows:[{values:{name:v},
  //   color, title, width}], height}
  function parallel(container, spec) {
    if (!spec.rows.length || spec.axes.length < 2) return empty(container, spec.empty || "no data yet", 200);
    const H = spec.height || 300;
    const { svg, width } = svgFor(container, H);
    const x0 = 40, x1 = width - 50, top = 56, bottom = H - 24;
    const n = spec.axes.length;
    const axX = (k) => x0 + (n === 1 ? 0 : k * (x1 - x0) / (n - 1));
    const pos = spec.axes.map((a) => {
      if (a.kind === "num") {
        const nums = a.values.filter((v) => typeof v === "number");
        let lo = Math.min(...nums), hi = Math.max(...nums);
        if (!(hi > lo)) { lo -= 1; hi += 1; }
        const s = scale(lo, hi, bottom, top, false);
        return { at: (v) => (typeof v === "number" ? s(v) : bottom + 16), ticks: niceTicks(lo, hi, 4).filter((t) => t >= lo && t <= hi).map((t) => [t, s(t)]) };
      }
      const keys = a.values.map((v) => JSON.stringify(v));
      const step = (bottom - top) / Math.max(1, keys.length - 1);
      const at = (v) => { const i = keys.indexOf(JSON.stringify(v)); return keys.length === 1 ? (top + bottom) / 2 : bottom - i * step; };
      return { at, ticks: a.values.map((v) => [v, at(v)]) };
    });
    const lines = el("g", { class: "pc-lines" }, svg);
    for (const r of spec.rows) {
      const d = spec.axes.map((a, k) => `${k ? "L" : "M"}${axX(k)},${pos[k].at(r.values[a.name])}`).join("");
      const p = el("path", { d, fill: "none", stroke: r.color, "stroke-width": r.width || 1.6, "stroke-opacity": r.opacity || 0.75,
                             class: "pc-line" }, lines);
      if (r.title) title(p, r.title);
    }
    spec.axes.forEach((a, k) => {
      const X = axX(k);
      el("line", { x1: X, x2: X, y1: top, y2: bottom, class: "axis" }, svg);
      // labels cycle through three rows so neighbouring names do not collide
      text(svg, X, top - 8 - 13 * (k % 3), a.label || a.name, { "text-anchor": k === 0 ? "start" : k === n - 1 ? "end" : "middle", class: "pc-axis-label" });
      for (const [v, y] of pos[k].ticks) {
        const lbl = v === null ? "default" : typeof v === "number" ? fmt(v) : String(v);
        text(svg, X + 4, y + 4, lbl, { class: "tick pc-tick" });
      }
    });
    return svg;
  }

  return { line, hbars, compare, parallel, fmt, empty, h };
})();
