// Package flow is the hosted query's Temporal side: the Query workflow (the agent loop) and its activities.
package flow

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/query"
)

// QueryWorkflowName is the registered name of the query workflow; never change it.
const QueryWorkflowName = "doppel.Query"

// Query runs the hosted agent once against a fresh seeded world. Its steps are local activities (run by the worker
// that runs the workflow, recorded as markers in the history): a query with an instant model is a few workflow
// tasks, not a server round trip per step, and each step still shows in the Temporal UI.
//
// It prepares the run (mode, seed instructions, the recorded run to replay), opens a session through the tool
// plane as sessions.open does, runs the agent loop (model → tool calls → twin → model …, or the recorded run's
// calls) under a step limit and a deadline, always closes the session, and records the result (or the error) on
// the query's row. A local activity's input is not recorded in the history, only its result, so the history holds
// each model message and tool answer once (not the conversation once per turn); the step limit bounds it.
func Query(ctx workflow.Context, in query.Input) (query.Result, error) {
	r := &queryRun{in: in, res: query.Result{ID: in.QueryID, Seed: in.Seed}}
	if r.in.MaxSteps <= 0 {
		r.in.MaxSteps = query.DefaultMaxSteps
	}
	if r.in.Deadline <= 0 {
		r.in.Deadline = query.DefaultDeadline
	}
	err := r.run(ctx)
	fin := FinishQueryInput{QueryID: in.QueryID, SessionID: r.res.SessionID, Usage: r.res.Usage}
	if err == nil {
		fin.Result = &r.res
	} else {
		fin.Error, fin.ErrorKind = err.Error(), errorType(err)
	}
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var a *Activities
	if ferr := workflow.ExecuteLocalActivity(shortActivity(dctx), a.FinishQuery, fin).Get(dctx, nil); ferr != nil {
		workflow.GetLogger(ctx).Error("record query outcome", "query", in.QueryID, "error", ferr)
		if err == nil {
			err = ferr
		}
	}
	if err != nil {
		return query.Result{}, err
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
			query.KindInvalid, query.KindNotFound}},
	})
}

type queryRun struct {
	in    query.Input
	res   query.Result
	start time.Time
}

func (r *queryRun) run(ctx workflow.Context) error {
	var a *Activities
	r.start = workflow.Now(ctx)
	// Preparing may ask the model for seed instructions (auto_seed): as long as a model turn.
	prepCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 3 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3, NonRetryableErrorTypes: []string{
			query.KindInvalid, query.KindNotFound}},
	})
	var prep PreparedQuery
	if err := workflow.ExecuteLocalActivity(prepCtx, a.PrepareQuery, PrepareQueryInput{EnvID: r.in.EnvID, Input: r.in.Input,
		SeedInstructions: r.in.SeedInstructions, AutoSeed: r.in.AutoSeed, Model: r.in.Model}).Get(ctx, &prep); err != nil {
		return err
	}
	r.res.Mode, r.res.Model, r.res.BuildID = prep.Mode, prep.Model, prep.BuildID
	r.res.Usage = prep.SeedUsage
	// The open waits for a cold twin as sessions.open does (about two minutes at most).
	openCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 6 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 2, NonRetryableErrorTypes: []string{
			query.KindInvalid, query.KindNotFound}},
	})
	var opened QueryOpened
	if err := workflow.ExecuteLocalActivity(openCtx, a.OpenQuerySession, QueryOpen{WorkspaceID: r.in.WorkspaceID,
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
	if prep.Mode == query.ModeReplay {
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
func (r *queryRun) toolSpan(ctx workflow.Context, sessionID, tool, args string, replayed bool) (ToolAnswer, error) {
	var a *Activities
	var ans ToolAnswer
	if err := workflow.ExecuteLocalActivity(callActivity(ctx), a.CallQueryTool, QueryToolCall{SessionID: sessionID, Tool: tool,
		Arguments: args}).Get(ctx, &ans); err != nil {
		return ans, err
	}
	sp := query.Span{Kind: "tool", Label: tool, Dur: durText(ans.Took, ans.Ms), Detail: args, Result: ans.Content,
		Error: ans.Error || ans.Refused, Fidelity: ans.Fidelity, Rung: ans.Rung, Downgraded: ans.Downgraded, Replayed: replayed}
	r.res.Trace = append(r.res.Trace, sp)
	if query.HighFidelity(ans.Fidelity) {
		r.res.Fidelity.High++
	} else {
		r.res.Fidelity.Low++
	}
	return ans, nil
}

// durText is a step's time as text, to the microsecond (from took, or ms when took is unknown).
func durText(took time.Duration, ms int64) string {
	if took <= 0 {
		took = time.Duration(ms) * time.Millisecond
	}
	return took.Round(time.Microsecond).String()
}

// replay replays the recorded run's calls against the seeded world and answers its recorded final answer.
func (r *queryRun) replay(ctx workflow.Context, plan *ReplayPlan) error {
	if plan == nil {
		return temporal.NewNonRetryableApplicationError("replay mode without a recorded run", query.KindInvalid, nil, "body.input")
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
	r.res.Trace = append(r.res.Trace, query.Span{Kind: "ok", Label: "final answer", Dur: durText(0, 0),
		Detail: "replayed from " + plan.TraceID, Replayed: true})
	return nil
}

// agentLoop runs model → tool calls → twin → model … until the model answers without calling a tool, the step
// limit or the deadline.
func (r *queryRun) agentLoop(ctx workflow.Context, prep PreparedQuery) error {
	var a *Activities
	var msgs Conversation
	r.res.Stopped = "step_limit"
	for step := 0; step < r.in.MaxSteps; step++ {
		if r.overDeadline(ctx) {
			r.res.Stopped = "deadline"
			break
		}
		var turn ModelTurnResult
		if err := workflow.ExecuteLocalActivity(r.boundedBy(ctx, 3*time.Minute), a.ModelTurn, ModelTurnInput{BuildID: prep.BuildID, Model: prep.Model,
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
			r.res.Trace = append(r.res.Trace, query.Span{Kind: "ok", Label: "final answer", Dur: durText(turn.Took, turn.Ms)})
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

// Registrar is the part of a worker (or the test environment) that takes workflow registrations.
type Registrar interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// Register registers the query workflow under its explicit name.
func Register(r Registrar) {
	r.RegisterWorkflowWithOptions(Query, workflow.RegisterOptions{Name: QueryWorkflowName})
}
