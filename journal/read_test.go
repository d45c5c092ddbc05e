package journal

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
)

// TestReadCalls: what the journal wrote reads back per session — in seq order, after a seq and limited, the last
// seq, counts per fidelity label with errors and downgrades, the last call, and the same for several sessions in two
// queries — on both backends.
func TestReadCalls(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		ids := seedSessions(t, db, 3)
		s1, s2, none := ids[0], ids[1], ids[2]
		base := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
		mk := func(s string, seq int64, fid string, isErr, down bool) schema.Call {
			c := call(s, seq)
			c.Fidelity, c.Error, c.Downgraded = fid, isErr, down
			c.StateHash = fmt.Sprintf("sha256:%s-%d", s, seq)
			c.CreatedAt = base.Add(time.Duration(seq) * time.Second)
			return c
		}
		if err := InsertCalls(ctx, db, []schema.Call{
			mk(s1, 1, schema.FidelityBTwin, false, false),
			mk(s2, 1, schema.FidelityBReplayed, true, false),
			mk(s1, 3, schema.FidelityBSimulated, false, true),
			mk(s1, 2, schema.FidelityBTwin, true, false),
		}); err != nil {
			t.Fatal(err)
		}
		calls, err := ListCalls(ctx, db, s1, 0, 0)
		if err != nil || len(calls) != 3 || calls[0].Seq != 1 || calls[2].Seq != 3 {
			t.Fatalf("ListCalls = %+v, %v", calls, err)
		}
		if tail, _ := ListCalls(ctx, db, s1, 1, 1); len(tail) != 1 || tail[0].Seq != 2 {
			t.Errorf("ListCalls(after 1, limit 1) = %+v", tail)
		}
		if seq, _ := LastSeq(ctx, db, s1); seq != 3 {
			t.Errorf("LastSeq = %d, want 3", seq)
		}
		if seq, _ := LastSeq(ctx, db, none); seq != 0 {
			t.Errorf("LastSeq(no calls) = %d, want 0", seq)
		}
		counts, err := CountCalls(ctx, db, s1)
		want := []FidelityCount{{schema.FidelityBSimulated, 1, 0, 1}, {schema.FidelityBTwin, 2, 1, 0}}
		if err != nil || fmt.Sprint(counts) != fmt.Sprint(want) {
			t.Errorf("CountCalls = %+v, %v; want %+v", counts, err, want)
		}
		last, err := LastCall(ctx, db, s1)
		if err != nil || last == nil || last.StateHash != "sha256:"+s1+"-3" || !last.CreatedAt.Equal(base.Add(3*time.Second)) {
			t.Errorf("LastCall = %+v, %v", last, err)
		}
		if last, err := LastCall(ctx, db, none); last != nil || err != nil {
			t.Errorf("LastCall(no calls) = %+v, %v", last, err)
		}
		many, lasts, err := CountSessionsCalls(ctx, db, []string{s1, s2, none})
		if err != nil || len(many) != 3 || len(lasts) != 2 {
			t.Fatalf("CountSessionsCalls = %+v %+v, %v", many, lasts, err)
		}
		for _, l := range lasts {
			if want := map[string]int64{s1: 3, s2: 1}[l.SessionID]; l.StateHash != fmt.Sprintf("sha256:%s-%d", l.SessionID, want) {
				t.Errorf("last call of %s: %+v", l.SessionID, l)
			}
		}
	})
}
