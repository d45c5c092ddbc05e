package cred

import (
	"sync"
	"time"
)

// CacheMax bounds a Cache's entries: past it the cache starts over rather than track recency.
const CacheMax = 100_000

// Cache remembers what credentials resolved to, by credential hash (Hash), each entry until its own expiry. It is
// safe for concurrent use; the zero value is empty and ready.
type Cache[V any] struct {
	mu sync.RWMutex
	m  map[string]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v   V
	exp time.Time
}

// Get returns the value cached for hash while now is before its expiry.
func (c *Cache[V]) Get(hash string, now time.Time) (V, bool) {
	c.mu.RLock()
	e, ok := c.m[hash]
	c.mu.RUnlock()
	if !ok || !now.Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// Put caches v for hash until exp.
func (c *Cache[V]) Put(hash string, v V, exp time.Time) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= CacheMax {
		c.m = map[string]cacheEntry[V]{}
	}
	c.m[hash] = cacheEntry[V]{v: v, exp: exp}
	c.mu.Unlock()
}

// Delete forgets hash.
func (c *Cache[V]) Delete(hash string) {
	c.mu.Lock()
	delete(c.m, hash)
	c.mu.Unlock()
}

// Clear forgets everything.
func (c *Cache[V]) Clear() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}
