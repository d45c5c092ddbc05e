package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/schema"
)

// QueryWorkflowName is the registered name of the query workflow; never change it.
const QueryWorkflowName = "doppel.Query"

// QueryWorkflowID is the workflow id of one query.
func QueryWorkflowID(queryID string) string { return "query/" + queryID }

// Defaults of a query's bounds.
const (
	DefaultQueryMaxSteps = 30
	DefaultQueryDeadline = 5 * time.Minute
)

// QueryInput is one query: its id (chosen by the API, its row already written), who asked, the environment, the
// user's input and the world's seed (drawn by the API when the request gave none), and its bounds.
type QueryInput struct {
	QueryID          string
	WorkspaceID      string
	KeyID            string
	EnvID            string
	EnvSlug          string
	Input            string
	SeedInstructions string
	AutoSeed         bool
	Seed             int64
	Model            string
	// MaxSteps bounds model turns (model mode) or replayed calls (replay mode); Deadline bounds the run.
	MaxSteps int
	Deadline time.Duration
}

// Query runs the hosted agent once against a fresh seeded world. Its steps are local activities (run by the worker
// that runs the workflow, recorded as markers in the history): a query with an instant model is a few workflow
// tasks, not a server round trip per step, and each step still shows in the Temporal UI.
//
// It prepares the run (mode, seed instructions, the recorded run to replay), opens a session through the tool
// plane as sessions.open does, runs the agent loop (model → tool calls → twin → model …, or the recorded run's
// calls) under a step limit and a deadline, always closes the session, and records the result (or the error) on
// the query's row. A local activity's input is not recorded in the history, only its result, so the history holds
// each model message and tool answer once (not the conversation once per turn); the step limit bounds it.
func Query(ctx workflow.Context, in QueryInput) (activities.QueryResult, error) {
	r := &queryRun{in: in, res: activities.QueryResult{ID: in.QueryID, Seed: in.Seed}}
	if r.in.MaxSteps <= 0 {
		r.in.MaxSteps = DefaultQueryMaxSteps
	}
	if r.in.Deadline <= 0 {
		r.in.Deadline = DefaultQueryDeadline
	}
	err := r.run(ctx)
	fin := activities.FinishQueryInput{QueryID: in.QueryID, SessionID: r.res.SessionID, Usage: r.res.Usage}
	if err == nil {
		fin.Result = &r.res
	} else {
		fin.Error, fin.ErrorKind = err.Error(), errorType(err)
	}
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var a *activities.Queries
	if ferr := workflow.ExecuteLocalActivity(shortActivity(dctx), a.FinishQuery, fin).Get(dctx, nil); ferr != nil {
		workflow.GetLogger(ctx).Error("record query outcome", "query", in.QueryID, "error", ferr)
		if err == nil {
			err = ferr
		}
	}
	if err != nil {
		return activities.QueryResult{}, err
	}
	return r.res, nil
}

// errorType is an application error's type, or "".
func errorType(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Type()
	}
	return ""
}

func shortActivity(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5, NonRetryableErrorTypes: []string{
			activities.ErrTypeQueryInvalid, activities.ErrTypeQueryNotFound}},
	})
}

type queryRun struct {
	in    QueryInput
	res   activities.QueryResult
	start time.Time
}

func (r *queryRun) run(ctx workflow.Context) error {
	var a *activities.Queries
	r.start = workflow.Now(ctx)
	// Preparing may ask the model for seed instructions (auto_seed): as long as a model turn.
	prepCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 3 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3, NonRetryableErrorTypes: []string{
			activities.ErrTypeQueryInvalid, activities.ErrTypeQueryNotFound}},
	})
	var prep activities.PreparedQuery
	if err := workflow.ExecuteLocalActivity(prepCtx, a.PrepareQuery, activities.PrepareQueryInput{EnvID: r.in.EnvID, Input: r.in.Input,
		SeedInstructions: r.in.SeedInstructions, AutoSeed: r.in.AutoSeed, Model: r.in.Model}).Get(ctx, &prep); err != nil {
		return err
	}
	r.res.Mode, r.res.Model, r.res.BuildID = prep.Mode, prep.Model, prep.BuildID
	r.res.Usage = prep.SeedUsage
	// The open waits for a cold twin as sessions.open does (about two minutes at most).
	openCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 6 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 2, NonRetryableErrorTypes: []string{
			activities.ErrTypeQueryInvalid, activities.ErrTypeQueryNotFound}},
	})
	var opened activities.QueryOpened
	if err := workflow.ExecuteLocalActivity(openCtx, a.OpenQuerySession, activities.QueryOpen{WorkspaceID: r.in.WorkspaceID,
		KeyID: r.in.KeyID, EnvSlug: r.in.EnvSlug, Seed: r.in.Seed, SeedInstructions: prep.SeedInstructions}).Get(ctx, &opened); err != nil {
		return err
	}
	r.res.SessionID, r.res.Seeded, r.res.WorldHash = opened.SessionID, opened.Seeded, opened.WorldHash
	r.res.Pinned, r.res.SeedInstructions, r.res.SeedNote = opened.Pinned, opened.SeedInstructions, opened.Note
	if r.res.Pinned == nil {
		r.res.Pinned = map[string][]string{}
	}
	if prep.SeedDerived && r.res.SeedNote == nil {
		note := fmt.Sprintf("seed instructions derived from the input by the %s", prep.DerivedBy)
		r.res.SeedNote = &note
	}
	if opened.BuildID != "" {
		r.res.BuildID = opened.BuildID
	}
	defer func() {
		// Always close the session, even when the run failed or was cancelled.
		dctx, cancel := workflow.NewDisconnectedContext(ctx)
		defer cancel()
		if err := workflow.ExecuteLocalActivity(shortActivity(dctx), a.CloseQuerySession, opened.SessionID).Get(dctx, nil); err != nil {
			workflow.GetLogger(ctx).Warn("close query session", "session", opened.SessionID, "error", err)
		}
	}()
	var err error
	if prep.Mode == activities.ModeReplay {
		err = r.replay(ctx, prep.Replay)
	} else {
		err = r.agentLoop(ctx, prep)
	}
	if err != nil {
		return err
	}
	r.res.NSpans = len(r.res.Trace)
	return nil
}

// callActivity runs one tool call; a call is journaled by the tool plane, so it is retried only on failures
// that leave nothing applied (the plane answers those as errors before journaling).
func callActivity(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3, InitialInterval: 500 * time.Millisecond},
	})
}

// boundedBy gives a model turn at most limit, and no more than the run's time left (at least a second). It is not
// retried: the model client retries a failing endpoint with backoff itself.
func (r *queryRun) boundedBy(ctx workflow.Context, limit time.Duration) workflow.Context {
	left := r.in.Deadline - workflow.Now(ctx).Sub(r.start)
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: max(min(limit, left), time.Second),
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
}

// overDeadline reports whether the run has used its time.
func (r *queryRun) overDeadline(ctx workflow.Context) bool {
	return workflow.Now(ctx).Sub(r.start) >= r.in.Deadline
}

// toolSpan runs a call and appends its span; it answers the call's answer.
func (r *queryRun) toolSpan(ctx workflow.Context, sessionID, tool, args string, replayed bool) (activities.ToolAnswer, error) {
	var a *activities.Queries
	var ans activities.ToolAnswer
	if err := workflow.ExecuteLocalActivity(callActivity(ctx), a.CallQueryTool, activities.QueryToolCall{SessionID: sessionID, Tool: tool,
		Arguments: args}).Get(ctx, &ans); err != nil {
		return ans, err
	}
	sp := activities.Span{Kind: "tool", Label: tool, Dur: durText(ans.Took, ans.Ms), Detail: args, Result: ans.Content,
		Error: ans.Error || ans.Refused, Fidelity: ans.Fidelity, Rung: ans.Rung, Downgraded: ans.Downgraded, Replayed: replayed}
	r.res.Trace = append(r.res.Trace, sp)
	if HighFidelity(ans.Fidelity) {
		r.res.Fidelity.High++
	} else {
		r.res.Fidelity.Low++
	}
	return ans, nil
}

// HighFidelity says which fidelity labels a query counts as high: answers from code run against the world
// (A_executed), from the world model (B_twin) and recorded answers to the same call (B_replayed). B_inferred
// (the nearest recording adapted) and B_simulated (a model imagined it) are low, as is a call nothing answered.
func HighFidelity(f string) bool {
	switch f {
	case schema.FidelityAExecuted, schema.FidelityBTwin, schema.FidelityBReplayed:
		return true
	}
	return false
}

// durText is a step's time as text, to the microsecond (from took, or ms when took is unknown).
func durText(took time.Duration, ms int64) string {
	if took <= 0 {
		took = time.Duration(ms) * time.Millisecond
	}
	return took.Round(time.Microsecond).String()
}

// replay replays the recorded run's calls against the seeded world and answers its recorded final answer.
func (r *queryRun) replay(ctx workflow.Context, plan *activities.ReplayPlan) error {
	if plan == nil {
		return temporal.NewNonRetryableApplicationError("replay mode without a recorded run", activities.ErrTypeQueryInvalid, nil, "body.input")
	}
	r.res.ReplayedTrace, r.res.ReplayScore = plan.TraceID, plan.Score
	r.res.Stopped = "answered"
	for i, c := range plan.Calls {
		if i >= r.in.MaxSteps {
			r.res.Stopped = "step_limit"
			break
		}
		if r.overDeadline(ctx) {
			r.res.Stopped = "deadline"
			break
		}
		if _, err := r.toolSpan(ctx, r.res.SessionID, c.Tool, c.Arguments, true); err != nil {
			return err
		}
		r.res.Steps++
	}
	r.res.Response = plan.Answer
	r.res.Trace = append(r.res.Trace, activities.Span{Kind: "ok", Label: "final answer", Dur: durText(0, 0),
		Detail: "replayed from " + plan.TraceID, Replayed: true})
	return nil
}

// agentLoop runs model → tool calls → twin → model … until the model answers without calling a tool, the step
// limit or the deadline.
func (r *queryRun) agentLoop(ctx workflow.Context, prep activities.PreparedQuery) error {
	var a *activities.Queries
	var msgs activities.Conversation
	r.res.Stopped = "step_limit"
	for step := 0; step < r.in.MaxSteps; step++ {
		if r.overDeadline(ctx) {
			r.res.Stopped = "deadline"
			break
		}
		var turn activities.ModelTurnResult
		if err := workflow.ExecuteLocalActivity(r.boundedBy(ctx, 3*time.Minute), a.ModelTurn, activities.ModelTurnInput{BuildID: prep.BuildID, Model: prep.Model,
			Input: r.in.Input, Messages: msgs, Seed: r.in.Seed}).Get(ctx, &turn); err != nil {
			return err
		}
		r.res.Steps++
		r.res.Usage.ModelCalls++
		r.res.Usage.PromptTokens += turn.Usage.PromptTokens
		r.res.Usage.CompletionTokens += turn.Usage.CompletionTokens
		msg := turn.Message
		msg.Role = "assistant"
		if len(msg.ToolCalls) == 0 {
			r.res.Response = msg.Content
			r.res.Stopped = "answered"
			r.res.Trace = append(r.res.Trace, activities.Span{Kind: "ok", Label: "final answer", Dur: durText(turn.Took, turn.Ms)})
			return nil
		}
		msgs = append(msgs, msg)
		for i, c := range msg.ToolCalls {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("call_%d_%d", step, i)
				msgs[len(msgs)-1].ToolCalls[i].ID = id
			}
			ans, err := r.toolSpan(ctx, r.res.SessionID, c.Name, c.Arguments, false)
			if err != nil {
				return err
			}
			msgs = msgs.WithTool(id, ans.Content)
		}
	}
	return nil
}

// RegisterQueries registers the query workflow under its explicit name.
func RegisterQueries(r Registrar) {
	r.RegisterWorkflowWithOptions(Query, workflow.RegisterOptions{Name: QueryWorkflowName})
}

// Queries starts query workflows from the API side and waits for their results.
type Queries struct {
	Client    client.Client
	TaskQueue string
}

// StartQuery starts the query's workflow (workflow id query/<id>); starting it again is a no-op.
func (q *Queries) StartQuery(ctx context.Context, in QueryInput) error {
	deadline := in.Deadline
	if deadline <= 0 {
		deadline = DefaultQueryDeadline
	}
	_, err := q.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       QueryWorkflowID(in.QueryID),
		TaskQueue:                q.TaskQueue,
		EnableEagerStart:         true,
		WorkflowExecutionTimeout: deadline + 10*time.Minute, // the open may wait for a cold twin; closing and recording follow
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "query " + in.QueryID + " on " + in.EnvSlug,
	}, QueryWorkflowName, in)
	if err != nil {
		return fmt.Errorf("start query %s: %w", in.QueryID, err)
	}
	return nil
}

// AwaitQuery waits for the query's result until ctx ends.
func (q *Queries) AwaitQuery(ctx context.Context, queryID string) (activities.QueryResult, error) {
	var out activities.QueryResult
	err := q.Client.GetWorkflow(ctx, QueryWorkflowID(queryID), "").Get(ctx, &out)
	return out, err
}
