package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// mcpgoOAuth is mcp-go's own OAuth support, used as its OAuth example does: the client's first request fails
// asking for authorization, and the handler it carries discovers the authorization server from /mcp's protected
// resource metadata, registers the client, builds the authorization URL with a PKCE challenge and exchanges the
// code; the transport then sends the token and refreshes it when it has expired. mcp-go has no revocation call: the
// token is revoked at the endpoint its discovery found.
type mcpgoOAuth struct {
	d         *doppel
	hc        *http.Client
	store     *client.MemoryTokenStore
	c         *client.Client
	handler   *transport.OAuthHandler
	verifier  string
	connected bool
}

func newMCPGoOAuth(t *testing.T, d *doppel) oauthClient {
	return &mcpgoOAuth{d: d, hc: newWire(t).client(), store: client.NewMemoryTokenStore()}
}

func (m *mcpgoOAuth) register(ctx context.Context, redirect string) error {
	c, err := client.NewOAuthStreamableHttpClient(m.d.url+"/mcp", client.OAuthConfig{RedirectURI: redirect,
		PKCEEnabled: true, TokenStore: m.store, HTTPClient: m.hc}, transport.WithHTTPBasicClient(m.hc))
	if err != nil {
		return err
	}
	m.c = c
	err = connectAndList(ctx, c)
	if m.handler = client.GetOAuthHandler(err); m.handler == nil {
		return fmt.Errorf("the first request without a token: %v, want an OAuth authorization-required error", err)
	}
	return m.handler.RegisterClient(ctx, "doppel conformance (mcp-go)")
}

func (m *mcpgoOAuth) authURL(ctx context.Context, state string) (string, error) {
	v, err := client.GenerateCodeVerifier()
	if err != nil {
		return "", err
	}
	m.verifier = v
	return m.handler.GetAuthorizationURL(ctx, state, client.GenerateCodeChallenge(v))
}

func (m *mcpgoOAuth) exchange(ctx context.Context, code, state string) error {
	return m.handler.ProcessAuthorizationResponse(ctx, code, state, m.verifier)
}

func (m *mcpgoOAuth) listTools(ctx context.Context) error {
	if !m.connected {
		err := connectAndList(ctx, m.c)
		m.connected = err == nil
		return err
	}
	_, err := m.c.ListTools(ctx, mcp.ListToolsRequest{})
	return err
}

func (m *mcpgoOAuth) tokens(ctx context.Context) (string, string) {
	tok, err := m.store.GetToken(ctx)
	if err != nil {
		return "", ""
	}
	return tok.AccessToken, tok.RefreshToken
}

func (m *mcpgoOAuth) expire(ctx context.Context) {
	tok, err := m.store.GetToken(ctx)
	if err != nil {
		return
	}
	expired := *tok
	expired.ExpiresAt = time.Unix(1, 0)
	_ = m.store.SaveToken(ctx, &expired)
}

func (m *mcpgoOAuth) refreshWith(ctx context.Context, refresh string) (string, error) {
	_, err := m.handler.RefreshToken(ctx, refresh)
	var oe transport.OAuthError
	if errors.As(err, &oe) {
		return oe.ErrorCode, err
	}
	return "", err
}

func (m *mcpgoOAuth) clientID() string { return m.handler.GetClientID() }

func (m *mcpgoOAuth) revocationEndpoint(ctx context.Context) (string, error) {
	meta, err := m.handler.GetServerMetadata(ctx)
	if err != nil {
		return "", err
	}
	return meta.RevocationEndpoint, nil
}
