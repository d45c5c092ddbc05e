package store_test

import (
	"errors"
	"reflect"
	"sort"
	"testing"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

func stagedSpan(env, trace, span, conv string) schema.StagedSpan {
	return schema.StagedSpan{EnvID: env, TraceID: trace, SpanID: span, ConversationID: conv, Bytes: 10, Span: []byte(`{"trace_id":"` + trace + `"}`)}
}

// TestStageSpans: a span is staged once however often it is sent; pending spans and the spans sharing a trace or
// a conversation with them are found; marking clears pending on the named spans only.
func TestStageSpans(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "agent")
		if err != nil {
			t.Fatal(err)
		}
		first := []schema.StagedSpan{stagedSpan(env.ID, "t1", "a", "conv"), stagedSpan(env.ID, "t1", "b", ""), stagedSpan(env.ID, "t1", "b", "")}
		n, err := store.StageSpans(ctx, db, first)
		if err != nil || n != 2 {
			t.Fatalf("StageSpans = %d, %v; want 2 (one given twice)", n, err)
		}
		if n, err := store.StageSpans(ctx, db, first); err != nil || n != 0 {
			t.Fatalf("resend: %d, %v; want 0", n, err)
		}
		if err := store.MarkSpansAssembled(ctx, db, env.ID, []store.SpanKey{{"t1", "a"}, {"t1", "b"}}); err != nil {
			t.Fatal(err)
		}
		if ids, err := store.EnvsWithPendingSpans(ctx, db); err != nil || len(ids) != 0 {
			t.Fatalf("pending envs after marking: %v, %v", ids, err)
		}
		// A later turn of the conversation, in another trace, and an unrelated trace.
		if _, err := store.StageSpans(ctx, db, []schema.StagedSpan{stagedSpan(env.ID, "t2", "c", "conv"), stagedSpan(env.ID, "t2", "d", ""),
			stagedSpan(env.ID, "t3", "e", "")}); err != nil {
			t.Fatal(err)
		}
		ids, err := store.EnvsWithPendingSpans(ctx, db)
		if err != nil || !reflect.DeepEqual(ids, []string{env.ID}) {
			t.Fatalf("pending envs: %v, %v", ids, err)
		}
		refs, err := store.PendingSpanClosure(ctx, db, env.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range refs {
			p := "-"
			if r.Pending {
				p = "+"
			}
			got = append(got, r.TraceID+"/"+r.SpanID+p)
		}
		sort.Strings(got)
		// a and b belong to the conversation c continues: they come with it, not pending.
		if want := []string{"t1/a-", "t1/b-", "t2/c+", "t2/d+", "t3/e+"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("closure %v, want %v", got, want)
		}
		rows, err := store.StagedSpans(ctx, db, env.ID, []store.SpanKey{{"t2", "d"}, {"t1", "a"}})
		if err != nil || len(rows) != 2 || rows[0].SpanID != "a" || string(rows[1].Span) != `{"trace_id":"t2"}` || rows[0].ConversationID != "conv" {
			t.Fatalf("StagedSpans = %+v, %v", rows, err)
		}
		if b, err := store.StagedBytes(ctx, db, env.ID); err != nil || b != 30 {
			t.Fatalf("staged bytes %d, %v; want 30", b, err)
		}
		if _, err := store.StageSpans(ctx, db, []schema.StagedSpan{{EnvID: env.ID, TraceID: "t"}}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("span without id: %v", err)
		}
	})
}

// TestInsertTraceVersions: a trace assembled again replaces its row's batch without counting it twice.
func TestInsertTraceVersions(t *testing.T) {
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ws := mustWorkspace(t, db, "acme")
		env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "agent")
		if err != nil {
			t.Fatal(err)
		}
		b1 := &schema.TraceBatch{EnvID: env.ID, BlobKey: "k1", Bytes: 100}
		r1, err := store.InsertTraceVersions(ctx, db, b1, []string{"x", "y"})
		if err != nil || len(r1.Inserted) != 2 || len(r1.Replaced) != 0 || r1.Env.NTraces != 2 || r1.Env.CollectedBytes != 100 {
			t.Fatalf("first = %+v, %v", r1, err)
		}
		b2 := &schema.TraceBatch{EnvID: env.ID, BlobKey: "k2", Bytes: 50}
		r2, err := store.InsertTraceVersions(ctx, db, b2, []string{"z", "y"})
		if err != nil || !reflect.DeepEqual(r2.Inserted, []string{"z"}) || !reflect.DeepEqual(r2.Replaced, []string{"y"}) ||
			r2.Env.NTraces != 3 || r2.Env.CollectedBytes != 150 || b2.NTraces != 2 {
			t.Fatalf("second = %+v, %v", r2, err)
		}
		traces, err := store.ListTraces(ctx, db, env.ID)
		if err != nil {
			t.Fatal(err)
		}
		owner := map[string]string{}
		for _, tr := range traces {
			owner[tr.TraceID] = tr.BatchID + "#" + string(rune('0'+tr.Idx))
		}
		want := map[string]string{"x": b1.ID + "#0", "y": b2.ID + "#1", "z": b2.ID + "#0"}
		if !reflect.DeepEqual(owner, want) {
			t.Fatalf("owners %v, want %v", owner, want)
		}
		if n, _ := store.CountTraces(ctx, db, env.ID); n != 3 {
			t.Errorf("count %d", n)
		}
		if ids, err := store.EnvsNeedingBuild(ctx, db); err != nil || !reflect.DeepEqual(ids, []string{env.ID}) {
			t.Errorf("needing build %v, %v", ids, err)
		}
		if _, err := store.InsertTraceVersions(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: "k3"}, []string{"a", "a"}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("an id twice: %v", err)
		}

		if err := store.SetEnvInputs(ctx, db, env.ID, "", "inputs/1"); err != nil {
			t.Fatal(err)
		}
		if err := store.SetEnvInputs(ctx, db, env.ID, "", "inputs/2"); !errors.Is(err, store.ErrConflict) {
			t.Errorf("stale inputs: %v", err)
		}
		if got, _ := store.GetEnvByID(ctx, db, env.ID); got.InputsKey != "inputs/1" {
			t.Errorf("inputs %q", got.InputsKey)
		}
	})
}
