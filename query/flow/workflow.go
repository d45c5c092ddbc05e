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

// queryV1 is the change that made a query's session open a child session-open workflow, its model turns
// heartbeating activities, and its conversation and trace a run record in the blob store passed by key (version
// 1). Histories from before it (DefaultVersion) replay the steps they recorded: the open, the model turns and the
// tool calls as local activities, the conversation and the trace in the workflow's state and result.
const queryV1 = "query-v1"

// Query runs the hosted agent once against a fresh seeded world. It prepares the run (mode, seed instructions,
// the recorded run to replay), opens a session as sessions.open does (checked and recorded by the tool plane, its
// world opened by a child doppel.SessionOpen workflow), runs the agent loop (model → tool calls → twin → model …,
// or the recorded run's calls) under a step limit and a deadline, always closes the session, and records the
// result (or the error) on the query's row, which is where the result is read.
//
// Model turns are activities that heartbeat (a worker lost mid-turn is noticed and the turn retried elsewhere);
// the short steps (prepare, the session's check, record and close, each tool call) are local activities, run by
// the worker that runs the workflow. The conversation and the trace never pass through the history: each step
// reads and writes the run record (runRecord) and the workflow passes its key.
func Query(ctx workflow.Context, in query.Input) (query.Result, error) {
	r := &queryRun{in: in, res: query.Result{ID: in.QueryID, Seed: in.Seed}}
	r.v = workflow.GetVersion(ctx, queryV1, workflow.DefaultVersion, 1)
	if r.in.MaxSteps <= 0 {
		r.in.MaxSteps = query.DefaultMaxSteps
	}
	if r.in.Deadline <= 0 {
		r.in.Deadline = query.DefaultDeadline
	}
	err := r.run(ctx)
	fin := FinishQueryInput{QueryID: in.QueryID, SessionID: r.res.SessionID, Usage: r.res.Usage, RunKey: r.runKey}
	if err == nil {
		fin.Result, fin.Final = &r.res, r.final
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

// queryRun is one run's state. Since queryV1 the trace is in the run record at runKey and the workflow keeps only
// the count of its spans and the final one; before, it kept the trace in res.
type queryRun struct {
	in     query.Input
	res    query.Result
	start  time.Time
	v      workflow.Version
	runKey string
	final  *query.Span
}

func (r *queryRun) run(ctx workflow.Context) error {
	var a *Activities
	r.start = workflow.Now(ctx)
	prep, err := r.prepare(ctx)
	if err != nil {
		return err
	}
	r.res.Mode, r.res.Model, r.res.BuildID = prep.Mode, prep.Model, prep.BuildID
	r.res.Usage = prep.SeedUsage
	opened, err := r.open(ctx, prep)
	if err != nil {
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
	if prep.Mode == query.ModeReplay {
		err = r.replay(ctx, prep.Replay)
	} else {
		err = r.agentLoop(ctx, prep)
	}
	if err != nil {
		return err
	}
	if r.v == workflow.DefaultVersion {
		r.res.NSpans = len(r.res.Trace)
	} else {
		r.res.NSpans++ // the final answer's span
	}
	return nil
}

// overDeadline reports whether the run has used its time.
func (r *queryRun) overDeadline(ctx workflow.Context) bool {
	return workflow.Now(ctx).Sub(r.start) >= r.in.Deadline
}

// left is the run's time left, at least a second.
func (r *queryRun) left(ctx workflow.Context, limit time.Duration) time.Duration {
	return max(min(limit, r.in.Deadline-workflow.Now(ctx).Sub(r.start)), time.Second)
}

// count counts a tool span's fidelity.
func (r *queryRun) count(fidelity string) {
	if query.HighFidelity(fidelity) {
		r.res.Fidelity.High++
	} else {
		r.res.Fidelity.Low++
	}
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
		if _, err := r.call(ctx, "", c.Tool, c.Arguments, true); err != nil {
			return err
		}
		r.res.Steps++
	}
	r.res.Response = plan.Answer
	r.answered(query.Span{Kind: "ok", Label: "final answer", Dur: durText(0, 0), Detail: "replayed from " + plan.TraceID, Replayed: true})
	return nil
}

// answered adds the final answer's span.
func (r *queryRun) answered(sp query.Span) {
	if r.v == workflow.DefaultVersion {
		r.res.Trace = append(r.res.Trace, sp)
		return
	}
	r.final = &sp
}

// Registrar is the part of a worker (or the test environment) that takes workflow registrations.
type Registrar interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// Register registers the query workflow under its explicit name.
func Register(r Registrar) {
	r.RegisterWorkflowWithOptions(Query, workflow.RegisterOptions{Name: QueryWorkflowName})
}
