package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/cred"
)

// doppel dev builds every URL of the MCP server's OAuth on its public URL — derived from api.addr when
// api.public_url is unset, as here — and never on a request's Host or X-Forwarded-* headers (issue 33): with
// Host: evil.example the issuer, the endpoints, the protected resource and WWW-Authenticate still name the
// server's own address.
func TestDevMCPURLsIgnoreRequestHost(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	s := startE2EStack(t, t.TempDir(), m.Plaintext, e2eFreeAddr(t), e2eFreeAddr(t), e2eFreeAddr(t))
	do := func(method, path string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, s.apiURL+path, strings.NewReader(`{}`))
		req.Host = "evil.example"
		req.Header.Set("X-Forwarded-Host", "evil.example")
		req.Header.Set("X-Forwarded-Proto", "https")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := s.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	for _, path := range []string{"/.well-known/oauth-authorization-server", "/.well-known/oauth-protected-resource/mcp"} {
		_, b := do(http.MethodGet, path)
		var meta map[string]any
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatalf("%s: %s", path, b)
		}
		if strings.Contains(string(b), "evil.example") {
			t.Errorf("%s names the request's Host: %s", path, b)
		}
		for _, k := range []string{"issuer", "authorization_endpoint", "token_endpoint", "resource"} {
			if v, ok := meta[k].(string); ok && !strings.HasPrefix(v, s.apiURL) {
				t.Errorf("%s %s = %s, want under %s", path, k, v, s.apiURL)
			}
		}
	}
	resp, _ := do(http.MethodPost, "/mcp")
	if want := `Bearer resource_metadata="` + s.apiURL + `/.well-known/oauth-protected-resource/mcp"`; resp.StatusCode != http.StatusUnauthorized ||
		resp.Header.Get("WWW-Authenticate") != want {
		t.Errorf("/mcp without a credential: %d %q, want 401 %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), want)
	}
}
