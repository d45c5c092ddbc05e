package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Security scheme names, declared in the OpenAPI document. An operation's Security picks
// which credentials the auth middleware accepts for it.
const (
	SchemeWorkspaceKey = "workspaceKey" // Authorization: Bearer mk_live_…
	SchemeSessionToken = "sessionToken" // Authorization: Bearer ms_…
	SchemeMCPToken     = "mcpToken"     // Authorization: Bearer mcp_at_…
)

// SessionIDParam is the path parameter session routes must name the session with.
const SessionIDParam = "session_id"

// WorkspaceKeyAuth is the Security of routes that take a workspace key (environment routes, collect, keys).
func WorkspaceKeyAuth() []map[string][]string {
	return []map[string][]string{{SchemeWorkspaceKey: {}}}
}

// SessionAuth is the Security of session routes (path parameter {session_id}): the session's
// token, or the workspace key that opened the session.
func SessionAuth() []map[string][]string {
	return []map[string][]string{{SchemeSessionToken: {}}, {SchemeWorkspaceKey: {}}}
}

// MCPAuth is the Security of MCP routes: an MCP token or a workspace key.
func MCPAuth() []map[string][]string {
	return []map[string][]string{{SchemeMCPToken: {}}, {SchemeWorkspaceKey: {}}}
}

// Principal is who a request acts as, set by the auth middleware.
type Principal struct {
	Workspace *schema.Workspace
	// Key is the workspace key or MCP token presented; nil when a session token was.
	Key *schema.APIKey
	// Session is the session a session route names; nil on other routes. Its status may be
	// closed or expired when the opening key asks: use SessionGone to answer those.
	Session *schema.Session
	// Admin is set on admin verbs, which act on no workspace of their own (Workspace is nil).
	Admin bool
}

type principalKey struct{}

// PrincipalFrom returns the request's principal, nil on routes without auth.
func PrincipalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// WithPrincipal returns ctx carrying p (for raw handlers and tests).
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// SessionGone is the 404 for a session that is no longer open (spec §3: an expired session answers 404), nil when open.
func SessionGone(s *schema.Session) error {
	if s.Status == schema.SessionOpen {
		return nil
	}
	return NotFound("session %s is %s", s.ID, s.Status)
}

// Authenticator resolves bearer credentials against the metadata database.
type Authenticator struct {
	DB *bun.DB
	// Tokens, when set, resolves session tokens (a short-lived cache in front of the database on the call hot
	// path: SessionTokens). Without it every session route reads the session and its workspace.
	Tokens TokenResolver

	// FailedPerMinute and FailedBurst budget each client address's credentials that do not resolve (defaults
	// DefaultFailedCredentialsPerMinute and DefaultFailedCredentialBurst); past it, every credential check from
	// that address answers 429 with Retry-After before the credential is looked up. Negative FailedPerMinute: off.
	FailedPerMinute float64
	FailedBurst     int

	keys     *keyCache // nil: every workspace key and MCP token is read from the database
	admin    *adminKey // nil: admin verbs refuse every credential
	failOnce sync.Once
	failures *keyedLimiter
}

// TokenResolver answers the session and workspace of a session token, whatever the session's status; an unknown
// token is store.ErrNotFound. The returned values are shared: callers must not change them. ForgetAll drops every
// cached resolution (after a key is revoked: the tokens derived from it are refused at once).
type TokenResolver interface {
	Resolve(ctx context.Context, token string) (*schema.Session, *schema.Workspace, error)
	ForgetAll()
}

// resolveToken reads a session token through Tokens when set, else from the database; the session is a copy.
func (a *Authenticator) resolveToken(ctx context.Context, db *bun.DB, tok string) (*schema.Session, *schema.Workspace, error) {
	if a.Tokens != nil {
		s, ws, err := a.Tokens.Resolve(ctx, tok)
		if err != nil {
			return nil, nil, err
		}
		sc := *s
		return &sc, ws, nil
	}
	s, err := store.SessionByToken(ctx, db, tok)
	if err != nil {
		return nil, nil, err
	}
	ws, err := store.GetWorkspace(ctx, db, s.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	return s, ws, nil
}

func credential(authorization string) (string, error) {
	tok := cred.FromHeader(authorization)
	if tok == "" {
		return "", Unauthorized("missing credential: send Authorization: Bearer <credential>")
	}
	return tok, nil
}

func checkAccess(ws *schema.Workspace) error {
	switch ws.Access {
	case schema.AccessGranted:
		return nil
	case schema.AccessPending:
		return Forbidden(AccessPending, "workspace access is pending")
	default:
		return Forbidden(AccessDenied, "workspace access is denied")
	}
}

func (a *Authenticator) db() (*bun.DB, error) {
	if a == nil || a.DB == nil {
		return nil, Unavailable("metadata database is not configured")
	}
	return a.DB, nil
}

// Key authenticates an Authorization header carrying a key of one of the given kinds
// (cred.KindWorkspace, cred.KindMCP). Missing, malformed, unknown, revoked or wrong-kind
// credentials are 401; a workspace whose access is not granted is 403.
func (a *Authenticator) Key(ctx context.Context, authorization string, kinds ...cred.Kind) (*Principal, error) {
	db, err := a.db()
	if err != nil {
		return nil, err
	}
	tok, err := credential(authorization)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(kinds, cred.KindOf(tok)) {
		return nil, Unauthorized("this route takes " + describeKinds(kinds))
	}
	if err := a.failureGate(ctx); err != nil {
		return nil, err
	}
	var key *schema.APIKey
	var ws *schema.Workspace
	if a.keys != nil {
		key, ws, err = a.keys.resolve(ctx, tok)
	} else {
		key, ws, err = store.ResolveKey(ctx, db, tok)
	}
	if errors.Is(err, store.ErrNotFound) {
		a.failed(ctx)
		return nil, Unauthorized("invalid or revoked credential")
	}
	if err != nil {
		return nil, err
	}
	if err := checkAccess(ws); err != nil {
		return nil, err
	}
	return &Principal{Workspace: ws, Key: key}, nil
}

// forgetKeys drops every cached key and session-token resolution, after this process revoked a key or changed a
// workspace, so the change applies to its next request at once, to the key and to every credential derived from it.
func (a *Authenticator) forgetKeys() {
	if a != nil {
		a.keys.forget()
		if a.Tokens != nil {
			a.Tokens.ForgetAll()
		}
	}
}

// Workspace authenticates a workspace key (mk_live_…).
func (a *Authenticator) Workspace(ctx context.Context, authorization string) (*Principal, error) {
	return a.Key(ctx, authorization, cred.KindWorkspace)
}

// Session authenticates a session route for sessionID: the session's own token (ms_…) or any workspace key of
// its workspace (spec §5: a workspace key may do anything its workspace can), or, through the MCP server, an MCP
// token of its workspace. A closed or broken session's token
// is revoked (401), and so is the token of a session whose opening key was revoked; an expired one's answers 404.
// A session of another workspace, or a token of another session, is 404.
func (a *Authenticator) Session(ctx context.Context, authorization, sessionID string) (*Principal, error) {
	db, err := a.db()
	if err != nil {
		return nil, err
	}
	tok, err := credential(authorization)
	if err != nil {
		return nil, err
	}
	switch cred.KindOf(tok) {
	case cred.KindSession:
		if err := a.failureGate(ctx); err != nil {
			return nil, err
		}
		s, ws, err := a.resolveToken(ctx, db, tok)
		if errors.Is(err, store.ErrNotFound) {
			a.failed(ctx)
			return nil, Unauthorized("invalid session token")
		}
		if err != nil {
			return nil, err
		}
		if s.Status == schema.SessionClosed || s.Status == schema.SessionBroken {
			return nil, Unauthorized("session token revoked: the session has ended")
		}
		if s.ID != sessionID {
			return nil, NotFound("session %s not found", sessionID)
		}
		if s.Status == schema.SessionExpired {
			return nil, NotFound("session %s expired", sessionID)
		}
		if err := checkAccess(ws); err != nil {
			return nil, err
		}
		return &Principal{Workspace: ws, Session: s}, nil
	case cred.KindWorkspace, cred.KindMCP:
		p, err := a.Key(ctx, authorization, keyKinds(ctx, false)...)
		if err != nil {
			return nil, err
		}
		s, err := store.GetSession(ctx, db, p.Workspace.ID, sessionID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, NotFound("session %s not found", sessionID)
		}
		if err != nil {
			return nil, err
		}
		p.Session = s
		return p, nil
	}
	return nil, Unauthorized("session routes take the session token (ms_…) or the workspace key that opened the session")
}

type mcpCallKey struct{}

// viaMCP marks ctx as a verb called as a tool of the MCP server's workspace face (for in-process dispatch only: no
// request from outside can carry it).
func viaMCP(ctx context.Context) context.Context { return context.WithValue(ctx, mcpCallKey{}, true) }

// keyKinds are the key kinds a workspace-key route accepts: a workspace key, and an MCP token when the verb is
// called through the MCP server (spec §5: the MCP token is for the MCP server), except on the verbs that mint and
// revoke keys (keysVerb), so a short-lived token cannot make itself a lasting key.
func keyKinds(ctx context.Context, keysVerb bool) []cred.Kind {
	if on, _ := ctx.Value(mcpCallKey{}).(bool); on && !keysVerb {
		return []cred.Kind{cred.KindWorkspace, cred.KindMCP}
	}
	return []cred.Kind{cred.KindWorkspace}
}

func describeKinds(kinds []cred.Kind) string {
	s := ""
	for i, k := range kinds {
		if i > 0 {
			s += " or "
		}
		switch k {
		case cred.KindWorkspace:
			s += "a workspace key (mk_live_…)"
		case cred.KindMCP:
			s += "an MCP token (mcp_at_…)"
		case cred.KindSession:
			s += "a session token (ms_…)"
		}
	}
	return s
}

// middleware authenticates each operation per its Security and puts the Principal in the context.
func (a *Authenticator) middleware(humaAPI huma.API) func(huma.Context, func(huma.Context)) {
	return func(ctx huma.Context, next func(huma.Context)) {
		op := ctx.Operation()
		if op == nil || len(op.Security) == 0 {
			next(ctx)
			return
		}
		accepts := func(scheme string) bool {
			for _, req := range op.Security {
				if _, ok := req[scheme]; ok {
					return true
				}
			}
			return false
		}
		var p *Principal
		var err error
		header := ctx.Header("Authorization")
		began := time.Now()
		web := webFrom(ctx.Context())
		switch {
		case web != nil && header == "" && !accepts(SchemeAdminKey):
			// A console request through /trpc: the web session stands for the workspace key it was signed in with.
			p, err = a.webPrincipal(ctx.Context(), web, accepts(SchemeSessionToken), ctx.Param(SessionIDParam))
		case accepts(SchemeAdminKey):
			if err = a.failureGate(ctx.Context()); err == nil {
				if p, err = a.Admin(header); err != nil && header != "" {
					a.failed(ctx.Context()) // a credential that is not the admin key spends a failed credential
				}
			}
		case accepts(SchemeSessionToken):
			p, err = a.Session(ctx.Context(), header, ctx.Param(SessionIDParam))
		case accepts(SchemeMCPToken):
			kinds := []cred.Kind{cred.KindMCP}
			if accepts(SchemeWorkspaceKey) {
				kinds = append(kinds, cred.KindWorkspace)
			}
			p, err = a.Key(ctx.Context(), header, kinds...)
		case accepts(SchemeWorkspaceKey):
			p, err = a.Key(ctx.Context(), header, keyKinds(ctx.Context(), slices.Contains(op.Tags, "keys"))...)
		default:
			next(ctx)
			return
		}
		if ri := requestInfo(ctx.Context()); ri != nil {
			ri.auth = time.Since(began)
		}
		if err != nil {
			writeHumaError(ctx, err)
			return
		}
		next(huma.WithValue(ctx, principalKey{}, p))
	}
}

// writeHumaError writes err as an envelope from inside a huma middleware.
func writeHumaError(ctx huma.Context, err error) {
	e, status := EnvelopeOf(ctx.Context(), err)
	if status == 0 {
		status = http.StatusInternalServerError
	}
	ctx.SetHeader("Content-Type", "application/json")
	if e.retryAfter > 0 {
		ctx.SetHeader("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if status == http.StatusUnauthorized {
		ctx.SetHeader("WWW-Authenticate", "Bearer")
	}
	ctx.SetStatus(status)
	_ = jsonEncode(ctx.BodyWriter(), e)
}
