package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// The OAuth 2.1 authorization server that issues mcp_at_ tokens, as MCP's authorization spec asks: protected
// resource metadata (RFC 9728) for /mcp and each /mcp/envs/{slug}, authorization server metadata (RFC 8414), dynamic
// client registration (RFC 7591, public clients), the authorization code grant with PKCE S256 only, a consent page
// where the user authorizes with a workspace key, and revocation (RFC 7009). Tokens are api_keys rows of kind mcp:
// hashed, expiring, revocable. The metadata documents are the SDK's oauthex types; PKCE's S256 transform is
// golang.org/x/oauth2's.

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
	base := o.base(r)
	resource := base
	if p := r.PathValue("path"); p != "" {
		if p != "mcp" && !strings.HasPrefix(p, "mcp/envs/") {
			WriteError(w, r, NotFound("no protected resource /%s: the MCP addresses are /mcp and /mcp/envs/{slug}", p))
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

func (o *oauthServer) serverMetadata(w http.ResponseWriter, r *http.Request) {
	base := o.base(r)
	writeJSON(w, http.StatusOK, &oauthex.AuthServerMeta{
		Issuer:                                 base,
		AuthorizationEndpoint:                  base + oauthAuthorize,
		TokenEndpoint:                          base + oauthToken,
		RegistrationEndpoint:                   base + oauthRegister,
		RevocationEndpoint:                     base + oauthRevoke,
		ResponseTypesSupported:                 []string{"code"},
		GrantTypesSupported:                    []string{"authorization_code"},
		TokenEndpointAuthMethodsSupported:      []string{"none"},
		RevocationEndpointAuthMethodsSupported: []string{"none"},
		CodeChallengeMethodsSupported:          []string{"S256"},
		ServiceDocumentation:                   base + "/docs",
		// The authorization response names the issuer (RFC 9207), against mix-up attacks.
		AuthorizationResponseIssParameterSupported: true,
	})
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
// so the answer's token_endpoint_auth_method is none and it carries no secret.
func (o *oauthServer) registerClient(w http.ResponseWriter, r *http.Request) {
	var meta oauthex.ClientRegistrationMetadata
	if err := json.NewDecoder(io.LimitReader(r.Body, oauthMaxBody)).Decode(&meta); err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", "body: expected the client metadata as JSON: "+err.Error())
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
	for _, g := range meta.GrantTypes {
		if g != "authorization_code" {
			o.fail(w, r, http.StatusBadRequest, "invalid_client_metadata", "body.grant_types: only authorization_code is supported, not "+g)
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
		"redirect_uris": c.RedirectURIs, "grant_types": []string{"authorization_code"},
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
	if u.Fragment != "" {
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

// authRequest is an authorization request's parameters, as the consent form carries them along.
type authRequest struct {
	ClientID, RedirectURI, State, Challenge, Method, Scope, Resource string
	client                                                           *schema.OAuthClient
}

// readAuthRequest validates an authorization request. Errors before the redirect URI is known to be the client's
// are shown to the user (redirectable false); later ones go back to the client.
func (o *oauthServer) readAuthRequest(r *http.Request, form url.Values) (ar *authRequest, redirectable bool, code, detail string) {
	ar = &authRequest{ClientID: form.Get("client_id"), RedirectURI: form.Get("redirect_uri"), State: form.Get("state"),
		Challenge: form.Get("code_challenge"), Method: form.Get("code_challenge_method"), Scope: form.Get("scope"),
		Resource: form.Get("resource")}
	if ar.ClientID == "" {
		return ar, false, "invalid_request", "client_id is required"
	}
	c, err := store.GetOAuthClient(r.Context(), o.db, ar.ClientID)
	if err != nil {
		return ar, false, "invalid_client", "unknown client_id: register the client first (" + oauthRegister + ")"
	}
	ar.client = c
	if ar.RedirectURI == "" && len(c.RedirectURIs) == 1 {
		ar.RedirectURI = c.RedirectURIs[0]
	}
	if !slices.Contains(c.RedirectURIs, ar.RedirectURI) {
		return ar, false, "invalid_request", "redirect_uri is not one the client registered"
	}
	switch {
	case form.Get("response_type") != "code":
		return ar, true, "unsupported_response_type", "response_type must be code"
	case ar.Challenge == "":
		return ar, true, "invalid_request", "code_challenge is required (PKCE)"
	case ar.Method != "S256":
		return ar, true, "invalid_request", "code_challenge_method must be S256"
	case len(ar.Challenge) != 43:
		return ar, true, "invalid_request", "code_challenge must be the 43-character S256 challenge"
	}
	if ar.Resource != "" {
		base := o.base(r)
		if ar.Resource != base && ar.Resource != base+"/mcp" && !strings.HasPrefix(ar.Resource, base+"/mcp/envs/") {
			return ar, true, "invalid_target", "resource must be this server's MCP address"
		}
	}
	return ar, true, "", ""
}

// redirect sends the user agent back to the client with params (and state, and the issuer per RFC 9207).
func (o *oauthServer) redirect(w http.ResponseWriter, r *http.Request, ar *authRequest, params url.Values) {
	u, _ := url.Parse(ar.RedirectURI)
	q := u.Query()
	for k, vs := range params {
		q[k] = vs
	}
	if ar.State != "" {
		q.Set("state", ar.State)
	}
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusFound)
}

var consentPage = template.Must(template.New("consent").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorize {{.Client}} · doppel</title>
<style>body{font:16px system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem}input[type=password]{width:100%;padding:.5rem;font:inherit}button{padding:.5rem 1rem;font:inherit}.err{color:#b00}</style></head>
<body><h1>Authorize {{.Client}}</h1>
<p><b>{{.Client}}</b> asks to use doppel's MCP server for your workspace: your environments, their sessions and their tools. It gets a token valid for {{.TTL}}, which you can revoke.</p>
{{if .Error}}<p class="err">{{.Error}}</p>{{end}}
<form method="post" action="{{.Action}}">
{{range $k, $v := .Hidden}}<input type="hidden" name="{{$k}}" value="{{$v}}">{{end}}
<label for="key">Workspace key (mk_live_…)</label><br>
<input type="password" id="key" name="workspace_key" autocomplete="off" required><br><br>
<button type="submit" name="decision" value="allow">Authorize</button>
<button type="submit" name="decision" value="deny" formnovalidate>Deny</button>
</form></body></html>`))

func (o *oauthServer) renderConsent(w http.ResponseWriter, status int, ar *authRequest, msg string) {
	name := ar.client.Name
	if name == "" {
		name = ar.ClientID
	}
	hidden := map[string]string{"client_id": ar.ClientID, "redirect_uri": ar.RedirectURI, "state": ar.State,
		"code_challenge": ar.Challenge, "code_challenge_method": ar.Method, "scope": ar.Scope, "resource": ar.Resource,
		"response_type": "code"}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	w.WriteHeader(status)
	_ = consentPage.Execute(w, map[string]any{"Client": name, "TTL": o.TokenTTL.String(), "Error": msg,
		"Action": oauthAuthorize, "Hidden": hidden})
}

// authorizePage shows the consent form for a valid authorization request.
func (o *oauthServer) authorizePage(w http.ResponseWriter, r *http.Request) {
	ar, redirectable, code, detail := o.readAuthRequest(r, r.URL.Query())
	switch {
	case code != "" && redirectable:
		o.redirect(w, r, ar, url.Values{"error": {code}, "error_description": {detail}})
	case code != "":
		o.fail(w, r, http.StatusBadRequest, code, detail)
	default:
		o.renderConsent(w, http.StatusOK, ar, "")
	}
}

// authorize takes the consent form: a valid workspace key of a workspace with access grants a code for it.
func (o *oauthServer) authorize(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, oauthMaxBody)
	if err := r.ParseForm(); err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "body: expected a form: "+err.Error())
		return
	}
	ar, redirectable, code, detail := o.readAuthRequest(r, r.PostForm)
	switch {
	case code != "" && redirectable:
		o.redirect(w, r, ar, url.Values{"error": {code}, "error_description": {detail}})
		return
	case code != "":
		o.fail(w, r, http.StatusBadRequest, code, detail)
		return
	}
	if r.PostForm.Get("decision") == "deny" {
		o.redirect(w, r, ar, url.Values{"error": {"access_denied"}, "error_description": {"the user denied the request"}})
		return
	}
	p, err := o.auth.Workspace(r.Context(), "Bearer "+strings.TrimSpace(r.PostForm.Get("workspace_key")))
	if err != nil {
		e, _ := EnvelopeOf(r.Context(), err)
		o.renderConsent(w, http.StatusUnauthorized, ar, "That key was refused: "+e.Detail)
		return
	}
	plain, err := store.CreateOAuthCode(r.Context(), o.db, &schema.OAuthCode{ClientID: ar.ClientID, WorkspaceID: p.Workspace.ID,
		KeyID: p.Key.ID, RedirectURI: ar.RedirectURI, Challenge: ar.Challenge, Resource: ar.Resource, Scope: ar.Scope,
		ExpiresAt: schema.Now().Add(oauthCodeTTL)})
	if err != nil {
		WriteError(w, r, err)
		return
	}
	o.redirect(w, r, ar, url.Values{"code": {plain}, "iss": {o.base(r)}})
}

// token exchanges an authorization code for an mcp_at_ token: the code must be live, unused, the client's, sent
// with the same redirect URI, and its PKCE verifier must match the challenge. A code used twice is refused and the
// token it gave revoked.
func (o *oauthServer) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, oauthMaxBody)
	if err := r.ParseForm(); err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "body: expected a form: "+err.Error())
		return
	}
	f := r.PostForm
	if g := f.Get("grant_type"); g != "authorization_code" {
		o.fail(w, r, http.StatusBadRequest, "unsupported_grant_type", "grant_type must be authorization_code, not "+g)
		return
	}
	clientID := f.Get("client_id")
	if id, _, ok := r.BasicAuth(); ok && clientID == "" {
		clientID, _ = url.QueryUnescape(id)
	}
	c, err := store.OAuthCodeByValue(r.Context(), o.db, f.Get("code"))
	if errors.Is(err, store.ErrNotFound) {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "code: unknown authorization code")
		return
	}
	if err != nil {
		WriteError(w, r, err)
		return
	}
	bad := ""
	switch verifier := f.Get("code_verifier"); {
	case c.UsedAt != nil:
		if _, err := store.RevokeCodeTokens(r.Context(), o.db, c.ID); err != nil {
			WriteError(w, r, err)
			return
		}
		o.auth.forgetKeys()
		bad = "code: already used; the token it gave is revoked"
	case !schema.Now().Before(c.ExpiresAt):
		bad = "code: expired"
	case clientID != c.ClientID:
		bad = "client_id: the code was issued to another client"
	case f.Get("redirect_uri") != c.RedirectURI:
		bad = "redirect_uri: differs from the authorization request's"
	case verifier == "":
		bad = "code_verifier: required (PKCE)"
	case subtle.ConstantTimeCompare([]byte(oauth2.S256ChallengeFromVerifier(verifier)), []byte(c.Challenge)) != 1:
		bad = "code_verifier: does not match the code_challenge"
	}
	if bad != "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", bad)
		return
	}
	key, tok, err := store.IssueOAuthToken(r.Context(), o.db, c, o.TokenTTL)
	if errors.Is(err, store.ErrCodeUsed) {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "code: already used; the token it gave is revoked")
		return
	}
	if err != nil {
		WriteError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	body := map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": int64(key.ExpiresAt.Sub(key.CreatedAt).Seconds())}
	if c.Scope != "" {
		body["scope"] = c.Scope
	}
	writeJSON(w, http.StatusOK, body)
}

// revoke is token revocation (RFC 7009): the client that holds a token revokes it. Unknown tokens answer 200 too.
func (o *oauthServer) revoke(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, oauthMaxBody)
	if err := r.ParseForm(); err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "body: expected a form: "+err.Error())
		return
	}
	tok := r.PostForm.Get("token")
	if tok == "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "token is required")
		return
	}
	if h := r.PostForm.Get("token_type_hint"); h != "" && h != "access_token" {
		o.fail(w, r, http.StatusBadRequest, "unsupported_token_type", "only access tokens are issued")
		return
	}
	clientID := r.PostForm.Get("client_id")
	if id, _, ok := r.BasicAuth(); ok && clientID == "" {
		clientID, _ = url.QueryUnescape(id)
	}
	if _, err := store.RevokeOAuthToken(r.Context(), o.db, tok, clientID); err != nil {
		WriteError(w, r, err)
		return
	}
	o.auth.forgetKeys()
	w.WriteHeader(http.StatusOK)
}
