package api

import (
	"crypto/subtle"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// parseForm reads the form of an OAuth POST (at most oauthMaxBody bytes) and refuses, as invalid_request naming
// the field, a form whose names or values hold a NUL or bytes that are not UTF-8: the form's values reach the
// database, which refuses such text. ok false means the error is written.
func (o *oauthServer) parseForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, oauthMaxBody)
	if err := r.ParseForm(); err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "body: expected a form: "+err.Error())
		return false
	}
	switch name, bad := badValues(r.PostForm); {
	case bad && name == "":
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "body: a field name holds a NUL byte or bytes that are not UTF-8")
		return false
	case bad:
		o.fail(w, r, http.StatusBadRequest, "invalid_request", name+": must not hold a NUL byte or bytes that are not UTF-8")
		return false
	}
	return true
}

// tokenClient reads the client of a token or revocation request (client_id in the form, or HTTP Basic's user for
// clients that send it so) and checks it is registered: missing is invalid_request and unknown invalid_client
// (RFC 6749 §5.2). ok false means the error is written.
func (o *oauthServer) tokenClient(w http.ResponseWriter, r *http.Request) (string, bool) {
	clientID := r.PostForm.Get("client_id")
	if id, _, basic := r.BasicAuth(); basic && clientID == "" {
		clientID, _ = url.QueryUnescape(id)
	}
	if clientID == "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "client_id is required (public clients name themselves)")
		return "", false
	}
	if badText(clientID) {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "client_id: must not hold a NUL byte or bytes that are not UTF-8")
		return "", false
	}
	if _, err := store.GetOAuthClient(r.Context(), o.db, clientID); errors.Is(err, store.ErrNotFound) {
		o.fail(w, r, http.StatusUnauthorized, "invalid_client", "client_id: unknown client: register it first ("+oauthRegister+")")
		return "", false
	} else if err != nil {
		WriteError(w, r, err)
		return "", false
	}
	return clientID, true
}

// token is the token endpoint: the authorization code grant (the code must be live, unused, the client's, sent
// with the same redirect URI, and its PKCE verifier must match the challenge; a code used twice is refused and
// what it gave revoked) and the refresh token grant (rotated on use; a rotated token presented again revokes its
// family). Each answers an mcp_at_ token bound to the grant's resource, or to a narrower one the request names,
// and a new refresh token.
func (o *oauthServer) token(w http.ResponseWriter, r *http.Request) {
	if !o.parseForm(w, r) {
		return
	}
	f := r.PostForm
	g := f.Get("grant_type")
	switch g {
	case "":
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "grant_type is required: authorization_code or refresh_token")
		return
	case grantCode, grantRefresh:
	default:
		o.fail(w, r, http.StatusBadRequest, "unsupported_grant_type", "grant_type must be authorization_code or refresh_token, not "+g)
		return
	}
	for _, name := range []string{"grant_type", "code", "code_verifier", "redirect_uri", "refresh_token", "client_id", "resource"} {
		if len(f[name]) > 1 {
			o.fail(w, r, http.StatusBadRequest, "invalid_request", name+": given more than once")
			return
		}
	}
	clientID, ok := o.tokenClient(w, r)
	if !ok {
		return
	}
	var grant *store.Grant
	if g == grantCode {
		grant, ok = o.codeGrant(w, r, clientID)
	} else {
		grant, ok = o.refreshGrant(w, r, clientID)
	}
	if !ok {
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	a := grant.Access
	body := map[string]any{"access_token": grant.AccessToken, "token_type": "Bearer",
		"expires_in": int64(a.ExpiresAt.Sub(a.CreatedAt).Seconds()), "refresh_token": grant.RefreshToken}
	if grant.Refresh.Scope != "" {
		body["scope"] = grant.Refresh.Scope
	}
	writeJSON(w, http.StatusOK, body)
}

// bound is the resource a token request's tokens are bound to: the request's resource, which may narrow the
// grant's (have) but not widen it, else the grant's. ok false means the error is written.
func (o *oauthServer) bound(w http.ResponseWriter, r *http.Request, have string) (string, bool) {
	raw := r.PostForm.Get("resource")
	if raw == "" {
		return have, true
	}
	want, err := o.resource(raw)
	if err != nil {
		o.fail(w, r, http.StatusBadRequest, "invalid_target", "resource: "+err.Error())
		return "", false
	}
	if !narrower(want, have) {
		o.fail(w, r, http.StatusBadRequest, "invalid_target", "resource: the grant is for "+have+", not "+raw)
		return "", false
	}
	return want, true
}

func (o *oauthServer) codeGrant(w http.ResponseWriter, r *http.Request, clientID string) (*store.Grant, bool) {
	f := r.PostForm
	if f.Get("code") == "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "code is required")
		return nil, false
	}
	c, err := store.OAuthCodeByValue(r.Context(), o.db, f.Get("code"))
	if errors.Is(err, store.ErrNotFound) {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "code: unknown authorization code")
		return nil, false
	}
	if err != nil {
		WriteError(w, r, err)
		return nil, false
	}
	bad := ""
	switch verifier := f.Get("code_verifier"); {
	case c.UsedAt != nil:
		if _, err := store.RevokeCodeTokens(r.Context(), o.db, c.ID); err != nil {
			WriteError(w, r, err)
			return nil, false
		}
		o.auth.forgetKeys()
		bad = "code: already used; the tokens it gave are revoked"
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
		return nil, false
	}
	resource, ok := o.bound(w, r, c.Resource)
	if !ok {
		return nil, false
	}
	g, err := store.IssueOAuthGrant(r.Context(), o.db, c, resource, store.GrantTTL{Access: o.TokenTTL, Refresh: o.RefreshTTL})
	if errors.Is(err, store.ErrCodeUsed) {
		o.auth.forgetKeys()
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "code: already used; the tokens it gave are revoked")
		return nil, false
	}
	if err != nil {
		WriteError(w, r, err)
		return nil, false
	}
	return g, true
}

func (o *oauthServer) refreshGrant(w http.ResponseWriter, r *http.Request, clientID string) (*store.Grant, bool) {
	tok := r.PostForm.Get("refresh_token")
	if tok == "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "refresh_token is required")
		return nil, false
	}
	rt, err := store.OAuthRefreshByValue(r.Context(), o.db, tok)
	if errors.Is(err, store.ErrNotFound) {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "refresh_token: unknown, expired or revoked")
		return nil, false
	}
	if err != nil {
		WriteError(w, r, err)
		return nil, false
	}
	if rt.ClientID != clientID {
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "refresh_token: issued to another client")
		return nil, false
	}
	resource, ok := o.bound(w, r, rt.Resource)
	if !ok {
		return nil, false
	}
	g, err := store.RotateOAuthRefresh(r.Context(), o.db, rt, resource, store.GrantTTL{Access: o.TokenTTL, Refresh: o.RefreshTTL})
	if errors.Is(err, store.ErrRefreshReused) {
		o.auth.forgetKeys()
		o.fail(w, r, http.StatusBadRequest, "invalid_grant", "refresh_token: already used; every token of its authorization is revoked")
		return nil, false
	}
	if err != nil {
		WriteError(w, r, err)
		return nil, false
	}
	return g, true
}

// revoke is token revocation (RFC 7009): the client that holds a token revokes it, an access token (and what
// derives from it) or a refresh token (and every token of its authorization). Unknown tokens answer 200 too.
func (o *oauthServer) revoke(w http.ResponseWriter, r *http.Request) {
	if !o.parseForm(w, r) {
		return
	}
	tok := r.PostForm.Get("token")
	if tok == "" {
		o.fail(w, r, http.StatusBadRequest, "invalid_request", "token is required")
		return
	}
	if h := r.PostForm.Get("token_type_hint"); h != "" && h != "access_token" && h != "refresh_token" {
		o.fail(w, r, http.StatusBadRequest, "unsupported_token_type", "token_type_hint: access_token or refresh_token, not "+h)
		return
	}
	clientID, ok := o.tokenClient(w, r)
	if !ok {
		return
	}
	var err error
	if strings.HasPrefix(tok, cred.PrefixRefresh) {
		_, err = store.RevokeOAuthRefresh(r.Context(), o.db, tok, clientID)
	} else {
		_, err = store.RevokeOAuthToken(r.Context(), o.db, tok, clientID)
	}
	if err != nil {
		WriteError(w, r, err)
		return
	}
	o.auth.forgetKeys()
	w.WriteHeader(http.StatusOK)
}
