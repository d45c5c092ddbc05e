// One session: its receipts, fidelity mix and state hash, a playground that calls a tool through a form generated
// from its input schema, the transcript (arguments, result, fidelity, latency) and close.
import { h, fill, table, badge, when, errorBox, short } from "./dom.js";
import { query, mutate } from "./trpc.js";
import { fidelityMix, callsOverTime } from "./charts.js";
import { schemaForm } from "./form.js";

export async function sessionPage(ctx, slug, id) {
  ctx.title(id);
  const [s, tools] = await Promise.all([query("sessions.get", { session_id: id }), query("envs.tools", { slug, format: "native" })]);
  const summary = h("div", {});
  const transcript = h("div", { id: "transcript" });
  const answer = h("div", { id: "answer", "aria-live": "polite" });
  const open = s.status === "open";

  const refresh = async () => {
    const [cur, tr] = await Promise.all([query("sessions.get", { session_id: id }), query("sessions.transcript", { session_id: id })]);
    renderSummary(summary, cur);
    renderTranscript(transcript, tr);
    return cur;
  };

  const closeBtn = h("button", { type: "button", id: "close-session", class: "danger", disabled: !open, onclick: async () => {
    closeBtn.disabled = true;
    try {
      await mutate("sessions.close", { session_id: id });
      const cur = await refresh();
      fill(answer, h("p", { class: "ok" }, `Session ${cur.status}. Its world is dropped and its token revoked.`));
      ctx.main.querySelectorAll("#playground button, #playground select").forEach((b) => { b.disabled = true; });
    } catch (err) {
      closeBtn.disabled = false;
      fill(answer, errorBox(err));
    }
  } }, "Close session");

  ctx.main.replaceChildren(h("section", { class: "session" },
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Environments"), " / ",
      h("a", { href: `#/env/${encodeURIComponent(slug)}` }, slug), " / ", id),
    h("h1", { tabindex: -1 }, "Session ", h("code", {}, id)),
    summary,
    h("h2", {}, "Playground"),
    open ? playground(tools || [], id, answer, refresh) : h("p", { class: "muted" }, `The session is ${s.status}: no more calls.`),
    answer,
    h("h2", {}, "Transcript"), transcript,
    h("p", {}, closeBtn)));
  ctx.main.querySelector("h1").focus({ preventScroll: true });
  await refresh();
}

function renderSummary(el, s) {
  const r = s.receipts || {};
  fill(el,
    h("dl", { class: "facts" },
      fact("Status", badge(s.status)), fact("Seed", String(r.seed ?? "–")), fact("Seeded", r.seeded ? "yes" : "no"),
      fact("Scenario", r.scenario || "–"), fact("Calls", String(s.n_calls)), fact("Errors", String(s.n_errors)),
      fact("Downgraded", String(s.n_downgraded)), fact("World hash", short(s.world_hash)),
      fact("State hash", h("span", { id: "state-hash" }, short(s.state_hash))), fact("Opened", when(s.created_at)),
      fact("Expires", s.status === "open" ? when(s.expires_at) : "–")),
    r.seedInstructions ? h("p", {}, "Seed instructions: ", h("q", {}, r.seedInstructions)) : null,
    r.trace ? h("p", {}, "Opened from trace ", h("code", {}, r.trace.id || "(no id)"), `: ${r.trace.used} of ${r.trace.given} calls used`,
      r.trace.firstWrite ? ` (up to the first write, ${r.trace.firstWrite})` : "", ", ", h("code", {}, short(r.trace.hash))) : null,
    r.note ? h("p", { class: "muted" }, "Note: ", r.note) : null,
    fidelityMix(s.fidelity || {}, "Fidelity mix of this session"));
}

function renderTranscript(el, tr) {
  const calls = tr.calls || [];
  fill(el,
    calls.length ? callsOverTime(calls.map((c) => ({ t: new Date(c.createdAt), n: 1 })), "Calls over time") : null,
    tr.recordOutputs ? null : h("p", { class: "muted" }, "Opened without recordOutputs: results are not kept."),
    table("Transcript", ["#", "Tool", "Arguments", "Result", "Fidelity", "Rung", "Latency", "State"], calls.map((c) => [
      String(c.seq), h("code", {}, c.name),
      h("pre", { class: "args" }, JSON.stringify(c.arguments, null, 1)),
      c.result === undefined ? h("span", { class: "muted" }, "not recorded") :
        h("pre", { class: `result${c.error ? " err" : ""}` }, clip(c.result)),
      h("span", {}, badge(c.fidelity, "fidelity"), c.downgraded ? badge("downgraded", "warn") : null, c.error ? badge("tool error", "failed") : null,
        c.fault ? badge(`fault: ${c.fault.kind}`, "warn") : null),
      c.rung, `${c.ms} ms`, short(c.stateHash)])));
  el.querySelectorAll("tbody tr").forEach((tr) => tr.classList.add("call"));
}

function clip(s) {
  const t = typeof s === "string" ? s : JSON.stringify(s);
  return t.length > 2000 ? t.slice(0, 2000) + "…" : t;
}

function fact(k, v) {
  return h("div", {}, h("dt", {}, k), h("dd", {}, v));
}

function playground(tools, id, answer, refresh) {
  const usable = tools.filter((t) => t.answerable !== false);
  const pick = h("select", { id: "tool", name: "tool" }, usable.map((t) => h("option", { value: t.name }, t.name)));
  const slot = h("div", {});
  const desc = h("p", { class: "muted" });
  let form = null;
  const choose = () => {
    const t = usable.find((x) => x.name === pick.value);
    if (!t) return;
    form = schemaForm(t.inputSchema || {}, `Arguments of ${t.name}`);
    fill(desc, t.description || "", " ", badge(t.binding, "binding"), ` rung ${t.rung}`);
    fill(slot, form.el);
  };
  pick.addEventListener("change", choose);
  const btn = h("button", { type: "submit", class: "primary", id: "call" }, "Call");
  const el = h("form", { class: "card", id: "playground",
    onsubmit: async (e) => {
      e.preventDefault();
      let args;
      try {
        args = form.read();
      } catch (err) {
        fill(answer, h("p", { class: "error", role: "alert" }, err.message));
        return;
      }
      btn.disabled = true;
      try {
        const r = await mutate("sessions.call", { session_id: id, name: pick.value, arguments: args, requestor: "user" });
        fill(answer, h("div", { class: "card answer", id: "call-answer" },
          h("p", {}, "Answer ", badge(r.fidelity, "fidelity"), " ", h("span", { class: "muted" }, `rung ${r.rung} · ${r.ms} ms · ${r.callId}`),
            r.error ? badge("tool error", "failed") : null, r.downgraded ? badge("downgraded", "warn") : null),
          h("pre", {}, clip(r.content))));
        await refresh();
      } catch (err) {
        fill(answer, errorBox(err));
      } finally {
        btn.disabled = false;
      }
    } },
    h("label", { for: "tool" }, "Tool"), pick, desc, slot, btn);
  choose();
  return el;
}
