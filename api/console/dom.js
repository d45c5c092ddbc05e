// Small DOM helpers: elements are built with textContent, never from HTML strings.

/** h makes an element: attrs (on* are listeners, class, other attributes), then children (strings or nodes). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** fill replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** table renders rows under a header; cells are strings or nodes. It scrolls sideways on narrow screens. */
export function table(caption, headers, rows) {
  return h("div", { class: "scroll", tabindex: 0, role: "region", "aria-label": caption },
    h("table", {},
      h("caption", { class: "sr" }, caption),
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))
        : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "None yet.")))));
}

/** pct formats a percentage. */
export function pct(x) {
  return x === undefined || x === null ? "–" : `${Number(x).toFixed(1)}%`;
}

/** badge is a labelled status or fidelity chip. */
export function badge(text, kind) {
  return h("span", { class: `badge ${kind || text || ""}` }, text || "–");
}

/** when formats a timestamp in the reader's locale. */
export function when(ts) {
  if (!ts) return "–";
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toLocaleString();
}

/** errorBox shows an API error with its request id. */
export function errorBox(err) {
  const env = (err && err.envelope) || {};
  return h("p", { class: "error", role: "alert" }, err.message || String(err),
    env.requestId ? h("small", {}, ` (request ${env.requestId})`) : null);
}

/** short shortens a hash for display; the whole is in the title. */
export function short(hash) {
  if (!hash) return "–";
  return h("code", { title: hash }, hash.length > 22 ? hash.slice(0, 19) + "…" : hash);
}
