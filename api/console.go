package api

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// The console: a web app at / (hand-written HTML, CSS and ES modules, embedded; nothing fetched from elsewhere) whose
// every data fetch is a /trpc procedure. Signing in and out are the only plain routes it adds, under /console/.

//go:embed console
var consoleFiles embed.FS

// consoleCSP keeps the console to its own assets and its own API.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// ConsoleSession is what the console learns of its web session: who it acts as, the CSRF token its mutations send
// in X-CSRF-Token, and when it ends.
type ConsoleSession struct {
	SignedIn  bool `json:"signedIn"`
	Workspace struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"workspace"`
	Key       KeyInfo   `json:"key"`
	CSRF      string    `json:"csrf"`
	ExpiresAt time.Time `json:"expiresAt"`
}

func consoleSession(ws *schema.Workspace, key *schema.APIKey, s *webSession) ConsoleSession {
	out := ConsoleSession{SignedIn: true}
	out.Workspace.ID, out.Workspace.Name = ws.ID, ws.Name
	out.Key, out.CSRF, out.ExpiresAt = KeyInfoOf(key), s.csrf, s.expires()
	return out
}

// registerConsole serves the console's page and assets, and its sign-in, session and sign-out routes.
// consoleSignInMaxBody caps the sign-in body ({"key": …}).
const consoleSignInMaxBody = 4096

func registerConsole(mux *http.ServeMux, auth *Authenticator, web *WebSessions) {
	assets, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	page := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", consoleCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, assets, "index.html")
	}
	mux.HandleFunc("GET /{$}", page)
	mux.HandleFunc("GET /console/{$}", page)
	mux.HandleFunc("GET /console/assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if name == "index.html" || strings.Contains(name, "/") {
			WriteError(w, r, NotFound("no console asset %q", name))
			return
		}
		if _, err := fs.Stat(assets, name); err != nil {
			WriteError(w, r, NotFound("no console asset %q", name))
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, assets, name)
	})

	mux.HandleFunc("POST /console/signin", func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewCrossOriginProtection().Check(r); err != nil {
			WriteError(w, r, Errorf(http.StatusForbidden, "cross-origin sign-in refused: %v", err))
			return
		}
		addr := clientAddress(r.RemoteAddr, r.Header.Get("X-Forwarded-For"), web.TrustForwardedFor)
		failures := web.signInFailures()
		if failures != nil {
			if wait := failures.wait(addr); wait > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
				WriteError(w, r, RateLimited(fmt.Sprintf("too many failed sign-ins from this address; retry after %s", wait.Round(time.Second))))
				return
			}
		}
		var in struct {
			Key string `json:"key"`
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, consoleSignInMaxBody))
		if err != nil {
			WriteError(w, r, TooLarge("sign-in body is over %d bytes", consoleSignInMaxBody))
			return
		}
		if err := json.Unmarshal(body, &in); err != nil {
			WriteError(w, r, Invalid("body", "expected {\"key\": \"mk_live_…\"}: "+err.Error()))
			return
		}
		in.Key = strings.TrimSpace(in.Key)
		if in.Key == "" {
			WriteError(w, r, Invalid("body.key", "required: a workspace key (mk_live_…)"))
			return
		}
		if cred.KindOf(in.Key) != cred.KindWorkspace {
			WriteError(w, r, Unauthorized("the console signs in with a workspace key (mk_live_…)"))
			return
		}
		p, err := auth.Workspace(r.Context(), "Bearer "+in.Key)
		if err != nil {
			var env *Envelope
			if failures != nil && errors.As(err, &env) && env.status == http.StatusUnauthorized {
				failures.allow(addr) // a key that does not resolve spends one of the address's failed sign-ins
			}
			WriteError(w, r, err)
			return
		}
		tok, s, err := web.mint(r.Context(), p.Key)
		if err != nil {
			WriteError(w, r, err)
			return
		}
		http.SetCookie(w, web.cookie(r, tok, s.expires()))
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "application/json")
		_ = jsonEncode(w, consoleSession(p.Workspace, p.Key, s))
	})

	mux.HandleFunc("GET /console/session", func(w http.ResponseWriter, r *http.Request) {
		// The console asks this on every load: no session, or one that ended (expired, signed out, its key
		// revoked), is an answer, not an error — {signedIn: false} with the reason, and the stale cookie cleared.
		signedOut := func(reason string) {
			if reason != "" {
				http.SetCookie(w, web.cookie(r, "", time.Time{}))
			}
			w.Header().Set("Cache-Control", "no-store")
			w.Header().Set("Content-Type", "application/json")
			_ = jsonEncode(w, map[string]any{"signedIn": false, "detail": reason})
		}
		s, err := web.fromRequest(r)
		var p *Principal
		if err == nil && s != nil {
			p, err = auth.webPrincipal(r.Context(), s, false, "")
		}
		var env *Envelope
		switch {
		case err != nil && errors.As(err, &env) && (env.status == http.StatusUnauthorized || env.status == http.StatusForbidden):
			signedOut(env.Detail)
			return
		case err != nil:
			WriteError(w, r, err)
			return
		case s == nil:
			signedOut("")
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "application/json")
		_ = jsonEncode(w, consoleSession(p.Workspace, p.Key, s))
	})

	mux.HandleFunc("POST /console/signout", func(w http.ResponseWriter, r *http.Request) {
		s, err := web.fromRequest(r)
		var env *Envelope
		if err != nil && errors.As(err, &env) && env.status == http.StatusForbidden {
			WriteError(w, r, err) // a signed-in session's sign-out is a mutation: CSRF token and origin checked
			return
		}
		if s != nil {
			if err := store.SignOutWeb(r.Context(), web.DB, s.claims.ID, s.expires()); err != nil {
				WriteError(w, r, err)
				return
			}
		}
		http.SetCookie(w, web.cookie(r, "", time.Time{}))
		w.WriteHeader(http.StatusNoContent)
	})
}
