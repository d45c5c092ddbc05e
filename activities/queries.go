package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/agent"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
)

// QuerySessions opens, calls and closes a query's session through the tool plane, the path sessions.open and
// sessions.call take (toolplane.QuerySessions is it).
type QuerySessions interface {
	OpenQuerySession(ctx context.Context, in QueryOpen) (QueryOpened, error)
	CallQuerySession(ctx context.Context, in QueryToolCall) (ToolAnswer, error)
	CloseQuerySession(ctx context.Context, sessionID string) error
}

// BundleSource reads a build's bundle (toolplane.Bundles is one).
type BundleSource interface {
	Get(ctx context.Context, build *schema.Build) (*twin.Bundle, error)
}

// ChatModel is the model endpoint the hosted agent runs on (llm.Client is one).
type ChatModel interface {
	Chat(ctx context.Context, r llm.ChatRequest) (llm.ChatResponse, error)
	Model() string
}

// Queries holds the dependencies of the query activities: the hosted agent's model turns, its tool calls
// through the tool plane, and the queries rows.
type Queries struct {
	DB       *bun.DB
	Sessions QuerySessions
	Bundles  BundleSource
	// Model is the configured model endpoint; nil: queries run in replay mode only.
	Model ChatModel
	Log   *slog.Logger

	mu      sync.Mutex
	indexes map[string]*agent.Index // build id → its runs' index
}

func (q *Queries) log() *slog.Logger {
	if q.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return q.Log
}

func queryInvalid(field, msg string) error {
	return temporal.NewNonRetryableApplicationError(field+": "+msg, ErrTypeQueryInvalid, nil, field)
}

// bundleOf reads the build's bundle.
func (q *Queries) bundleOf(ctx context.Context, buildID string) (*twin.Bundle, error) {
	b, err := store.GetBuildByID(ctx, q.DB, buildID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, temporal.NewNonRetryableApplicationError("build "+buildID+" not found", ErrTypeQueryNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	return q.Bundles.Get(ctx, b)
}

// PrepareQuery decides how a query runs: replay mode when it asks for model "replay" or names none and no model
// is configured, else the model; the seed instructions (derived from the input when auto_seed asks and none are
// given); in replay mode, the recorded run closest to the input.
func (q *Queries) PrepareQuery(ctx context.Context, in PrepareQueryInput) (PreparedQuery, error) {
	env, err := store.GetEnvByID(ctx, q.DB, in.EnvID)
	if errors.Is(err, store.ErrNotFound) {
		return PreparedQuery{}, temporal.NewNonRetryableApplicationError("environment "+in.EnvID+" not found", ErrTypeQueryNotFound, err)
	}
	if err != nil {
		return PreparedQuery{}, err
	}
	if env.ActiveBuildID == "" {
		return PreparedQuery{}, temporal.NewNonRetryableApplicationError("environment "+env.Slug+" has no build yet", ErrTypeQueryNotFound, nil)
	}
	bundle, err := q.bundleOf(ctx, env.ActiveBuildID)
	if err != nil {
		return PreparedQuery{}, err
	}
	p := PreparedQuery{BuildID: env.ActiveBuildID, SeedInstructions: in.SeedInstructions}
	switch {
	case in.Model == ReplayModel || (in.Model == "" && q.Model == nil):
		p.Mode, p.Model = ModeReplay, ReplayModel
	case q.Model == nil:
		return p, queryInvalid("body.model", fmt.Sprintf("%q needs a model endpoint and none is configured (model.base_url); "+
			"use \"replay\" to replay the closest recorded run", in.Model))
	default:
		p.Mode, p.Model = ModeModel, in.Model
		if p.Model == "" {
			p.Model = q.Model.Model()
		}
		if !bundle.Agent.HasAgent() {
			return p, queryInvalid("body.model", "the traces show no agent to run (no system prompt, or no tool calls); "+
				"use \"replay\" to replay the closest recorded run")
		}
	}
	if strings.TrimSpace(p.SeedInstructions) == "" && in.AutoSeed {
		p.SeedInstructions = agent.DeriveSeed(in.Input, bundle.Tables)
		p.SeedDerived, p.DerivedBy = p.SeedInstructions != "", "parser"
		if !p.SeedDerived && q.Model != nil {
			if err := q.modelSeed(ctx, in, bundle, &p); err != nil {
				return p, err
			}
		}
	}
	if p.Mode == ModeReplay {
		var runs []twin.AgentRun
		if bundle.Agent != nil {
			runs = bundle.Agent.Runs
		}
		m, ok := q.index(p.BuildID, runs).Best(in.Input)
		if !ok {
			return p, queryInvalid("body.input", "replay mode found no recorded run whose first user message shares a word with the input")
		}
		run := runs[m.Run]
		rp := &ReplayPlan{TraceID: run.TraceID, Score: m.Score, Answer: run.Answer}
		for _, c := range run.Calls {
			rp.Calls = append(rp.Calls, ReplayCall{Tool: c.Tool, Arguments: c.Arguments})
		}
		p.Replay = rp
	}
	return p, nil
}

// modelSeed asks the model for seed instructions when the parser found nothing the input names: the world's
// entities (name, key field, a few keys) and the input go in, one line of plain instructions (or NONE) comes out.
// The twin turns them into rows (with its parser, or the model when they need it) and the receipts keep them, so
// the query can be run again with exactly these instructions.
func (q *Queries) modelSeed(ctx context.Context, in PrepareQueryInput, bundle *twin.Bundle, p *PreparedQuery) error {
	var ents strings.Builder
	for _, t := range bundle.Tables {
		fmt.Fprintf(&ents, "- %s (key %s", t.Name, t.Key)
		for i, r := range t.Rows {
			if i == 3 {
				break
			}
			fmt.Fprintf(&ents, ", e.g. %s", r.Key)
		}
		ents.WriteString(")\n")
	}
	sys := "You write seed instructions for a simulated world an agent will run against, so that the world holds what " +
		"the user's message is about. Answer with one line of plain instructions in forms such as \"order #W0000001 " +
		"with status pending\", \"2 orders for user jane_doe_1234 with status delivered\" or \"user with email a@b.c\" " +
		"(clauses separated by \";\"), naming only these entities:\n" + ents.String() +
		"Answer NONE when the message names nothing the world should hold."
	model := p.Model
	if p.Mode == ModeReplay {
		model = q.Model.Model() // replay mode runs no model for the agent; the seeding may still ask the configured one
	}
	seed := int64(0)
	res, err := q.Model.Chat(ctx, llm.ChatRequest{Model: model, Seed: &seed, MaxTokens: 200, Messages: []llm.ChatMessage{
		{Role: "system", Content: sys}, {Role: "user", Content: in.Input}}})
	if err != nil {
		return modelError(model, err)
	}
	p.SeedUsage = QueryUsage{ModelCalls: 1, PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens}
	line := strings.TrimSpace(strings.SplitN(strings.TrimSpace(res.Message.Content), "\n", 2)[0])
	if line == "" || strings.EqualFold(strings.Trim(line, ". "), "none") {
		return nil
	}
	p.SeedInstructions, p.SeedDerived, p.DerivedBy = line, true, "model"
	return nil
}

// modelError types a model failure for the workflow: unavailable (down, slow, 5xx after retries) or failed.
func modelError(model string, err error) error {
	if errors.Is(err, llm.ErrUnavailable) {
		return temporal.NewNonRetryableApplicationError("model "+model+": "+err.Error(), ErrTypeModelUnavailable, err)
	}
	return temporal.NewNonRetryableApplicationError("model "+model+": "+err.Error(), ErrTypeModelFailed, err)
}

// index is the build's runs' index, made once per build.
func (q *Queries) index(buildID string, runs []twin.AgentRun) *agent.Index {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ix, ok := q.indexes[buildID]; ok {
		return ix
	}
	if q.indexes == nil || len(q.indexes) >= 64 {
		q.indexes = map[string]*agent.Index{}
	}
	ix := agent.NewIndex(runs)
	q.indexes[buildID] = ix
	return ix
}

// OpenQuerySession opens the query's seeded session through the tool plane.
func (q *Queries) OpenQuerySession(ctx context.Context, in QueryOpen) (QueryOpened, error) {
	return q.Sessions.OpenQuerySession(ctx, in)
}

// CallQueryTool runs one of the agent's tool calls in the query's session.
func (q *Queries) CallQueryTool(ctx context.Context, in QueryToolCall) (ToolAnswer, error) {
	return q.Sessions.CallQuerySession(ctx, in)
}

// CloseQuerySession ends the query's session.
func (q *Queries) CloseQuerySession(ctx context.Context, sessionID string) error {
	return q.Sessions.CloseQuerySession(ctx, sessionID)
}

// ModelTurn asks the model for the agent's next message: the agent's system prompt (learned from the traces),
// the user's input, the conversation so far, and the build's tools. A model endpoint that stays down after the
// client's retries is a non-retryable ErrTypeModelUnavailable; one that refuses is ErrTypeModelFailed.
func (q *Queries) ModelTurn(ctx context.Context, in ModelTurnInput) (ModelTurnResult, error) {
	if q.Model == nil {
		return ModelTurnResult{}, temporal.NewNonRetryableApplicationError("no model endpoint is configured", ErrTypeModelFailed, nil)
	}
	bundle, err := q.bundleOf(ctx, in.BuildID)
	if err != nil {
		return ModelTurnResult{}, err
	}
	msgs := make([]llm.ChatMessage, 0, len(in.Messages)+2)
	if bundle.Agent != nil && bundle.Agent.SystemPrompt != "" {
		msgs = append(msgs, llm.ChatMessage{Role: "system", Content: bundle.Agent.SystemPrompt})
	}
	msgs = append(msgs, llm.ChatMessage{Role: "user", Content: in.Input})
	msgs = append(msgs, in.Messages...)
	tools := make([]llm.Tool, 0, len(bundle.Tools))
	for _, t := range bundle.Tools {
		params := t.InputSchema
		if len(params) == 0 {
			params = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, llm.Tool{Type: "function", Function: llm.ToolFunction{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	seed := in.Seed
	started := time.Now()
	res, err := q.Model.Chat(ctx, llm.ChatRequest{Model: in.Model, Messages: msgs, Tools: tools, Seed: &seed})
	if err != nil {
		q.log().Warn("query model turn", "model", in.Model, "error", err)
		return ModelTurnResult{}, modelError(in.Model, err)
	}
	took := time.Since(started)
	return ModelTurnResult{Message: res.Message, Model: res.Model, Usage: res.Usage, Ms: took.Milliseconds(), Took: took}, nil
}

// FinishQuery records the query's outcome on its row.
func (q *Queries) FinishQuery(ctx context.Context, in FinishQueryInput) error {
	o := store.QueryOutcome{SessionID: in.SessionID, Error: in.Error, ErrorKind: in.ErrorKind,
		ModelCalls: in.Usage.ModelCalls, PromptTokens: in.Usage.PromptTokens, CompletionTokens: in.Usage.CompletionTokens}
	o.Status = schema.QueryFailed
	if in.Result != nil {
		data, err := MarshalResult(in.Result)
		if err != nil {
			return err
		}
		o.Status, o.Result = schema.QuerySucceeded, data
	}
	return store.FinishQuery(ctx, q.DB, in.QueryID, o)
}
