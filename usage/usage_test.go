package usage_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/usage"
)

var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }
func ptr(t time.Time) *time.Time   { return &t }

func TestTaskSecondsRounding(t *testing.T) {
	const idle = time.Hour
	from, to := usage.Bounds(t0, usage.PeriodMonth)
	cases := []struct {
		name string
		span store.SessionSpan
		now  time.Time
		want int64
	}{
		{"closed after 90s exactly", store.SessionSpan{CreatedAt: at(0), ClosedAt: ptr(at(90 * time.Second)), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(2 * time.Hour), 90},
		{"a part second rounds up", store.SessionSpan{CreatedAt: at(0), ClosedAt: ptr(at(90*time.Second + time.Millisecond)), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(2 * time.Hour), 91},
		{"open counts to now", store.SessionSpan{CreatedAt: at(0), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(10 * time.Minute), 600},
		{"expired: billed to its idle deadline, not to when the reaper noticed", store.SessionSpan{CreatedAt: at(0), ClosedAt: ptr(at(idle + 7*time.Minute)), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(3 * time.Hour), 3600},
		{"a later call moves the deadline the row has not caught up with", store.SessionSpan{CreatedAt: at(0), ClosedAt: ptr(at(2 * time.Hour)), ExpiresAt: at(idle), LastUsedAt: at(0), LastCallAt: ptr(at(30 * time.Minute))}, at(3 * time.Hour), 5400},
		{"open but idle past its deadline, not yet reaped", store.SessionSpan{CreatedAt: at(0), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(5 * time.Hour), 3600},
		{"closed before it opened in this period (clock skew)", store.SessionSpan{CreatedAt: at(0), ClosedAt: ptr(at(-time.Second)), ExpiresAt: at(idle), LastUsedAt: at(0)}, at(time.Hour), 0},
	}
	for _, c := range cases {
		if got := usage.TaskSeconds([]store.SessionSpan{c.span}, from, to, c.now, idle); got != c.want {
			t.Errorf("%s: %d seconds, want %d", c.name, got, c.want)
		}
	}

	// A session across the month boundary is billed its part in each month, and the parts sum to the whole.
	end := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	span := store.SessionSpan{CreatedAt: end.Add(-30*time.Second - 500*time.Millisecond), ClosedAt: ptr(end.Add(45 * time.Second)), ExpiresAt: end.Add(idle), LastUsedAt: end.Add(-31 * time.Second)}
	marFrom, marTo := usage.Bounds(span.CreatedAt, usage.PeriodMonth)
	aprFrom, aprTo := usage.Bounds(*span.ClosedAt, usage.PeriodMonth)
	mar := usage.TaskSeconds([]store.SessionSpan{span}, marFrom, marTo, end.Add(time.Hour), idle)
	apr := usage.TaskSeconds([]store.SessionSpan{span}, aprFrom, aprTo, end.Add(time.Hour), idle)
	if mar != 31 || apr != 45 {
		t.Fatalf("across the boundary: March %d, April %d; want 31 and 45", mar, apr)
	}
}

func TestBounds(t *testing.T) {
	s, e := usage.Bounds(time.Date(2026, 12, 31, 23, 59, 59, 0, time.FixedZone("x", -5*3600)), usage.PeriodMonth)
	if s != time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC) || e != time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC) {
		t.Fatalf("month of 2026-12-31 23:59:59 -05:00 = %v – %v, want January 2027 (UTC)", s, e)
	}
	s, e = usage.Bounds(t0, usage.PeriodDay)
	if s != time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC) || e.Sub(s) != 24*time.Hour {
		t.Fatalf("day = %v – %v", s, e)
	}
}

// fixture is a workspace with an environment, on db.
func fixture(t *testing.T, db *bun.DB, name string) (*schema.Workspace, *schema.Environment) {
	t.Helper()
	ctx := context.Background()
	ws, err := store.CreateWorkspace(ctx, db, name)
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	return ws, env
}

// session inserts a session row with the times given, and calls at the offsets given.
func session(t *testing.T, db *bun.DB, ws *schema.Workspace, env *schema.Environment, status string, opened time.Time, closed *time.Time, calls ...time.Time) {
	t.Helper()
	ctx := context.Background()
	s := &schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: env.ID, WorkspaceID: ws.ID, TokenHash: schema.NewID("h"),
		Status: status, CreatedAt: opened, LastUsedAt: opened, ExpiresAt: opened.Add(time.Hour), ClosedAt: closed}
	if _, err := db.NewInsert().Model(s).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		row := schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: s.ID, Seq: int64(i + 1), Tool: "t", Arguments: []byte("{}"),
			Fidelity: schema.FidelityBTwin, CreatedAt: c}
		if _, err := db.NewInsert().Model(&row).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadIsExactFromTheRecords: sessions of known durations, read at a fixed clock, give exact task-minutes,
// calls and open sessions on both databases; another workspace's sessions never count.
func TestReadIsExactFromTheRecords(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws, env := fixture(t, db, "acme")
		other, otherEnv := fixture(t, db, "globex")
		feb := time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC)
		session(t, db, ws, env, schema.SessionClosed, at(0), ptr(at(90*time.Second)), at(10*time.Second), at(20*time.Second))
		session(t, db, ws, env, schema.SessionClosed, at(time.Minute), ptr(at(time.Minute+2500*time.Millisecond)))     // 2.5s → 3
		session(t, db, ws, env, schema.SessionExpired, at(0), ptr(at(2*time.Hour+17*time.Minute)), at(20*time.Minute)) // 1h20m
		session(t, db, ws, env, schema.SessionOpen, at(50*time.Minute), nil, at(55*time.Minute))                       // to now: 10m
		session(t, db, ws, env, schema.SessionClosed, feb, ptr(feb.Add(90*time.Minute)), feb.Add(10*time.Minute), feb.Add(80*time.Minute))
		session(t, db, other, otherEnv, schema.SessionOpen, at(0), nil, at(time.Second))

		src := &usage.Source{DB: db, Plans: usage.Plans{Default: "p", ByName: map[string]usage.Plan{"p": {TaskMinutes: 1000, OpenSessions: 3}}}}
		now := at(time.Hour)
		r, err := src.Read(context.Background(), ws, now)
		if err != nil {
			t.Fatal(err)
		}
		// 90 + 3 + 4800 + 600 + the 30 minutes of February's session that fall in March.
		want := int64(90 + 3 + 4800 + 600 + 1800)
		if r.TaskSeconds != want {
			t.Fatalf("task seconds = %d, want %d", r.TaskSeconds, want)
		}
		tm, _ := r.Meter(usage.MeterTaskMinutes, "")
		calls, _ := r.Meter(usage.MeterToolCalls, "")
		open, _ := r.Meter(usage.MeterOpenSessions, "")
		opened, _ := r.Meter(usage.MeterSessions, "")
		if tm.Used != float64(want)/60 || tm.Limit != 1000 || calls.Used != 5 || open.Used != 1 || open.Limit != 3 || opened.Used != 4 {
			t.Fatalf("meters = %+v", r.Meters)
		}
		if r.Start != time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC) || r.End != time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC) {
			t.Fatalf("period %v – %v", r.Start, r.End)
		}
		// The rule in Go over the rows (SessionSpans) gives what the database computed.
		spans, err := store.SessionSpans(context.Background(), db, ws.ID, r.Start, r.End)
		if err != nil {
			t.Fatal(err)
		}
		if got := usage.TaskSeconds(spans, r.Start, r.End, now, store.DefaultSessionIdle); got != want {
			t.Fatalf("TaskSeconds over the spans = %d, want %d", got, want)
		}
		// Read again: the same figures (nothing is counted by reading).
		again, err := src.Read(context.Background(), ws, now)
		if err != nil || again.TaskSeconds != want {
			t.Fatalf("second read: %v, %v", again, err)
		}
		// The open session ends, another opens and calls: a reader holding a memo of the settled sessions and a
		// fresh one (a restart) read the same.
		if _, err := db.NewUpdate().Model((*schema.Session)(nil)).Set("status = ?", schema.SessionClosed).Set("closed_at = ?", at(70*time.Minute)).
			Where("workspace_id = ? AND status = ?", ws.ID, schema.SessionOpen).Exec(context.Background()); err != nil {
			t.Fatal(err)
		}
		session(t, db, ws, env, schema.SessionOpen, at(80*time.Minute), nil, at(81*time.Minute), at(82*time.Minute))
		for _, later := range []time.Time{at(65 * time.Minute), at(90 * time.Minute), at(3 * time.Hour)} {
			held, err := src.Read(context.Background(), ws, later)
			if err != nil {
				t.Fatal(err)
			}
			fresh, err := (&usage.Source{DB: db, Plans: src.Plans}).Read(context.Background(), ws, later)
			if err != nil {
				t.Fatal(err)
			}
			spans, _ := store.SessionSpans(context.Background(), db, ws.ID, r.Start, r.End)
			oracle := usage.TaskSeconds(spans, r.Start, r.End, later, store.DefaultSessionIdle)
			hc, _ := held.Meter(usage.MeterToolCalls, "")
			fc, _ := fresh.Meter(usage.MeterToolCalls, "")
			if held.TaskSeconds != oracle || fresh.TaskSeconds != oracle || hc.Used != 7 || fc.Used != 7 {
				t.Fatalf("at %v: memo reader %d s %g calls, fresh reader %d s %g calls, the rule %d s (7 calls)", later, held.TaskSeconds, hc.Used, fresh.TaskSeconds, fc.Used, oracle)
			}
		}
	})
}

// TestRacingOpensNeverPassTheQuota: 50 goroutines open sessions at once against a quota of 5; exactly 5 open, on
// both databases, and after two close exactly two more get in.
func TestRacingOpensNeverPassTheQuota(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws, env := fixture(t, db, "acme")
		const racers, quota = 50, 5
		race := func() (ok []string) {
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < racers; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					s := &schema.Session{EnvID: env.ID, ExpiresAt: time.Now().Add(time.Hour)}
					_, err := store.CreateSessionWithin(context.Background(), db, s, quota)
					var over *store.OpenLimitError
					switch {
					case err == nil:
						mu.Lock()
						ok = append(ok, s.ID)
						mu.Unlock()
					case errors.As(err, &over):
						if over.Limit != quota || over.Open < quota {
							t.Errorf("refusal %+v", over)
						}
					default:
						t.Errorf("open: %v", err)
					}
				}()
			}
			close(start)
			wg.Wait()
			return ok
		}
		first := race()
		n, err := store.OpenSessions(context.Background(), db, ws.ID)
		if err != nil || len(first) != quota || n != quota {
			t.Fatalf("%d opens succeeded, %d open (%v); want %d", len(first), n, err, quota)
		}
		for _, id := range first[:2] {
			if _, err := store.EndSession(context.Background(), db, id, schema.SessionClosed); err != nil {
				t.Fatal(err)
			}
		}
		second := race()
		n, _ = store.OpenSessions(context.Background(), db, ws.ID)
		if len(second) != 2 || n != quota {
			t.Fatalf("after two closed: %d more opened, %d open; want 2 and %d", len(second), n, quota)
		}
	})
}
