package journal

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
)

// batchLog records the size of each committed batch (an OnCommit).
type batchLog struct {
	mu sync.Mutex
	n  []int
}

func (l *batchLog) commit(n int, _ time.Duration, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n = append(l.n, n)
}

func (l *batchLog) sizes() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.n)
}

// With LingerFrom, a batch waits only after a batch of at least LingerFrom records: a lone record at low load commits
// at once, and under load the wait gathers the records that arrive meanwhile, a LingerStep at a time while they come.
func TestLingerFrom(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	sessions := seedSessions(t, db, 1)
	ctx := context.Background()
	g := newGate()
	var batches batchLog
	w, err := New(Options[schema.Call]{DB: db, Insert: g.insert, Linger: time.Hour, LingerStep: time.Minute, LingerFrom: 3,
		OnCommit: batches.commit})
	if err != nil {
		t.Fatal(err)
	}
	lingering, goOn := make(chan time.Duration), make(chan struct{})
	w.sleep = func(d time.Duration) {
		lingering <- d
		<-goOn
	}
	submit := func(seq int64) <-chan error {
		done := make(chan error, 1)
		go func() { done <- w.Submit(ctx, call(sessions[0], seq)) }()
		return done
	}
	wait := func(done <-chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case d := <-lingering:
			t.Fatalf("a batch lingered %s after batches of %v (LingerFrom 3)", d, batches.sizes())
		}
	}

	// A first record holds its batch open while three queue behind it: a batch of one, then one of three, neither
	// after a batch of three or more.
	first := submit(1)
	<-g.entered
	rest := []<-chan error{submit(2), submit(3), submit(4)}
	waitQueued(t, w, 3)
	close(g.release)
	wait(first)
	for _, done := range rest {
		wait(done)
	}

	// After the batch of three, the next batch lingers a step, and what arrives meanwhile joins it; as a record came,
	// it lingers another step, which brings none: the batch commits without waiting out the Linger.
	fifth := submit(5)
	if d := <-lingering; d != time.Minute {
		t.Fatalf("lingered %s, want a LingerStep of 1m", d)
	}
	sixth := submit(6)
	waitQueued(t, w, 1)
	goOn <- struct{}{}
	if d := <-lingering; d != time.Minute {
		t.Fatalf("lingered %s, want a second LingerStep of 1m", d)
	}
	goOn <- struct{}{}
	wait(fifth)
	wait(sixth)

	// After that batch of two, a lone record commits at once.
	wait(submit(7))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := batches.sizes(), []int{1, 3, 2, 1}; !slices.Equal(got, want) {
		t.Errorf("batches of %v, want %v", got, want)
	}
	if got := countCalls(t, db); got != 7 {
		t.Errorf("%d calls committed, want 7", got)
	}
}

// While records keep coming, the steps stop at Linger: two steps of a minute for a Linger of two.
func TestLingerStepsStopAtLinger(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	sessions := seedSessions(t, db, 1)
	ctx := context.Background()
	g := newGate()
	var batches batchLog
	w, err := New(Options[schema.Call]{DB: db, Insert: g.insert, Linger: 2 * time.Minute, LingerStep: time.Minute,
		LingerFrom: 1, OnCommit: batches.commit})
	if err != nil {
		t.Fatal(err)
	}
	lingering, goOn := make(chan struct{}), make(chan struct{})
	w.sleep = func(time.Duration) {
		lingering <- struct{}{}
		<-goOn
	}
	close(g.release)
	var done []chan error
	submit := func(seq int64) {
		c := make(chan error, 1)
		done = append(done, c)
		go func() { c <- w.Submit(ctx, call(sessions[0], seq)) }()
	}
	submit(1) // the first batch: nothing committed before it, so no linger
	if err := <-done[0]; err != nil {
		t.Fatal(err)
	}
	submit(2)
	for seq := int64(3); seq <= 4; seq++ {
		<-lingering
		submit(seq)
		waitQueued(t, w, 1)
		goOn <- struct{}{}
	}
	for _, c := range done[1:] {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := batches.sizes(), []int{1, 3}; !slices.Equal(got, want) {
		t.Errorf("batches of %v, want %v", got, want)
	}
}
