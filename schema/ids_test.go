package schema_test

import (
	"sort"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/schema"
)

func TestIDs(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name, prefix, id string
		len              int
	}{
		{"random", schema.PrefixSession, schema.NewID(schema.PrefixSession), len("ses_") + 16},
		{"sortable", schema.PrefixCall, schema.NewSortableID(schema.PrefixCall, at), len("call_") + 26},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if len(c.id) != c.len {
				t.Fatalf("%s: length %d, want %d", c.id, len(c.id), c.len)
			}
			prefix := c.prefix
			if !schema.HasPrefix(c.id, prefix) {
				t.Fatalf("HasPrefix(%q, %q) = false", c.id, prefix)
			}
			if schema.HasPrefix(c.id+"x", prefix) || schema.HasPrefix(c.id[:len(c.id)-1]+"U", prefix) {
				t.Fatalf("HasPrefix accepted a malformed id derived from %q", c.id)
			}
		})
	}
}

// Sortable ids sort by their time (to the millisecond), whatever their random parts, and differ within one
// millisecond.
func TestSortableIDsSortByTime(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var ids []string
	seen := map[string]bool{}
	for i := range 2000 {
		id := schema.NewSortableID(schema.PrefixCall, at.Add(time.Duration(i/4)*time.Millisecond))
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	for i := 4; i < len(ids); i++ {
		if ids[i] <= ids[i-4] {
			t.Fatalf("ids[%d] = %s made 1 ms after ids[%d] = %s does not sort after it", i, ids[i], i-4, ids[i-4])
		}
	}
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	for i := range sorted {
		if sorted[i][:len("call_")+9] != ids[i][:len("call_")+9] { // 9 chars = the first 45 bits of the time
			t.Fatalf("sorted order differs from time order at %d", i)
		}
	}
}
