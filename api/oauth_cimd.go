package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Client ID Metadata Documents (MCP 2025-11-25's client identification, draft-ietf-oauth-client-id-metadata-
// document): a client_id that is an https URL names a JSON document, served there, that describes the client
// (client_id equal to that URL, client_name, redirect_uris). The server fetches it at each authorization request,
// through the same server-side request forgery guard as webhooks (MCPRoutes.ClientMetadataGuard: the URL checked
// before the fetch, every dialled address checked again), and records the client so the token endpoint knows it.

// cimdMaxBody bounds a client metadata document, cimdTimeout its fetch.
const (
	cimdMaxBody = 16 << 10
	cimdTimeout = 5 * time.Second
)

// isCIMD says whether a client_id is a Client ID Metadata Document's URL.
func isCIMD(clientID string) bool { return strings.HasPrefix(clientID, "https://") }

// cimdClient is the HTTP client documents are fetched with: the guard's dialer (or ClientMetadataTransport), no
// redirects, a timeout.
func (o *oauthServer) cimdClient() *http.Client {
	rt := o.ClientMetadataTransport
	if rt == nil {
		rt = &http.Transport{DialContext: o.ClientMetadataGuard.Dialer().DialContext, TLSHandshakeTimeout: cimdTimeout,
			ResponseHeaderTimeout: cimdTimeout, MaxResponseHeaderBytes: 16 << 10}
	}
	return &http.Client{Transport: rt, Timeout: cimdTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// fetchClient fetches and checks the metadata document at clientID and records the client it describes.
func (o *oauthServer) fetchClient(ctx context.Context, clientID string) (*schema.OAuthClient, error) {
	if o.ClientMetadataGuard == nil {
		return nil, errors.New("this server does not fetch client metadata documents: register the client (" + oauthRegister + ")")
	}
	u, err := url.Parse(clientID)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" || strings.Contains(clientID, "#") || u.User != nil {
		return nil, errors.New("a client_id URL must be https with a path, no fragment and no user info")
	}
	if err := o.ClientMetadataGuard.CheckURL(ctx, clientID); err != nil {
		return nil, fmt.Errorf("client_id %s: %w", clientID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cimdTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, clientID, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := o.cimdClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the client metadata document %s: %w", clientID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the client metadata document %s answered %d", clientID, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, cimdMaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read the client metadata document %s: %w", clientID, err)
	}
	if len(body) > cimdMaxBody {
		return nil, fmt.Errorf("the client metadata document %s is over %d bytes", clientID, cimdMaxBody)
	}
	var doc struct {
		oauthex.ClientRegistrationMetadata
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("the client metadata document %s is not JSON client metadata: %w", clientID, err)
	}
	switch {
	case doc.ClientID != clientID:
		return nil, fmt.Errorf("the client metadata document %s names client_id %q, not its own URL", clientID, doc.ClientID)
	case doc.ClientSecret != "":
		return nil, fmt.Errorf("the client metadata document %s carries a client_secret: clients are public", clientID)
	case len(doc.RedirectURIs) == 0:
		return nil, fmt.Errorf("the client metadata document %s has no redirect_uris", clientID)
	}
	for i, r := range doc.RedirectURIs {
		if err := checkRedirectURI(r); err != nil {
			return nil, fmt.Errorf("the client metadata document %s: redirect_uris[%d]: %w", clientID, i, err)
		}
	}
	return store.PutOAuthClient(ctx, o.db, clientID, doc.ClientName, doc.RedirectURIs)
}
