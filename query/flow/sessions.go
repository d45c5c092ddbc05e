package flow

import (
	"context"
	"errors"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// OpenQuerySession opens a seeded session as sessions.open does.
func (q *Activities) OpenQuerySession(ctx context.Context, in QueryOpen) (QueryOpened, error) {
	seed := in.Seed
	o, err := q.Plane.Open(ctx, toolplane.OpenRequest{WorkspaceID: in.WorkspaceID, KeyID: in.KeyID, Env: in.EnvSlug, Seed: &seed,
		SeedInstructions: in.SeedInstructions})
	if err != nil {
		return QueryOpened{}, activityError(err)
	}
	rc := o.Receipts
	return QueryOpened{SessionID: o.Session.ID, BuildID: o.Session.BuildID, Seeded: rc.Seeded, WorldHash: rc.WorldHash,
		Pinned: rc.Pinned, SeedInstructions: o.Session.SeedInstructions, Note: rc.Note}, nil
}

// CallQueryTool runs one of the agent's tool calls in the query's session, as sessions.call does (journaled,
// requestor assistant). A tool the twin cannot route or arguments it refuses are answered as a refused call, for
// the agent to read.
func (q *Activities) CallQueryTool(ctx context.Context, in QueryToolCall) (ToolAnswer, error) {
	s, err := store.GetSessionByID(ctx, q.DB, in.SessionID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return ToolAnswer{}, temporal.NewNonRetryableApplicationError("session "+in.SessionID+" not found", query.KindNotFound, err)
		}
		return ToolAnswer{}, err
	}
	args := strings.TrimSpace(in.Arguments)
	if args == "" {
		args = "{}"
	}
	res, err := q.Plane.Call(ctx, s, toolplane.CallRequest{Tool: in.Tool, Arguments: []byte(args), Requestor: "assistant"})
	var pe *toolplane.Error
	if errors.As(err, &pe) && (pe.Kind == toolplane.Invalid || (pe.Kind == toolplane.NotFound && strings.HasPrefix(pe.Detail, "tool "))) {
		return ToolAnswer{Content: "error: " + pe.Error(), Error: true, Refused: true}, nil
	}
	if err != nil {
		return ToolAnswer{}, activityError(err)
	}
	return ToolAnswer{Content: res.Content, Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
		Downgraded: res.Downgraded, Ms: res.Ms, Took: res.Twin + res.Journal}, nil
}

// CloseQuerySession ends the query's session; one already ended is fine.
func (q *Activities) CloseQuerySession(ctx context.Context, sessionID string) error {
	s, err := store.GetSessionByID(ctx, q.DB, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = q.Plane.Close(ctx, s)
	return err
}

// activityError makes a refusal the caller must fix non-retryable (Invalid with its field, NotFound); the rest
// stay retryable.
func activityError(err error) error {
	var pe *toolplane.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Kind {
	case toolplane.Invalid:
		// The open's fields (body.seed_instructions, body.seed) are the query's own.
		return temporal.NewNonRetryableApplicationError(pe.Error(), query.KindInvalid, err, pe.Field)
	case toolplane.NotFound:
		return temporal.NewNonRetryableApplicationError(pe.Detail, query.KindNotFound, err)
	}
	return err
}

// BeginQuerySession checks and admits the query's session as sessions.open does, without opening its world: the
// workflow opens it with a child session-open workflow, then RecordQuerySession records it.
func (q *Activities) BeginQuerySession(ctx context.Context, in QueryOpen) (toolplane.PendingOpen, error) {
	seed := in.Seed
	pend, err := q.Plane.BeginOpen(ctx, toolplane.OpenRequest{WorkspaceID: in.WorkspaceID, KeyID: in.KeyID, Env: in.EnvSlug,
		Seed: &seed, SeedInstructions: in.SeedInstructions})
	if err != nil {
		return toolplane.PendingOpen{}, activityError(err)
	}
	return *pend, nil
}

// RecordQuerySession records the query's session once its world is open (its row, its session.opened event); a
// session that cannot be recorded has its world dropped.
func (q *Activities) RecordQuerySession(ctx context.Context, in RecordSessionInput) (QueryOpened, error) {
	o, err := q.Plane.FinishOpen(ctx, &in.Pending, in.Opened)
	if err != nil {
		return QueryOpened{}, activityError(err)
	}
	rc := o.Receipts
	return QueryOpened{SessionID: o.Session.ID, BuildID: o.Session.BuildID, Seeded: rc.Seeded, WorldHash: rc.WorldHash,
		Pinned: rc.Pinned, SeedInstructions: o.Session.SeedInstructions, Note: rc.Note}, nil
}

// ErrTypeRunNotStored: a tool call ran but its answer could not be stored in the run record; the call is not run
// again (it changed the world), so the query fails.
const ErrTypeRunNotStored = "QueryRunNotStored"

// RunQueryTool runs one of the agent's tool calls in the query's session as CallQueryTool does, and stores its
// span (and, for a model's call, the tool's answer in the conversation) in a new run record. A failure before the
// call is retried; one after it is not, so a call runs once.
func (q *Activities) RunQueryTool(ctx context.Context, in RunToolInput) (RunToolResult, error) {
	rec, err := q.readRun(ctx, in.RunKey)
	if err != nil {
		return RunToolResult{}, err
	}
	ans, err := q.CallQueryTool(ctx, QueryToolCall{SessionID: in.SessionID, Tool: in.Tool, Arguments: in.Arguments})
	if err != nil {
		return RunToolResult{}, err
	}
	rec.Trace = append(rec.Trace, toolSpan(in.Tool, in.Arguments, ans, in.Replayed))
	if in.CallID != "" {
		rec.Messages = append(rec.Messages, llm.ChatMessage{Role: "tool", ToolCallID: in.CallID, Content: ans.Content})
	}
	key, err := q.writeRun(ctx, in.QueryID, in.RunKey, rec)
	if err != nil {
		return RunToolResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeRunNotStored, err)
	}
	return RunToolResult{RunKey: key, Fidelity: ans.Fidelity}, nil
}
