package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// The workspace face: every registry verb is a tool with the verb's input schema, answered by the verb's REST route.
func TestMCPWorkspaceFace(t *testing.T) {
	ctx := context.Background()
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	cs := p.connect(t, "/mcp", p.key)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := p.api.Get("/api/registry")
	var reg struct{ Verbs []api.RegistryVerb }
	if err := json.Unmarshal(res.Body.Bytes(), &reg); err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != len(reg.Verbs) {
		t.Fatalf("%d tools, %d verbs", len(tools.Tools), len(reg.Verbs))
	}
	sort.Slice(tools.Tools, func(i, j int) bool { return tools.Tools[i].Name < tools.Tools[j].Name })
	for i, v := range reg.Verbs {
		tl := tools.Tools[i]
		if tl.Name != api.VerbToolName(v.Name) || !jsonEqual(t, tl.InputSchema, v.Input) || !strings.HasPrefix(tl.Description, v.Summary) {
			t.Errorf("tool %s is not verb %s", tl.Name, v.Name)
		}
		if ro := tl.Annotations != nil && tl.Annotations.ReadOnlyHint; ro != (v.Kind == "query") {
			t.Errorf("tool %s: readOnlyHint %v for a %s", tl.Name, ro, v.Kind)
		}
	}

	// A verb answers what its REST route answers.
	got, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "envs_get", Arguments: map[string]any{"slug": p.env.Slug}})
	if err != nil || got.IsError {
		t.Fatalf("envs.get: %+v %v", got, err)
	}
	_, want := p.do(http.MethodGet, "/v1/envs/"+p.env.Slug, p.key, nil)
	var gotBody map[string]any
	if err := json.Unmarshal([]byte(textOf(t, got)), &gotBody); err != nil || !jsonEqual(t, gotBody, want) || !jsonEqual(t, got.StructuredContent, want) {
		t.Fatalf("envs.get over MCP = %s, REST = %v", textOf(t, got), want)
	}
	// A session opened and called through the verbs.
	open, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions_open", Arguments: map[string]any{"slug": p.env.Slug, "seed": 42, "seedInstructions": pending2}})
	if err != nil || open.IsError {
		t.Fatalf("sessions.open: %+v %v", open, err)
	}
	rest := p.open(map[string]any{"seed": 42, "seedInstructions": pending2})
	var opened map[string]any
	_ = json.Unmarshal([]byte(textOf(t, open)), &opened)
	if opened["world_hash"] != rest.Open["world_hash"] {
		t.Fatalf("sessions.open over MCP: world %v, REST %v", opened["world_hash"], rest.Open["world_hash"])
	}

	// A verb's error is isError with the REST route's envelope.
	for _, c := range []struct {
		name   string
		args   map[string]any
		status int
		field  string
	}{
		{"envs_get", map[string]any{"slug": "nope"}, 404, ""},
		{"envs_get", map[string]any{"slug": p.otherEnv.Slug}, 404, ""},
		{"sessions_call", map[string]any{"session_id": opened["sessionId"], "arguments": map[string]any{}}, 422, "name"},
		{"sessions_open", map[string]any{"slug": p.env.Slug, "seed": "x"}, 422, "body.seed"},
		{"envs_tools", map[string]any{"slug": p.env.Slug, "colour": "red"}, 422, "input.colour"},
	} {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil || !r.IsError {
			t.Errorf("%s %v: %+v %v, want isError", c.name, c.args, r, err)
			continue
		}
		var env api.Envelope
		if err := json.Unmarshal([]byte(textOf(t, r)), &env); err != nil || env.Code == "" || !strings.HasPrefix(env.RequestID, "req_") ||
			!strings.Contains(env.Detail, c.field) {
			t.Errorf("%s: envelope %s", c.name, textOf(t, r))
		}
		if m := metaOf(t, r.Meta, api.MetaError); m["httpStatus"] != float64(c.status) {
			t.Errorf("%s: status %v, want %d", c.name, m["httpStatus"], c.status)
		}
	}
}

// oauthFlow is a client's view of the authorization server: discovery, registration, and the consent step.
type oauthFlow struct {
	p        *mcpPlane
	clientID string
	noFollow *http.Client
}

// consent answers an authorization URL as a user would, by posting the workspace key to the consent form.
func (f *oauthFlow) consent(t testing.TB, authURL, key string) *url.URL {
	t.Helper()
	resp, err := http.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `name="workspace_key"`) {
		t.Fatalf("consent page: %d %s", resp.StatusCode, page)
	}
	u, _ := url.Parse(authURL)
	form := u.Query()
	f.clientID = form.Get("client_id")
	form.Set("workspace_key", key)
	form.Set("decision", "allow")
	resp, err = f.noFollow.PostForm(f.p.srv.URL+"/oauth/authorize", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("consent: %d", resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func newOAuthFlow(p *mcpPlane) *oauthFlow {
	return &oauthFlow{p: p, noFollow: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// The OAuth flow end to end with the SDK's own client: discovery from the 401, registration, consent with PKCE,
// the token, /mcp with it; then revocation, and the refusals of a wrong verifier, a reused code and an expired token.
func TestMCPOAuthFlow(t *testing.T) {
	ctx := context.Background()
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	flow := newOAuthFlow(p)
	const redirect = "http://127.0.0.1:7777/callback"

	// Discovery documents.
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, p.srv.URL+"/.well-known/oauth-protected-resource/mcp", p.srv.URL+"/mcp", nil)
	if err != nil || len(prm.AuthorizationServers) != 1 || prm.AuthorizationServers[0] != p.srv.URL {
		t.Fatalf("protected resource metadata: %+v %v", prm, err)
	}
	if _, err := oauthex.GetProtectedResourceMetadata(ctx, p.srv.URL+"/.well-known/oauth-protected-resource", p.srv.URL, nil); err != nil {
		t.Fatalf("root protected resource metadata: %v", err)
	}
	asm, err := auth.GetAuthServerMetadata(ctx, p.srv.URL, nil)
	if err != nil || asm == nil || asm.CodeChallengeMethodsSupported[0] != "S256" || asm.RevocationEndpoint == "" || asm.RegistrationEndpoint == "" {
		t.Fatalf("authorization server metadata: %+v %v", asm, err)
	}

	// The SDK's client runs the whole flow from the first 401.
	var token string
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			ClientName: "doppel test", RedirectURIs: []string{redirect}, TokenEndpointAuthMethod: "none"}},
		AuthorizationCodeFetcher: func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			loc := flow.consent(t, args.URL, p.key)
			return &auth.AuthorizationResult{Code: loc.Query().Get("code"), State: loc.Query().Get("state"), Iss: loc.Query().Get("iss")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "oauth-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.srv.URL + "/mcp", OAuthHandler: h}, nil)
	if err != nil {
		t.Fatalf("connect with OAuth: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "envs_list", Arguments: map[string]any{}})
	if err != nil || r.IsError || !strings.Contains(textOf(t, r), p.env.Slug) {
		t.Fatalf("envs.list with the OAuth token: %+v %v", r, err)
	}
	firstClient := flow.clientID
	// An environment's address, seeded by its query, authorizes the same way.
	h2, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			ClientName: "doppel test", RedirectURIs: []string{redirect}, TokenEndpointAuthMethod: "none"}},
		AuthorizationCodeFetcher: func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			loc := flow.consent(t, args.URL, p.key)
			return &auth.AuthorizationResult{Code: loc.Query().Get("code"), State: loc.Query().Get("state"), Iss: loc.Query().Get("iss")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	envCS, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.srv.URL + "/mcp/envs/" + p.env.Slug + "?seed=42", OAuthHandler: h2}, nil)
	if err != nil {
		t.Fatalf("connect to an environment with OAuth: %v", err)
	}
	t.Cleanup(func() { _ = envCS.Close() })
	if m := metaOf(t, envCS.InitializeResult().Meta, api.MetaSession); m["seed"] != float64(42) {
		t.Fatalf("environment session over OAuth: %v", m)
	}
	ts, _ := h.TokenSource(ctx)
	tok, err := ts.Token()
	if err != nil || !strings.HasPrefix(tok.AccessToken, "mcp_at_") || tok.Expiry.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("token %+v %v, want an mcp_at_ token for about an hour", tok, err)
	}
	token = tok.AccessToken
	if n, _ := p.db.NewSelect().Model((*schema.APIKey)(nil)).Where("hash = ?", token).Count(ctx); n != 0 {
		t.Fatal("the token is stored in plain text")
	}

	// Revocation (RFC 7009), then 401 with the resource metadata.
	resp, err := http.PostForm(asm.RevocationEndpoint, url.Values{"token": {token}, "client_id": {firstClient}})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("revoke: %v %v", resp, err)
	}
	resp.Body.Close()
	hr, out := p.postInitialize(t, "/mcp", token)
	if hr.StatusCode != http.StatusUnauthorized || out["code"] != "unauthorized" ||
		hr.Header.Get("WWW-Authenticate") != `Bearer resource_metadata="`+p.srv.URL+`/.well-known/oauth-protected-resource/mcp"` {
		t.Fatalf("revoked token: %d %v %q", hr.StatusCode, out, hr.Header.Get("WWW-Authenticate"))
	}

	// By hand with x/oauth2: a wrong verifier, a reused code, an expired token.
	cfg := &oauth2.Config{ClientID: firstClient, RedirectURL: redirect,
		Endpoint: oauth2.Endpoint{AuthURL: asm.AuthorizationEndpoint, TokenURL: asm.TokenEndpoint, AuthStyle: oauth2.AuthStyleInParams}}
	code := func(verifier string) string {
		loc := flow.consent(t, cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier)), p.key)
		if loc.Query().Get("state") != "st" || loc.Query().Get("iss") != p.srv.URL {
			t.Fatalf("redirect %s", loc)
		}
		return loc.Query().Get("code")
	}
	verifier := oauth2.GenerateVerifier()
	c1 := code(verifier)
	var re *oauth2.RetrieveError
	if _, err := cfg.Exchange(ctx, c1, oauth2.VerifierOption(oauth2.GenerateVerifier())); !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("wrong verifier: %v", err)
	}
	if _, err := cfg.Exchange(ctx, c1); !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("no verifier: %v", err)
	}
	t1, err := cfg.Exchange(ctx, c1, oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	if hr, _ := p.postInitialize(t, "/mcp", t1.AccessToken); hr.StatusCode != 200 {
		t.Fatalf("fresh token: %d", hr.StatusCode)
	}
	if _, err := cfg.Exchange(ctx, c1, oauth2.VerifierOption(verifier)); !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("reused code: %v", err)
	}
	if hr, _ := p.postInitialize(t, "/mcp", t1.AccessToken); hr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the token of a reused code answers %d, want 401 (revoked)", hr.StatusCode)
	}
	v2 := oauth2.GenerateVerifier()
	t2, err := cfg.Exchange(ctx, code(v2), oauth2.VerifierOption(v2))
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := store.ResolveKey(ctx, p.db, t2.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.db.NewUpdate().Model((*schema.APIKey)(nil)).Set("expires_at = ?", schema.Now().Add(-time.Second)).
		Where("id = ?", key.ID).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if hr, _ := p.postInitialize(t, "/mcp", t2.AccessToken); hr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("expired token: %d, want 401", hr.StatusCode)
	}

	// PKCE is S256 only; a bad key re-shows the form.
	u, _ := url.Parse(cfg.AuthCodeURL("st"))
	q := u.Query()
	q.Set("code_challenge", "abc")
	q.Set("code_challenge_method", "plain")
	u.RawQuery = q.Encode()
	resp, err = flow.noFollow.Get(u.String())
	if err != nil || resp.StatusCode != http.StatusFound || !strings.Contains(resp.Header.Get("Location"), "error=invalid_request") {
		t.Fatalf("plain PKCE: %v %v", resp, err)
	}
	resp.Body.Close()
	form := url.Values{"client_id": {flow.clientID}, "redirect_uri": {redirect}, "response_type": {"code"}, "state": {"s"},
		"code_challenge": {oauth2.S256ChallengeFromVerifier(v2)}, "code_challenge_method": {"S256"}, "workspace_key": {"mk_live_nope"}}
	resp, err = flow.noFollow.PostForm(p.srv.URL+"/oauth/authorize", form)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad key at consent: %v %v", resp, err)
	}
	resp.Body.Close()
}

// An mcp_at_ token of one workspace sees none of another's environments or sessions, on either face.
func TestMCPCrossTenant(t *testing.T) {
	ctx := context.Background()
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	// A token of ws, issued through the store as the token endpoint issues it.
	client, err := store.CreateOAuthClient(ctx, p.db, "x", []string{"http://127.0.0.1:1/cb"})
	if err != nil {
		t.Fatal(err)
	}
	wsKey, _, err := store.ResolveKey(ctx, p.db, p.key)
	if err != nil {
		t.Fatal(err)
	}
	code := &schema.OAuthCode{ClientID: client.ID, WorkspaceID: p.ws.ID, KeyID: wsKey.ID, RedirectURI: "http://127.0.0.1:1/cb",
		Challenge: "c", ExpiresAt: schema.Now().Add(time.Minute)}
	if _, err := store.CreateOAuthCode(ctx, p.db, code); err != nil {
		t.Fatal(err)
	}
	_, token, err := store.IssueOAuthToken(ctx, p.db, code, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	theirs := p.plane
	_, theirOpen := theirs.do(http.MethodPost, "/v1/envs/"+p.otherEnv.Slug+"/sessions", p.otherKey, map[string]any{"seed": 1})
	theirSession := str(theirOpen["sessionId"])
	if theirSession == "" {
		t.Fatalf("their open: %v", theirOpen)
	}

	// The environment face.
	if hr, out := p.postInitialize(t, "/mcp/envs/"+p.otherEnv.Slug, token); hr.StatusCode != http.StatusNotFound || out["code"] != "notFound" {
		t.Fatalf("their environment's MCP address: %d %v", hr.StatusCode, out)
	}
	mine := p.connect(t, "/mcp/envs/"+p.env.Slug, token)
	if _, err := mine.ListTools(ctx, nil); err != nil {
		t.Fatalf("own environment with the token: %v", err)
	}
	// Their key cannot take over my MCP session: the SDK binds it to my workspace.
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+"/mcp/envs/"+p.env.Slug,
		strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+p.otherKey)
	req.Header.Set("Mcp-Session-Id", mine.ID())
	req.Header.Set("Mcp-Protocol-Version", mine.InitializeResult().ProtocolVersion)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another workspace's key on my MCP session: %d", resp.StatusCode)
	}

	// The workspace face.
	cs := p.connect(t, "/mcp", token)
	list, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "envs_list", Arguments: map[string]any{}})
	if err != nil || list.IsError || !strings.Contains(textOf(t, list), p.env.Slug) || strings.Contains(textOf(t, list), p.otherEnv.Slug) {
		t.Fatalf("envs.list: %+v %v", list, err)
	}
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"envs_get", map[string]any{"slug": p.otherEnv.Slug}},
		{"envs_tools", map[string]any{"slug": p.otherEnv.Slug}},
		{"sessions_open", map[string]any{"slug": p.otherEnv.Slug}},
		{"sessions_get", map[string]any{"session_id": theirSession}},
		{"sessions_transcript", map[string]any{"session_id": theirSession}},
		{"sessions_call", map[string]any{"session_id": theirSession, "name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}}},
		{"sessions_close", map[string]any{"session_id": theirSession}},
	} {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil || !r.IsError || metaOf(t, r.Meta, api.MetaError)["httpStatus"] != float64(404) {
			t.Errorf("%s of theirs: %+v %v, want a 404", c.name, r, err)
		}
	}
	// A short-lived token cannot mint keys.
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "keys_create", Arguments: map[string]any{"name": "forever"}})
	if err != nil || !r.IsError || metaOf(t, r.Meta, api.MetaError)["httpStatus"] != float64(401) {
		t.Fatalf("keys.create with an MCP token: %+v %v", r, err)
	}
	// Their session is untouched.
	if _, v := theirs.do(http.MethodGet, "/v1/sessions/"+theirSession, p.otherKey, nil); v["status"] != "open" {
		t.Fatalf("their session: %v", v)
	}
}
