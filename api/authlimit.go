package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Defaults of the failed-credential budget per client address (REST, tRPC, MCP, /oauth/authorize): a client with
// a mistyped key is not slowed, a script guessing credentials is held to 30 a minute.
const (
	DefaultFailedCredentialsPerMinute = 30
	DefaultFailedCredentialBurst      = 30
)

// failedCredentials is the console sign-in's mechanism (a keyedLimiter per client address) applied to every
// credential check: a presented credential that does not resolve spends one token of its address's bucket, and
// once the bucket is empty every credential check from that address answers 429 with Retry-After before the
// credential is looked up, so guessing is held to the bucket's rate whatever the route.
func (a *Authenticator) failedCredentials() *keyedLimiter {
	if a == nil {
		return nil
	}
	a.failOnce.Do(func() {
		a.failures = failureLimiter(a.FailedPerMinute, a.FailedBurst, DefaultFailedCredentialsPerMinute, DefaultFailedCredentialBurst, nil)
	})
	return a.failures
}

// failureGate answers the 429 for a request whose address has spent its failed credentials, nil otherwise (and
// always nil outside a request from a client: in-process dispatch of an MCP tool call).
func (a *Authenticator) failureGate(ctx context.Context) error {
	ri := requestInfo(ctx)
	lim := a.failedCredentials()
	if ri == nil || ri.addr == "" || lim == nil {
		return nil
	}
	wait := lim.wait(ri.addr)
	if wait <= 0 {
		return nil
	}
	secs := int(math.Ceil(wait.Seconds()))
	e := RateLimited(fmt.Sprintf("too many failed credentials from this address; retry after %s (api.failed_credentials_per_minute)",
		time.Duration(secs)*time.Second))
	e.retryAfter = secs
	return e
}

// failed spends one of the request's address's failed credentials.
func (a *Authenticator) failed(ctx context.Context) {
	ri := requestInfo(ctx)
	if lim := a.failedCredentials(); ri != nil && ri.addr != "" && lim != nil {
		lim.allow(ri.addr)
	}
}

// matches reports whether tok is the admin key.
func (k *adminKey) matches(tok string) bool {
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], k.sum[:]) == 1
}

// resolveAny is the workspace id a workspace key, MCP token or live session token belongs to; "" with
// store.ErrNotFound (or nil) when it resolves to none.
func (a *Authenticator) resolveAny(ctx context.Context, tok string) (string, error) {
	switch cred.KindOf(tok) {
	case cred.KindWorkspace, cred.KindMCP:
		var ws *schema.Workspace
		var err error
		if a.keys != nil {
			_, ws, err = a.keys.resolve(ctx, tok)
		} else {
			_, ws, err = store.ResolveKey(ctx, a.DB, tok)
		}
		if err != nil {
			return "", err
		}
		return ws.ID, nil
	case cred.KindSession:
		s, ws, err := a.resolveToken(ctx, a.DB, tok)
		if err != nil {
			return "", err
		}
		if s.Status == schema.SessionClosed || s.Status == schema.SessionBroken {
			return "", store.ErrNotFound
		}
		return ws.ID, nil
	}
	return "", store.ErrNotFound
}

// notFound reports whether err says a credential resolved to nothing.
func notFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
