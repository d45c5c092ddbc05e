package api

import (
	"context"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// DefaultKeyCacheTTL is how long a resolved workspace key or MCP token is trusted without reading the database
// again: the longest another API process goes on accepting a key revoked (or a workspace changed) elsewhere.
const DefaultKeyCacheTTL = 5 * time.Second

// keyCache remembers what a workspace key or MCP token resolved to (the key row and its workspace), so a
// request authenticated with one does not read the database each time: REST and tRPC routes that take a
// workspace key, session routes called with one, and every request to the MCP server. Only live keys are
// cached. An entry is trusted for ttl, and never past the key's own expiry; this process forgets every entry
// when it revokes a key or changes a workspace, so what it revokes is refused at once here, and what another
// process revokes within ttl.
type keyCache struct {
	db  *bun.DB
	ttl time.Duration
	now func() time.Time

	entries cred.Cache[keyEntry]
}

type keyEntry struct {
	key *schema.APIKey
	ws  *schema.Workspace
}

func newKeyCache(db *bun.DB, ttl time.Duration) *keyCache {
	return &keyCache{db: db, ttl: ttl, now: time.Now}
}

// resolve returns copies of the key and workspace a credential names, as store.ResolveKey does, from the cache
// when a fresh entry holds them.
func (c *keyCache) resolve(ctx context.Context, token string) (*schema.APIKey, *schema.Workspace, error) {
	h := cred.Hash(token)
	now := c.now()
	if e, ok := c.entries.Get(h, now); ok && (e.key.ExpiresAt == nil || now.Before(*e.key.ExpiresAt)) {
		return copyKey(e.key, e.ws)
	}
	key, ws, err := store.ResolveKey(ctx, c.db, token)
	if err != nil {
		return nil, nil, err
	}
	c.entries.Put(h, keyEntry{key: key, ws: ws}, now.Add(c.ttl))
	return copyKey(key, ws)
}

// forget drops every entry: the next request with any key reads the database.
func (c *keyCache) forget() {
	if c == nil {
		return
	}
	c.entries.Clear()
}

// copyKey returns copies, so a caller changing its principal cannot change the cached values.
func copyKey(k *schema.APIKey, ws *schema.Workspace) (*schema.APIKey, *schema.Workspace, error) {
	kc, wc := *k, *ws
	return &kc, &wc, nil
}
