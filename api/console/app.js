// The console: a hash-routed single page over /trpc. Routes: #/ environments, #/env/<slug>, #/env/<slug>/session/<id>,
// #/usage, #/keys; #/signin when there is no web session.
import { h, fill, table, pct, badge, when, errorBox } from "./dom.js";
import { query, mutate, session, signIn, signOut, APIError } from "./trpc.js";
import { meter } from "./charts.js";
import { envPage } from "./env.js";
import { sessionPage } from "./session.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
let me = null;
let ended = "";
let stop = () => {};

/** poller runs fn every ms until the page changes; pages register theirs through ctx.every. */
function every(fn, ms) {
  const id = setInterval(fn, ms);
  const prev = stop;
  stop = () => { clearInterval(id); prev(); };
}

async function route() {
  stop();
  stop = () => {};
  const path = location.hash.replace(/^#/, "") || "/";
  if (!me) {
    try {
      const s = await session();
      if (s.signedIn) me = s;
      else ended = s.detail || "";
    } catch {
      me = null;
    }
  }
  nav.hidden = !me;
  if (!me) return show(signInPage());
  document.getElementById("who").textContent = `${me.workspace.name} · ${me.key.prefix}`;
  const ctx = { main, every, go, title };
  let m;
  try {
    if (path === "/" || path === "/envs") await envsPage(ctx);
    else if ((m = path.match(/^\/env\/([^/]+)\/session\/([^/]+)$/))) await sessionPage(ctx, decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    else if ((m = path.match(/^\/env\/([^/]+)$/))) await envPage(ctx, decodeURIComponent(m[1]));
    else if (path === "/usage") await usagePage(ctx);
    else if (path === "/keys") await keysPage(ctx);
    else show(h("section", {}, h("h1", { tabindex: -1 }, "Not found"), h("p", {}, h("a", { href: "#/" }, "Environments"))));
  } catch (err) {
    if (err instanceof APIError && err.status === 401) {
      me = null;
      location.hash = "#/signin";
      return route();
    }
    show(h("section", {}, h("h1", { tabindex: -1 }, "Something went wrong"), errorBox(err)));
  }
}

function show(node) {
  fill(main, node);
  const h1 = main.querySelector("h1");
  if (h1) h1.focus({ preventScroll: true });
}

function title(t) {
  document.title = `${t} · doppel`;
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function signInPage() {
  title("Sign in");
  const key = h("input", { id: "key", name: "key", type: "password", autocomplete: "current-password", required: true,
    placeholder: "mk_live_…", spellcheck: false });
  const msg = h("div", { "aria-live": "polite" });
  const form = h("form", { class: "card narrow", id: "signin",
    onsubmit: async (e) => {
      e.preventDefault();
      fill(msg);
      try {
        me = await signIn(key.value.trim());
        key.value = "";
        ended = "";
        go(location.hash && location.hash !== "#/signin" ? location.hash : "#/");
      } catch (err) {
        fill(msg, errorBox(err));
      }
    } },
    h("h1", { tabindex: -1 }, "Sign in"),
    h("p", {}, "Sign in with a workspace key. The console keeps a session cookie for it; the key itself is not stored."),
    ended ? h("p", { class: "muted", role: "status" }, `Your last session ended: ${ended}`) : null,
    h("label", { for: "key" }, "Workspace key"), key,
    h("button", { type: "submit", class: "primary" }, "Sign in"), msg);
  return form;
}

async function envsPage(ctx) {
  title("Environments");
  const envs = (await query("envs.list")) || [];
  show(h("section", {},
    h("h1", { tabindex: -1 }, "Environments"),
    h("p", { class: "muted" }, `${envs.length} in this workspace. Each is built from the traces collected under its project.`),
    table("Environments", ["Environment", "Status", "Headline", "Traces", "Tools", "Covered", "Simulated", "Twin"],
      envs.map((e) => [
        h("a", { href: `#/env/${encodeURIComponent(e.slug)}`, class: "envlink" }, e.name || e.slug),
        badge(e.status), e.headline || "–", String(e.n_traces), String(e.n_tools), pct(e.covered_pct),
        pct(e.simulated_pct), badge(e.twin_state || "stopped")]))));
}

async function usagePage(ctx) {
  title("Usage");
  const u = await query("usage.get");
  const tm = u.taskMinutes || {};
  show(h("section", {},
    h("h1", { tabindex: -1 }, "Usage"),
    h("p", { class: "muted" }, `Plan ${u.plan || "default"} · period ${when(u.periodStart)} – ${when(u.periodEnd)} · card on file: ${u.cardOnFile ? "yes" : "no"}`),
    h("div", { class: "card" },
      meter("task minutes", tm.used || 0, tm.limit, "minutes"),
      (u.meters || []).map((m) => meter(m.env ? `${m.name} (${m.env})` : m.name, m.used, m.limit, m.unit)))));
}

async function keysPage(ctx) {
  title("Keys");
  const keys = (await query("keys.list")) || [];
  const shown = h("div", { "aria-live": "polite" });
  const name = h("input", { id: "keyname", name: "name", required: true, maxlength: 100, placeholder: "ci" });
  const kind = h("select", { id: "keykind", name: "kind" }, h("option", { value: "workspace" }, "workspace key (mk_live_)"),
    h("option", { value: "mcp" }, "MCP token (mcp_at_)"));
  const create = h("form", { class: "card row",
    onsubmit: async (e) => {
      e.preventDefault();
      try {
        const k = await mutate("keys.create", { name: name.value, kind: kind.value });
        await keysPage(ctx);
        fill(main.querySelector("[aria-live]"), h("p", { class: "ok" }, "New key — copy it now, it is shown only once: ",
          h("code", { class: "secret" }, k.key)));
      } catch (err) {
        fill(shown, errorBox(err));
      }
    } },
    h("label", { for: "keyname" }, "Name"), name, h("label", { for: "keykind" }, "Kind"), kind,
    h("button", { type: "submit", class: "primary" }, "Create key"));
  show(h("section", {},
    h("h1", { tabindex: -1 }, "Keys"),
    h("p", { class: "muted" }, "Revoking a key ends every console session signed in with it."),
    shown, create,
    table("Keys", ["Name", "Kind", "Key", "Created", "Last used", "Status", ""], keys.map((k) => [
      k.name, k.kind, h("code", {}, k.prefix), when(k.created_at), when(k.last_used_at),
      k.revoked_at ? badge("revoked", "failed") : badge("active", "ready"),
      k.revoked_at || k.id === me.key.id ? (k.id === me.key.id ? h("span", { class: "muted" }, "this session") : "") :
        h("button", { type: "button", onclick: async () => {
          if (!confirm(`Revoke ${k.name}? Anything using it stops working.`)) return;
          try {
            await mutate("keys.revoke", { id: k.id });
            await keysPage(ctx);
          } catch (err) {
            fill(shown, errorBox(err));
          }
        } }, "Revoke")]))));
}

document.getElementById("signout").addEventListener("click", async () => {
  await signOut();
  me = null;
  go("#/signin");
});
window.addEventListener("hashchange", route);
route();
