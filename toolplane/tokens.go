package toolplane

import (
	"context"
	"sync"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Tokens caches what a session token resolves to (its session and workspace), so the call path does not read the
// database twice per call. Resolutions are trusted for a TTL; the plane forgets a session the moment this process
// closes, expires or breaks it, and every session when this process revokes a key, so its token is refused at
// once here, and another process refuses it within the TTL (sooner for an ended session: its next call finds the
// world dropped and the row ended).
type Tokens struct {
	db  *bun.DB
	ttl time.Duration

	entries cred.Cache[tokenEntry]

	mu   sync.Mutex
	byID map[string]string // session id → token hash
}

// DefaultTokenTTL is how long a session-token resolution is trusted unless told: how long another API process may
// still accept the token of a session one process closed.
const DefaultTokenTTL = 5 * time.Second

// NewTokens is a token cache over db trusting each resolution for ttl (default DefaultTokenTTL).
func NewTokens(db *bun.DB, ttl time.Duration) *Tokens { return &Tokens{db: db, ttl: ttl} }

type tokenEntry struct {
	s  *schema.Session
	ws *schema.Workspace
}

// Resolve returns the session and workspace of an ms_ token, whatever the session's status (callers decide what an
// ended session answers); unknown tokens are store.ErrNotFound. The values are shared: callers must not change them.
func (c *Tokens) Resolve(ctx context.Context, token string) (*schema.Session, *schema.Workspace, error) {
	h := cred.Hash(token)
	now := time.Now()
	if e, ok := c.entries.Get(h, now); ok {
		return e.s, e.ws, nil
	}
	s, err := store.SessionByToken(ctx, c.db, token)
	if err != nil {
		return nil, nil, err
	}
	ws, err := store.GetWorkspace(ctx, c.db, s.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	ttl := c.ttl
	if ttl <= 0 {
		ttl = DefaultTokenTTL
	}
	c.mu.Lock()
	if c.byID == nil || len(c.byID) >= cred.CacheMax {
		// Start over, as the cache does, and with it: an entry byID no longer names could not be forgotten.
		c.byID = map[string]string{}
		c.entries.Clear()
	}
	c.byID[s.ID] = h
	c.mu.Unlock()
	c.entries.Put(h, tokenEntry{s: s, ws: ws}, now.Add(ttl))
	return s, ws, nil
}

// ForgetAll drops every resolution (a key was revoked: the tokens of the sessions it opened end with it).
func (c *Tokens) ForgetAll() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.byID = nil
	c.entries.Clear()
	c.mu.Unlock()
}

// Forget drops a session's resolution: its next request reads the database again.
func (c *Tokens) Forget(sessionID string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	h, ok := c.byID[sessionID]
	delete(c.byID, sessionID)
	c.mu.Unlock()
	if ok {
		c.entries.Delete(h)
	}
}
