package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// derived is a credential as its holder has it, and the chain of derivations that made it from a workspace key.
type derived struct {
	chain string // e.g. "key → mcp_at_ → session (over /mcp) → fork (with the session token)"
	kind  cred.Kind
	token string
	// session is the session a session token is for.
	session string
	// web is a console sign-in (kind "" with web set).
	web *web
}

// instance is one API process over the shared database and twins: its base URL.
type instance struct {
	name string
	url  string
}

// probe answers the status a credential gets on a route it is meant for: GET /v1/envs for a workspace key, the MCP
// initialize for an MCP token, GET /v1/sessions/{id} for a session token, /trpc/envs.list for a web session.
func probe(t *testing.T, in instance, c derived) int {
	t.Helper()
	var req *http.Request
	switch {
	case c.web != nil:
		req, _ = http.NewRequest(http.MethodGet, in.url+"/trpc/envs.list", nil)
		req.AddCookie(&http.Cookie{Name: c.web.cookie.Name, Value: c.web.cookie.Value})
	case c.kind == cred.KindWorkspace:
		req, _ = http.NewRequest(http.MethodGet, in.url+"/v1/envs", nil)
	case c.kind == cred.KindMCP:
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
		req, _ = http.NewRequest(http.MethodPost, in.url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	case c.kind == cred.KindSession:
		req, _ = http.NewRequest(http.MethodGet, in.url+"/v1/sessions/"+c.session, nil)
	}
	if c.web == nil {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// mcpOpen opens a session through the MCP server's sessions.open tool with token, as an MCP client does.
func (p *mcpPlane) mcpOpen(t *testing.T, token string) (id, tok string) {
	t.Helper()
	cs := p.connect(t, "/mcp", token)
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sessions_open", Arguments: map[string]any{"slug": p.env.Slug}})
	if err != nil || r.IsError {
		t.Fatalf("sessions.open over MCP: %+v %v", r, err)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(textOf(t, r)), &out); err != nil {
		t.Fatal(err)
	}
	return str(out["sessionId"]), str(out["token"])
}

// mcpFork forks a session through the MCP server's sessions.fork tool with token.
func (p *mcpPlane) mcpFork(t *testing.T, token, sessionID string) (id, tok string) {
	t.Helper()
	cs := p.connect(t, "/mcp", token)
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sessions_fork", Arguments: map[string]any{"session_id": sessionID}})
	if err != nil || r.IsError {
		t.Fatalf("sessions.fork over MCP: %+v %v", r, err)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(textOf(t, r)), &out); err != nil {
		t.Fatal(err)
	}
	return str(out["sessionId"]), str(out["token"])
}

// oauthToken runs the authorization code grant with PKCE as a client would: registration, consent with key,
// exchange. It answers the mcp_at_ token, its refresh token and the client they were issued to.
func (p *mcpPlane) oauthToken(t *testing.T, key string) (token, refresh, clientID string) {
	t.Helper()
	const redirect = "http://127.0.0.1:7777/callback"
	reg, _ := json.Marshal(map[string]any{"client_name": "revocation test", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	resp, err := http.Post(p.srv.URL+"/oauth/register", "application/json", bytes.NewReader(reg))
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || client.ClientID == "" {
		t.Fatalf("register: %d %+v", resp.StatusCode, client)
	}
	cfg := &oauth2.Config{ClientID: client.ClientID, RedirectURL: redirect, Endpoint: oauth2.Endpoint{
		AuthURL: p.srv.URL + "/oauth/authorize", TokenURL: p.srv.URL + "/oauth/token", AuthStyle: oauth2.AuthStyleInParams}}
	verifier := oauth2.GenerateVerifier()
	loc := newOAuthFlow(p).consent(t, cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier)), key)
	tok, err := cfg.Exchange(context.Background(), loc.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return tok.AccessToken, tok.RefreshToken, client.ClientID
}

// webMutation runs a tRPC mutation with a console web session and answers its result data, failing the test on an
// error answer.
func webMutation(t *testing.T, h http.Handler, w web, verb string, input any) map[string]any {
	t.Helper()
	code, out := trpcAs(t, h, http.MethodPost, "/trpc/"+verb, w, w.csrf, input)
	res, _ := out["result"].(map[string]any)
	data, _ := res["data"].(map[string]any)
	if code != http.StatusOK || data == nil {
		t.Fatalf("tRPC %s: %d %v", verb, code, out)
	}
	return data
}

// TestRevocationEndsEveryDerivedCredential walks every chain of credentials that derive from a workspace key today
// and revokes the key: every credential on every chain is refused at once by the process that revoked it, and
// within the documented window (docs/credentials.md: the key and token caches' TTL) by another process that had
// them cached; credentials of another key are untouched. Revoking a credential in the middle of a chain ends what
// derives from it and nothing above it.
//
// Chains (each link derives the next):
//
//	key → session token → fork token (made with the session token) → its fork's token
//	key → fork token (made with the key)
//	key → mcp_at_ (keys.create) → session token (sessions.open over /mcp) → fork token (with the session token)
//	key → mcp_at_ (keys.create) → fork token (sessions.fork over /mcp, with the mcp_at_)
//	key → mcp_at_ (OAuth consent) → session token (over /mcp) → fork token
//	key → mcp_at_ (OAuth) and its refresh token → mcp_at_ refreshed from it → session token (over /mcp) → fork token
//	key → web session (console) → session token (tRPC) → fork token; → fork token (tRPC fork, with the web session)
//	key → web session → mcp_at_ (tRPC keys.create) → session token (over /mcp) → fork token
//
// The refresh token is no bearer credential: it is checked by refreshing with it, once the key is revoked (a
// refresh before would rotate it), on both processes' token endpoints (it is read from the database on each use).
func TestRevocationEndsEveryDerivedCredential(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		// A: the process that revokes, its key cache on as doppel serve has it (a revoked key must not wait for it).
		p := newMCPPlaneKeyCache(t, driver, shopBundle(t), api.DefaultKeyCacheTTL)
		// B: another process over the same database and twins, its key and session-token caches at window.
		const window = 300 * time.Millisecond
		tpB := toolplane.New(toolplane.Options{DB: p.db, Opener: p.opener, Twins: p.twins, Journal: p.journal,
			Bundles: &toolplane.Bundles{Blob: p.blobs}, TokenTTL: window})
		srvB := httptest.NewUnstartedServer(nil)
		hB, _ := api.New(api.Options{DB: p.db, KeyCacheTTL: window, Routes: []func(huma.API, *api.Deps){
			(&api.SessionRoutes{Plane: tpB}).Register, (&api.MCPRoutes{Plane: tpB, PublicURL: "http://" + srvB.Listener.Addr().String()}).Register,
		}})
		srvB.Config.Handler = hB
		srvB.Start()
		t.Cleanup(srvB.Close)
		a, b := instance{"A (revokes)", p.srv.URL}, instance{"B (another process)", srvB.URL}

		kRow, k, err := store.CreateKey(ctx, p.db, p.ws.ID, cred.KindWorkspace, "root")
		if err != nil {
			t.Fatal(err)
		}
		var all []derived
		add := func(chain string, kind cred.Kind, token, session string) derived {
			d := derived{chain: chain, kind: kind, token: token, session: session}
			all = append(all, d)
			return d
		}
		restOpen := func(token string) session {
			t.Helper()
			code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", token, nil)
			if code != http.StatusCreated {
				t.Fatalf("open: %d %v", code, out)
			}
			return session{ID: str(out["sessionId"]), Token: str(out["token"])}
		}

		add("key", cred.KindWorkspace, k, "")
		// key → session token → fork token → fork of the fork; key → fork token.
		s1 := restOpen(k)
		add("key → session", cred.KindSession, s1.Token, s1.ID)
		f1 := p.fork(s1, s1.Token, nil)
		add("key → session → fork (session token)", cred.KindSession, f1.Token, f1.ID)
		f1b := p.fork(f1, f1.Token, nil)
		add("key → session → fork → fork (session tokens)", cred.KindSession, f1b.Token, f1b.ID)
		g1 := p.fork(s1, k, nil)
		add("key → fork (key)", cred.KindSession, g1.Token, g1.ID)

		// key → mcp_at_ → session over /mcp → fork; → fork over /mcp with the mcp_at_.
		code, out := p.do(http.MethodPost, "/v1/keys", k, map[string]any{"name": "agent's MCP", "kind": "mcp"})
		if code != http.StatusCreated {
			t.Fatalf("keys.create mcp: %d %v", code, out)
		}
		m := add("key → mcp_at_", cred.KindMCP, str(out["key"]), "")
		id, tok := p.mcpOpen(t, m.token)
		s2 := session{ID: id, Token: tok}
		add("key → mcp_at_ → session (over /mcp)", cred.KindSession, s2.Token, s2.ID)
		f2 := p.fork(s2, s2.Token, nil)
		add("key → mcp_at_ → session → fork (session token)", cred.KindSession, f2.Token, f2.ID)
		id, tok = p.mcpFork(t, m.token, s2.ID)
		add("key → mcp_at_ → fork (over /mcp, mcp_at_)", cred.KindSession, tok, id)

		// key → OAuth mcp_at_ → session over /mcp → fork, twice: the first token is revoked alone below.
		var oauthTok, clientID string
		var oa, oaS, oaF derived
		for i, suffix := range []string{" #1", " #2"} {
			tokI, _, client := p.oauthToken(t, k)
			o := add("key → mcp_at_ (OAuth"+suffix+")", cred.KindMCP, tokI, "")
			id, tok = p.mcpOpen(t, o.token)
			s3 := session{ID: id, Token: tok}
			os := add("key → mcp_at_ (OAuth"+suffix+") → session", cred.KindSession, s3.Token, s3.ID)
			f3 := p.fork(s3, s3.Token, nil)
			of := add("key → mcp_at_ (OAuth"+suffix+") → session → fork", cred.KindSession, f3.Token, f3.ID)
			if i == 0 {
				oauthTok, clientID, oa, oaS, oaF = tokI, client, o, os, of
			}
		}

		// key → OAuth mcp_at_ and its refresh token → mcp_at_ refreshed from it → session over /mcp → fork.
		_, rt, rtClient := p.oauthToken(t, k)
		st, out := p.refresh(t, oauthClient{id: rtClient}, rt)
		if st != http.StatusOK {
			t.Fatalf("refresh: %d %v", st, out)
		}
		rt = str(out["refresh_token"]) // rotated: the live one now
		r := add("key → mcp_at_ (OAuth) → refresh → mcp_at_", cred.KindMCP, str(out["access_token"]), "")
		id, tok = p.mcpOpen(t, r.token)
		s6 := session{ID: id, Token: tok}
		add("key → mcp_at_ (OAuth) → refresh → mcp_at_ → session", cred.KindSession, s6.Token, s6.ID)
		f6 := p.fork(s6, s6.Token, nil)
		add("key → mcp_at_ (OAuth) → refresh → mcp_at_ → session → fork", cred.KindSession, f6.Token, f6.ID)

		// key → web session → session (tRPC) → fork; → fork made with the web session; → mcp_at_ → session → fork.
		_, w := signIn(t, p.h, k, nil)
		all = append(all, derived{chain: "key → web session", web: &w})
		data := webMutation(t, p.h, w, "sessions.open", map[string]any{"slug": p.env.Slug})
		s4 := session{ID: str(data["sessionId"]), Token: str(data["token"])}
		add("key → web session → session", cred.KindSession, s4.Token, s4.ID)
		f4 := p.fork(s4, s4.Token, nil)
		add("key → web session → session → fork (session token)", cred.KindSession, f4.Token, f4.ID)
		data = webMutation(t, p.h, w, "sessions.fork", map[string]any{"session_id": s4.ID})
		add("key → web session → fork (web session)", cred.KindSession, str(data["token"]), str(data["sessionId"]))
		data = webMutation(t, p.h, w, "keys.create", map[string]any{"name": "console MCP", "kind": "mcp"})
		m4 := add("key → web session → mcp_at_", cred.KindMCP, str(data["key"]), "")
		id, tok = p.mcpOpen(t, m4.token)
		s5 := session{ID: id, Token: tok}
		add("key → web session → mcp_at_ → session", cred.KindSession, s5.Token, s5.ID)
		f5 := p.fork(s5, s5.Token, nil)
		add("key → web session → mcp_at_ → session → fork", cred.KindSession, f5.Token, f5.ID)

		// Another key's credentials, which revoking this one leaves alone.
		c := restOpen(p.key2)
		cf := p.fork(c, c.Token, nil)
		control := []derived{{chain: "other key", kind: cred.KindWorkspace, token: p.key2},
			{chain: "other key → session", kind: cred.KindSession, token: c.Token, session: c.ID},
			{chain: "other key → session → fork", kind: cred.KindSession, token: cf.Token, session: cf.ID}}

		expect := func(in instance, cs []derived, want int, when string) {
			t.Helper()
			for _, c := range cs {
				if got := probe(t, in, c); got != want {
					t.Errorf("%s on %s %s: %d, want %d", c.chain, in.name, when, got, want)
				}
			}
		}
		// Both processes accept every credential (B now holds each in its caches).
		for _, in := range []instance{a, b} {
			expect(in, append(all, control...), http.StatusOK, "before any revocation")
		}
		if t.Failed() {
			t.FailNow()
		}

		// Revoking in the middle of a chain (the OAuth token, RFC 7009) ends what derives from it, not what it
		// derives from.
		resp, err := http.PostForm(p.srv.URL+"/oauth/revoke", url.Values{"token": {oauthTok}, "client_id": {clientID}})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("revoke the OAuth token: %v %v", resp, err)
		}
		resp.Body.Close()
		expect(a, []derived{oa, oaS, oaF}, http.StatusUnauthorized, "after its OAuth token was revoked")
		expect(a, []derived{all[0], m}, http.StatusOK, "after an OAuth token of its chain was revoked")

		// Revoking the key ends every chain: at once where it was revoked…
		if code, out := p.do(http.MethodDelete, "/v1/keys/"+kRow.ID, p.key, nil); code != http.StatusOK {
			t.Fatalf("revoke: %d %v", code, out)
		}
		expect(a, all, http.StatusUnauthorized, "at once after the key was revoked")
		// The refresh token is refused at once on both (read from the database at each use).
		for _, in := range []instance{a, b} {
			resp, err := http.PostForm(in.url+"/oauth/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}, "client_id": {rtClient}})
			if err != nil {
				t.Fatal(err)
			}
			var e map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || e["error"] != "invalid_grant" {
				t.Errorf("key → mcp_at_ (OAuth) → refresh token on %s after the key was revoked: %d %v, want invalid_grant", in.name, resp.StatusCode, e)
			}
		}
		// …and within the window elsewhere.
		time.Sleep(window)
		expect(b, all, http.StatusUnauthorized, "one cache window after the key was revoked")
		for _, in := range []instance{a, b} {
			expect(in, control, http.StatusOK, "after another key was revoked")
		}
	})
}
