package flow

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// TestRunRecordFinish: run records chain by key, each step's its own content-addressed object; finishing the
// query puts the record's trace, with the final span, and the model's answer on the row, deletes the earlier
// records and keeps the last; finishing again (a retried activity) records the same outcome.
func TestRunRecordFinish(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	blobs, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	q := &Activities{DB: db, Blobs: blobs}
	ws, err := store.CreateWorkspace(ctx, db, "w")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	row := &schema.Query{ID: schema.NewID(schema.PrefixQuery), WorkspaceID: ws.ID, EnvID: env.ID, Input: "cancel #W1", Model: "m"}
	if err := store.CreateQuery(ctx, db, row); err != nil {
		t.Fatal(err)
	}

	// Three steps, as a model turn and two tool calls write them.
	var keys []string
	rec := runRecord{Input: "cancel #W1"}
	prev := ""
	for i, sp := range []query.Span{{Kind: "tool", Label: "get_order_details", Result: `{"status":"pending"}`, Fidelity: "B_twin"},
		{Kind: "tool", Label: "cancel_pending_order", Result: `{"status":"cancelled"}`, Fidelity: "B_twin"}} {
		rec.Trace = append(rec.Trace, sp)
		rec.Messages = append(rec.Messages, llm.ChatMessage{Role: "tool", ToolCallID: "c" + string(rune('1'+i)), Content: sp.Result})
		if i == 1 {
			rec.Response = "Cancelled."
		}
		key, err := q.writeRun(ctx, row.ID, prev, rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := q.readRun(ctx, key)
		if err != nil || len(got.Trace) != i+1 || len(got.Earlier) != len(keys) {
			t.Fatalf("record %d read back as %+v, %v", i, got, err)
		}
		rec = got
		keys = append(keys, key)
		prev = key
	}
	if keys[0] == keys[1] {
		t.Fatal("two steps share a key")
	}

	final := query.Span{Kind: "ok", Label: "final answer", Dur: "2ms"}
	in := FinishQueryInput{QueryID: row.ID, SessionID: "ses_1", Result: &query.Result{ID: row.ID, Mode: query.ModeModel, NSpans: 3},
		RunKey: prev, Final: &final, Usage: query.Usage{ModelCalls: 2}}
	for attempt := range 2 {
		if err := q.FinishQuery(ctx, in); err != nil {
			t.Fatalf("finish (attempt %d): %v", attempt+1, err)
		}
		got, err := store.GetQuery(ctx, db, ws.ID, row.ID)
		if err != nil || got.Status != schema.QuerySucceeded || got.ModelCalls != 2 {
			t.Fatalf("row: %+v %v", got, err)
		}
		var res query.Result
		if err := json.Unmarshal(got.Result, &res); err != nil {
			t.Fatal(err)
		}
		if res.Response != "Cancelled." || res.NSpans != 3 || len(res.Trace) != 3 || res.Trace[0].Label != "get_order_details" ||
			res.Trace[2] != final {
			t.Fatalf("result (attempt %d) = %+v", attempt+1, res)
		}
	}
	if _, err := blobs.Get(ctx, keys[0]); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("the earlier record is still there: %v", err)
	}
	if _, err := q.readRun(ctx, keys[1]); err != nil {
		t.Errorf("the last record (the query's conversation) is gone: %v", err)
	}
}
