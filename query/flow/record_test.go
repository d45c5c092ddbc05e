package flow_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/internal/replaytest"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/query/flow"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// Recorders of testdata/ histories (see its README): each runs a query on a real Temporal server
// (DOPPEL_TEST_TEMPORAL) with stand-in activities and writes its history as JSON into the file its RECORD_*
// variable names; skipped when it is unset.

// TestReplayRecordedHistories replays the query histories recorded from real runs against today's workflow code.
func TestReplayRecordedHistories(t *testing.T) {
	replaytest.Replay(t, "testdata", func(r worker.WorkflowReplayer) {
		flow.Register(r)
		workflows.Register(r)
	})
}

// recorder is a recording's setup: the output file outVar names (the test is skipped when it is unset), a client
// of the Temporal server at DOPPEL_TEST_TEMPORAL, and a worker with every workflow registered on a fresh task queue
// named from prefix. The client closes with the test.
func recorder(t *testing.T, outVar, prefix string) (out string, c client.Client, queue string, w worker.Worker) {
	t.Helper()
	out = os.Getenv(outVar)
	if out == "" {
		t.Skip(outVar + " not set")
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv("DOPPEL_TEST_TEMPORAL"), Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	queue = prefix + time.Now().Format("150405.000000")
	w = worker.New(c, queue, worker.Options{})
	flow.Register(w)
	workflows.Register(w)
	return out, c, queue, w
}

// registerQueryStandIns registers stand-ins of the query activities that open, call and close like the real ones;
// prepare answers prep (or fails with prepErr).
func registerQueryStandIns(w interface {
	RegisterActivityWithOptions(any, activity.RegisterOptions)
}, prep flow.PreparedQuery, prepErr error) {
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.PrepareQueryInput) (flow.PreparedQuery, error) {
		return prep, prepErr
	}, activity.RegisterOptions{Name: "PrepareQuery"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.QueryOpen) (flow.QueryOpened, error) {
		return flow.QueryOpened{SessionID: "ses_q", BuildID: "bld_record", Seeded: true, WorldHash: "sha256:w",
			Pinned: map[string][]string{"orders": {"#W1"}}, SeedInstructions: in.SeedInstructions}, nil
	}, activity.RegisterOptions{Name: "OpenQuerySession"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.QueryToolCall) (flow.ToolAnswer, error) {
		return flow.ToolAnswer{Content: `{"order_id":"#W1","status":"pending"}`, Fidelity: "B_twin", Rung: "twin", Ms: 1,
			Took: time.Millisecond}, nil
	}, activity.RegisterOptions{Name: "CallQueryTool"})
	w.RegisterActivityWithOptions(func(ctx context.Context, id string) error { return nil }, activity.RegisterOptions{Name: "CloseQuerySession"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.FinishQueryInput) error { return nil }, activity.RegisterOptions{Name: "FinishQuery"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.ModelTurnInput) (flow.ModelTurnResult, error) {
		return flow.ModelTurnResult{Message: llm.ChatMessage{Role: "assistant", Content: "done"}}, nil
	}, activity.RegisterOptions{Name: "ModelTurn"})
	// query-v1's steps, and the child session open's (whose twin refuses seed instructions naming widgets).
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.QueryOpen) (toolplane.PendingOpen, error) {
		return toolplane.PendingOpen{World: toolplane.OpenWorld{SessionID: "ses_q" + time.Now().Format("150405.000"), EnvID: "env_record",
			Spec: rpc.SessionSpec{Seed: in.Seed, SeedInstructions: in.SeedInstructions}}, WorkspaceID: in.WorkspaceID,
			EnvSlug: in.EnvSlug, ActiveBuildID: "bld_record", KeyID: in.KeyID}, nil
	}, activity.RegisterOptions{Name: "BeginQuerySession"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.FindTwinInput) (activities.TwinEndpoint, error) {
		return activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_record", HandleID: "twin-1"}, nil
	}, activity.RegisterOptions{Name: "FindTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
		if strings.Contains(in.Spec.SeedInstructions, "widgets") {
			return activities.OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError("seed_instructions: no table named widgets",
				activities.ErrTypeSessionSpec, nil)
		}
		return activities.OpenOnTwinResult{Receipts: rpc.Receipts{Seed: in.Spec.Seed, WorldHash: "sha256:w", Seeded: true,
			Pinned: map[string][]string{"orders": {"#W1"}}}}, nil
	}, activity.RegisterOptions{Name: "OpenOnTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.RecordSessionInput) (flow.QueryOpened, error) {
		rc := in.Opened.Receipts
		return flow.QueryOpened{SessionID: in.Pending.World.SessionID, BuildID: in.Opened.BuildID, Seeded: rc.Seeded,
			WorldHash: rc.WorldHash, Pinned: rc.Pinned, SeedInstructions: in.Pending.World.Spec.SeedInstructions}, nil
	}, activity.RegisterOptions{Name: "RecordQuerySession"})
	var n atomic.Int32
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.RunToolInput) (flow.RunToolResult, error) {
		return flow.RunToolResult{RunKey: fmt.Sprintf("queries/%s/run/%d", in.QueryID, n.Add(1)), Fidelity: "B_twin"}, nil
	}, activity.RegisterOptions{Name: "RunQueryTool"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in flow.AgentTurnInput) (flow.AgentTurnResult, error) {
		return flow.AgentTurnResult{RunKey: fmt.Sprintf("queries/%s/run/%d", in.QueryID, n.Add(1))}, nil
	}, activity.RegisterOptions{Name: "AgentTurn"})
}

// TestRecordQueryReplayHistory: a query in replay mode replays two recorded calls and answers the recorded answer.
func TestRecordQueryReplayHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_QUERY_REPLAY", "record-query-")
	registerQueryStandIns(w, flow.PreparedQuery{BuildID: "bld_record", Mode: query.ModeReplay, Model: query.ReplayModel,
		SeedInstructions: "order #W1 with status pending", SeedDerived: true, DerivedBy: "parser",
		Replay: &flow.ReplayPlan{TraceID: "tau2/retail/task-1/trial-0", Score: 0.8, Answer: "Cancelled.",
			Calls: []flow.ReplayCall{{Tool: "get_order_details", Arguments: `{"order_id":"#W1"}`},
				{Tool: "cancel_pending_order", Arguments: `{"order_id":"#W1","reason":"no longer needed"}`}}}}, nil)
	runQuery(t, c, w, queue, out, false)
}

// TestRecordQueryInvalidHistory: a query whose preparation refuses it (no recorded run to replay) records the
// error and fails.
func TestRecordQueryInvalidHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_QUERY_INVALID", "record-query-")
	registerQueryStandIns(w, flow.PreparedQuery{}, temporal.NewNonRetryableApplicationError(
		"body.input: replay mode found no recorded run", query.KindInvalid, nil, "body.input"))
	runQuery(t, c, w, queue, out, true)
}

// TestRecordQuerySpecRefusedHistory: the twin refuses the seed instructions in the child session open; the query
// fails as invalid input naming them.
func TestRecordQuerySpecRefusedHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_QUERY_SPEC_REFUSED", "record-query-")
	registerQueryStandIns(w, flow.PreparedQuery{BuildID: "bld_record", Mode: query.ModeModel, Model: "m",
		SeedInstructions: "3 widgets"}, nil)
	runQuery(t, c, w, queue, out, true)
}

func runQuery(t *testing.T, c client.Client, w interface {
	Start() error
	Stop()
}, queue, out string, fails bool) {
	t.Helper()
	ctx := context.Background()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	qid := "qry_record" + time.Now().Format("150405")
	id := wfclient.QueryWorkflowID(qid)
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, flow.QueryWorkflowName,
		query.Input{QueryID: qid, WorkspaceID: "ws_record", KeyID: "key_record", EnvID: "env_record", EnvSlug: "retail",
			Input: "cancel order #W1", AutoSeed: true, Seed: 7, Model: "replay"})
	if err != nil {
		t.Fatal(err)
	}
	var res query.Result
	err = run.Get(ctx, &res)
	if fails != (err != nil) {
		t.Fatalf("query: %+v %v", res, err)
	}
	replaytest.Record(t, c, id, "", out)
}
