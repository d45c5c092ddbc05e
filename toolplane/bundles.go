package toolplane

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin"
)

// Bundles loads build bundles from the blob store, keeping the few most recent in memory by build id.
type Bundles struct {
	Blob blob.Store
	// Keep is how many bundles stay in memory (default 8).
	Keep int

	mu    sync.Mutex
	byID  map[string]*bundleEntry
	order []string
}

type bundleEntry struct {
	once sync.Once
	b    *twin.Bundle
	err  error
}

// Get returns the bundle of build (loaded once; concurrent callers share the load).
func (c *Bundles) Get(ctx context.Context, build *schema.Build) (*twin.Bundle, error) {
	if c == nil || c.Blob == nil {
		return nil, errorf(Unavailable, "no blob store configured to read build bundles")
	}
	if build.BundleKey == "" {
		return nil, errorf(NotReady, "build %s has no bundle yet", build.ID)
	}
	c.mu.Lock()
	if c.byID == nil {
		c.byID = map[string]*bundleEntry{}
	}
	e, ok := c.byID[build.ID]
	if !ok {
		e = &bundleEntry{}
		c.byID[build.ID] = e
		c.order = append(c.order, build.ID)
		keep := c.Keep
		if keep <= 0 {
			keep = 8
		}
		for len(c.order) > keep {
			delete(c.byID, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.mu.Unlock()
	e.once.Do(func() { e.b, e.err = loadBundle(context.WithoutCancel(ctx), c.Blob, build) })
	if e.err != nil {
		c.mu.Lock()
		if c.byID[build.ID] == e {
			delete(c.byID, build.ID) // retry a failed load next time
		}
		c.mu.Unlock()
	}
	return e.b, e.err
}

func loadBundle(ctx context.Context, bs blob.Store, build *schema.Build) (*twin.Bundle, error) {
	rc, err := bs.Get(ctx, build.BundleKey)
	if err != nil {
		return nil, fmt.Errorf("read bundle of build %s: %w", build.ID, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read bundle of build %s: %w", build.ID, err)
	}
	b, err := twin.UnmarshalBundle(data)
	if err != nil {
		return nil, fmt.Errorf("bundle of build %s: %w", build.ID, err)
	}
	return b, nil
}
