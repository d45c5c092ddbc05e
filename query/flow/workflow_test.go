package flow

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/workflows"
)

// The workflow's tests script its activities and its child session open; the activities are tested on their own
// (activities_test.go) and with the workflow, end to end, in api's query tests. Histories from before query-v1
// are replayed by TestReplayRecordedHistories.

func newQueryEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	Register(env)
	workflows.Register(env)
	env.RegisterActivity(&Activities{})
	return env
}

var queryIn = query.Input{QueryID: "qry_1", WorkspaceID: "ws_1", KeyID: "key_1", EnvID: "env_1", EnvSlug: "shop",
	Input: "cancel order #W1", Seed: 42, MaxSteps: 4}

var pending = toolplane.PendingOpen{World: toolplane.OpenWorld{SessionID: "ses_1", EnvID: "env_1", Spec: rpc.SessionSpec{Seed: 42}},
	WorkspaceID: "ws_1", EnvSlug: "shop", ActiveBuildID: "bld_1", KeyID: "key_1"}

// expectOpenClose scripts the prepare, the open (checked, opened by the child workflow, recorded) and the close
// every run makes, and records the outcome.
func expectOpenClose(env *testsuite.TestWorkflowEnvironment, prep PreparedQuery, fin *FinishQueryInput) {
	var a *Activities
	env.OnActivity(a.PrepareQuery, mock.Anything, PrepareQueryInput{EnvID: "env_1", Input: queryIn.Input, Model: queryIn.Model}).
		Return(prep, nil).Once()
	env.OnActivity(a.BeginQuerySession, mock.Anything, QueryOpen{WorkspaceID: "ws_1", KeyID: "key_1", EnvSlug: "shop", Seed: 42,
		SeedInstructions: prep.SeedInstructions}).Return(pending, nil).Once()
	world := workflows.SessionOpenResult{TwinAddr: "http://twin", BuildID: "bld_1", Receipts: rpc.Receipts{WorldHash: "sha256:w"}}
	env.OnWorkflow(workflows.SessionOpenWorkflowName, mock.Anything, mock.MatchedBy(func(in workflows.SessionOpenInput) bool {
		return in.SessionID == "ses_1" && in.EnvID == "env_1" && in.Spec.Seed == 42 && in.TwinWait == workflows.DefaultSessionTwinWait
	})).Return(world, nil).Once()
	env.OnActivity(a.RecordQuerySession, mock.Anything, RecordSessionInput{Pending: pending, Opened: toolplane.OpenedWorld{
		TwinAddr: world.TwinAddr, BuildID: world.BuildID, Receipts: world.Receipts}}).
		Return(QueryOpened{SessionID: "ses_1", BuildID: "bld_1", Seeded: false, WorldHash: "sha256:w"}, nil).Once()
	env.OnActivity(a.CloseQuerySession, mock.Anything, "ses_1").Return(nil).Once()
	env.OnActivity(a.FinishQuery, mock.Anything, mock.Anything).Return(func(_ context.Context, in FinishQueryInput) error {
		*fin = in
		return nil
	}).Once()
}

func TestQueryModelLoop(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	// The first turn carries the input and starts the run record; the next continue it by key.
	env.OnActivity(a.AgentTurn, mock.Anything, AgentTurnInput{QueryID: "qry_1", BuildID: "bld_1", Model: "m", Seed: 42, Input: queryIn.Input}).
		Return(AgentTurnResult{RunKey: "run/1", Calls: []llm.ToolCall{{ID: "c1", Name: "get_order_details", Arguments: `{"order_id":"#W1"}`}},
			Usage: llm.Usage{PromptTokens: 100, CompletionTokens: 10}, Ms: 5}, nil).Once()
	env.OnActivity(a.RunQueryTool, mock.Anything, RunToolInput{QueryID: "qry_1", SessionID: "ses_1", RunKey: "run/1", CallID: "c1",
		Tool: "get_order_details", Arguments: `{"order_id":"#W1"}`}).Return(RunToolResult{RunKey: "run/2", Fidelity: "B_twin"}, nil).Once()
	env.OnActivity(a.AgentTurn, mock.Anything, AgentTurnInput{QueryID: "qry_1", BuildID: "bld_1", Model: "m", Seed: 42, Step: 1, RunKey: "run/2"}).
		Return(AgentTurnResult{RunKey: "run/3", Usage: llm.Usage{PromptTokens: 150, CompletionTokens: 5}, Ms: 2}, nil).Once()
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res query.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.NSpans != 2 || res.Trace != nil || res.Fidelity != (query.FidelityCount{High: 1}) ||
		res.Usage != (query.Usage{ModelCalls: 2, PromptTokens: 250, CompletionTokens: 15}) || res.Stopped != "answered" ||
		res.Seed != 42 || res.WorldHash != "sha256:w" || res.Mode != query.ModeModel || res.Steps != 2 {
		t.Fatalf("result = %+v", res)
	}
	// The row gets the trace from the last run record and the final span.
	if fin.Result == nil || fin.RunKey != "run/3" || fin.Final == nil || fin.Final.Kind != "ok" || fin.Final.Label != "final answer" ||
		fin.Final.Dur != "2ms" || fin.Usage.PromptTokens != 250 || fin.SessionID != "ses_1" {
		t.Fatalf("finish = %+v (final %+v)", fin, fin.Final)
	}
	env.AssertExpectations(t)
}

func TestQueryStepLimitClosesTheSession(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	env.OnActivity(a.AgentTurn, mock.Anything, mock.Anything).Return(AgentTurnResult{RunKey: "run/x",
		Calls: []llm.ToolCall{{ID: "c", Name: "list_orders", Arguments: `{}`}}}, nil).Times(queryIn.MaxSteps)
	env.OnActivity(a.RunQueryTool, mock.Anything, mock.Anything).Return(RunToolResult{RunKey: "run/y"}, nil).Times(queryIn.MaxSteps)
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	var res query.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Stopped != "step_limit" || res.Steps != queryIn.MaxSteps || res.NSpans != queryIn.MaxSteps+1 || res.Fidelity.Low != queryIn.MaxSteps || res.Response != "" {
		t.Fatalf("result = %+v", res)
	}
	if fin.RunKey != "run/y" || fin.Final != nil {
		t.Fatalf("finish = %+v", fin)
	}
	env.AssertExpectations(t)
}

func TestQueryModelDownFailsAndRecordsIt(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	env.OnActivity(a.AgentTurn, mock.Anything, mock.Anything).
		Return(AgentTurnResult{}, temporal.NewNonRetryableApplicationError("model m: connection refused", query.KindModelUnavailable, nil)).Once()
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	var appErr *temporal.ApplicationError
	if err := env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != query.KindModelUnavailable {
		t.Fatalf("error = %v", err)
	}
	if fin.Result != nil || fin.ErrorKind != query.KindModelUnavailable || fin.SessionID != "ses_1" {
		t.Fatalf("finish = %+v", fin)
	}
	env.AssertExpectations(t) // the session was closed
}

func TestQueryReplay(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	plan := &ReplayPlan{TraceID: "tau2/m/task-1/trial-0", Score: 0.9, Answer: "Cancelled.",
		Calls: []ReplayCall{{Tool: "get_order_details", Arguments: `{"order_id":"#W1"}`}, {Tool: "cancel_pending_order", Arguments: `{"order_id":"#W1","reason":"no longer needed"}`}}}
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeReplay, Model: "replay", Replay: plan,
		SeedInstructions: "order #W1", SeedDerived: true, DerivedBy: "parser"}, &fin)
	key := ""
	for i, c := range plan.Calls {
		next := []string{"run/1", "run/2"}[i]
		env.OnActivity(a.RunQueryTool, mock.Anything, RunToolInput{QueryID: "qry_1", SessionID: "ses_1", RunKey: key, Tool: c.Tool,
			Arguments: c.Arguments, Replayed: true}).Return(RunToolResult{RunKey: next, Fidelity: []string{"B_twin", "B_inferred"}[i]}, nil).Once()
		key = next
	}
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	var res query.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Response != "Cancelled." || res.ReplayedTrace != plan.TraceID || res.NSpans != 3 || res.Fidelity != (query.FidelityCount{High: 1, Low: 1}) ||
		res.Usage.ModelCalls != 0 || res.SeedNote == nil {
		t.Fatalf("result = %+v", res)
	}
	if fin.RunKey != "run/2" || fin.Final == nil || !fin.Final.Replayed || fin.Final.Detail != "replayed from "+plan.TraceID {
		t.Fatalf("finish = %+v", fin)
	}
	env.AssertExpectations(t)
}

// TestQuerySpecRefusedByTheTwin: a spec the twin refuses in the child open fails the query as invalid input
// naming the field, and nothing is recorded as a session.
func TestQuerySpecRefusedByTheTwin(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	env.OnActivity(a.PrepareQuery, mock.Anything, mock.Anything).Return(PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, nil).Once()
	env.OnActivity(a.BeginQuerySession, mock.Anything, mock.Anything).Return(pending, nil).Once()
	env.OnWorkflow(workflows.SessionOpenWorkflowName, mock.Anything, mock.Anything).Return(workflows.SessionOpenResult{},
		temporal.NewNonRetryableApplicationError("seed_instructions: no table named widgets", activities.ErrTypeSessionSpec, nil)).Once()
	env.OnActivity(a.FinishQuery, mock.Anything, mock.Anything).Return(func(_ context.Context, in FinishQueryInput) error {
		fin = in
		return nil
	}).Once()
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	var appErr *temporal.ApplicationError
	err := env.GetWorkflowError()
	if !errors.As(err, &appErr) || appErr.Type() != query.KindInvalid {
		t.Fatalf("error = %v", err)
	}
	var field string
	if !appErr.HasDetails() || appErr.Details(&field) != nil || field != "body.seed_instructions" {
		t.Fatalf("field = %q", field)
	}
	if fin.ErrorKind != query.KindInvalid || fin.SessionID != "" {
		t.Fatalf("finish = %+v", fin)
	}
	env.AssertExpectations(t)
}

// TestKindsAgreeWithActivities: the query names the session activities' error type it maps (query imports no
// Temporal package, so it repeats the name).
func TestKindsAgreeWithActivities(t *testing.T) {
	if query.KindSessionSpec != activities.ErrTypeSessionSpec {
		t.Fatalf("query.KindSessionSpec %q, activities.ErrTypeSessionSpec %q", query.KindSessionSpec, activities.ErrTypeSessionSpec)
	}
}
