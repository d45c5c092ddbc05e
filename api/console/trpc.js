// tRPC client over fetch: queries are GET with ?input=, mutations POST with a JSON body and the CSRF token. The web
// session itself travels in its HttpOnly cookie.

let csrf = "";

/** setCSRF keeps the token sign-in (or the session read) gave. */
export function setCSRF(token) {
  csrf = token || "";
}

/** APIError carries the REST envelope of a failed procedure. */
export class APIError extends Error {
  constructor(status, envelope) {
    super((envelope && envelope.detail) || `HTTP ${status}`);
    this.status = status;
    this.envelope = envelope || {};
  }
}

async function answer(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    throw new APIError(res.status, { detail: `HTTP ${res.status}: not JSON` });
  }
  if (body && body.error) {
    const d = body.error.data || {};
    throw new APIError(d.httpStatus || res.status, d.envelope || { detail: body.error.message });
  }
  return body && body.result ? body.result.data : body;
}

/** query runs a read verb. */
export async function query(name, input) {
  const q = input === undefined ? "" : "?input=" + encodeURIComponent(JSON.stringify(input));
  const res = await fetch(`/trpc/${name}${q}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
  return answer(res);
}

/** mutate runs a write verb. */
export async function mutate(name, input) {
  const res = await fetch(`/trpc/${name}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(input || {}),
  });
  return answer(res);
}

/** session reads the web session ({signedIn: false} when there is none). */
export async function session() {
  const res = await fetch("/console/session", { credentials: "same-origin" });
  if (res.status === 401) return { signedIn: false };
  const s = await res.json();
  if (!res.ok) throw new APIError(res.status, s);
  setCSRF(s.csrf);
  return s;
}

/** signIn trades a workspace key for a web session. */
export async function signIn(key) {
  const res = await fetch("/console/signin", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ key }),
  });
  const s = await res.json();
  if (!res.ok) throw new APIError(res.status, s);
  setCSRF(s.csrf);
  return s;
}

/** signOut ends the web session. */
export async function signOut() {
  await fetch("/console/signout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
  setCSRF("");
}
