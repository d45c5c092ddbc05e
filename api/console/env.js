// One environment: summary, twin state and wake, the active build's report, build history (polled while a build
// runs), tools with binding, rung and source, sessions (open, list, chart) and a one-shot query.
import { h, fill, table, pct, badge, when, errorBox, short } from "./dom.js";
import { query, mutate } from "./trpc.js";
import { fidelityMix, callsOverTime } from "./charts.js";

export async function envPage(ctx, slug) {
  ctx.title(slug);
  const env = await query("envs.get", { slug });
  const twin = h("span", {}, badge(env.twin_state || "stopped"));
  const wakeMsg = h("span", { "aria-live": "polite", class: "muted" });
  const wake = h("button", { type: "button", id: "wake", onclick: async () => {
    wake.disabled = true;
    try {
      const w = await mutate("envs.wake", { slug });
      fill(twin, badge(w.twin_state || w.state));
      fill(wakeMsg, w.twin_state === "ready" ? " ready" : " booting — polling");
      if (w.twin_state !== "ready") pollTwin();
    } catch (err) {
      fill(wakeMsg, errorBox(err));
    } finally {
      wake.disabled = false;
    }
  } }, "Wake twin");
  let twinPoll = false;
  const pollTwin = () => {
    if (twinPoll) return;
    twinPoll = true;
    ctx.every(async () => {
      const e = await query("envs.get", { slug }).catch(() => null);
      if (e) fill(twin, badge(e.twin_state || "stopped"));
    }, 2000);
  };

  const builds = h("div", {}, h("p", { class: "muted" }, "Loading builds…"));
  const report = h("div", {}, h("p", { class: "muted" }, env.active_build ? "Loading the report…" : "No active build yet."));
  const tools = h("div", {}, h("p", { class: "muted" }, "Loading tools…"));
  const sessions = h("div", {}, h("p", { class: "muted" }, "Loading sessions…"));
  const ab = env.active_build;

  ctx.main.replaceChildren(h("section", { class: "env" },
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Environments"), " / ", env.slug),
    h("h1", { tabindex: -1 }, env.name || env.slug, " ", badge(env.status)),
    h("p", { class: "headline" }, env.headline || "No build has finished yet."),
    h("dl", { class: "facts" },
      fact("Traces", env.n_traces), fact("Tools", env.n_tools), fact("Covered", pct(env.covered_pct)),
      fact("Simulated", pct(env.simulated_pct)), fact("Schema", env.schema_source || "–"),
      fact("Framework", env.framework || "–"), fact("Language", env.language || "–"),
      fact("Active build", ab ? h("span", {}, h("code", {}, ab.id), " ", badge(ab.status)) : "none"),
      fact("Twin", h("span", {}, twin, " ", wake, wakeMsg))),
    h("h2", { id: "sessions-h" }, "Sessions"), openForm(ctx, slug), sessions,
    h("h2", {}, "Build report"), report,
    h("h2", {}, "Tools"), tools,
    h("h2", {}, "Builds"), builds,
    h("h2", {}, "One-shot query"), queryForm(slug)));
  ctx.main.querySelector("h1").focus({ preventScroll: true });

  const loadBuilds = async () => {
    const list = (await query("builds.list", { slug })) || [];
    fill(builds, table("Builds", ["Build", "Status", "Stage", "Progress", "Created", "Finished", "Bundle"], list.map((b) => [
      h("code", { "data-id": b.id }, b.id), badge(b.status), b.stage || "–",
      h("progress", { max: 1, value: b.progress, "aria-label": `${b.id} progress` }),
      when(b.created_at), when(b.finished_at), short(b.bundle_hash)])));
    return list.some((b) => b.status === "queued" || b.status === "running");
  };
  const tasks = [
    loadBuilds().then((live) => {
      // Live progress: poll the history every 2 s while a build is queued or running, then stop.
      let polling = live;
      if (live) ctx.every(async () => { if (polling) polling = await loadBuilds(); }, 2000);
    }),
    ab && ab.status === "succeeded" ? loadReport(report, slug, ab.id) : null,
    loadTools(tools, slug),
    loadSessions(sessions, slug),
  ];
  for (const [i, p] of tasks.entries()) {
    if (!p) continue;
    p.catch((err) => fill([builds, report, tools, sessions][i], errorBox(err)));
  }
  if (env.twin_state === "booting") pollTwin();
}

function fact(k, v) {
  return h("div", {}, h("dt", {}, k), h("dd", {}, v === undefined || v === null ? "–" : v));
}

async function loadReport(el, slug, id) {
  const r = await query("builds.report", { slug, build_id: id });
  const sc = r.self_check || {};
  const byName = new Map((sc.tools || []).map((t) => [t.name, t]));
  const rows = ((r.build && r.build.tools) || []).map((t) => {
    const c = byName.get(t.name) || {};
    return [h("code", {}, t.name), badge(t.binding, "binding"), t.rung || "–", t.kind || "–", String(t.calls ?? "–"),
      c.calls ? pct(c.agreement_pct) : "–", c.calls ? pct(c.shape_agree_pct) : "–", String(c.calls ?? 0)];
  });
  fill(el,
    h("p", {}, `Self-check (${sc.mode || "–"}, ${sc.split || "–"}): `, h("strong", {}, pct(sc.agreement_pct)),
      ` of ${sc.calls ?? 0} recorded calls answered exactly as recorded; ${pct(sc.shape_agree_pct)} in shape; ${pct(sc.error_agree_pct)} errors alike.`),
    sc.fidelity ? fidelityMix(sc.fidelity, "Self-check fidelity mix") : null,
    table("Per-tool self-check agreement", ["Tool", "Binding", "Rung", "Kind", "Recorded calls", "Agreement", "Shape", "Checked calls"], rows),
    (r.build && r.build.warnings && r.build.warnings.length) ? h("details", {}, h("summary", {}, `${r.build.warnings.length} input warnings`),
      h("ul", {}, r.build.warnings.map((w) => h("li", {}, `${w.code} ×${w.count}`, w.example ? h("code", {}, ` ${w.example}`) : null)))) : null);
}

async function loadTools(el, slug) {
  const list = (await query("envs.tools", { slug, format: "native" })) || [];
  fill(el, h("ul", { class: "tools" }, list.map((t) => {
    const src = h("div", { class: "src" });
    const d = h("details", { ontoggle: async () => {
      if (!d.open || src.dataset.loaded) return;
      src.dataset.loaded = "1";
      fill(src, h("p", { class: "muted" }, "Loading source…"));
      try {
        const s = await query("tools.source", { slug, name: t.name });
        fill(src,
          s.provided ? h("div", {}, h("h4", {}, "Provided code (runs first)"), h("pre", {}, h("code", {}, s.provided))) : null,
          h("h4", {}, `Synthesized ${s.language} (${s.kind})`),
          s.source ? h("pre", {}, h("code", {}, s.source)) : h("p", { class: "muted" }, "No handler could be synthesized."));
      } catch (err) {
        fill(src, errorBox(err));
      }
    } },
    h("summary", {}, h("code", {}, t.name), " ", badge(t.binding, "binding"), " ", h("span", { class: "muted" }, `rung ${t.rung}`)),
    h("p", {}, t.description || ""),
    (t.attention || []).length ? h("ul", { class: "attention" }, t.attention.map((a) => h("li", {}, a))) : null,
    h("details", { class: "schema" }, h("summary", {}, "Input schema"), h("pre", {}, h("code", {}, JSON.stringify(t.inputSchema, null, 2)))),
    src);
    return h("li", {}, d);
  })));
}

async function loadSessions(el, slug) {
  const list = (await query("sessions.list", { slug, limit: 100 })) || [];
  const mix = {};
  for (const s of list) for (const [k, v] of Object.entries(s.fidelity || {})) mix[k] = (mix[k] || 0) + v;
  const points = list.filter((s) => s.n_calls).map((s) => ({ t: new Date(s.last_used_at), n: s.n_calls }));
  fill(el,
    h("div", { class: "charts" }, fidelityMix(mix, "Fidelity mix, all listed sessions"), callsOverTime(points, "Calls over time (by last use)")),
    table("Sessions", ["Session", "Status", "Seed", "Calls", "Errors", "Fidelity", "State", "Opened"], list.map((s) => [
      h("a", { href: `#/env/${encodeURIComponent(slug)}/session/${encodeURIComponent(s.id)}` }, h("code", {}, s.id)),
      badge(s.status), String(s.seed) + (s.scenario ? ` · ${s.scenario}` : ""), String(s.n_calls), String(s.n_errors),
      h("div", { class: "mini" }, fidelityMix(s.fidelity || {}, "Mix")), short(s.state_hash), when(s.created_at)])));
}

function openForm(ctx, slug) {
  const seed = h("input", { id: "open-seed", name: "seed", type: "number", min: 0, step: 1, placeholder: "drawn when empty" });
  const instr = h("textarea", { id: "open-instructions", name: "seedInstructions", rows: 2,
    placeholder: "e.g. a user with 2 pending orders (needs a model)" });
  const scenario = h("input", { id: "open-scenario", name: "scenario", placeholder: "a scenario from the build config" });
  const trace = h("textarea", { id: "open-trace", name: "trace", rows: 2,
    placeholder: "a trace id the environment holds, or a trace {id, model, messages} as JSON: opens the world it saw" });
  const rec = h("input", { id: "open-record", name: "recordOutputs", type: "checkbox", checked: true });
  const msg = h("div", { "aria-live": "polite" });
  const btn = h("button", { type: "submit", class: "primary", id: "open-session" }, "Open session");
  return h("form", { class: "card grid", id: "open",
    onsubmit: async (e) => {
      e.preventDefault();
      const body = { slug, recordOutputs: rec.checked };
      if (seed.value !== "") body.seed = Number(seed.value);
      if (instr.value.trim()) body.seedInstructions = instr.value.trim();
      if (scenario.value.trim()) body.scenario = scenario.value.trim();
      const tr = trace.value.trim();
      if (tr) {
        // A trace object as JSON, else a held trace's id.
        try {
          body.trace = tr.startsWith("{") ? JSON.parse(tr) : tr;
        } catch (err) {
          fill(msg, errorBox(new Error("Trace: not valid JSON (" + err.message + ")")));
          return;
        }
      }
      btn.disabled = true;
      fill(msg, h("p", { class: "muted" }, "Opening (waits for the twin)…"));
      try {
        const s = await mutate("sessions.open", body);
        ctx.go(`#/env/${encodeURIComponent(slug)}/session/${encodeURIComponent(s.sessionId)}`);
      } catch (err) {
        fill(msg, errorBox(err));
      } finally {
        btn.disabled = false;
      }
    } },
    h("div", { class: "field" }, h("label", { for: "open-seed" }, "Seed"), seed),
    h("div", { class: "field" }, h("label", { for: "open-scenario" }, "Scenario"), scenario),
    h("div", { class: "field wide" }, h("label", { for: "open-instructions" }, "Seed instructions"), instr),
    h("div", { class: "field wide" }, h("label", { for: "open-trace" }, "Trace (instead of seed instructions)"), trace),
    h("div", { class: "field" }, h("label", { for: "open-record", class: "check" }, rec, " Record outputs in the transcript")),
    h("div", { class: "field" }, btn), msg);
}

function queryForm(slug) {
  const input = h("textarea", { id: "q-input", name: "input", rows: 2, required: true, placeholder: "What the user says to the agent" });
  const seed = h("input", { id: "q-seed", name: "seed", type: "number", min: 0, step: 1 });
  const out = h("div", { "aria-live": "polite" });
  return h("form", { class: "card grid",
    onsubmit: async (e) => {
      e.preventDefault();
      fill(out, h("p", { class: "muted" }, "Running…"));
      const body = { slug, input: input.value };
      if (seed.value !== "") body.seed = Number(seed.value);
      try {
        const r = await mutate("envs.query", body);
        fill(out, h("div", { class: "answer" },
          h("p", {}, badge(r.status || "done"), " ", `fidelity high ${r.fidelity ? r.fidelity.high : 0} · low ${r.fidelity ? r.fidelity.low : 0} · seed ${r.seed} · world `, short(r.world_hash)),
          h("pre", {}, r.response || (r.error && r.error.detail) || ""),
          table("Query trace", ["Kind", "Label", "Duration", "Detail"], (r.trace || []).map((s) => [s.kind, s.label, s.dur, h("code", {}, s.detail || "")]))));
      } catch (err) {
        fill(out, errorBox(err));
      }
    } },
    h("div", { class: "field wide" }, h("label", { for: "q-input" }, "Input"), input),
    h("div", { class: "field" }, h("label", { for: "q-seed" }, "Seed"), seed),
    h("div", { class: "field" }, h("button", { type: "submit" }, "Run query")), out);
}
