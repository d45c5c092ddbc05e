package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/doppel-dev/doppel/store"
)

// The OAuth 2.1 authorization server that issues mcp_at_ tokens, as MCP's authorization spec asks: protected
// resource metadata (RFC 9728) for /mcp and each /mcp/envs/{slug}, authorization server metadata (RFC 8414), dynamic
// client registration (RFC 7591, public clients), the authorization code grant with PKCE S256 only, a consent page
// where the user authorizes with a workspace key, refresh tokens rotated on use, resource indicators (RFC 8707: a
// token works only on the MCP address it was issued for), and revocation (RFC 7009). Access tokens are api_keys rows
// of kind mcp: hashed, expiring, revocable; refresh tokens are oauth_refresh_tokens rows. Every URL in the metadata
// is the configured public URL's (MCPRoutes.PublicURL), never the request's Host. The metadata documents are the
// SDK's oauthex types; PKCE's S256 transform is golang.org/x/oauth2's.

// OAuth routes.
const (
	wellKnownResource = "/.well-known/oauth-protected-resource"
	wellKnownAuth     = "/.well-known/oauth-authorization-server"
	oauthRegister     = "/oauth/register"
	oauthAuthorize    = "/oauth/authorize"
	oauthToken        = "/oauth/token"
	oauthRevoke       = "/oauth/revoke"
)

// oauthCodeTTL bounds how long an authorization code may wait for its exchange.
const oauthCodeTTL = time.Minute

// oauthMaxBody bounds an OAuth request body.
const oauthMaxBody = 64 << 10

// DefaultRefreshTokenTTL is how long an OAuth refresh token lives unless configured: each refresh issues a new one
// with this lifetime, so a client used at least this often never sends its user back to the browser.
const DefaultRefreshTokenTTL = 30 * 24 * time.Hour

// OAuth grant types the token endpoint takes.
const (
	grantCode    = "authorization_code"
	grantRefresh = "refresh_token"
)

type oauthServer struct {
	*mcpDeps
}

func (o *oauthServer) register(mux *http.ServeMux) {
	mux.HandleFunc("GET "+wellKnownResource, o.resourceMetadata)
	mux.HandleFunc("GET "+wellKnownResource+"/{path...}", o.resourceMetadata)
	mux.HandleFunc("GET "+wellKnownAuth, o.serverMetadata)
	mux.HandleFunc("POST "+oauthRegister, o.registerClient)
	mux.HandleFunc("GET "+oauthAuthorize, o.authorizePage)
	mux.HandleFunc("POST "+oauthAuthorize, o.authorize)
	mux.HandleFunc("POST "+oauthToken, o.token)
	mux.HandleFunc("POST "+oauthRevoke, o.revoke)
}

// resourceMetadata answers RFC 9728 metadata: at the root for the server, path-suffixed for an MCP address.
func (o *oauthServer) resourceMetadata(w http.ResponseWriter, r *http.Request) {
	base := o.base()
	resource := base
	if p := r.PathValue("path"); p != "" {
		if _, ok := o.resourcePath("/" + p); !ok {
			WriteError(w, r, NotFound("no protected resource /%s: the MCP addresses are /mcp, /mcp/envs/{slug} and /mcp/envs/{slug}/sessions/{session_id}", p))
			return
		}
		resource = base + "/" + p
		if r.URL.RawQuery != "" {
			resource += "?" + r.URL.RawQuery // the query of an environment address, which seeds its sessions
		}
	}
	auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               resource,
		AuthorizationServers:   []string{base},
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "doppel MCP server",
		ResourceDocumentation:  base + "/docs",
	}).ServeHTTP(w, r)
}

// authServerMeta is RFC 8414 metadata: the SDK's document, without the jwks_uri it always writes (doppel's tokens
// are opaque, so it has no key set: an empty string is not a URL).
type authServerMeta struct {
	oauthex.AuthServerMeta
	JWKSURI string `json:"jwks_uri,omitempty"`
}

func (o *oauthServer) serverMetadata(w http.ResponseWriter, r *http.Request) {
	base := o.base()
	writeJSON(w, http.StatusOK, authServerMeta{AuthServerMeta: oauthex.AuthServerMeta{
		Issuer:                                 base,
		AuthorizationEndpoint:                  base + oauthAuthorize,
		TokenEndpoint:                          base + oauthToken,
		RegistrationEndpoint:                   base + oauthRegister,
		RevocationEndpoint:                     base + oauthRevoke,
		ResponseTypesSupported:                 []string{"code"},
		GrantTypesSupported:                    []string{grantCode, grantRefresh},
		TokenEndpointAuthMethodsSupported:      []string{"none"},
		RevocationEndpointAuthMethodsSupported: []string{"none"},
		CodeChallengeMethodsSupported:          []string{"S256"},
		ServiceDocumentation:                   base + "/docs",
		// The authorization response names the issuer (RFC 9207), against mix-up attacks.
		AuthorizationResponseIssParameterSupported: true,
		ClientIDMetadataDocumentSupported:          o.ClientMetadataGuard != nil,
	}})
}

// resourcePath reads the path of an MCP address: /mcp or /mcp/envs/{slug}.
func (o *oauthServer) resourcePath(p string) (string, bool) {
	if p == "/mcp" {
		return p, true
	}
	rest, ok := strings.CutPrefix(p, "/mcp/envs/")
	slug, session, hasSession := strings.Cut(rest, "/sessions/")
	if hasSession && (session == "" || strings.ContainsAny(session, "/?#")) {
		return p, false
	}
	return p, ok && slug != "" && !strings.ContainsAny(slug, "/?#")
}

// resource reads a resource indicator (RFC 8707) naming this server or one of its MCP addresses. It answers the
// resource a token is bound to: the MCP address without its query (an environment address's query seeds its
// sessions; it is no boundary), or "" for the server itself, whose tokens work on every MCP address. Anything else
// is the OAuth error invalid_target.
func (o *oauthServer) resource(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	base := o.base()
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || strings.Contains(raw, "#") || u.User != nil {
		return "", errors.New("resource must be an absolute URI without a fragment")
	}
	u.RawQuery, u.ForceQuery = "", false
	p, ok := strings.CutPrefix(u.String(), base)
	if !ok {
		return "", fmt.Errorf("resource %s is not this server's (%s)", raw, base)
	}
	if p == "" || p == "/" {
		return "", nil
	}
	if _, ok := o.resourcePath(p); !ok {
		return "", fmt.Errorf("resource %s is not an MCP address of this server: use %s/mcp, %s/mcp/envs/{slug} or a session's %s/mcp/envs/{slug}/sessions/{session_id}", raw, base, base, base)
	}
	return base + p, nil
}

// narrower says whether a token bound to want may be issued on a grant bound to have: the same resource, one of
// the sessions of the environment address have names, or any when the grant is for the whole server ("").
func narrower(want, have string) bool {
	return have == "" || want == have || strings.HasPrefix(want, have+"/sessions/")
}

// oauthError is an OAuth error answer (RFC 6749 §5.2) that is also the spec's envelope.
type oauthError struct {
	Error       string `json:"error"`
	Description string `json:"error_description"`
	*Envelope
}

func (o *oauthServer) fail(w http.ResponseWriter, r *http.Request, status int, code, detail string) {
	e := NewError(status, detail)
	e.RequestID = RequestID(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, oauthError{Error: code, Description: detail, Envelope: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// registerClient is dynamic client registration (RFC 7591). Every client is public: it authenticates with PKCE,
// so the answer's token_endpoint_auth_method is none (whatever was asked, as §3.2.1 allows) and it carries no
// secret. A client may register the authorization_code and refresh_token grants.
func (o *oauthServer) registerClient(w http.ResponseWriter, r *http.Request) {
	var meta oauthex.ClientRegistrationMetadata
	data, err := io.ReadAll(io.LimitReader(r.Body, oauthMaxBody))
	if err == nil {
		err = json.Unmarshal(data, &meta)
	}
	if err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", "body: expected the client metadata as JSON: "+err.Error())
		return
	}
	if at := nulField(data); at != "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", at+": "+nulMessage)
		return
	}
	if len(meta.RedirectURIs) == 0 {
		o.fail(w, r, http.StatusBadRequest, "invalid_redirect_uri", "body.redirect_uris: at least one redirect URI is required")
		return
	}
	for i, u := range meta.RedirectURIs {
		if err := checkRedirectURI(u); err != nil {
			o.fail(w, r, http.StatusBadRequest, "invalid_redirect_uri", fmt.Sprintf("body.redirect_uris[%d]: %v", i, err))
			return
		}
	}
	grants := meta.GrantTypes
	if len(grants) == 0 {
		grants = []string{grantCode} // RFC 7591 §2's default
	}
	for _, g := range grants {
		if g != grantCode && g != grantRefresh {
			o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", "body.grant_types: authorization_code and refresh_token are supported, not "+g)
			return
		}
	}
	for _, rt := range meta.ResponseTypes {
		if rt != "code" {
			o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", "body.response_types: only code is supported, not "+rt)
			return
		}
	}
	c, err := store.CreateOAuthClient(r.Context(), o.db, meta.ClientName, meta.RedirectURIs)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"client_id": c.ID, "client_id_issued_at": c.CreatedAt.Unix(), "client_name": c.Name,
		"redirect_uris": c.RedirectURIs, "grant_types": grants,
		"response_types": []string{"code"}, "token_endpoint_auth_method": "none",
	})
}

// checkRedirectURI accepts an absolute URI without a fragment: https, http to a loopback host, or a native app's
// private scheme (OAuth 2.1 §2.3.1, RFC 8252).
func checkRedirectURI(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() {
		return fmt.Errorf("%q is not an absolute URI", raw)
	}
	if strings.Contains(raw, "#") { // an empty fragment ("x:y#") is a fragment too, and u.Fragment is "" for it
		return fmt.Errorf("%q has a fragment", raw)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
	case "http":
		if h := u.Hostname(); h != "localhost" && h != "127.0.0.1" && h != "::1" {
			return fmt.Errorf("%q: http is only for loopback redirects", raw)
		}
	case "javascript", "data", "file", "vbscript":
		return fmt.Errorf("%q: scheme %s is not allowed", raw, u.Scheme)
	}
	return nil
}
