package api

import (
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// authRequest is an authorization request's parameters, as the consent form carries them along.
type authRequest struct {
	ClientID, RedirectURI, State, Challenge, Method, Scope, Resource string
	client                                                           *schema.OAuthClient
	// bound is the resource the request's tokens will be bound to ("" for every MCP address).
	bound string
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
	var c *schema.OAuthClient
	var err error
	if isCIMD(ar.ClientID) {
		if c, err = o.fetchClient(r.Context(), ar.ClientID); err != nil {
			return ar, false, "invalid_client", err.Error()
		}
	} else if c, err = store.GetOAuthClient(r.Context(), o.db, ar.ClientID); err != nil {
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
	case len(form["resource"]) > 1:
		return ar, true, "invalid_target", "resource: give one (a token is bound to one MCP address)"
	}
	if ar.bound, err = o.resource(ar.Resource); err != nil {
		return ar, true, "invalid_target", err.Error()
	}
	return ar, true, "", ""
}

// redirect sends the user agent back to the client with params, state, and the issuer (RFC 9207).
func (o *oauthServer) redirect(w http.ResponseWriter, r *http.Request, ar *authRequest, params url.Values) {
	u, _ := url.Parse(ar.RedirectURI)
	q := u.Query()
	for k, vs := range params {
		q[k] = vs
	}
	if ar.State != "" {
		q.Set("state", ar.State)
	}
	q.Set("iss", o.base())
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusFound)
}

var consentPage = template.Must(template.New("consent").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorize {{.Client}} · doppel</title>
<style>body{font:16px system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem}input[type=password]{width:100%;padding:.5rem;font:inherit}button{padding:.5rem 1rem;font:inherit}.err{color:#b00}</style></head>
<body><h1>Authorize {{.Client}}</h1>
<p><b>{{.Client}}</b> asks to use {{if .Resource}}doppel's MCP address <code>{{.Resource}}</code>{{else}}doppel's MCP server{{end}} for your workspace: {{if .Env}}the environment's tools, in sessions of their own{{else}}your environments, their sessions and their tools{{end}}. It gets a token valid for {{.TTL}}, renewed without asking you again until you revoke it.</p>
{{if .Error}}<p class="err">{{.Error}}</p>{{end}}
<form method="post" action="{{.Action}}">
{{range $k, $v := .Hidden}}<input type="hidden" name="{{$k}}" value="{{$v}}">{{end}}
<label for="key">Workspace key (mk_live_…)</label><br>
<input type="password" id="key" name="workspace_key" autocomplete="off" required><br><br>
<button type="submit" name="decision" value="allow">Authorize</button>
<button type="submit" name="decision" value="deny" formnovalidate>Deny</button>
</form></body></html>`))

// formAction is the consent page's CSP form-action: this server, and the origin of the client's redirect URI (a
// registered one, checked before the page is shown). Chromium applies form-action to the redirect that answers
// the form post, so without the client's origin the browser would stay on the page and the client never hear back.
func formAction(redirectURI string) string {
	src := "'self'"
	u, err := url.Parse(redirectURI)
	if err != nil || u.Scheme == "" {
		return src
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case (scheme == "http" || scheme == "https") && u.Host != "" && !strings.ContainsAny(u.Host, " ;,'\""):
		return src + " " + scheme + "://" + u.Host
	case scheme != "http" && scheme != "https":
		return src + " " + scheme + ":" // a native app's private scheme (RFC 8252 §7.1)
	}
	return src
}

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
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action "+formAction(ar.RedirectURI))
	w.WriteHeader(status)
	_ = consentPage.Execute(w, map[string]any{"Client": name, "TTL": o.TokenTTL.String(), "Error": msg,
		"Action": oauthAuthorize, "Hidden": hidden, "Resource": ar.bound, "Env": strings.Contains(ar.bound, "/mcp/envs/")})
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
	if !o.parseForm(w, r) {
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
		KeyID: p.Key.ID, RedirectURI: ar.RedirectURI, Challenge: ar.Challenge, Resource: ar.bound, Scope: ar.Scope,
		ExpiresAt: schema.Now().Add(oauthCodeTTL)})
	if err != nil {
		WriteError(w, r, err)
		return
	}
	o.redirect(w, r, ar, url.Values{"code": {plain}})
}
