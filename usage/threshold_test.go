package usage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/usage"
)

// sinkRecord is one threshold a sink was told of.
type sinkRecord struct {
	meter   string
	percent int
	used    float64
}

// recordingSink keeps what it is told; failNext makes its next call fail (the gate must offer it again).
type recordingSink struct {
	got      []sinkRecord
	failNext bool
}

func (s *recordingSink) Threshold(_ context.Context, _ *schema.Workspace, _ *usage.Reading, m usage.Value, percent int) error {
	if s.failNext {
		s.failNext = false
		return errors.New("database down")
	}
	s.got = append(s.got, sinkRecord{m.Name, percent, m.Used})
	return nil
}

// The gate tells its sink when a period meter reaches 80% and 100% of its limit: each threshold once, again after a
// failed attempt, never for a meter without a limit (usage.threshold events, issue 17).
func TestGateReportsThresholds(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws, env := fixture(t, db, "acme")
		clock := at(time.Hour)
		sink := &recordingSink{}
		g := &usage.Gate{Source: &usage.Source{DB: db, Plans: usage.Plans{Default: "p", ByName: map[string]usage.Plan{"p": {ToolCalls: 10}}}},
			Now: func() time.Time { return clock }, Thresholds: sink}
		ctx := context.Background()
		// Sessions still open (as a live workspace's are): the source memoizes sessions that ended a while ago.
		calls := func(n int) []time.Time {
			ts := make([]time.Time, n)
			for i := range ts {
				ts[i] = at(59*time.Minute + time.Duration(i)*time.Second)
			}
			return ts
		}
		session(t, db, ws, env, schema.SessionOpen, at(58*time.Minute), nil, calls(7)...)
		if err := g.AdmitCall(ctx, ws.ID); err != nil {
			t.Fatal(err)
		}
		if len(sink.got) != 0 {
			t.Fatalf("7 of 10 calls reported %v", sink.got)
		}
		session(t, db, ws, env, schema.SessionOpen, at(58*time.Minute), nil, calls(1)...) // 8 of 10: 80%
		sink.failNext = true
		g.Forget(ws.ID)
		_ = g.AdmitCall(ctx, ws.ID) // the sink fails: not taken
		g.Forget(ws.ID)
		_ = g.AdmitCall(ctx, ws.ID)
		g.Forget(ws.ID)
		_ = g.AdmitCall(ctx, ws.ID) // already taken: not offered again
		if len(sink.got) != 1 || sink.got[0] != (sinkRecord{usage.MeterToolCalls, 80, 8}) {
			t.Fatalf("at 8 of 10 calls the sink got %v, want tool_calls 80%% once", sink.got)
		}
		session(t, db, ws, env, schema.SessionOpen, at(58*time.Minute), nil, calls(2)...) // 10 of 10
		g.Forget(ws.ID)
		if err := g.AdmitCall(ctx, ws.ID); err == nil {
			t.Fatal("a call past the limit was admitted")
		}
		if len(sink.got) != 2 || sink.got[1] != (sinkRecord{usage.MeterToolCalls, 100, 10}) {
			t.Fatalf("at 10 of 10 calls the sink got %v, want tool_calls 100%% next", sink.got)
		}
		for _, r := range sink.got {
			if r.meter != usage.MeterToolCalls {
				t.Errorf("a meter without a limit was reported: %v", r)
			}
		}
	})
}
