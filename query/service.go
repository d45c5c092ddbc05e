package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
)

// DefaultWait is how long a query request waits for its result before answering with the id to poll.
const DefaultWait = 60 * time.Second

// Runner runs query workflows (wfclient.Queries does, on Temporal). Await answers once the run ended: nil when it
// succeeded (its result is then on the query's row), a *Failure when it failed, ctx's error when ctx ended first.
type Runner interface {
	Start(ctx context.Context, in Input) error
	Await(ctx context.Context, queryID string) error
}

// Quota meters one-shot queries (usage.Gate is one).
type Quota interface {
	// AdmitQuery answers nil when the workspace may start a query.
	AdmitQuery(ctx context.Context, workspaceID string) error
}

// Service runs and reads one-shot queries: what envs.query and queries.get call. Its refusals are the tool
// plane's (*toolplane.Error), which every transport maps.
type Service struct {
	DB *bun.DB
	// Runner runs the query workflows (nil: queries answer 503).
	Runner Runner
	// Quota, when set, refuses queries past the workspace's plan.
	Quota Quota
	// Model is the configured model's name ("" when none is configured: queries run in replay mode).
	Model string
	// Wait bounds how long a query request waits for its result before answering with the id to poll (0:
	// DefaultWait).
	Wait time.Duration
	// MaxSteps and Deadline bound each query's run (0: the workflow's defaults).
	MaxSteps int
	Deadline time.Duration
	Log      *slog.Logger
}

// Request is one one-shot query.
type Request struct {
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

// Answer is a query: finished (Result set), still running (poll it), or failed (Err set).
type Answer struct {
	ID     string
	Status string
	Seed   int64
	Model  string
	Result *Result
	Usage  Usage
	// Err is why a failed query failed, as the tool plane's refusal.
	Err *toolplane.Error
}

func (s *Service) wait() time.Duration {
	if s.Wait <= 0 {
		return DefaultWait
	}
	return s.Wait
}

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// Run runs a one-shot query: it checks the environment (another workspace's is NotFound), draws the seed when
// none is given, records the query and starts its workflow, then waits up to the query wait for the result. A
// query still running then is answered with its id and status running, to poll with Get.
func (s *Service) Run(ctx context.Context, req Request) (*Answer, error) {
	if strings.TrimSpace(req.Input) == "" {
		return nil, invalid("body.input", "must not be empty")
	}
	if req.Model != "" && req.Model != ReplayModel && s.Model == "" {
		return nil, invalid("body.model", fmt.Sprintf("%q needs a model endpoint and none is configured; use \"replay\" "+
			"(the default without one) to replay the closest recorded run", req.Model))
	}
	env, err := store.GetEnv(ctx, s.DB, req.WorkspaceID, req.Env)
	if err != nil {
		return nil, notFoundOr(err, "environment "+req.Env)
	}
	if env.ActiveBuildID == "" {
		return nil, refusal(toolplane.NotReady, "environment %s has no build yet (status %s)", env.Slug, env.Status)
	}
	if s.Runner == nil {
		return nil, refusal(toolplane.Unavailable, "queries cannot run: no workflow client configured")
	}
	if s.Quota != nil {
		// Before the query's row or workflow exists: a refused query leaves nothing behind.
		if err := s.Quota.AdmitQuery(ctx, env.WorkspaceID); err != nil {
			return nil, err
		}
	}
	seed := toolplane.DrawSeed()
	if req.Seed != nil {
		seed = *req.Seed
	}
	model := req.Model
	if model == "" {
		model = s.Model
		if model == "" {
			model = ReplayModel
		}
	}
	q := &schema.Query{ID: schema.NewID(schema.PrefixQuery), WorkspaceID: env.WorkspaceID, EnvID: env.ID, KeyID: req.KeyID,
		BuildID: env.ActiveBuildID, Input: req.Input, Model: model, Seed: seed}
	if err := store.CreateQuery(ctx, s.DB, q); err != nil {
		return nil, err
	}
	in := Input{QueryID: q.ID, WorkspaceID: env.WorkspaceID, KeyID: req.KeyID, EnvID: env.ID, EnvSlug: env.Slug, BuildID: env.ActiveBuildID,
		Input: req.Input, SeedInstructions: req.SeedInstructions, AutoSeed: req.AutoSeed, Seed: seed, Model: req.Model,
		MaxSteps: s.MaxSteps, Deadline: s.Deadline}
	if err := s.Runner.Start(ctx, in); err != nil {
		_ = store.FinishQuery(context.WithoutCancel(ctx), s.DB, q.ID, store.QueryOutcome{Status: schema.QueryFailed,
			Error: err.Error(), ErrorKind: "StartFailed"})
		return nil, refusal(toolplane.Unavailable, "the query could not be started: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, s.wait())
	defer cancel()
	err = s.Runner.Await(wctx, q.ID)
	switch {
	case err == nil:
		// Its row holds the result.
		done, err := store.GetQuery(ctx, s.DB, env.WorkspaceID, q.ID)
		if err != nil {
			return nil, err
		}
		ans := &Answer{}
		return ans, ans.fill(done)
	case wctx.Err() != nil && ctx.Err() == nil:
		return &Answer{ID: q.ID, Status: schema.QueryRunning, Seed: seed, Model: model}, nil // still running: the caller polls
	}
	return nil, runError(err)
}

// Get reads a workspace's query (another workspace's is NotFound): its result once it succeeded, its error once it
// failed.
func (s *Service) Get(ctx context.Context, workspaceID, id string) (*Answer, error) {
	q, err := store.GetQuery(ctx, s.DB, workspaceID, id)
	if err != nil {
		return nil, notFoundOr(err, "query "+id)
	}
	ans := &Answer{}
	if err := ans.fill(q); err != nil {
		return nil, err
	}
	if q.Status == schema.QueryRunning {
		s.settle(ctx, q, ans)
	}
	return ans, nil
}

// fill makes a the query its row q holds.
func (a *Answer) fill(q *schema.Query) error {
	*a = Answer{ID: q.ID, Status: q.Status, Seed: q.Seed, Model: q.Model,
		Usage: Usage{ModelCalls: q.ModelCalls, PromptTokens: q.PromptTokens, CompletionTokens: q.CompletionTokens}}
	switch q.Status {
	case schema.QuerySucceeded:
		var r Result
		if err := json.Unmarshal(q.Result, &r); err != nil {
			return fmt.Errorf("query %s: decode result: %w", q.ID, err)
		}
		a.Result = &r
	case schema.QueryFailed:
		a.Err = errorOfKind(q.ErrorKind, "", q.Error)
	}
	return nil
}

// settleWait is how long a read of a running query asks its workflow whether it ended.
const settleWait = 100 * time.Millisecond

// settle asks a running query's workflow whether it has in fact ended: one that succeeded is read again, and one
// that ended without recording its outcome (timed out, terminated) is recorded as failed, so a poll does not
// answer running forever.
func (s *Service) settle(ctx context.Context, q *schema.Query, ans *Answer) {
	if s.Runner == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	err := s.Runner.Await(wctx, q.ID)
	switch {
	case err == nil:
		// It succeeded, so its row holds the result.
		if done, err := store.GetQuery(ctx, s.DB, q.WorkspaceID, q.ID); err == nil && done.Status != schema.QueryRunning {
			_ = ans.fill(done)
		}
		return
	case wctx.Err() != nil:
		return // still running
	}
	ans.Status, ans.Err = schema.QueryFailed, runError(err)
	kind, msg := "WorkflowEnded", err.Error()
	var f *Failure
	if errors.As(err, &f) && f.Kind != "" {
		kind, msg = f.Kind, f.Message
	}
	if ferr := store.FinishQuery(context.WithoutCancel(ctx), s.DB, q.ID, store.QueryOutcome{Status: schema.QueryFailed,
		SessionID: q.SessionID, Error: msg, ErrorKind: kind}); ferr != nil {
		s.log().Warn("record an ended query", "query", q.ID, "error", ferr)
	}
}

// runError maps a failed query run to a refusal: bad input is Invalid naming the field, a gone environment
// NotFound, a model endpoint that is down or refused BadGateway, the rest Unavailable.
func runError(err error) *toolplane.Error {
	var f *Failure
	if !errors.As(err, &f) {
		return refusal(toolplane.Unavailable, "the query failed: %v", err)
	}
	if f.Timeout {
		return refusal(toolplane.Unavailable, "the query did not finish in time: %v", err)
	}
	return errorOfKind(f.Kind, f.Field, f.Message)
}

func errorOfKind(kind, field, msg string) *toolplane.Error {
	switch kind {
	case KindInvalid:
		if field == "" {
			field = "body"
		}
		return invalid(field, strings.TrimPrefix(msg, field+": "))
	case KindNotFound:
		return refusal(toolplane.NotFound, "%s", msg)
	case KindModelUnavailable:
		return refusal(toolplane.BadGateway, "the model endpoint is not answering: %s", msg)
	case KindModelFailed:
		return refusal(toolplane.BadGateway, "the model endpoint refused or gave no usable answer: %s", msg)
	case KindSessionSpec:
		return invalid("body.seed_instructions", msg)
	}
	return refusal(toolplane.Unavailable, "the query failed: %s", msg)
}

func refusal(k toolplane.Kind, format string, args ...any) *toolplane.Error {
	return &toolplane.Error{Kind: k, Detail: fmt.Sprintf(format, args...)}
}

func invalid(field, detail string) *toolplane.Error {
	return &toolplane.Error{Kind: toolplane.Invalid, Field: field, Detail: detail}
}

// notFoundOr turns store.ErrNotFound into a NotFound naming what; other errors pass unchanged.
func notFoundOr(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return refusal(toolplane.NotFound, "%s not found", what)
	}
	return err
}
