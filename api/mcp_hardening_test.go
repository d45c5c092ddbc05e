package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/usage"
)

// rawMCP posts body to an MCP path with headers (Content-Type and Accept as a client sends them unless given) and
// answers the status, headers and body.
func (p *mcpPlane) rawMCP(t testing.TB, method, path, body string, headers map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, p.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// envelope reads a body as the error envelope, failing the test when it is not one.
func mcpEnvelope(t testing.TB, what string, b []byte) api.Envelope {
	t.Helper()
	var e api.Envelope
	if err := json.Unmarshal(b, &e); err != nil || e.Code == "" || e.Detail == "" || !strings.HasPrefix(e.RequestID, "req_") {
		t.Errorf("%s: body %q is not the envelope", what, b)
	}
	return e
}

// Every absolute URL the MCP server and its OAuth emit is the public URL's (issue 33): a request's Host and
// X-Forwarded-* headers change nothing.
func TestMCPURLsComeFromThePublicURL(t *testing.T) {
	const public = "https://doppel.example.com"
	p := newMCPPlaneWith(t, schema.DriverSQLite, shopBundle(t), planeOptions{}, 0, func(m *api.MCPRoutes) { m.PublicURL = public })
	evil := map[string]string{"Host": "evil.example", "X-Forwarded-Host": "evil2.example", "X-Forwarded-Proto": "http"}
	get := func(path string) map[string]any {
		req, _ := http.NewRequest(http.MethodGet, p.srv.URL+path, nil)
		req.Host = evil["Host"]
		req.Header.Set("X-Forwarded-Host", evil["X-Forwarded-Host"])
		req.Header.Set("X-Forwarded-Proto", "http")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b), "evil") {
			t.Errorf("%s names a request header's host: %s", path, b)
		}
		var out map[string]any
		_ = json.Unmarshal(b, &out)
		return out
	}
	as := get("/.well-known/oauth-authorization-server")
	for _, k := range []string{"issuer", "authorization_endpoint", "token_endpoint", "registration_endpoint", "revocation_endpoint"} {
		if !strings.HasPrefix(str(as[k]), public) {
			t.Errorf("authorization server metadata %s = %v, want under %s", k, as[k], public)
		}
	}
	for path, want := range map[string]string{
		"/.well-known/oauth-protected-resource":                        public,
		"/.well-known/oauth-protected-resource/mcp":                    public + "/mcp",
		"/.well-known/oauth-protected-resource/mcp/envs/" + p.env.Slug: public + "/mcp/envs/" + p.env.Slug,
	} {
		if prm := get(path); prm["resource"] != want || !jsonEqual(t, prm["authorization_servers"], []any{public}) {
			t.Errorf("%s: %v, want resource %s", path, prm, want)
		}
	}
	for _, path := range []string{"/mcp", "/mcp/envs/" + p.env.Slug} {
		st, h, _ := p.rawMCP(t, http.MethodPost, path, initializeBody, evil)
		if st != http.StatusUnauthorized || h.Get("WWW-Authenticate") != `Bearer resource_metadata="`+public+`/.well-known/oauth-protected-resource`+path+`"` {
			t.Errorf("%s without a credential: %d %q", path, st, h.Get("WWW-Authenticate"))
		}
	}
	// The consent's redirect names the public URL as the issuer (RFC 9207), and a resource on the Host's name is
	// not this server's.
	c := p.newClient(t)
	q := url.Values{"client_id": {c.id}, "redirect_uri": {c.redirect}, "response_type": {"code"}, "state": {"s"},
		"code_challenge": {strings.Repeat("a", 43)}, "code_challenge_method": {"S256"}, "resource": {"http://evil.example/mcp"}}
	req, _ := http.NewRequest(http.MethodGet, p.srv.URL+"/oauth/authorize?"+q.Encode(), nil)
	req.Host = "evil.example"
	resp, err := newOAuthFlow(p).noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || loc.Query().Get("error") != "invalid_target" || loc.Query().Get("iss") != public {
		t.Errorf("a resource named by the Host: %d %s", resp.StatusCode, loc)
	}
}

// An OAuth token works only on the MCP address it was issued for (RFC 8707, issue 33): a token for an
// environment's address is refused on /mcp, which holds every workspace verb, and on another environment's; a
// token for /mcp is refused on an environment's address; a token asked without a resource is the server's and
// works on every address; a resource that is not this server's MCP address is refused at authorize and at token.
func TestMCPTokenBoundToItsResource(t *testing.T) {
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	c := p.newClient(t)
	envAddr, wsAddr := "/mcp/envs/"+p.env.Slug, "/mcp"
	token := func(resource string, extra url.Values) string {
		code, verifier := p.code(t, c, p.key, resource)
		return str(p.exchange(t, c, code, verifier, extra)["access_token"])
	}
	envTok := token(p.srv.URL+envAddr+"?seed=42", nil) // an environment address's query seeds it; it is no boundary
	wsTok := token(p.srv.URL+wsAddr, nil)
	anyTok := token("", nil)
	narrowed := token("", url.Values{"resource": {p.srv.URL + envAddr}}) // a server-wide grant narrowed at the token
	for _, tc := range []struct {
		name, tok, path string
		want            int
	}{
		{"env token on its address", envTok, envAddr, 200},
		{"env token on its address, another seed", envTok, envAddr + "?seed=7", 200},
		{"env token on /mcp", envTok, wsAddr, 401},
		{"env token on another environment", envTok, "/mcp/envs/their-shop", 401},
		{"/mcp token on /mcp", wsTok, wsAddr, 200},
		{"/mcp token on an environment", wsTok, envAddr, 401},
		{"server token on /mcp", anyTok, wsAddr, 200},
		{"server token on an environment", anyTok, envAddr, 200},
		{"narrowed token on its address", narrowed, envAddr, 200},
		{"narrowed token on /mcp", narrowed, wsAddr, 401},
	} {
		st, h, b := p.rawMCP(t, http.MethodPost, tc.path, initializeBody, map[string]string{"Authorization": "Bearer " + tc.tok})
		if st != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.name, st, tc.want, b)
			continue
		}
		if st == 401 {
			mcpEnvelope(t, tc.name, b)
			if !strings.Contains(h.Get("WWW-Authenticate"), `error="invalid_token"`) {
				t.Errorf("%s: WWW-Authenticate %q", tc.name, h.Get("WWW-Authenticate"))
			}
		}
	}
	// A grant for one address cannot be widened at the token endpoint.
	code, verifier := p.code(t, c, p.key, p.srv.URL+envAddr)
	if st, out := p.tokenPost(t, url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
		"client_id": {c.id}, "redirect_uri": {c.redirect}, "resource": {p.srv.URL + wsAddr}}); st != 400 || out["error"] != "invalid_target" {
		t.Errorf("widening at the token endpoint: %d %v", st, out)
	}
	// Resources that are not this server's MCP addresses are refused at authorize.
	for _, res := range []string{"https://elsewhere.example/mcp", p.srv.URL + "/v1/envs", p.srv.URL + "/mcp/envs/", p.srv.URL + "/mcp#x"} {
		q := url.Values{"client_id": {c.id}, "redirect_uri": {c.redirect}, "response_type": {"code"}, "state": {"s"},
			"code_challenge": {strings.Repeat("a", 43)}, "code_challenge_method": {"S256"}, "resource": {res}}
		resp, err := newOAuthFlow(p).noFollow.Get(p.srv.URL + "/oauth/authorize?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc, _ := url.Parse(resp.Header.Get("Location")); resp.StatusCode != http.StatusFound || loc.Query().Get("error") != "invalid_target" {
			t.Errorf("resource %s at authorize: %d %s", res, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
}

// MCP checks Origin (issue 33: the Streamable HTTP transport's defence against DNS rebinding): a present Origin
// that is not the public URL's or a configured one is refused 403 with the envelope, on both faces; no Origin
// (a non-browser client) passes.
func TestMCPOriginChecked(t *testing.T) {
	p := newMCPPlaneWith(t, schema.DriverSQLite, shopBundle(t), planeOptions{}, 0, func(m *api.MCPRoutes) {
		m.AllowedOrigins = []string{"http://localhost:6274"}
	})
	for _, path := range []string{"/mcp", "/mcp/envs/" + p.env.Slug} {
		for _, tc := range []struct {
			origin string
			want   int
		}{
			{"https://evil.example", 403},
			{"null", 403},
			{strings.Replace(p.srv.URL, "127.0.0.1", "localhost", 1), 403}, // another origin, though the same machine
			{"", 200},
			{p.srv.URL, 200},
			{"http://localhost:6274", 200},
		} {
			h := map[string]string{"Authorization": "Bearer " + p.key}
			if tc.origin != "" {
				h["Origin"] = tc.origin
			}
			st, _, b := p.rawMCP(t, http.MethodPost, path, initializeBody, h)
			if st != tc.want {
				t.Errorf("%s with Origin %q: %d, want %d (%s)", path, tc.origin, st, tc.want, b)
			}
			if st == 403 {
				if e := mcpEnvelope(t, path+" foreign origin", b); e.Code != api.CodeForbidden {
					t.Errorf("%s foreign origin: code %s", path, e.Code)
				}
			}
		}
	}
}

// Every error of the MCP server is the envelope (spec §7, issue 33): the SDK's transport refusals answer their
// status with the envelope as the body; an over-quota open on an environment's address answers 402 with it (not
// a JSON-RPC error in a 200); a JSON-RPC error in a 200 (an unknown tool) carries it in error.data.
func TestMCPErrorsAreEnvelopes(t *testing.T) {
	plans := &usage.Plans{Default: "small", ByName: map[string]usage.Plan{"small": {OpenSessions: 1}}}
	p := newMCPPlaneWith(t, schema.DriverSQLite, shopBundle(t), planeOptions{plans: plans}, 0, nil)
	auth := map[string]string{"Authorization": "Bearer " + p.key}
	cs := connectAt(t, p.srv.URL+"/mcp", p.key, api.MCPSessionVersions()[0]) // MCP sessions' own refusals
	big := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 5<<20) + `"}}`
	batch := `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`
	with := func(extra map[string]string) map[string]string {
		h := map[string]string{}
		for k, v := range auth {
			h[k] = v
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	session := map[string]string{"Mcp-Session-Id": cs.ID(), "Mcp-Protocol-Version": cs.InitializeResult().ProtocolVersion}
	for _, tc := range []struct {
		name, method, body string
		headers            map[string]string
		status             int
		code               string
	}{
		{"malformed payload", http.MethodPost, `{"jsonrpc":`, with(session), 400, api.CodeInvalid},
		{"a batch", http.MethodPost, batch, with(session), 400, api.CodeInvalid},
		{"a body over the cap", http.MethodPost, big, with(session), 413, api.CodeTooLarge},
		{"another workspace on my session", http.MethodPost, `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`,
			map[string]string{"Authorization": "Bearer " + p.otherKey, "Mcp-Session-Id": cs.ID(), "Mcp-Protocol-Version": session["Mcp-Protocol-Version"]}, 403, api.CodeForbidden},
		{"an unknown session", http.MethodPost, `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`,
			with(map[string]string{"Mcp-Session-Id": "nope", "Mcp-Protocol-Version": session["Mcp-Protocol-Version"]}), 404, api.CodeNotFound},
		{"a wrong Accept", http.MethodPost, initializeBody, with(map[string]string{"Accept": "text/html"}), 400, api.CodeInvalid},
		{"a wrong method", http.MethodPut, initializeBody, auth, 405, api.CodeMethodNotAllowed},
	} {
		st, h, b := p.rawMCP(t, tc.method, "/mcp", tc.body, tc.headers)
		if st != tc.status || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
			t.Errorf("%s: %d %s %q, want %d with the envelope", tc.name, st, h.Get("Content-Type"), b, tc.status)
			continue
		}
		if e := mcpEnvelope(t, tc.name, b); e.Code != tc.code {
			t.Errorf("%s: code %s, want %s", tc.name, e.Code, tc.code)
		}
	}

	// Over the open-sessions quota, an environment's address answers 402 with the envelope.
	p.open(nil)
	st, h, b := p.rawMCP(t, http.MethodPost, "/mcp/envs/"+p.env.Slug, initializeBody, auth)
	if st != http.StatusPaymentRequired || h.Get("Mcp-Session-Id") != "" {
		t.Fatalf("initialize over the quota: %d %q %s, want 402 and no MCP session", st, h.Get("Mcp-Session-Id"), b)
	}
	var env map[string]any
	_ = json.Unmarshal(b, &env)
	wantMeter(t, env, usage.MeterOpenSessions, 1, 1, false)

	// A JSON-RPC error in a 200 carries the envelope in error.data.
	st, _, b = p.rawMCP(t, http.MethodPost, "/mcp", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"no.such.tool","arguments":{}}}`, with(session))
	body := string(b)
	if i := strings.Index(body, "data: "); i >= 0 { // an SSE answer: its one event's data
		body = strings.TrimSpace(strings.SplitN(body[i+6:], "\n", 2)[0])
	}
	var rpc struct {
		Error struct {
			Code int `json:"code"`
			Data struct {
				HTTPStatus int          `json:"httpStatus"`
				Envelope   api.Envelope `json:"envelope"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &rpc); err != nil || st != 200 || rpc.Error.Code == 0 || rpc.Error.Data.HTTPStatus == 0 ||
		rpc.Error.Data.Envelope.Code == "" || !strings.HasPrefix(rpc.Error.Data.Envelope.RequestID, "req_") {
		t.Errorf("an unknown tool: %d %s, want a JSON-RPC error with the envelope in error.data", st, b)
	}
	// So does one at the stateless revision (whose Streamable HTTP answers a request's error with 400).
	st, out := p.rpc(t, "/mcp", p.key, api.MCPStatelessVersion, "tools/call", map[string]any{"name": "no.such.tool", "arguments": map[string]any{}})
	e, _ := out["error"].(map[string]any)
	data, _ := e["data"].(map[string]any)
	if envelope, _ := data["envelope"].(map[string]any); st != http.StatusBadRequest || data["httpStatus"] == nil || envelope["code"] == nil ||
		!strings.HasPrefix(str(envelope["requestId"]), "req_") {
		t.Errorf("an unknown tool at %s: %d %v, want a JSON-RPC error with the envelope in error.data", api.MCPStatelessVersion, st, out)
	}
}
