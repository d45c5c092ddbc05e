package journal

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
)

// OnCommit is told every batch: its size, its commit time and its error (the metrics' journal commit latency).
func TestOnCommitSeesEveryBatch(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	ids := seedSessions(t, db, 1)
	var mu sync.Mutex
	var sizes []int
	w, err := NewCalls(db, CallOptions{OnCommit: func(n int, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil || d <= 0 {
			t.Errorf("OnCommit(%d, %s, %v): want a positive time and no error", n, d, err)
		}
		sizes = append(sizes, n)
	}})
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		if err := w.Submit(context.Background(), call(ids[0], seq)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range sizes {
		total += n
	}
	if st := w.Stats(); total != 3 || int64(len(sizes)) != st.Batches {
		t.Errorf("OnCommit saw batches %v, want %d batches of 3 calls in all", sizes, st.Batches)
	}
}
