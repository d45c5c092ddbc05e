package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"golang.org/x/oauth2"
)

// xoauth2 is golang.org/x/oauth2 as an MCP host uses it. x/oauth2 neither discovers nor registers, so the host does
// that over plain HTTP as the MCP authorization spec lays out: /mcp's 401 names the protected resource metadata
// (RFC 9728), which names the authorization server, whose metadata (RFC 8414) names the endpoints; registration is
// RFC 7591. x/oauth2 builds the authorization URL with its PKCE challenge, exchanges the code, and refreshes
// through its token source; its transport authorizes mcp-go's requests to /mcp.
type xoauth2 struct {
	d        *doppel
	hc       *http.Client // the wire every request goes over, x/oauth2's too
	resource string       // RFC 8707: the MCP address the token is for
	meta     authServer
	cfg      *oauth2.Config
	verifier string
	src      oauth2.TokenSource
}

func newXOAuth2(t *testing.T, d *doppel) oauthClient { return &xoauth2{d: d, hc: newWire(t).client()} }

// ctx carries the wire to x/oauth2, which takes its HTTP client from the context.
func (x *xoauth2) ctx(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, x.hc)
}

var resourceMetadataParam = regexp.MustCompile(`resource_metadata="([^"]+)"`)

func (x *xoauth2) register(ctx context.Context, redirect string) error {
	init := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, x.d.url+"/mcp", bytes.NewReader(init))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := x.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	m := resourceMetadataParam.FindStringSubmatch(resp.Header.Get("WWW-Authenticate"))
	if resp.StatusCode != http.StatusUnauthorized || m == nil {
		return fmt.Errorf("/mcp without a token: %s, WWW-Authenticate %q: want 401 naming resource_metadata", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := getJSON(ctx, x.hc, m[1], &prm); err != nil {
		return err
	}
	if prm.Resource != x.d.url+"/mcp" || len(prm.AuthorizationServers) != 1 {
		return fmt.Errorf("protected resource metadata %+v: want resource %s/mcp and one authorization server", prm, x.d.url)
	}
	x.resource = prm.Resource
	if err := getJSON(ctx, x.hc, prm.AuthorizationServers[0]+"/.well-known/oauth-authorization-server", &x.meta); err != nil {
		return err
	}
	if x.meta.Issuer != prm.AuthorizationServers[0] {
		return fmt.Errorf("authorization server metadata names issuer %s, not %s", x.meta.Issuer, prm.AuthorizationServers[0])
	}
	body, _ := json.Marshal(map[string]any{"client_name": "doppel conformance (x/oauth2)", "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		"token_endpoint_auth_method": "none"})
	resp, err = x.hc.Post(x.meta.RegistrationEndpoint, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var reg struct {
		ClientID string `json:"client_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&reg); err != nil || resp.StatusCode != http.StatusCreated || reg.ClientID == "" {
		return fmt.Errorf("register: %s %+v %v", resp.Status, reg, err)
	}
	x.cfg = &oauth2.Config{ClientID: reg.ClientID, RedirectURL: redirect, Endpoint: oauth2.Endpoint{
		AuthURL: x.meta.AuthorizationEndpoint, TokenURL: x.meta.TokenEndpoint, AuthStyle: oauth2.AuthStyleInParams}}
	return nil
}

func (x *xoauth2) authURL(_ context.Context, state string) (string, error) {
	x.verifier = oauth2.GenerateVerifier()
	return x.cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(x.verifier), oauth2.SetAuthURLParam("resource", x.resource)), nil
}

func (x *xoauth2) exchange(ctx context.Context, code, _ string) error {
	tok, err := x.cfg.Exchange(x.ctx(ctx), code, oauth2.VerifierOption(x.verifier), oauth2.SetAuthURLParam("resource", x.resource))
	if err != nil {
		return err
	}
	x.src = x.cfg.TokenSource(x.ctx(ctx), tok)
	return nil
}

func (x *xoauth2) listTools(ctx context.Context) error {
	c, err := client.NewStreamableHttpClient(x.d.url+"/mcp", transport.WithHTTPBasicClient(oauth2.NewClient(x.ctx(ctx), x.src)))
	if err != nil {
		return err
	}
	defer c.Close()
	return connectAndList(ctx, c)
}

func (x *xoauth2) tokens(context.Context) (string, string) {
	tok, err := x.src.Token()
	if err != nil {
		return "", ""
	}
	return tok.AccessToken, tok.RefreshToken
}

func (x *xoauth2) expire(ctx context.Context) {
	tok, err := x.src.Token()
	if err != nil {
		return
	}
	expired := *tok
	expired.Expiry = time.Unix(1, 0)
	x.src = x.cfg.TokenSource(x.ctx(ctx), &expired)
}

func (x *xoauth2) refreshWith(ctx context.Context, refresh string) (string, error) {
	_, err := x.cfg.TokenSource(x.ctx(ctx), &oauth2.Token{RefreshToken: refresh}).Token()
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return re.ErrorCode, err
	}
	return "", err
}

func (x *xoauth2) clientID() string { return x.cfg.ClientID }

func (x *xoauth2) revocationEndpoint(context.Context) (string, error) {
	return x.meta.RevocationEndpoint, nil
}
