// Inline SVG charts: the fidelity mix as one stacked bar, calls over time as columns, meters as bars.
import { h } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";

function s(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/** FIDELITY lists the labels in ladder order. */
export const FIDELITY = ["A_executed", "B_twin", "B_replayed", "B_inferred", "B_simulated"];

/** fidelityMix draws the calls per fidelity label as one stacked bar with a legend. */
export function fidelityMix(mix, title) {
  const total = FIDELITY.reduce((n, k) => n + (mix[k] || 0), 0);
  const label = `${title}: ` + (total ? FIDELITY.filter((k) => mix[k]).map((k) => `${k} ${mix[k]}`).join(", ") : "no calls yet");
  const svg = s("svg", { viewBox: "0 0 100 6", preserveAspectRatio: "none", class: "mix", role: "img", "aria-label": label });
  svg.append(s("title", {}, label));
  let x = 0;
  if (!total) svg.append(s("rect", { x: 0, y: 0, width: 100, height: 6, class: "f-none" }));
  for (const k of FIDELITY) {
    const n = mix[k] || 0;
    if (!n) continue;
    const w = (100 * n) / total;
    svg.append(s("rect", { x, y: 0, width: w, height: 6, class: `f-${k}` }, s("title", {}, `${k}: ${n}`)));
    x += w;
  }
  const legend = h("ul", { class: "legend" }, FIDELITY.filter((k) => mix[k]).map((k) =>
    h("li", {}, h("span", { class: `swatch f-${k}` }), `${k} ${mix[k]} (${((100 * mix[k]) / total).toFixed(0)}%)`)));
  return h("figure", { class: "chart" }, h("figcaption", {}, title), svg, total ? legend : h("p", { class: "muted" }, "No calls yet."));
}

/** callsOverTime draws counts per time bucket as columns; points are {t: Date, n: number}. */
export function callsOverTime(points, title) {
  const label = `${title}: ${points.reduce((n, p) => n + p.n, 0)} calls`;
  if (!points.length) return h("figure", { class: "chart" }, h("figcaption", {}, title), h("p", { class: "muted" }, "No calls yet."));
  const t0 = Math.min(...points.map((p) => p.t.getTime()));
  const t1 = Math.max(...points.map((p) => p.t.getTime()));
  const span = Math.max(t1 - t0, 1);
  const unit = span > 2 * 86400e3 ? 86400e3 : span > 2 * 3600e3 ? 3600e3 : span > 120e3 ? 60e3 : 1e3;
  const buckets = new Map();
  for (const p of points) {
    const b = Math.floor((p.t.getTime() - t0) / unit);
    buckets.set(b, (buckets.get(b) || 0) + p.n);
  }
  const nb = Math.max(...buckets.keys()) + 1;
  const max = Math.max(...buckets.values());
  const W = 300, H = 80;
  const bw = W / nb;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H + 12}`, class: "cols", role: "img", "aria-label": label });
  svg.append(s("title", {}, label));
  svg.append(s("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" }));
  for (const [b, n] of [...buckets.entries()].sort((a, c) => a[0] - c[0])) {
    const bh = (H - 4) * (n / max);
    svg.append(s("rect", { x: b * bw + bw * 0.1, y: H - bh, width: Math.max(bw * 0.8, 1), height: bh, class: "col" },
      s("title", {}, `${new Date(t0 + b * unit).toLocaleString()}: ${n}`)));
  }
  const unitName = { 1000: "second", 60000: "minute", 3600000: "hour", 86400000: "day" }[unit];
  svg.append(s("text", { x: 0, y: H + 10, class: "tick" }, new Date(t0).toLocaleTimeString()));
  return h("figure", { class: "chart" }, h("figcaption", {}, `${title} (per ${unitName}, peak ${max})`), svg);
}

/** meter draws used against limit as a bar (no limit: the bar shows usage alone). */
export function meter(name, used, limit, unit) {
  const frac = limit ? Math.min(used / limit, 1) : 0;
  const label = `${name}: ${fmt(used)} ${unit}` + (limit ? ` of ${fmt(limit)} (${(100 * used / limit).toFixed(0)}%)` : " (no limit)");
  const svg = s("svg", { viewBox: "0 0 100 4", preserveAspectRatio: "none", class: "meter", role: "img", "aria-label": label },
    s("rect", { x: 0, y: 0, width: 100, height: 4, class: "track" }),
    s("rect", { x: 0, y: 0, width: limit ? 100 * frac : 0, height: 4, class: frac >= 1 ? "over" : frac > 0.8 ? "near" : "fill" }));
  return h("div", { class: "meterrow" }, h("div", { class: "metername" }, name, h("span", { class: "muted" }, label.slice(name.length + 1))), svg);
}

function fmt(x) {
  return Number.isInteger(x) ? String(x) : Number(x).toFixed(2);
}
