package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/schema"
)

// OAuth endpoints a FuzzOAuth input goes to, by its first argument (modulo their number).
var oauthFuzzRoutes = []struct{ method, path, contentType string }{
	{http.MethodPost, "/oauth/register", "application/json"},
	{http.MethodGet, "/oauth/authorize", ""}, // the body is the query
	{http.MethodPost, "/oauth/authorize", "application/x-www-form-urlencoded"},
	{http.MethodPost, "/oauth/token", "application/x-www-form-urlencoded"},
	{http.MethodPost, "/oauth/revoke", "application/x-www-form-urlencoded"},
}

// FuzzOAuth sends fuzzed bodies to the OAuth endpoints (issue 33): dynamic registration (JSON), the authorization
// request and the consent form, the token endpoint and revocation (forms). Never a 5xx; every 4xx is the envelope
// and, on register and token, an OAuth error code too; a registration is accepted only with redirect URIs the
// rules allow and answers no secret; a redirect goes only to a redirect URI the client registered; a token answer
// carries an mcp_at_ access token and an mcp_rt_ refresh token.
func FuzzOAuth(f *testing.F) {
	p := newMCPPlane(f, schema.DriverSQLite, shopBundle(f))
	const redirect = "http://127.0.0.1:7777/callback"
	reg, _ := json.Marshal(map[string]any{"client_name": "fuzz", "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code", "refresh_token"}})
	w := fuzzSend(p.h, postJSON("/oauth/register", reg), "")
	var client struct {
		ClientID string `json:"client_id"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &client); err != nil || w.Code != http.StatusCreated {
		f.Fatalf("register: %d %s", w.Code, w.Body)
	}
	verifier := oauth2.GenerateVerifier()
	authz := url.Values{"client_id": {client.ClientID}, "redirect_uri": {redirect}, "response_type": {"code"}, "state": {"s"},
		"code_challenge": {oauth2.S256ChallengeFromVerifier(verifier)}, "code_challenge_method": {"S256"}}
	consent := url.Values{}
	for k, v := range authz {
		consent[k] = v
	}
	consent.Set("workspace_key", p.key)
	consent.Set("decision", "allow")
	seeds := []struct {
		route int
		body  string
	}{
		{0, string(reg)},
		{0, `{"redirect_uris":["javascript:alert(1)"]}`},
		{0, `{"redirect_uris":["http://evil.example/cb"],"grant_types":["password"]}`},
		{0, `{"redirect_uris":["com.example.app:/cb"],"response_types":["token"]}`},
		{0, `{"redirect_uris":[]}`},
		{0, `{"redirect_uris":"x"}`},
		{0, `{`},
		{0, ``},
		{1, authz.Encode()},
		{1, authz.Encode() + "&resource=" + url.QueryEscape(p.srv.URL+"/mcp/envs/x")},
		{1, authz.Encode() + "&resource=https%3A%2F%2Fevil.example%2Fmcp"},
		{1, "client_id=" + client.ClientID + "&redirect_uri=http%3A%2F%2Fevil.example%2F"},
		{1, "client_id=nope"},
		{1, "%zz"},
		{2, consent.Encode()},
		{2, strings.Replace(consent.Encode(), "decision=allow", "decision=deny", 1)},
		{2, strings.Replace(consent.Encode(), "workspace_key=", "workspace_key=x", 1)},
		{3, "grant_type=authorization_code&code=mcp_ac_x&code_verifier=" + verifier + "&client_id=" + client.ClientID + "&redirect_uri=" + url.QueryEscape(redirect)},
		{3, "grant_type=refresh_token&refresh_token=mcp_rt_x&client_id=" + client.ClientID},
		{3, "grant_type=password&username=a&password=b"},
		{3, "code=x"},
		{3, "grant_type=authorization_code&grant_type=refresh_token"},
		{3, "grant_type=refresh_token&client_id=" + client.ClientID + "&resource=%00"},
		{4, "token=mcp_at_x&client_id=" + client.ClientID},
		{4, "token=mcp_rt_x&token_type_hint=refresh_token&client_id=" + client.ClientID},
		{4, "token_type_hint=id_token&token=x&client_id=x"},
		// A NUL or non-UTF-8 byte in a form value or a registration reached SQLite (a 500 in CI's fuzzing).
		{3, "grant_type=refresh_token&refresh_token=mcp_rt_x&client_id=%00"},
		{3, "grant_type=authorization_code&code=%00&client_id=" + client.ClientID},
		{4, "token=mcp_at_x&client_id=%FF"},
		{2, strings.Replace(consent.Encode(), "client_id=", "client_id=%00", 1)},
		{0, `{"redirect_uris":["http://127.0.0.1:7777/callback"],"client_name":"a\u0000b"}`},
		// An empty fragment leaves url.URL.Fragment empty; the registration accepted it (CI's fuzzing).
		{0, `{"redirect_uris":["com.example.app:/cb#"]}`},
		{0, `{"redirect_uris":["http://127.0.0.1:7777/callback#"]}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.route), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		rt := oauthFuzzRoutes[int(route)%len(oauthFuzzRoutes)]
		var r *http.Request
		if rt.method == http.MethodGet {
			r = httptest.NewRequest(rt.method, "/oauth/authorize", nil)
			r.URL.RawQuery = string(body)
		} else {
			r = httptest.NewRequest(rt.method, rt.path, bytes.NewReader(body))
			r.Header.Set("Content-Type", rt.contentType)
		}
		w := fuzzSend(p.h, r, "")
		switch {
		case w.Code >= 500:
			t.Fatalf("%s %s: %d %s", rt.method, rt.path, w.Code, w.Body)
		case w.Code == http.StatusFound:
			loc := w.Header().Get("Location")
			if !strings.HasPrefix(loc, redirect+"?") {
				t.Fatalf("%s %s redirected to %q, not the client's registered redirect URI", rt.method, rt.path, loc)
			}
		case w.Code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "application/json"):
			checkEnvelope(t, w)
			if rt.path == "/oauth/register" || rt.path == "/oauth/token" {
				var e map[string]any
				_ = json.Unmarshal(w.Body.Bytes(), &e)
				if c, _ := e["error"].(string); c == "" {
					t.Fatalf("%s %d without an OAuth error code: %s", rt.path, w.Code, w.Body)
				}
			}
		case w.Code >= 400 && !(rt.path == "/oauth/authorize" && w.Code == http.StatusUnauthorized):
			t.Fatalf("%s %s: %d answered %s, not the envelope", rt.method, rt.path, w.Code, w.Header().Get("Content-Type"))
		case rt.path == "/oauth/register" && w.Code == http.StatusCreated:
			var c map[string]any
			_ = json.Unmarshal(w.Body.Bytes(), &c)
			if _, secret := c["client_secret"]; secret || c["token_endpoint_auth_method"] != "none" {
				t.Fatalf("a registration answered a confidential client: %s", w.Body)
			}
			uris, _ := c["redirect_uris"].([]any)
			for _, u := range uris {
				s, _ := u.(string)
				if l := strings.ToLower(s); strings.HasPrefix(l, "javascript:") || strings.HasPrefix(l, "data:") || strings.Contains(s, "#") {
					t.Fatalf("a registration accepted redirect URI %q", s)
				}
			}
		case rt.path == "/oauth/token" && w.Code == http.StatusOK:
			var tok map[string]any
			_ = json.Unmarshal(w.Body.Bytes(), &tok)
			if a, _ := tok["access_token"].(string); !strings.HasPrefix(a, "mcp_at_") {
				t.Fatalf("a token answer without an mcp_at_ token: %s", w.Body)
			}
			if rt, _ := tok["refresh_token"].(string); !strings.HasPrefix(rt, "mcp_rt_") {
				t.Fatalf("a token answer without an mcp_rt_ refresh token: %s", w.Body)
			}
		}
	})
}

func postJSON(path string, body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}
