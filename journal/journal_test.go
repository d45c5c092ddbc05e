package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/twinstate"
)

// seedSessions creates a workspace, an environment and n open sessions, returning the session ids.
func seedSessions(t testing.TB, db *bun.DB, n int) []string {
	t.Helper()
	ctx := context.Background()
	now := schema.Now()
	ws := &schema.Workspace{ID: schema.NewID(schema.PrefixWorkspace), Name: "journal", Access: schema.AccessGranted, CreatedAt: now}
	env := &schema.Environment{ID: schema.NewID(schema.PrefixEnv), WorkspaceID: ws.ID, Slug: "retail", Name: "retail",
		Status: schema.EnvReady, SchemaSource: "traces", TwinState: twinstate.Stopped, CreatedAt: now, UpdatedAt: now}
	if _, err := db.NewInsert().Model(ws).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.NewInsert().Model(env).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		s := &schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: env.ID, WorkspaceID: ws.ID,
			TokenHash: schema.NewID("h"), Status: schema.SessionOpen, CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour)}
		if _, err := db.NewInsert().Model(s).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		ids[i] = s.ID
	}
	return ids
}

func call(session string, seq int64) schema.Call {
	return schema.Call{
		ID:        schema.NewSortableID(schema.PrefixCall, time.Now()),
		SessionID: session,
		Seq:       seq,
		Tool:      "get_order_details",
		Arguments: json.RawMessage(fmt.Sprintf(`{"order_id":"#W%07d"}`, seq)),
		Content:   `{"order_id": "#W0000001", "status": "pending", "items": [{"name": "Skateboard", "price": 180.1}]}`,
		Fidelity:  schema.FidelityBTwin,
		Rung:      "twin",
		Requestor: "assistant",
		StateHash: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		CreatedAt: schema.Now(),
	}
}

func countCalls(t testing.TB, db bun.IDB) int {
	t.Helper()
	n, err := db.NewSelect().Model((*schema.Call)(nil)).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// gate holds the first batch inside its transaction until released, so the test controls what queues
// behind it.
type gate struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) insert(ctx context.Context, db bun.IDB, calls []schema.Call) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
	return InsertCalls(ctx, db, calls)
}

// waitQueued waits until n records sit in w's queue.
func waitQueued[T any](t *testing.T, w *Writer[T], n int) {
	t.Helper()
	queued := func() int {
		w.mu.RLock()
		defer w.mu.RUnlock()
		return len(w.queue)
	}
	for i := 0; queued() < n; i++ {
		if i > 10000 {
			t.Fatalf("queue holds %d records, want %d", queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGroupCommit(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		sessions := seedSessions(t, db, 4)
		g := newGate()
		w, err := New(Options[schema.Call]{DB: db, Insert: g.insert, MaxBatch: 40})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()

		errs := make(chan error, 101)
		go func() { errs <- w.Submit(ctx, call(sessions[0], 1)) }()
		<-g.entered // batch 1 (one call) is inside its transaction
		for i := range 100 {
			go func() { errs <- w.Submit(ctx, call(sessions[i%4], int64(i/4+2))) }()
		}
		waitQueued(t, w, 100)
		if got := countCalls(t, db); got != 0 {
			t.Fatalf("%d calls visible before the first commit", got)
		}
		close(g.release)
		for range 101 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := countCalls(t, db); got != 101 {
			t.Fatalf("%d calls committed, want 101", got)
		}
		// 1 + 40 + 40 + 20: the queue commits in full batches, never above MaxBatch.
		st := w.Stats()
		if st.Batches != 4 || st.Items != 101 || st.MaxBatch != 40 || st.Failed != 0 {
			t.Fatalf("stats = %+v, want 4 batches of at most 40 holding 101", st)
		}
	})
}

func TestFailedBatchFailsEveryWaiterAndCommitsNothing(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		sessions := seedSessions(t, db, 1)
		g := newGate()
		w, err := New(Options[schema.Call]{DB: db, Insert: g.insert})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()

		first := make(chan error, 1)
		go func() { first <- w.Submit(ctx, call(sessions[0], 1)) }()
		<-g.entered
		// Batch 2: nine good calls and one whose session does not exist (a foreign-key violation).
		errs := make(chan error, 10)
		for i := range 9 {
			go func() { errs <- w.Submit(ctx, call(sessions[0], int64(i+2))) }()
		}
		go func() { errs <- w.Submit(ctx, call("ses_doesnotexist0000", 1)) }()
		waitQueued(t, w, 10)
		close(g.release)
		if err := <-first; err != nil {
			t.Fatalf("first batch: %v", err)
		}
		for range 10 {
			if err := <-errs; err == nil {
				t.Fatal("a waiter of the failed batch got no error")
			}
		}
		if got := countCalls(t, db); got != 1 {
			t.Fatalf("%d calls committed, want only the first batch's 1", got)
		}
		if st := w.Stats(); st.Failed != 1 || st.Batches != 2 {
			t.Fatalf("stats = %+v", st)
		}
		// The writer keeps working after a failed batch.
		if err := w.Submit(ctx, call(sessions[0], 20)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCloseDrainsQueue(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		sessions := seedSessions(t, db, 1)
		g := newGate()
		w, err := New(Options[schema.Call]{DB: db, Insert: g.insert, MaxBatch: 8, Linger: 2 * time.Millisecond, Queue: 64})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 50)
		go func() { errs <- w.Submit(ctx, call(sessions[0], 1)) }()
		<-g.entered
		for i := range 49 {
			go func() { errs <- w.Submit(ctx, call(sessions[0], int64(i+2))) }()
		}
		waitQueued(t, w, 49)
		closed := make(chan error)
		go func() { closed <- w.Close() }()
		// Close has begun (it waits for the committer): new records are refused.
		for i := 0; ; i++ {
			w.mu.RLock()
			c := w.closed
			w.mu.RUnlock()
			if c {
				break
			}
			if i > 10000 {
				t.Fatal("Close did not begin")
			}
			time.Sleep(time.Millisecond)
		}
		if err := w.Submit(ctx, call(sessions[0], 99)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Submit after Close = %v, want ErrClosed", err)
		}
		close(g.release)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := countCalls(t, db); got != 50 {
			t.Fatalf("%d calls committed after Close, want 50", got)
		}
	})
}

func TestSubmitHonoursContext(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	sessions := seedSessions(t, db, 1)
	g := newGate()
	w, err := New(Options[schema.Call]{DB: db, Insert: g.insert})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Submit(ctx, call(sessions[0], 1)) }()
	<-g.entered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit = %v, want context.Canceled", err)
	}
	close(g.release)
	// The record was already in its batch: it still commits (the documented outcome).
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := countCalls(t, db); got != 1 {
		t.Fatalf("%d calls, want 1", got)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	tests := []struct {
		name string
		o    Options[schema.Call]
	}{
		{"no db", Options[schema.Call]{Insert: InsertCalls}},
		{"no insert", Options[schema.Call]{DB: db}},
		{"negative batch", Options[schema.Call]{DB: db, Insert: InsertCalls, MaxBatch: -1}},
		{"negative linger", Options[schema.Call]{DB: db, Insert: InsertCalls, Linger: -time.Millisecond}},
		{"negative linger from", Options[schema.Call]{DB: db, Insert: InsertCalls, LingerFrom: -1}},
		{"negative linger step", Options[schema.Call]{DB: db, Insert: InsertCalls, LingerStep: -1}},
	}
	for _, tt := range tests {
		if _, err := New(tt.o); err == nil {
			t.Errorf("%s: New succeeded", tt.name)
		}
	}
}

func TestCallsRoundTrip(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		sessions := seedSessions(t, db, 1)
		w, err := NewCalls(db, CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		want := call(sessions[0], 1)
		want.Error = true
		want.Downgraded = true
		want.Ms = 3
		if err := w.Submit(ctx, want); err != nil {
			t.Fatal(err)
		}
		var got schema.Call
		if err := db.NewSelect().Model(&got).Where("id = ?", want.ID).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		var a, b any
		_ = json.Unmarshal(got.Arguments, &a)
		_ = json.Unmarshal(want.Arguments, &b)
		if fmt.Sprint(a) != fmt.Sprint(b) || got.Content != want.Content || !got.Error || !got.Downgraded ||
			got.Ms != 3 || got.StateHash != want.StateHash || !got.CreatedAt.Equal(want.CreatedAt) {
			t.Fatalf("read back %+v, want %+v", got, want)
		}
	})
}

// TestCallsInsertMatchesBun: the journal NewCalls builds writes batches of one and of many exactly as bun's
// multi-row INSERT (InsertCalls) writes them, column for column (on SQLite this is the prepared-statement
// path), and a batch with a bad call writes none of it.
func TestCallsInsertMatchesBun(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		sessions := seedSessions(t, db, 2)
		w, err := NewCalls(db, CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		mk := func(session string, seq int64, id string) schema.Call {
			c := call(session, seq)
			c.ID, c.Error, c.Downgraded, c.Ms = id, seq%2 == 0, seq%3 == 0, seq
			c.Content = fmt.Sprintf(`{"n": %d, "quote": "it's"}`, seq)
			c.CreatedAt = time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC).Add(time.Duration(seq-1) * 10 * time.Microsecond)
			return c
		}
		// Reference rows in session 0, written by bun; the same values in session 1, written by the journal.
		var ref, got []schema.Call
		for seq := int64(1); seq <= 4; seq++ {
			ref = append(ref, mk(sessions[0], seq, fmt.Sprintf("call_ref%d", seq)))
			got = append(got, mk(sessions[1], seq, fmt.Sprintf("call_got%d", seq)))
		}
		if err := InsertCalls(ctx, db, ref); err != nil {
			t.Fatal(err)
		}
		for _, batch := range [][]schema.Call{got[:1], got[1:]} {
			if err := w.commit(batch); err != nil {
				t.Fatal(err)
			}
		}
		row := func(id string) []string {
			var cols []string
			rows, err := db.QueryContext(ctx, `SELECT session_id = ?, seq, tool, arguments, content, error, fidelity, rung,
				downgraded, ms, requestor, state_hash, created_at FROM calls WHERE id = ?`, sessions[0], id)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			if !rows.Next() {
				t.Fatalf("no row %s", id)
			}
			vals := make([]any, 13)
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				cols = append(cols, fmt.Sprintf("%T %v", v, v))
			}
			return cols
		}
		for i := range ref {
			r, g := row(ref[i].ID), row(got[i].ID)
			r[0] = g[0] // session_id differs on purpose
			if fmt.Sprint(r) != fmt.Sprint(g) {
				t.Errorf("seq %d: journal wrote\n%v\nbun wrote\n%v", i+1, g, r)
			}
		}

		bad := []schema.Call{mk(sessions[1], 10, "call_bad1"), mk(sessions[1], 11, "call_bad2"), mk(sessions[1], 12, "call_bad3")}
		bad[1].Arguments = nil
		if err := w.commit(bad); err == nil {
			t.Fatal("a batch with a call without arguments committed")
		}
		n, err := db.NewSelect().Model((*schema.Call)(nil)).Where("seq >= 10").Count(ctx)
		if err != nil || n != 0 {
			t.Fatalf("after the failed batch: %d rows with seq ≥ 10 (err %v), want 0", n, err)
		}
	})
}

// TestLeadersCommitEverything: submitters whose contexts cannot end lead the commits themselves, two batches at
// a time (Workers 2) on PostgreSQL, one on SQLite; every record commits once, in batches no larger than MaxBatch.
func TestLeadersCommitEverything(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		workers := 2
		if db.Dialect().Name().String() == "sqlite" {
			workers = 1
		}
		sessions := seedSessions(t, db, 8)
		w, err := New(Options[schema.Call]{DB: db, Insert: InsertCalls, Direct: true, MaxBatch: 8, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		const n = 400
		errs := make(chan error, n)
		for i := range n {
			go func() {
				errs <- w.Submit(context.WithoutCancel(context.Background()), call(sessions[i%8], int64(i/8+1)))
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if got := countCalls(t, db); got != n {
			t.Fatalf("%d calls committed, want %d", got, n)
		}
		if st := w.Stats(); st.Items != n || st.MaxBatch > 8 || st.Failed != 0 {
			t.Fatalf("stats = %+v, want %d records in batches of at most 8", st, n)
		}
	})
}

// TestCallsFailedBatchOnOwnConnection: the SQLite journal, on the connection it keeps, rolls a failed batch back
// whole (a foreign-key violation, a duplicate seq), gives up that connection, and commits the next batch on
// another; the pool's limit counts the journal's connection on top of the ones the rest of the process has, until
// Close gives it back.
func TestCallsFailedBatchOnOwnConnection(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	ctx := context.Background()
	sessions := seedSessions(t, db, 2)
	w, err := NewCalls(db, CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ins := w.o.Insert
	pool := db.DB.Stats().MaxOpenConnections
	tests := []struct {
		name  string
		batch []schema.Call
		fails bool
		want  int // calls stored after it
	}{
		{"good batch", []schema.Call{call(sessions[0], 1), call(sessions[1], 1), call(sessions[0], 2)}, false, 3},
		{"unknown session", []schema.Call{call(sessions[0], 3), call("ses_doesnotexist0000", 1), call(sessions[1], 2)}, true, 3},
		{"after a failure", []schema.Call{call(sessions[0], 3), call(sessions[1], 2)}, false, 5},
		{"duplicate seq", []schema.Call{call(sessions[1], 3), call(sessions[1], 3)}, true, 5},
		{"a lone call", []schema.Call{call(sessions[1], 3)}, false, 6},
		{"a lone duplicate", []schema.Call{call(sessions[1], 3)}, true, 6},
		{"last", []schema.Call{call(sessions[0], 4), call(sessions[1], 4)}, false, 8},
	}
	for _, tt := range tests {
		err := ins(ctx, db, tt.batch)
		if (err != nil) != tt.fails {
			t.Fatalf("%s: err = %v, want failure %v", tt.name, err, tt.fails)
		}
		if got := countCalls(t, db); got != tt.want {
			t.Fatalf("%s: %d calls stored, want %d", tt.name, got, tt.want)
		}
		// The journal holds its connection after a batch that committed, and none after one that failed.
		held := 1
		if tt.fails {
			held = 0
		}
		if st := db.DB.Stats(); st.InUse != held || st.MaxOpenConnections != pool+held {
			t.Fatalf("%s: %d connections in use between batches, pool limit %d; want %d and %d", tt.name, st.InUse,
				st.MaxOpenConnections, held, pool+held)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if st := db.DB.Stats(); st.InUse != 0 || st.MaxOpenConnections != pool {
		t.Fatalf("after Close: %d connections in use, pool limit %d; want 0 and %d", st.InUse, st.MaxOpenConnections, pool)
	}
}
