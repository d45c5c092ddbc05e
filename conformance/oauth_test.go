package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
)

// TestOAuth authorizes MCP clients at doppel's OAuth 2.1 server as a host does, with two OAuth clients nobody here
// wrote: golang.org/x/oauth2 and mcp-go's own OAuth transport. Each registers itself (RFC 7591), sends the user to
// the authorization URL, where headless Chromium types the workspace key on the consent page and allows, receives
// the code at a loopback callback, exchanges it with its PKCE verifier, calls /mcp with the token, refreshes when
// the token has expired (both tokens rotate, and the old refresh token is then refused), and revokes the access
// token (RFC 7009), which /mcp then answers 401 with its protected resource metadata.
func TestOAuth(t *testing.T) {
	bin := chromium(t)
	if testing.Short() {
		t.Skip("builds and starts doppel")
	}
	d := startDoppel(t)
	b := newBrowser(t, bin)
	for _, c := range []struct {
		name string
		new  func(*testing.T, *doppel) oauthClient
	}{
		{"x-oauth2", newXOAuth2},
		{"mcp-go", newMCPGoOAuth},
	} {
		t.Run(c.name, func(t *testing.T) { oauthFlow(t, d, b, c.new(t, d)) })
	}
}

// oauthClient is one OAuth client library as the flow drives it.
type oauthClient interface {
	// register registers the client (RFC 7591) with redirect as its redirect URI.
	register(ctx context.Context, redirect string) error
	// authURL is the authorization URL the user's browser opens, with state and a fresh PKCE challenge.
	authURL(ctx context.Context, state string) (string, error)
	// exchange trades the callback's code and state for tokens, with the PKCE verifier.
	exchange(ctx context.Context, code, state string) error
	// listTools is an MCP call on /mcp (tools/list, after connecting) authorized by the client's token, which the
	// client refreshes first when it has expired.
	listTools(ctx context.Context) error
	// tokens are the client's current access and refresh tokens.
	tokens(ctx context.Context) (access, refresh string)
	// expire makes the client hold its access token for expired, so that its next use refreshes it.
	expire(ctx context.Context)
	// refreshWith asks the token endpoint for new tokens on the given refresh token; on failure it answers the
	// OAuth error code (RFC 6749 §5.2) as the library reports it.
	refreshWith(ctx context.Context, refresh string) (code string, err error)
	// clientID is the registered client's id; revocationEndpoint is the one the client discovered.
	clientID() string
	revocationEndpoint(ctx context.Context) (string, error)
}

func oauthFlow(t *testing.T, d *doppel, b *browser, c oauthClient) {
	ctx := context.Background()
	cb := newCallback(t)
	if err := c.register(ctx, cb.url); err != nil {
		t.Fatalf("dynamic client registration: %v", err)
	}
	state := randomState(t)
	u, err := c.authURL(ctx, state)
	if err != nil {
		t.Fatalf("authorization URL: %v", err)
	}
	q := b.consent(t, u, d.key, cb)
	if q.Get("code") == "" || q.Get("state") != state || q.Get("iss") != d.url {
		t.Fatalf("callback query %v: want a code, state %s and iss %s", q, state, d.url)
	}
	if err := c.exchange(ctx, q.Get("code"), q.Get("state")); err != nil {
		t.Fatalf("code exchange: %v", err)
	}
	at1, rt1 := c.tokens(ctx)
	if !strings.HasPrefix(at1, "mcp_at_") || !strings.HasPrefix(rt1, "mcp_rt_") {
		t.Fatalf("tokens %.12s… %.12s…: want mcp_at_ and mcp_rt_", at1, rt1)
	}
	if err := c.listTools(ctx); err != nil {
		t.Fatalf("/mcp with the access token: %v", err)
	}

	c.expire(ctx)
	if err := c.listTools(ctx); err != nil {
		t.Fatalf("/mcp after the client refreshed its expired token: %v", err)
	}
	at2, rt2 := c.tokens(ctx)
	if at2 == at1 || rt2 == rt1 || !strings.HasPrefix(at2, "mcp_at_") || !strings.HasPrefix(rt2, "mcp_rt_") {
		t.Fatalf("the refresh did not rotate both tokens: %.12s… → %.12s…, %.12s… → %.12s…", at1, at2, rt1, rt2)
	}

	endpoint, err := c.revocationEndpoint(ctx)
	if err != nil || endpoint != d.url+"/oauth/revoke" {
		t.Fatalf("revocation endpoint %q %v", endpoint, err)
	}
	revoke(t, endpoint, c.clientID(), at2)
	err = c.listTools(ctx)
	if want := d.url + "/.well-known/oauth-protected-resource/mcp"; client.GetResourceMetadataURL(err) != want {
		t.Fatalf("/mcp with the revoked token: %v, want 401 naming resource metadata %s", err, want)
	}

	if code, err := c.refreshWith(ctx, rt1); code != "invalid_grant" {
		t.Fatalf("refreshing with the rotated refresh token: %v, want invalid_grant", err)
	}
}

// revoke revokes token at the RFC 7009 endpoint as clientID, a public client, does.
func revoke(t *testing.T, endpoint, clientID, token string) {
	t.Helper()
	resp, err := http.PostForm(endpoint, url.Values{"token": {token}, "token_type_hint": {"access_token"}, "client_id": {clientID}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
}

func randomState(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// authServer is the part of RFC 8414 metadata the clients use.
type authServer struct {
	Issuer                string `json:"issuer"`
	AuthorizationEndpoint string `json:"authorization_endpoint"`
	TokenEndpoint         string `json:"token_endpoint"`
	RegistrationEndpoint  string `json:"registration_endpoint"`
	RevocationEndpoint    string `json:"revocation_endpoint"`
}

// connectAndList connects an mcp-go client with its default settings and lists the tools: the MCP call the OAuth
// clients' tokens authorize.
func connectAndList(ctx context.Context, c *client.Client) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{
		ClientInfo: mcp.Implementation{Name: "doppel conformance (oauth)", Version: "1"}}}); err != nil {
		return err
	}
	res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err == nil && len(res.Tools) == 0 {
		err = errors.New("tools/list: no tools")
	}
	return err
}

// getJSON fetches a metadata document.
func getJSON(ctx context.Context, hc *http.Client, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(u + ": " + resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
