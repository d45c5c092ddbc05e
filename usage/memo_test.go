package usage_test

import (
	"context"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/usage"
)

// TestMemoEqualsRecount: two readers of one database (two API processes), each keeping its memo of the settled
// records as the clock moves its watermark forward, read exactly what summing every record afresh gives, after
// each step of a period: sessions ending across the watermark, calls and sessions journaled by the other process,
// and records committed late with times behind now but within SettleAfter, on both databases.
func TestMemoEqualsRecount(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		ws, env := fixture(t, db, "acme")
		other, otherEnv := fixture(t, db, "globex")
		plans := usage.Plans{Default: "p", ByName: map[string]usage.Plan{"p": {ToolCalls: 1 << 40}}}
		here, there := &usage.Source{DB: db, Plans: plans}, &usage.Source{DB: db, Plans: plans}
		now := t0
		from, to := usage.Bounds(now, usage.PeriodMonth)
		seed(t, db, ws, env, from, now.Add(-2*time.Hour), 300)
		seed(t, db, other, otherEnv, from, now, 50)
		var open []string // the open sessions' ids, oldest first
		openIDs := func() {
			open = open[:0]
			rows, err := db.NewSelect().Model((*schema.Session)(nil)).Column("id").Where("workspace_id = ? AND status = ?", ws.ID, schema.SessionOpen).
				Order("created_at ASC", "id ASC").Rows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				open = append(open, id)
			}
		}
		end := func(id string, at time.Time) {
			if _, err := db.NewUpdate().Model((*schema.Session)(nil)).Set("status = ?", schema.SessionClosed).Set("closed_at = ?", at).
				Where("id = ?", id).Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		call := func(id string, seq int64, at time.Time) {
			row := schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: id, Seq: seq, Tool: "t", Arguments: []byte("{}"),
				Fidelity: schema.FidelityBTwin, CreatedAt: at}
			if _, err := db.NewInsert().Model(&row).Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		steps := []struct {
			name    string
			advance time.Duration
			do      func(now time.Time)
		}{
			{"first readings make the memos", 0, func(time.Time) {}},
			{"the open sessions call", 20 * time.Second, func(now time.Time) {
				for i, id := range open {
					call(id, int64(100+i), now.Add(-time.Second))
				}
			}},
			{"one ends, the watermark moves past its end", 2 * time.Minute, func(now time.Time) { end(open[0], now.Add(-110*time.Second)) }},
			{"one ends a moment ago", 5 * time.Second, func(now time.Time) { end(open[1], now.Add(-time.Second)) }},
			{"the other process opens and calls", 30 * time.Second, func(now time.Time) {
				session(t, db, ws, env, schema.SessionOpen, now.Add(-20*time.Second), nil, now.Add(-15*time.Second), now.Add(-5*time.Second))
			}},
			{"late commits: a session ended and one opened and closed behind now, within the margin", 10 * time.Second, func(now time.Time) {
				end(open[2], now.Add(-50*time.Second))
				session(t, db, ws, env, schema.SessionClosed, now.Add(-55*time.Second), ptr(now.Add(-45*time.Second)), now.Add(-50*time.Second))
			}},
			{"late calls behind now, within the margin, of an open session", 15 * time.Second, func(now time.Time) {
				call(open[3], 900, now.Add(-55*time.Second))
				call(open[3], 901, now.Add(-40*time.Second))
			}},
			{"the watermark moves past all of it", 3 * time.Minute, func(time.Time) {}},
			{"idle sessions pass their deadline unreaped", 2 * time.Hour, func(time.Time) {}},
			{"the reaper expires them", time.Minute, func(now time.Time) {
				for _, id := range open {
					end(id, now.Add(-time.Second))
				}
			}},
			{"long after", 10 * time.Hour, func(time.Time) {}},
		}
		var counted []int64
		for _, st := range steps {
			now = now.Add(st.advance)
			openIDs()
			st.do(now)
			spans, err := store.SessionSpans(ctx, db, ws.ID, from, to)
			if err != nil {
				t.Fatal(err)
			}
			var calls int64
			for _, s := range spans {
				calls += s.CallsInRange
			}
			opened, err := store.SessionsOpenedIn(ctx, db, ws.ID, from, to)
			if err != nil {
				t.Fatal(err)
			}
			counted = append(counted, calls)
			seconds := usage.TaskSeconds(spans, from, to, now, store.DefaultSessionIdle)
			for _, src := range []struct {
				name string
				s    *usage.Source
			}{{"this process", here}, {"the other process", there}, {"a restarted process", &usage.Source{DB: db, Plans: plans}}} {
				r, err := src.s.Read(ctx, ws, now)
				if err != nil {
					t.Fatal(err)
				}
				c, _ := r.Meter(usage.MeterToolCalls, "")
				o, _ := r.Meter(usage.MeterSessions, "")
				if r.TaskSeconds != seconds || int64(c.Used) != calls || int64(o.Used) != opened {
					t.Fatalf("%s, %s: %d s, %g calls, %g sessions; the records say %d s, %d calls, %d sessions",
						st.name, src.name, r.TaskSeconds, c.Used, o.Used, seconds, calls, opened)
				}
			}
		}
		if first, last := counted[0], counted[len(counted)-1]; last <= first {
			t.Fatalf("the steps journaled nothing: %d calls before, %d after", first, last)
		}
	})
}
