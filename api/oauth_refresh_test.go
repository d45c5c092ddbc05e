package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/schema"
)

// oauthClient is a registered public client and the redirect URI it registered.
type oauthClient struct {
	id, redirect string
}

// register registers a client as MCP hosts do (mcp-remote, mcp-go): both grants, no secret.
func (p *mcpPlane) register(t testing.TB, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.srv.URL+"/oauth/register", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func (p *mcpPlane) newClient(t testing.TB) oauthClient {
	t.Helper()
	const redirect = "http://127.0.0.1:7777/callback"
	code, out := p.register(t, map[string]any{"client_name": "mcp host", "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		"token_endpoint_auth_method": "none"})
	if code != http.StatusCreated {
		t.Fatalf("register with the refresh_token grant: %d %v", code, out)
	}
	return oauthClient{id: str(out["client_id"]), redirect: redirect}
}

// code runs the consent for c with key (and resource, when given) and answers the code and its verifier.
func (p *mcpPlane) code(t testing.TB, c oauthClient, key, resource string) (code, verifier string) {
	t.Helper()
	verifier = oauth2.GenerateVerifier()
	q := url.Values{"client_id": {c.id}, "redirect_uri": {c.redirect}, "response_type": {"code"}, "state": {"s"},
		"code_challenge": {oauth2.S256ChallengeFromVerifier(verifier)}, "code_challenge_method": {"S256"}}
	if resource != "" {
		q.Set("resource", resource)
	}
	loc := newOAuthFlow(p).consent(t, p.srv.URL+"/oauth/authorize?"+q.Encode(), key)
	if loc.Query().Get("code") == "" {
		t.Fatalf("consent answered %s", loc)
	}
	return loc.Query().Get("code"), verifier
}

// tokenPost posts form to the token endpoint and answers the status and the JSON body.
func (p *mcpPlane) tokenPost(t testing.TB, form url.Values) (int, map[string]any) {
	t.Helper()
	resp, err := http.PostForm(p.srv.URL+"/oauth/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// exchange trades a code for tokens, failing the test on an error answer.
func (p *mcpPlane) exchange(t testing.TB, c oauthClient, code, verifier string, extra url.Values) map[string]any {
	t.Helper()
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
		"client_id": {c.id}, "redirect_uri": {c.redirect}}
	for k, v := range extra {
		form[k] = v
	}
	st, out := p.tokenPost(t, form)
	if st != http.StatusOK {
		t.Fatalf("exchange: %d %v", st, out)
	}
	return out
}

func (p *mcpPlane) refresh(t testing.TB, c oauthClient, rt string) (int, map[string]any) {
	t.Helper()
	return p.tokenPost(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}, "client_id": {c.id}})
}

// Refresh tokens (issue 34): a client registers with the refresh_token grant, as mcp-remote and mcp-go do; the
// code gives an access token and a refresh token; refreshing rotates the refresh token; presenting a rotated one
// again revokes every token of that authorization; revoking the consenting key ends the refresh token too.
func TestOAuthRefreshTokens(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newMCPPlaneWith(t, driver, shopBundle(t), planeOptions{}, 0, nil)
		resp, err := http.Get(p.srv.URL + "/.well-known/oauth-authorization-server")
		if err != nil {
			t.Fatal(err)
		}
		var meta map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&meta)
		resp.Body.Close()
		if !jsonEqual(t, meta["grant_types_supported"], []any{"authorization_code", "refresh_token"}) {
			t.Fatalf("grant_types_supported = %v", meta["grant_types_supported"])
		}
		c := p.newClient(t)
		code, verifier := p.code(t, c, p.key, "")
		first := p.exchange(t, c, code, verifier, nil)
		at1, rt1 := str(first["access_token"]), str(first["refresh_token"])
		if !strings.HasPrefix(at1, "mcp_at_") || !strings.HasPrefix(rt1, "mcp_rt_") {
			t.Fatalf("token answer %v: want an mcp_at_ and an mcp_rt_", first)
		}
		if n, _ := p.db.NewSelect().Model((*schema.OAuthRefreshToken)(nil)).Where("hash = ?", rt1).Count(t.Context()); n != 0 {
			t.Fatal("the refresh token is stored in plain text")
		}
		// A refresh token is no bearer credential.
		if hr, _ := p.postInitialize(t, "/mcp", rt1); hr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a refresh token as a bearer: %d", hr.StatusCode)
		}
		// Another client cannot use it.
		other := p.newClient(t)
		if st, out := p.refresh(t, other, rt1); st != http.StatusBadRequest || out["error"] != "invalid_grant" {
			t.Fatalf("another client's refresh: %d %v", st, out)
		}

		st, second := p.refresh(t, c, rt1)
		if st != http.StatusOK {
			t.Fatalf("refresh: %d %v", st, second)
		}
		at2, rt2 := str(second["access_token"]), str(second["refresh_token"])
		if at2 == at1 || rt2 == rt1 || !strings.HasPrefix(rt2, "mcp_rt_") {
			t.Fatalf("refresh answered %v: want a new access token and a rotated refresh token", second)
		}
		for _, tok := range []string{at1, at2} {
			if hr, _ := p.postInitialize(t, "/mcp", tok); hr.StatusCode != http.StatusOK {
				t.Fatalf("access token after one refresh: %d", hr.StatusCode)
			}
		}
		// x/oauth2 refreshes with it as a client library does.
		cfg := &oauth2.Config{ClientID: c.id, Endpoint: oauth2.Endpoint{TokenURL: p.srv.URL + "/oauth/token", AuthStyle: oauth2.AuthStyleInParams}}
		tok3, err := cfg.TokenSource(t.Context(), &oauth2.Token{RefreshToken: rt2}).Token()
		if err != nil || !strings.HasPrefix(tok3.AccessToken, "mcp_at_") || tok3.RefreshToken == rt2 {
			t.Fatalf("x/oauth2 refresh: %+v %v", tok3, err)
		}

		// The rotated rt1 presented again: refused, and the whole family ends.
		if st, out := p.refresh(t, c, rt1); st != http.StatusBadRequest || out["error"] != "invalid_grant" {
			t.Fatalf("reused refresh token: %d %v", st, out)
		}
		for name, tok := range map[string]string{"first": at1, "second": at2, "third": tok3.AccessToken} {
			if hr, _ := p.postInitialize(t, "/mcp", tok); hr.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s access token after a refresh token was reused: %d, want 401", name, hr.StatusCode)
			}
		}
		if st, out := p.refresh(t, c, tok3.RefreshToken); st != http.StatusBadRequest || out["error"] != "invalid_grant" {
			t.Fatalf("the family's newest refresh token after a reuse: %d %v", st, out)
		}

		// Another authorization's family is untouched by that, and revoking its refresh token (RFC 7009) ends it.
		code, verifier = p.code(t, c, p.key, "")
		fam := p.exchange(t, c, code, verifier, nil)
		resp, err = http.PostForm(p.srv.URL+"/oauth/revoke", url.Values{"token": {str(fam["refresh_token"])},
			"token_type_hint": {"refresh_token"}, "client_id": {c.id}})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("revoke a refresh token: %v %v", resp, err)
		}
		resp.Body.Close()
		if hr, _ := p.postInitialize(t, "/mcp", str(fam["access_token"])); hr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("access token of a revoked refresh token's family: %d", hr.StatusCode)
		}
	})
}

// The token endpoint's errors follow RFC 6749 §5.2 (issue 34): a missing grant_type is invalid_request, an unknown
// one unsupported_grant_type; a valid code with a missing client_id is invalid_request, with an unknown one
// invalid_client (401); the metadata carries no empty jwks_uri. Each error is also the envelope.
func TestOAuthTokenErrors(t *testing.T) {
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	resp, err := http.Get(p.srv.URL + "/.well-known/oauth-authorization-server")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(raw), `"jwks_uri"`) {
		t.Errorf("metadata carries jwks_uri with no key set: %s", raw)
	}
	c := p.newClient(t)
	code, verifier := p.code(t, c, p.key, "")
	good := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
		"client_id": {c.id}, "redirect_uri": {c.redirect}}
	with := func(k, v string) url.Values {
		f := url.Values{}
		for kk, vv := range good {
			f[kk] = vv
		}
		if v == "" {
			f.Del(k)
		} else {
			f.Set(k, v)
		}
		return f
	}
	for _, tc := range []struct {
		name   string
		form   url.Values
		status int
		error  string
	}{
		{"no grant_type", with("grant_type", ""), 400, "invalid_request"},
		{"an unknown grant_type", with("grant_type", "password"), 400, "unsupported_grant_type"},
		{"no client_id", with("client_id", ""), 400, "invalid_request"},
		{"an unknown client_id", with("client_id", "oc_nobodyatall"), 401, "invalid_client"},
		{"no code", with("code", ""), 400, "invalid_request"},
		{"a resource of another server", with("resource", "https://elsewhere.example/mcp"), 400, "invalid_target"},
		{"no refresh_token", url.Values{"grant_type": {"refresh_token"}, "client_id": {c.id}}, 400, "invalid_request"},
	} {
		st, out := p.tokenPost(t, tc.form)
		if st != tc.status || out["error"] != tc.error || out["code"] == "" || !strings.HasPrefix(str(out["requestId"]), "req_") {
			t.Errorf("%s: %d %v, want %d %s with the envelope", tc.name, st, out, tc.status, tc.error)
		}
	}
	// The code survived every refusal: it still exchanges.
	p.exchange(t, c, code, verifier, nil)
}
