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
)

func newQueryEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	Register(env)
	env.RegisterActivity(&Activities{})
	return env
}

var queryIn = query.Input{QueryID: "qry_1", WorkspaceID: "ws_1", KeyID: "key_1", EnvID: "env_1", EnvSlug: "shop",
	Input: "cancel order #W1", Seed: 42, MaxSteps: 4}

// expectOpenClose scripts the prepare, the open and the close every run makes, and records the outcome.
func expectOpenClose(env *testsuite.TestWorkflowEnvironment, prep PreparedQuery, fin *FinishQueryInput) {
	var a *Activities
	env.OnActivity(a.PrepareQuery, mock.Anything, PrepareQueryInput{EnvID: "env_1", Input: queryIn.Input, Model: queryIn.Model}).
		Return(prep, nil).Once()
	env.OnActivity(a.OpenQuerySession, mock.Anything, QueryOpen{WorkspaceID: "ws_1", KeyID: "key_1", EnvSlug: "shop", Seed: 42,
		SeedInstructions: prep.SeedInstructions}).
		Return(QueryOpened{SessionID: "ses_1", BuildID: "bld_1", Seeded: false, WorldHash: "sha256:w"}, nil).Once()
	env.OnActivity(a.CloseQuerySession, mock.Anything, "ses_1").Return(nil).Once()
	env.OnActivity(a.FinishQuery, mock.Anything, mock.Anything).Return(func(_ context.Context, in FinishQueryInput) error {
		*fin = in
		return nil
	}).Once()
}

func toolTurn(id, name, args string) ModelTurnResult {
	return ModelTurnResult{Message: llm.ChatMessage{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: id, Name: name, Arguments: args}}},
		Usage: llm.Usage{PromptTokens: 100, CompletionTokens: 10}, Ms: 5}
}

func TestQueryModelLoop(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	env.OnActivity(a.ModelTurn, mock.Anything, mock.MatchedBy(func(in ModelTurnInput) bool { return len(in.Messages) == 0 })).
		Return(toolTurn("c1", "get_order_details", `{"order_id":"#W1"}`), nil).Once()
	env.OnActivity(a.CallQueryTool, mock.Anything, QueryToolCall{SessionID: "ses_1", Tool: "get_order_details", Arguments: `{"order_id":"#W1"}`}).
		Return(ToolAnswer{Content: `{"status":"pending"}`, Fidelity: "B_twin", Rung: "twin", Ms: 2}, nil).Once()
	env.OnActivity(a.ModelTurn, mock.Anything, mock.MatchedBy(func(in ModelTurnInput) bool {
		// The second turn sees the tool call and its answer.
		return len(in.Messages) == 2 && in.Messages[1].Role == "tool" && in.Messages[1].ToolCallID == "c1" && in.Messages[1].Content == `{"status":"pending"}`
	})).Return(ModelTurnResult{Message: llm.ChatMessage{Content: "It is pending."}, Usage: llm.Usage{PromptTokens: 150, CompletionTokens: 5}}, nil).Once()
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res query.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Response != "It is pending." || res.NSpans != 2 || res.Trace[0].Kind != "tool" || res.Trace[0].Detail != `{"order_id":"#W1"}` ||
		res.Trace[0].Result != `{"status":"pending"}` || res.Trace[1].Kind != "ok" || res.Trace[1].Label != "final answer" {
		t.Fatalf("result = %+v", res)
	}
	if res.Fidelity != (query.FidelityCount{High: 1}) || res.Usage != (query.Usage{ModelCalls: 2, PromptTokens: 250, CompletionTokens: 15}) ||
		res.Stopped != "answered" || res.Seed != 42 || res.WorldHash != "sha256:w" || res.Mode != query.ModeModel {
		t.Fatalf("result = %+v", res)
	}
	if fin.Result == nil || fin.Result.Response != res.Response || fin.Usage.PromptTokens != 250 || fin.SessionID != "ses_1" {
		t.Fatalf("finish = %+v", fin)
	}
	env.AssertExpectations(t)
}

func TestQueryStepLimitClosesTheSession(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	env.OnActivity(a.ModelTurn, mock.Anything, mock.Anything).Return(toolTurn("", "list_orders", `{}`), nil).Times(queryIn.MaxSteps)
	env.OnActivity(a.CallQueryTool, mock.Anything, mock.Anything).
		Return(ToolAnswer{Content: "error: tool \"list_orders\" not found", Error: true, Refused: true}, nil).Times(queryIn.MaxSteps)
	env.ExecuteWorkflow(QueryWorkflowName, queryIn)
	var res query.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Stopped != "step_limit" || res.Steps != queryIn.MaxSteps || res.NSpans != queryIn.MaxSteps || res.Fidelity.Low != queryIn.MaxSteps || res.Response != "" {
		t.Fatalf("result = %+v", res)
	}
	env.AssertExpectations(t)
}

func TestQueryModelDownFailsAndRecordsIt(t *testing.T) {
	env := newQueryEnv(t)
	var a *Activities
	var fin FinishQueryInput
	expectOpenClose(env, PreparedQuery{BuildID: "bld_1", Mode: query.ModeModel, Model: "m"}, &fin)
	env.OnActivity(a.ModelTurn, mock.Anything, mock.Anything).
		Return(ModelTurnResult{}, temporal.NewNonRetryableApplicationError("model m: connection refused", query.KindModelUnavailable, nil)).Once()
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
	for i, c := range plan.Calls {
		env.OnActivity(a.CallQueryTool, mock.Anything, QueryToolCall{SessionID: "ses_1", Tool: c.Tool, Arguments: c.Arguments}).
			Return(ToolAnswer{Content: "answer", Fidelity: []string{"B_twin", "B_inferred"}[i], Ms: 1}, nil).Once()
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
	for _, s := range res.Trace {
		if !s.Replayed {
			t.Errorf("span %+v not marked replayed", s)
		}
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
