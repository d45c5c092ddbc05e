package flow

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/workflows"
)

// The steps of a query's run, as each version of the workflow takes them (see queryV1).

// prepare decides how the query runs. It may ask the model for seed instructions (auto_seed without
// instructions): since queryV1 it is then a heartbeating activity, as a model turn is, and otherwise a short local
// activity.
func (r *queryRun) prepare(ctx workflow.Context) (PreparedQuery, error) {
	var a *Activities
	in := PrepareQueryInput{EnvID: r.in.EnvID, Input: r.in.Input, SeedInstructions: r.in.SeedInstructions,
		AutoSeed: r.in.AutoSeed, Model: r.in.Model}
	retry := &temporal.RetryPolicy{MaximumAttempts: 3, NonRetryableErrorTypes: []string{query.KindInvalid, query.KindNotFound}}
	var prep PreparedQuery
	var f workflow.Future
	switch {
	case r.v == workflow.DefaultVersion:
		f = workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: 3 * time.Minute, RetryPolicy: retry}), a.PrepareQuery, in)
	case r.in.AutoSeed && strings.TrimSpace(r.in.SeedInstructions) == "":
		f = workflow.ExecuteActivity(r.modelStep(ctx, "prepare (may ask the model for seed instructions)", retry), a.PrepareQuery, in)
	default:
		f = workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: time.Minute, RetryPolicy: retry}), a.PrepareQuery, in)
	}
	err := f.Get(ctx, &prep)
	return prep, err
}

// modelStep is the options of an activity that waits on the model: bounded by the run's time left (at most three
// minutes), heartbeating, retried when its worker is lost (the model's own failures are final: the model client
// retries a failing endpoint itself).
func (r *queryRun) modelStep(ctx workflow.Context, summary string, retry *temporal.RetryPolicy) workflow.Context {
	left := r.left(ctx, 3*time.Minute)
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout:    left,
		ScheduleToCloseTimeout: left,
		HeartbeatTimeout:       4 * turnHeartbeat,
		Summary:                summary,
		RetryPolicy:            retry,
	})
}

// open opens the query's session as sessions.open does. Since queryV1 the tool plane checks and admits it
// (BeginQuerySession), a child doppel.SessionOpen workflow opens its world (waiting for a cold twin as
// sessions.open does), and the tool plane records it (RecordQuerySession); before, one local activity did all three.
func (r *queryRun) open(ctx workflow.Context, prep PreparedQuery) (QueryOpened, error) {
	var a *Activities
	qo := QueryOpen{WorkspaceID: r.in.WorkspaceID, KeyID: r.in.KeyID, EnvSlug: r.in.EnvSlug, Seed: r.in.Seed,
		SeedInstructions: prep.SeedInstructions}
	var opened QueryOpened
	if r.v == workflow.DefaultVersion {
		// The open waits for a cold twin as sessions.open does (about two minutes at most).
		openCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: 6 * time.Minute,
			RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 2, NonRetryableErrorTypes: []string{
				query.KindInvalid, query.KindNotFound}},
		})
		err := workflow.ExecuteLocalActivity(openCtx, a.OpenQuerySession, qo).Get(ctx, &opened)
		return opened, err
	}
	var pend toolplane.PendingOpen
	if err := workflow.ExecuteLocalActivity(shortActivity(ctx), a.BeginQuerySession, qo).Get(ctx, &pend); err != nil {
		return opened, err
	}
	w := pend.World
	wait := r.in.TwinWait
	if wait <= 0 {
		wait = workflows.DefaultSessionTwinWait
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:               workflows.SessionOpenWorkflowID(w.SessionID),
		WorkflowExecutionTimeout: wait + time.Minute,
		StaticSummary:            "open session " + w.SessionID + " for query " + r.in.QueryID,
		TypedSearchAttributes:    workflows.ChildTags(ctx, pend.ActiveBuildID),
	})
	var world workflows.SessionOpenResult
	if err := workflow.ExecuteChildWorkflow(cctx, workflows.SessionOpenWorkflowName, workflows.SessionOpenInput{
		SessionID: w.SessionID, EnvID: w.EnvID, Spec: w.Spec, TwinWait: wait}).Get(ctx, &world); err != nil {
		return opened, childOpenError(err)
	}
	// Recorded once: a session that cannot be recorded has its world dropped, so it is not recorded again.
	rctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
	err := workflow.ExecuteLocalActivity(rctx, a.RecordQuerySession, RecordSessionInput{Pending: pend, Opened: toolplane.OpenedWorld{
		TwinAddr: world.TwinAddr, BuildID: world.BuildID, Receipts: world.Receipts, StateHash: world.StateHash}}).Get(ctx, &opened)
	return opened, err
}

// childOpenError makes a failed session open the query's failure as sessions.open answers it: a spec the twin
// refused is the query's invalid input naming its field, a gone environment not found; the rest (a twin that never
// came up) pass unchanged.
func childOpenError(err error) error {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		switch appErr.Type() {
		case activities.ErrTypeSessionSpec:
			return activityError(toolplane.SpecRefusal(appErr.Message()))
		case activities.ErrTypeBadInput:
			return activityError(&toolplane.Error{Kind: toolplane.NotFound, Detail: appErr.Message()})
		}
	}
	return err
}

// callActivity runs one tool call; a call is journaled by the tool plane, so it is retried only on failures
// that leave nothing applied (the plane answers those as errors before journaling).
func callActivity(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3, InitialInterval: 500 * time.Millisecond},
	})
}

// call runs a tool call in the query's session and counts its span. Since queryV1 the span (and, for a model's
// call named callID, the tool's answer) goes into the run record; before, into the workflow's trace, the answer
// returned for the conversation.
func (r *queryRun) call(ctx workflow.Context, callID, tool, args string, replayed bool) (ToolAnswer, error) {
	var a *Activities
	var ans ToolAnswer
	if r.v == workflow.DefaultVersion {
		if err := workflow.ExecuteLocalActivity(callActivity(ctx), a.CallQueryTool, QueryToolCall{SessionID: r.res.SessionID,
			Tool: tool, Arguments: args}).Get(ctx, &ans); err != nil {
			return ans, err
		}
		r.res.Trace = append(r.res.Trace, toolSpan(tool, args, ans, replayed))
		r.count(ans.Fidelity)
		return ans, nil
	}
	var res RunToolResult
	if err := workflow.ExecuteLocalActivity(callActivity(ctx), a.RunQueryTool, RunToolInput{QueryID: r.in.QueryID,
		SessionID: r.res.SessionID, RunKey: r.runKey, CallID: callID, Tool: tool, Arguments: args, Replayed: replayed}).Get(ctx, &res); err != nil {
		return ans, err
	}
	r.runKey = res.RunKey
	r.count(res.Fidelity)
	r.res.NSpans++
	return ans, nil
}

// agentLoop runs model → tool calls → twin → model … until the model answers without calling a tool, the step
// limit or the deadline.
func (r *queryRun) agentLoop(ctx workflow.Context, prep PreparedQuery) error {
	if r.v == workflow.DefaultVersion {
		return r.agentLoopV0(ctx, prep)
	}
	var a *Activities
	retry := &temporal.RetryPolicy{InitialInterval: time.Second, MaximumAttempts: 3, NonRetryableErrorTypes: []string{
		query.KindInvalid, query.KindNotFound, query.KindModelUnavailable, query.KindModelFailed}}
	r.res.Stopped = "step_limit"
	for step := 0; step < r.in.MaxSteps; step++ {
		if r.overDeadline(ctx) {
			r.res.Stopped = "deadline"
			break
		}
		in := AgentTurnInput{QueryID: r.in.QueryID, BuildID: prep.BuildID, Model: prep.Model, Seed: r.in.Seed, Step: step, RunKey: r.runKey}
		if r.runKey == "" {
			in.Input = r.in.Input
		}
		var turn AgentTurnResult
		if err := workflow.ExecuteActivity(r.modelStep(ctx, fmt.Sprintf("model turn %d", step+1), retry), a.AgentTurn, in).Get(ctx, &turn); err != nil {
			return err
		}
		r.runKey = turn.RunKey
		r.used(turn.Usage.PromptTokens, turn.Usage.CompletionTokens)
		if len(turn.Calls) == 0 {
			r.res.Stopped = "answered"
			r.answered(query.Span{Kind: "ok", Label: "final answer", Dur: durText(turn.Took, turn.Ms)})
			return nil
		}
		for _, c := range turn.Calls {
			if _, err := r.call(ctx, c.ID, c.Name, c.Arguments, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// agentLoopV0 is the agent loop of histories from before queryV1: model turns as local activities, the
// conversation in the workflow's state and in every turn's input.
func (r *queryRun) agentLoopV0(ctx workflow.Context, prep PreparedQuery) error {
	var a *Activities
	var msgs Conversation
	r.res.Stopped = "step_limit"
	for step := 0; step < r.in.MaxSteps; step++ {
		if r.overDeadline(ctx) {
			r.res.Stopped = "deadline"
			break
		}
		// A model turn gets at most three minutes and the run's time left; it is not retried: the model client
		// retries a failing endpoint with backoff itself.
		tctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: r.left(ctx, 3*time.Minute),
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		var turn ModelTurnResult
		if err := workflow.ExecuteLocalActivity(tctx, a.ModelTurn, ModelTurnInput{BuildID: prep.BuildID, Model: prep.Model,
			Input: r.in.Input, Messages: msgs, Seed: r.in.Seed}).Get(ctx, &turn); err != nil {
			return err
		}
		r.used(turn.Usage.PromptTokens, turn.Usage.CompletionTokens)
		msg := turn.Message
		msg.Role = "assistant"
		if len(msg.ToolCalls) == 0 {
			r.res.Response = msg.Content
			r.res.Stopped = "answered"
			r.answered(query.Span{Kind: "ok", Label: "final answer", Dur: durText(turn.Took, turn.Ms)})
			return nil
		}
		msgs = append(msgs, msg)
		for i, c := range msg.ToolCalls {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("call_%d_%d", step, i)
				msgs[len(msgs)-1].ToolCalls[i].ID = id
			}
			ans, err := r.call(ctx, id, c.Name, c.Arguments, false)
			if err != nil {
				return err
			}
			msgs = msgs.WithTool(id, ans.Content)
		}
	}
	return nil
}

// used counts a model turn and its tokens.
func (r *queryRun) used(prompt, completion int64) {
	r.res.Steps++
	r.res.Usage.ModelCalls++
	r.res.Usage.PromptTokens += prompt
	r.res.Usage.CompletionTokens += completion
}
