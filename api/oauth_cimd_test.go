package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/webhook"
)

// Client ID Metadata Documents (issue 34): a client names itself by the https URL of its metadata document, which
// the server fetches through the webhooks' SSRF guard at the authorization request; the flow then runs as for a
// registered client. A document that names another client_id, or one the guard refuses to reach, is invalid_client;
// a server without the guard does not advertise the feature and refuses such a client_id.
func TestOAuthClientIDMetadataDocument(t *testing.T) {
	const redirect = "http://127.0.0.1:7777/callback"
	var fetches atomic.Int64
	var doc func(self string) map[string]any
	docs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		self := "https://" + r.Host + r.URL.Path
		_ = json.NewEncoder(w).Encode(doc(self))
	}))
	t.Cleanup(docs.Close)
	loopback := &webhook.Guard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	transport := func(g *webhook.Guard) http.RoundTripper {
		return &http.Transport{DialContext: g.Dialer().DialContext, TLSClientConfig: docs.Client().Transport.(*http.Transport).TLSClientConfig}
	}
	p := newMCPPlaneWith(t, schema.DriverSQLite, shopBundle(t), planeOptions{}, 0, func(m *api.MCPRoutes) {
		m.ClientMetadataGuard, m.ClientMetadataTransport = loopback, transport(loopback)
	})
	var meta map[string]any
	resp, err := http.Get(p.srv.URL + "/.well-known/oauth-authorization-server")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&meta)
	resp.Body.Close()
	if meta["client_id_metadata_document_supported"] != true {
		t.Fatalf("metadata: %v", meta)
	}

	clientID := docs.URL + "/oauth/client.json"
	doc = func(self string) map[string]any {
		return map[string]any{"client_id": self, "client_name": "a CIMD client", "redirect_uris": []string{redirect},
			"grant_types": []string{"authorization_code", "refresh_token"}, "token_endpoint_auth_method": "none"}
	}
	c := oauthClient{id: clientID, redirect: redirect}
	code, verifier := p.code(t, c, p.key, "")
	out := p.exchange(t, c, code, verifier, nil)
	if hr, _ := p.postInitialize(t, "/mcp", str(out["access_token"])); hr.StatusCode != http.StatusOK || fetches.Load() == 0 {
		t.Fatalf("a CIMD client's token on /mcp: %d (%d fetches)", hr.StatusCode, fetches.Load())
	}
	if st, rb := p.refresh(t, c, str(out["refresh_token"])); st != http.StatusOK {
		t.Fatalf("a CIMD client's refresh: %d %v", st, rb)
	}

	authorize := func(p *mcpPlane, clientID string) (int, map[string]any) {
		q := url.Values{"client_id": {clientID}, "redirect_uri": {redirect}, "response_type": {"code"}, "state": {"s"},
			"code_challenge": {oauth2.S256ChallengeFromVerifier(oauth2.GenerateVerifier())}, "code_challenge_method": {"S256"}}
		resp, err := newOAuthFlow(p).noFollow.Get(p.srv.URL + "/oauth/authorize?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	// A document naming another client, or with a redirect URI the rules refuse.
	doc = func(string) map[string]any {
		return map[string]any{"client_id": "https://elsewhere.example/client.json", "redirect_uris": []string{redirect}}
	}
	if st, e := authorize(p, clientID); st != 400 || e["error"] != "invalid_client" {
		t.Errorf("a document naming another client_id: %d %v", st, e)
	}
	doc = func(self string) map[string]any {
		return map[string]any{"client_id": self, "redirect_uris": []string{"javascript:alert(1)"}}
	}
	if st, e := authorize(p, clientID); st != 400 || e["error"] != "invalid_client" {
		t.Errorf("a document with a javascript: redirect URI: %d %v", st, e)
	}
	doc = func(self string) map[string]any {
		return map[string]any{"client_id": self, "redirect_uris": []string{redirect}}
	}
	// The SSRF guard: with the webhooks' default rules, a document on a loopback address is not fetched.
	strict := &webhook.Guard{}
	before := fetches.Load()
	ps := newMCPPlaneWith(t, schema.DriverSQLite, shopBundle(t), planeOptions{}, 0, func(m *api.MCPRoutes) {
		m.ClientMetadataGuard, m.ClientMetadataTransport = strict, transport(strict)
	})
	if st, e := authorize(ps, clientID); st != 400 || e["error"] != "invalid_client" || !strings.Contains(str(e["detail"]), "127.0.0.1") {
		t.Errorf("a loopback document past the default guard: %d %v", st, e)
	}
	if fetches.Load() != before {
		t.Errorf("the guard let a fetch of a loopback document through")
	}
	// Without the guard configured: no CIMD at all.
	plain := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	if st, e := authorize(plain, clientID); st != 400 || e["error"] != "invalid_client" {
		t.Errorf("a CIMD client on a server without it: %d %v", st, e)
	}
}
