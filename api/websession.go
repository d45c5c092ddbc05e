package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// The console's web sessions (spec §5's fourth credential): signing in with a workspace key sets an HS256 JWT in an
// HttpOnly, SameSite=Strict cookie (Secure behind TLS). /trpc accepts it in place of a bearer credential, scoped to
// the key's workspace; a mutation must also send the CSRF token bound to the JWT in X-CSRF-Token, and come from the
// same origin. Revoking the key ends its web sessions; signing out ends one before it expires.

// Web session names.
const (
	// WebCookie is the cookie holding the web session JWT.
	WebCookie = "doppel_session"
	// CSRFHeader carries the web session's CSRF token on mutations.
	CSRFHeader = "X-CSRF-Token"
	// DefaultWebSessionTTL is how long a web session lasts when Options.WebSessionTTL is 0.
	DefaultWebSessionTTL = 12 * time.Hour

	webIssuer   = "doppel"
	webAudience = "doppel-console"
	webSecretID = "console"
)

// webClaims are a web session JWT's claims: the key signed in with (sub) and its workspace.
type webClaims struct {
	Workspace string `json:"ws"`
	jwt.RegisteredClaims
}

// WebSessions mints and checks web session JWTs.
type WebSessions struct {
	// DB keeps the generated secret and the sign-outs.
	DB *bun.DB
	// Secret signs the JWTs (config console.secret). Empty: a random secret is generated once and kept in the
	// database (web_secrets), so restarts and every API process share it.
	Secret []byte
	// TTL is a session's lifetime (0: DefaultWebSessionTTL).
	TTL time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// FailedSignInsPerMinute and FailedSignInBurst budget each client address's sign-ins with a key that does not
	// resolve (defaults DefaultFailedSignInsPerMinute and DefaultFailedSignInBurst); past it, sign-in answers 429
	// with Retry-After, before the key is looked up. A negative FailedSignInsPerMinute turns the limit off.
	FailedSignInsPerMinute float64
	FailedSignInBurst      int
	// TrustForwardedFor takes the client address from X-Forwarded-For's first entry (set it only behind a proxy
	// that writes that header); by default the connection's address counts.
	TrustForwardedFor bool

	mu       sync.Mutex
	key      []byte
	failOnce sync.Once
	failures *keyedLimiter
}

// Defaults of the failed sign-in budget per client address: a person mistyping a key is not slowed, a script
// guessing keys is held to 10 a minute.
const (
	DefaultFailedSignInsPerMinute = 10
	DefaultFailedSignInBurst      = 10
)

// signInFailures is the failed sign-in limiter, or nil when it is off.
func (w *WebSessions) signInFailures() *keyedLimiter {
	w.failOnce.Do(func() {
		w.failures = failureLimiter(w.FailedSignInsPerMinute, w.FailedSignInBurst, DefaultFailedSignInsPerMinute, DefaultFailedSignInBurst, w.Now)
	})
	return w.failures
}

func (w *WebSessions) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

func (w *WebSessions) ttl() time.Duration {
	if w.TTL > 0 {
		return w.TTL
	}
	return DefaultWebSessionTTL
}

// secret returns the signing key, reading (or first storing) the generated one.
func (w *WebSessions) secret(ctx context.Context) ([]byte, error) {
	if len(w.Secret) > 0 {
		return w.Secret, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.key != nil {
		return w.key, nil
	}
	if w.DB == nil {
		return nil, Unavailable("metadata database is not configured")
	}
	var fresh [32]byte
	if _, err := rand.Read(fresh[:]); err != nil {
		return nil, fmt.Errorf("web session secret: %w", err)
	}
	s, err := store.WebSecret(ctx, w.DB, webSecretID, hex.EncodeToString(fresh[:]))
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(s)
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("web session secret in the database is malformed")
	}
	w.key = key
	return key, nil
}

// csrfToken is the CSRF token bound to a session's JWT id.
func csrfToken(secret []byte, jti string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("csrf\x00" + jti))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// webSession is a checked web session.
type webSession struct {
	claims *webClaims
	csrf   string
}

func (s *webSession) expires() time.Time { return s.claims.ExpiresAt.UTC() }

// mint signs a session for key.
func (w *WebSessions) mint(ctx context.Context, key *schema.APIKey) (string, *webSession, error) {
	secret, err := w.secret(ctx)
	if err != nil {
		return "", nil, err
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", nil, fmt.Errorf("web session id: %w", err)
	}
	now := w.now()
	c := &webClaims{Workspace: key.WorkspaceID, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: webIssuer, Audience: jwt.ClaimStrings{webAudience}, Subject: key.ID,
		ID: hex.EncodeToString(id[:]), IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(w.ttl())),
	}}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
	if err != nil {
		return "", nil, fmt.Errorf("sign web session: %w", err)
	}
	return tok, &webSession{claims: c, csrf: csrfToken(secret, c.ID)}, nil
}

// parse checks a JWT: HS256 under our secret, our issuer and audience, not expired. Any failure is a 401. Whether
// it was signed out is read with its key (webPrincipal).
func (w *WebSessions) parse(ctx context.Context, tok string) (*webSession, error) {
	secret, err := w.secret(ctx)
	if err != nil {
		return nil, err
	}
	c := &webClaims{}
	_, err = jwt.ParseWithClaims(tok, c, func(*jwt.Token) (any, error) { return secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}), jwt.WithIssuer(webIssuer),
		jwt.WithAudience(webAudience), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithTimeFunc(w.now))
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, Unauthorized("web session expired: sign in again")
	case err != nil:
		return nil, Unauthorized("invalid web session: sign in again")
	case c.ID == "" || c.Subject == "" || c.Workspace == "":
		return nil, Unauthorized("invalid web session: sign in again")
	}
	return &webSession{claims: c, csrf: csrfToken(secret, c.ID)}, nil
}

// fromRequest checks the request's session cookie: nil, nil when there is none. A mutation (any method but GET and
// HEAD) must come from the same origin (net/http's cross-origin protection) and send the session's CSRF token.
func (w *WebSessions) fromRequest(r *http.Request) (*webSession, error) {
	ck, err := r.Cookie(WebCookie)
	if err != nil || ck.Value == "" {
		return nil, nil
	}
	s, err := w.parse(r.Context(), ck.Value)
	if err != nil {
		return nil, err
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := http.NewCrossOriginProtection().Check(r); err != nil {
			return nil, Errorf(http.StatusForbidden, "cross-origin request refused: %v", err)
		}
		got := r.Header.Get(CSRFHeader)
		if got == "" {
			return nil, Errorf(http.StatusForbidden, "missing %s: a web session's mutations carry the CSRF token sign-in gave", CSRFHeader)
		}
		if !hmac.Equal([]byte(got), []byte(s.csrf)) {
			return nil, Errorf(http.StatusForbidden, "wrong %s for this web session", CSRFHeader)
		}
	}
	return s, nil
}

// cookie is the session cookie for tok (an empty tok clears it).
func (w *WebSessions) cookie(r *http.Request, tok string, exp time.Time) *http.Cookie {
	c := &http.Cookie{Name: WebCookie, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"}
	if tok == "" {
		c.MaxAge = -1
	} else {
		c.Expires = exp
		c.MaxAge = max(1, int(exp.Sub(w.now()).Seconds()))
	}
	return c
}

type webKey struct{}

// withWeb marks ctx as acting for a checked web session (only the tRPC handler does, after checking the cookie: no
// request from outside can carry it).
func withWeb(ctx context.Context, s *webSession) context.Context {
	return context.WithValue(ctx, webKey{}, s)
}

func webFrom(ctx context.Context) *webSession {
	s, _ := ctx.Value(webKey{}).(*webSession)
	return s
}

// webPrincipal resolves a checked web session to the key it was signed in with: a revoked or deleted key, or one
// moved out of the session's workspace, ends the session (401). On a session route it names the session, which must
// belong to the workspace (404 otherwise).
func (a *Authenticator) webPrincipal(ctx context.Context, s *webSession, sessionRoute bool, sessionID string) (*Principal, error) {
	db, err := a.db()
	if err != nil {
		return nil, err
	}
	// One read for the key and the sign-out, one for the workspace: as many as a bearer key takes.
	key, signedOut, err := store.GetWebKey(ctx, db, s.claims.Subject, s.claims.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, Unauthorized("web session ended: its key no longer exists")
	}
	if err != nil {
		return nil, err
	}
	if signedOut {
		return nil, Unauthorized("web session signed out: sign in again")
	}
	if key.WorkspaceID != s.claims.Workspace || key.Kind != schema.KeyKindWorkspace {
		return nil, Unauthorized("invalid web session: sign in again")
	}
	if key.RevokedAt != nil {
		return nil, Unauthorized("web session ended: the key it was signed in with was revoked")
	}
	ws, err := store.GetWorkspace(ctx, db, key.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := checkAccess(ws); err != nil {
		return nil, err
	}
	p := &Principal{Workspace: ws, Key: key}
	if sessionRoute {
		sess, err := store.GetSession(ctx, db, ws.ID, sessionID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, NotFound("session %s not found", sessionID)
		}
		if err != nil {
			return nil, err
		}
		p.Session = sess
	}
	return p, nil
}
