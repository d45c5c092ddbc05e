package cred_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
)

func TestCache(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c cred.Cache[string]
	if _, ok := c.Get("h", t0); ok {
		t.Fatal("an empty cache answered")
	}
	c.Put("h", "v", t0.Add(time.Second))
	c.Put("g", "w", t0.Add(time.Second))
	for _, tc := range []struct {
		name string
		at   time.Time
		ok   bool
	}{
		{"fresh", t0, true},
		{"just before expiry", t0.Add(time.Second - 1), true},
		{"at expiry", t0.Add(time.Second), false},
		{"after expiry", t0.Add(time.Minute), false},
	} {
		v, ok := c.Get("h", tc.at)
		if ok != tc.ok || (ok && v != "v") {
			t.Errorf("%s: got %q %v, want ok=%v", tc.name, v, ok, tc.ok)
		}
	}
	c.Delete("h")
	if _, ok := c.Get("h", t0); ok {
		t.Error("a deleted entry answered")
	}
	if v, ok := c.Get("g", t0); !ok || v != "w" {
		t.Errorf("deleting h lost g: %q %v", v, ok)
	}
	c.Clear()
	if _, ok := c.Get("g", t0); ok {
		t.Error("a cleared cache answered")
	}
}

// TestCacheBounded: past CacheMax entries the cache starts over instead of growing.
func TestCacheBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c cred.Cache[int]
	for i := range cred.CacheMax + 1 {
		c.Put(strconv.Itoa(i), i, t0.Add(time.Hour))
	}
	if _, ok := c.Get("0", t0); ok {
		t.Error("the first entry survived past CacheMax: the cache grew without bound")
	}
	if v, ok := c.Get(strconv.Itoa(cred.CacheMax), t0); !ok || v != cred.CacheMax {
		t.Errorf("the last entry: %d %v", v, ok)
	}
}
