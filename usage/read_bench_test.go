package usage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/usage"
)

// seed journals n sessions of three calls each, opened across [from, now) (one in ten expired after two hours,
// the rest closed within ten minutes), and 64 open sessions: the records a busy workspace's period holds.
func seed(tb testing.TB, db *bun.DB, ws *schema.Workspace, env *schema.Environment, from, now time.Time, n int) {
	tb.Helper()
	ctx := context.Background()
	span := now.Sub(from)
	const batch = 500
	for lo := 0; lo < n+64; lo += batch {
		var sessions []schema.Session
		var calls []schema.Call
		for i := lo; i < min(lo+batch, n+64); i++ {
			opened := from.Add(time.Duration(int64(span) / int64(n) * int64(i%n)))
			s := schema.Session{ID: schema.NewID(schema.PrefixSession), EnvID: env.ID, WorkspaceID: ws.ID, TokenHash: schema.NewID("h"),
				Status: schema.SessionClosed, CreatedAt: opened, LastUsedAt: opened, ExpiresAt: opened.Add(time.Hour),
				ClosedAt: new(opened.Add(time.Duration(i%600) * time.Second))}
			switch {
			case i >= n:
				s.Status, s.ClosedAt, s.CreatedAt = schema.SessionOpen, nil, now.Add(-time.Minute)
			case i%10 == 0:
				s.Status, s.ClosedAt = schema.SessionExpired, new(opened.Add(2*time.Hour))
			}
			sessions = append(sessions, s)
			for k := 1; k <= 3; k++ {
				calls = append(calls, schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: s.ID, Seq: int64(k), Tool: "t",
					Arguments: []byte("{}"), Fidelity: schema.FidelityBTwin, CreatedAt: s.CreatedAt.Add(time.Duration(k) * time.Second)})
			}
		}
		if _, err := db.NewInsert().Model(&sessions).Exec(ctx); err != nil {
			tb.Fatal(err)
		}
		if _, err := db.NewInsert().Model(&calls).Exec(ctx); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkSourceRead: one Source.Read of a workspace with N sessions (3N calls) in the period. warm: as the gate
// reads it every usage.refresh while calls flow, its memos made, the clock moving a second a read; cold: the first
// reading of a process (a new Source each time).
func BenchmarkSourceRead(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, c := range []struct {
			n    int
			cold bool
		}{{10000, false}, {50000, false}, {50000, true}} {
			name := fmt.Sprintf("%s/sessions=%d/warm", driver, c.n)
			if c.cold {
				name = fmt.Sprintf("%s/sessions=%d/cold", driver, c.n)
			}
			n := c.n
			b.Run(name, func(b *testing.B) {
				db := schematest.Open(b, driver)
				ctx := context.Background()
				ws, err := store.CreateWorkspace(ctx, db, "acme")
				if err != nil {
					b.Fatal(err)
				}
				env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
				if err != nil {
					b.Fatal(err)
				}
				now := time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC)
				from, _ := usage.Bounds(now, usage.PeriodMonth)
				seed(b, db, ws, env, from, now, n)
				src := &usage.Source{DB: db, Plans: usage.Plans{Default: "p", ByName: map[string]usage.Plan{"p": {ToolCalls: 1 << 40}}}}
				if _, err := src.Read(ctx, ws, now); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := range b.N {
					if c.cold {
						src = &usage.Source{DB: db, Plans: src.Plans}
					}
					if _, err := src.Read(ctx, ws, now.Add(time.Duration(i+1)*time.Second)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
