package toolplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/workflows"
)

// DefaultQueryWait is how long a query request waits for its result before answering with the id to poll.
const DefaultQueryWait = 60 * time.Second

// QueryStarter runs query workflows (workflows.Queries does, on Temporal).
type QueryStarter interface {
	StartQuery(ctx context.Context, in workflows.QueryInput) error
	AwaitQuery(ctx context.Context, queryID string) (activities.QueryResult, error)
}

// QueryRequest is one one-shot query.
type QueryRequest struct {
	WorkspaceID string
	KeyID       string
	Env         string // the environment's slug
	Input       string
	// Seed pins the world; nil draws one (here, outside the workflow).
	Seed             *int64
	SeedInstructions string
	AutoSeed         bool
	Model            string
}

// QueryAnswer is a query: finished (Result set), still running (poll it), or failed (Err set).
type QueryAnswer struct {
	ID     string
	Status string
	Seed   int64
	Model  string
	Result *activities.QueryResult
	Usage  activities.QueryUsage
	// Err is why a failed query failed, as the tool plane's refusal.
	Err *Error
}

// Query runs a one-shot query: it checks the environment (another workspace's is NotFound), draws the seed when
// none is given, records the query and starts its workflow, then waits up to the query wait for the result. A
// query still running then is answered with its id and status running, to poll with GetQuery.
func (p *Plane) Query(ctx context.Context, req QueryRequest) (*QueryAnswer, error) {
	if strings.TrimSpace(req.Input) == "" {
		return nil, invalid("body.input", "must not be empty")
	}
	if req.Model != "" && req.Model != activities.ReplayModel && p.queryModel == "" {
		return nil, invalid("body.model", fmt.Sprintf("%q needs a model endpoint and none is configured; use \"replay\" "+
			"(the default without one) to replay the closest recorded run", req.Model))
	}
	env, err := store.GetEnv(ctx, p.db, req.WorkspaceID, req.Env)
	if err != nil {
		return nil, notFoundOr(err, "environment "+req.Env)
	}
	if env.ActiveBuildID == "" {
		return nil, errorf(NotReady, "environment %s has no build yet (status %s)", env.Slug, env.Status)
	}
	if p.queries == nil {
		return nil, errorf(Unavailable, "queries cannot run: no workflow client configured")
	}
	if qq, ok := p.quota.(QueryQuota); ok {
		// Before the query's row or workflow exists: a refused query leaves nothing behind.
		if err := qq.AdmitQuery(ctx, env.WorkspaceID); err != nil {
			return nil, err
		}
	}
	seed := DrawSeed()
	if req.Seed != nil {
		seed = *req.Seed
	}
	model := req.Model
	if model == "" {
		model = p.queryModel
		if model == "" {
			model = activities.ReplayModel
		}
	}
	q := &schema.Query{ID: schema.NewID(schema.PrefixQuery), WorkspaceID: env.WorkspaceID, EnvID: env.ID, KeyID: req.KeyID,
		BuildID: env.ActiveBuildID, Input: req.Input, Model: model, Seed: seed}
	if err := store.CreateQuery(ctx, p.db, q); err != nil {
		return nil, err
	}
	in := workflows.QueryInput{QueryID: q.ID, WorkspaceID: env.WorkspaceID, KeyID: req.KeyID, EnvID: env.ID, EnvSlug: env.Slug,
		Input: req.Input, SeedInstructions: req.SeedInstructions, AutoSeed: req.AutoSeed, Seed: seed, Model: req.Model,
		MaxSteps: p.queryMaxSteps, Deadline: p.queryDeadline}
	if err := p.queries.StartQuery(ctx, in); err != nil {
		_ = store.FinishQuery(context.WithoutCancel(ctx), p.db, q.ID, store.QueryOutcome{Status: schema.QueryFailed,
			Error: err.Error(), ErrorKind: "StartFailed"})
		return nil, errorf(Unavailable, "the query could not be started: %v", err)
	}
	ans := &QueryAnswer{ID: q.ID, Status: schema.QueryRunning, Seed: seed, Model: model}
	wctx, cancel := context.WithTimeout(ctx, p.queryWait)
	defer cancel()
	res, err := p.queries.AwaitQuery(wctx, q.ID)
	switch {
	case err == nil:
		ans.Status, ans.Result, ans.Usage = schema.QuerySucceeded, &res, res.Usage
		return ans, nil
	case wctx.Err() != nil && ctx.Err() == nil:
		return ans, nil // still running: the caller polls
	}
	return nil, queryError(err)
}

// GetQuery reads a workspace's query (another workspace's is NotFound): its result once it succeeded, its error
// once it failed.
func (p *Plane) GetQuery(ctx context.Context, workspaceID, id string) (*QueryAnswer, error) {
	q, err := store.GetQuery(ctx, p.db, workspaceID, id)
	if err != nil {
		return nil, notFoundOr(err, "query "+id)
	}
	ans := &QueryAnswer{ID: q.ID, Status: q.Status, Seed: q.Seed, Model: q.Model,
		Usage: activities.QueryUsage{ModelCalls: q.ModelCalls, PromptTokens: q.PromptTokens, CompletionTokens: q.CompletionTokens}}
	switch q.Status {
	case schema.QuerySucceeded:
		var r activities.QueryResult
		if err := json.Unmarshal(q.Result, &r); err != nil {
			return nil, fmt.Errorf("query %s: decode result: %w", q.ID, err)
		}
		ans.Result = &r
	case schema.QueryFailed:
		ans.Err = errorOfKind(q.ErrorKind, "", q.Error)
	case schema.QueryRunning:
		p.settle(ctx, q, ans)
	}
	return ans, nil
}

// settleWait is how long a read of a running query asks its workflow whether it ended.
const settleWait = 100 * time.Millisecond

// settle asks a running query's workflow whether it has in fact ended: one that ended without recording its
// outcome (timed out, terminated) is recorded as failed, so a poll does not answer running forever.
func (p *Plane) settle(ctx context.Context, q *schema.Query, ans *QueryAnswer) {
	if p.queries == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	res, err := p.queries.AwaitQuery(wctx, q.ID)
	switch {
	case err == nil:
		ans.Status, ans.Result, ans.Usage = schema.QuerySucceeded, &res, res.Usage
	case wctx.Err() != nil:
		// still running
	default:
		var pe *Error
		if !errors.As(queryError(err), &pe) {
			return
		}
		ans.Status, ans.Err = schema.QueryFailed, pe
		kind, msg := "WorkflowEnded", err.Error()
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) {
			kind, msg = appErr.Type(), appErr.Message()
		}
		if ferr := store.FinishQuery(context.WithoutCancel(ctx), p.db, q.ID, store.QueryOutcome{Status: schema.QueryFailed,
			SessionID: q.SessionID, Error: msg, ErrorKind: kind}); ferr != nil {
			p.log.Warn("record an ended query", "query", q.ID, "error", ferr)
		}
	}
}

// queryError maps a failed query workflow to a refusal: bad input is Invalid naming the field, a gone
// environment NotFound, a model endpoint that is down or refused BadGateway, the rest Unavailable.
func queryError(err error) error {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		field := ""
		if appErr.HasDetails() {
			_ = appErr.Details(&field)
		}
		return errorOfKind(appErr.Type(), field, appErr.Message())
	}
	var te *temporal.TimeoutError
	if errors.As(err, &te) {
		return errorf(Unavailable, "the query did not finish in time: %v", err)
	}
	return errorf(Unavailable, "the query failed: %v", err)
}

func errorOfKind(kind, field, msg string) *Error {
	switch kind {
	case activities.ErrTypeQueryInvalid:
		if field == "" {
			field = "body"
		}
		return invalid(field, strings.TrimPrefix(msg, field+": "))
	case activities.ErrTypeQueryNotFound:
		return errorf(NotFound, "%s", msg)
	case activities.ErrTypeModelUnavailable:
		return errorf(BadGateway, "the model endpoint is not answering: %s", msg)
	case activities.ErrTypeModelFailed:
		return errorf(BadGateway, "the model endpoint refused or gave no usable answer: %s", msg)
	case activities.ErrTypeSessionSpec:
		return invalid("body.seed_instructions", msg)
	}
	return errorf(Unavailable, "the query failed: %s", msg)
}

// QuerySessions gives the query activities the tool plane's sessions: the open, call and close every transport
// uses. Refusals the caller can act on are non-retryable application errors.
type QuerySessions struct{ P *Plane }

var _ activities.QuerySessions = QuerySessions{}

// OpenQuerySession opens a seeded session as sessions.open does.
func (qs QuerySessions) OpenQuerySession(ctx context.Context, in activities.QueryOpen) (activities.QueryOpened, error) {
	seed := in.Seed
	o, err := qs.P.Open(ctx, OpenRequest{WorkspaceID: in.WorkspaceID, KeyID: in.KeyID, Env: in.EnvSlug, Seed: &seed,
		SeedInstructions: in.SeedInstructions})
	if err != nil {
		return activities.QueryOpened{}, activityError(err)
	}
	rc := o.Receipts
	return activities.QueryOpened{SessionID: o.Session.ID, BuildID: o.Session.BuildID, Seeded: rc.Seeded, WorldHash: rc.WorldHash,
		Pinned: rc.Pinned, SeedInstructions: o.Session.SeedInstructions, Note: rc.Note}, nil
}

// CallQuerySession runs one call in the session as sessions.call does (journaled, requestor assistant). A tool the
// twin cannot route or arguments it refuses are answered as a refused call, for the agent to read.
func (qs QuerySessions) CallQuerySession(ctx context.Context, in activities.QueryToolCall) (activities.ToolAnswer, error) {
	s, err := store.GetSessionByID(ctx, qs.P.db, in.SessionID)
	if err != nil {
		return activities.ToolAnswer{}, activityError(notFoundOr(err, "session "+in.SessionID))
	}
	args := strings.TrimSpace(in.Arguments)
	if args == "" {
		args = "{}"
	}
	res, err := qs.P.Call(ctx, s, CallRequest{Tool: in.Tool, Arguments: []byte(args), Requestor: "assistant"})
	var pe *Error
	if errors.As(err, &pe) && (pe.Kind == Invalid || (pe.Kind == NotFound && strings.HasPrefix(pe.Detail, "tool "))) {
		return activities.ToolAnswer{Content: "error: " + pe.Error(), Error: true, Refused: true}, nil
	}
	if err != nil {
		return activities.ToolAnswer{}, activityError(err)
	}
	return activities.ToolAnswer{Content: res.Content, Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
		Downgraded: res.Downgraded, Ms: res.Ms, Took: res.Twin + res.Journal}, nil
}

// CloseQuerySession ends the session; one already ended is fine.
func (qs QuerySessions) CloseQuerySession(ctx context.Context, sessionID string) error {
	s, err := store.GetSessionByID(ctx, qs.P.db, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = qs.P.Close(ctx, s)
	return err
}

// activityError makes a refusal the caller must fix non-retryable (Invalid with its field, NotFound); the rest
// stay retryable.
func activityError(err error) error {
	var pe *Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Kind {
	case Invalid:
		// The open's fields (body.seed_instructions, body.seed) are the query's own.
		return temporal.NewNonRetryableApplicationError(pe.Error(), activities.ErrTypeQueryInvalid, err, pe.Field)
	case NotFound:
		return temporal.NewNonRetryableApplicationError(pe.Detail, activities.ErrTypeQueryNotFound, err)
	}
	return err
}
