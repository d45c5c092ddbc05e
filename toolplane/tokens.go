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
// closes, expires or breaks it, so its token is refused at once here, and another process refuses it within the
// TTL (sooner: its next call finds the world dropped and the row ended).
type Tokens struct {
	db  *bun.DB
	ttl time.Duration

	mu   sync.RWMutex
	byID map[string]string // session id → token hash
	m    map[string]tokenEntry
}

// NewTokens is a token cache over db trusting each resolution for ttl (default 5s).
func NewTokens(db *bun.DB, ttl time.Duration) *Tokens { return &Tokens{db: db, ttl: ttl} }

type tokenEntry struct {
	s   *schema.Session
	ws  *schema.Workspace
	exp time.Time
}

// Resolve returns the session and workspace of an ms_ token, whatever the session's status (callers decide what an
// ended session answers); unknown tokens are store.ErrNotFound. The values are shared: callers must not change them.
func (c *Tokens) Resolve(ctx context.Context, token string) (*schema.Session, *schema.Workspace, error) {
	h := cred.Hash(token)
	now := time.Now()
	c.mu.RLock()
	e, ok := c.m[h]
	c.mu.RUnlock()
	if ok && now.Before(e.exp) {
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
		ttl = 5 * time.Second
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) > 100_000 { // bound memory: start over rather than track recency
		c.m, c.byID = map[string]tokenEntry{}, map[string]string{}
	}
	c.m[h] = tokenEntry{s: s, ws: ws, exp: now.Add(ttl)}
	c.byID[s.ID] = h
	c.mu.Unlock()
	return s, ws, nil
}

// Forget drops a session's resolution: its next request reads the database again.
func (c *Tokens) Forget(sessionID string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if h, ok := c.byID[sessionID]; ok {
		delete(c.m, h)
		delete(c.byID, sessionID)
	}
	c.mu.Unlock()
}
