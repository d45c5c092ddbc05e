package flow

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

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
)

// Plane is the tool plane as a query uses it: sessions opened, called and closed as sessions.open, sessions.call
// and sessions.close do (*toolplane.Plane is it).
type Plane interface {
	Open(ctx context.Context, req toolplane.OpenRequest) (*toolplane.Opened, error)
	BeginOpen(ctx context.Context, req toolplane.OpenRequest) (*toolplane.PendingOpen, error)
	FinishOpen(ctx context.Context, pend *toolplane.PendingOpen, res toolplane.OpenedWorld) (*toolplane.Opened, error)
	Call(ctx context.Context, s *schema.Session, req toolplane.CallRequest) (*toolplane.CallResult, error)
	Close(ctx context.Context, s *schema.Session) (bool, error)
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

// Activities holds the dependencies of the query activities: the hosted agent's model turns, its tool calls
// through the tool plane, and the queries rows.
type Activities struct {
	DB *bun.DB
	// Plane opens, calls and closes the query's session.
	Plane   Plane
	Bundles BundleSource
	// Blobs keeps the run records of queries (their conversations and traces).
	Blobs activities.BlobStore
	// Model is the configured model endpoint; nil: queries run in replay mode only.
	Model ChatModel
	Log   *slog.Logger

	mu      sync.Mutex
	indexes map[string]*query.Index // build id → its runs' index
}

func (q *Activities) log() *slog.Logger {
	if q.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return q.Log
}

func queryInvalid(field, msg string) error {
	return temporal.NewNonRetryableApplicationError(field+": "+msg, query.KindInvalid, nil, field)
}

// bundleOf reads the build's bundle.
func (q *Activities) bundleOf(ctx context.Context, buildID string) (*twin.Bundle, error) {
	b, err := store.GetBuildByID(ctx, q.DB, buildID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, temporal.NewNonRetryableApplicationError("build "+buildID+" not found", query.KindNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	return q.Bundles.Get(ctx, b)
}

// PrepareQuery decides how a query runs: replay mode when it asks for model "replay" or names none and no model
// is configured, else the model; the seed instructions (derived from the input when auto_seed asks and none are
// given); in replay mode, the recorded run closest to the input.
func (q *Activities) PrepareQuery(ctx context.Context, in PrepareQueryInput) (PreparedQuery, error) {
	stop := activities.Heartbeat(ctx, turnHeartbeat) // it may ask the model for seed instructions
	defer stop()
	env, err := store.GetEnvByID(ctx, q.DB, in.EnvID)
	if errors.Is(err, store.ErrNotFound) {
		return PreparedQuery{}, temporal.NewNonRetryableApplicationError("environment "+in.EnvID+" not found", query.KindNotFound, err)
	}
	if err != nil {
		return PreparedQuery{}, err
	}
	if env.ActiveBuildID == "" {
		return PreparedQuery{}, temporal.NewNonRetryableApplicationError("environment "+env.Slug+" has no build yet", query.KindNotFound, nil)
	}
	bundle, err := q.bundleOf(ctx, env.ActiveBuildID)
	if err != nil {
		return PreparedQuery{}, err
	}
	p := PreparedQuery{BuildID: env.ActiveBuildID, SeedInstructions: in.SeedInstructions}
	switch {
	case in.Model == query.ReplayModel || (in.Model == "" && q.Model == nil):
		p.Mode, p.Model = query.ModeReplay, query.ReplayModel
	case q.Model == nil:
		return p, queryInvalid("body.model", fmt.Sprintf("%q needs a model endpoint and none is configured (model.base_url); "+
			"use \"replay\" to replay the closest recorded run", in.Model))
	default:
		p.Mode, p.Model = query.ModeModel, in.Model
		if p.Model == "" {
			p.Model = q.Model.Model()
		}
		if !bundle.Agent.HasAgent() {
			return p, queryInvalid("body.model", "the traces show no agent to run (no system prompt, or no tool calls); "+
				"use \"replay\" to replay the closest recorded run")
		}
	}
	if strings.TrimSpace(p.SeedInstructions) == "" && in.AutoSeed {
		p.SeedInstructions = query.DeriveSeed(in.Input, bundle.Tables)
		p.SeedDerived, p.DerivedBy = p.SeedInstructions != "", "parser"
		if !p.SeedDerived && q.Model != nil {
			if err := q.modelSeed(ctx, in, bundle, &p); err != nil {
				return p, err
			}
		}
	}
	if p.Mode == query.ModeReplay {
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
func (q *Activities) modelSeed(ctx context.Context, in PrepareQueryInput, bundle *twin.Bundle, p *PreparedQuery) error {
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
	if p.Mode == query.ModeReplay {
		model = q.Model.Model() // replay mode runs no model for the agent; the seeding may still ask the configured one
	}
	seed := int64(0)
	res, err := q.Model.Chat(ctx, llm.ChatRequest{Model: model, Seed: &seed, MaxTokens: 200, Messages: []llm.ChatMessage{
		{Role: "system", Content: sys}, {Role: "user", Content: in.Input}}})
	if err != nil {
		return modelError(model, err)
	}
	p.SeedUsage = query.Usage{ModelCalls: 1, PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens}
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
		return temporal.NewNonRetryableApplicationError("model "+model+": "+err.Error(), query.KindModelUnavailable, err)
	}
	return temporal.NewNonRetryableApplicationError("model "+model+": "+err.Error(), query.KindModelFailed, err)
}

// index is the build's runs' index, made once per build.
func (q *Activities) index(buildID string, runs []twin.AgentRun) *query.Index {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ix, ok := q.indexes[buildID]; ok {
		return ix
	}
	if q.indexes == nil || len(q.indexes) >= 64 {
		q.indexes = map[string]*query.Index{}
	}
	ix := query.NewIndex(runs)
	q.indexes[buildID] = ix
	return ix
}

// ModelTurn asks the model for the agent's next message: the agent's system prompt (learned from the traces),
// the user's input, the conversation so far, and the build's tools. A model endpoint that stays down after the
// client's retries is a non-retryable query.KindModelUnavailable; one that refuses is query.KindModelFailed. (The
// step of queries from before the query-v1 change; AgentTurn is today's.)
func (q *Activities) ModelTurn(ctx context.Context, in ModelTurnInput) (ModelTurnResult, error) {
	res, took, err := q.chat(ctx, in.BuildID, in.Model, in.Input, in.Messages, in.Seed)
	if err != nil {
		return ModelTurnResult{}, err
	}
	return ModelTurnResult{Message: res.Message, Model: res.Model, Usage: res.Usage, Ms: took.Milliseconds(), Took: took}, nil
}

// AgentTurn asks the model for the agent's next message, as ModelTurn does, over the conversation in the run
// record at in.RunKey, and stores the record with the message: the calls it asks for, or its final answer. It
// heartbeats while the model thinks, so a worker that dies meanwhile is noticed within the heartbeat timeout and
// the turn is retried elsewhere.
func (q *Activities) AgentTurn(ctx context.Context, in AgentTurnInput) (AgentTurnResult, error) {
	stop := activities.Heartbeat(ctx, turnHeartbeat)
	defer stop()
	rec, err := q.readRun(ctx, in.RunKey)
	if err != nil {
		return AgentTurnResult{}, err
	}
	if in.RunKey == "" {
		rec.Input = in.Input
	}
	res, took, err := q.chat(ctx, in.BuildID, in.Model, rec.Input, rec.Messages, in.Seed)
	if err != nil {
		return AgentTurnResult{}, err
	}
	msg := res.Message
	msg.Role = "assistant"
	out := AgentTurnResult{Usage: res.Usage, Ms: took.Milliseconds(), Took: took}
	if len(msg.ToolCalls) == 0 {
		rec.Response = msg.Content
	} else {
		for i := range msg.ToolCalls {
			if msg.ToolCalls[i].ID == "" {
				msg.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", in.Step, i)
			}
		}
		rec.Messages = append(rec.Messages, msg)
		out.Calls = msg.ToolCalls
	}
	if out.RunKey, err = q.writeRun(ctx, in.QueryID, in.RunKey, rec); err != nil {
		return AgentTurnResult{}, err
	}
	return out, nil
}

// turnHeartbeat is how often a model turn heartbeats; the workflow's heartbeat timeout is a few times it.
const turnHeartbeat = 5 * time.Second

// chat asks the model for the agent's next message after input and the conversation msgs, with the build's agent
// profile and tools; it answers the reply and how long the model took.
func (q *Activities) chat(ctx context.Context, buildID, model, input string, conv []llm.ChatMessage, seed int64) (llm.ChatResponse, time.Duration, error) {
	if q.Model == nil {
		return llm.ChatResponse{}, 0, temporal.NewNonRetryableApplicationError("no model endpoint is configured", query.KindModelFailed, nil)
	}
	bundle, err := q.bundleOf(ctx, buildID)
	if err != nil {
		return llm.ChatResponse{}, 0, err
	}
	msgs := make([]llm.ChatMessage, 0, len(conv)+2)
	if bundle.Agent != nil && bundle.Agent.SystemPrompt != "" {
		msgs = append(msgs, llm.ChatMessage{Role: "system", Content: bundle.Agent.SystemPrompt})
	}
	msgs = append(msgs, llm.ChatMessage{Role: "user", Content: input})
	msgs = append(msgs, conv...)
	tools := make([]llm.Tool, 0, len(bundle.Tools))
	for _, t := range bundle.Tools {
		params := t.InputSchema
		if len(params) == 0 {
			params = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, llm.Tool{Type: "function", Function: llm.ToolFunction{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	started := time.Now()
	res, err := q.Model.Chat(ctx, llm.ChatRequest{Model: model, Messages: msgs, Tools: tools, Seed: &seed})
	if err != nil {
		q.log().Warn("query model turn", "model", model, "error", err)
		return llm.ChatResponse{}, 0, modelError(model, err)
	}
	return res, time.Since(started), nil
}

// FinishQuery records the query's outcome on its row. A result of the query-v1 change gets its trace (and, in
// model mode, its response) from the run record at in.RunKey and in.Final; the run's earlier records are deleted
// once the row holds it.
func (q *Activities) FinishQuery(ctx context.Context, in FinishQueryInput) error {
	o := store.QueryOutcome{SessionID: in.SessionID, Error: in.Error, ErrorKind: in.ErrorKind,
		ModelCalls: in.Usage.ModelCalls, PromptTokens: in.Usage.PromptTokens, CompletionTokens: in.Usage.CompletionTokens}
	o.Status = schema.QueryFailed
	var rec runRecord
	if in.Result != nil {
		res := *in.Result
		if in.Final != nil {
			var err error
			if rec, err = q.readRun(ctx, in.RunKey); err != nil {
				return err
			}
			res.Trace = append(rec.Trace, *in.Final)
			res.NSpans = len(res.Trace)
			if res.Response == "" {
				res.Response = rec.Response
			}
		}
		data, err := json.Marshal(&res)
		if err != nil {
			return err
		}
		o.Status, o.Result = schema.QuerySucceeded, data
	} else if in.RunKey != "" {
		rec, _ = q.readRun(ctx, in.RunKey) // only to find the earlier records
	}
	if err := store.FinishQuery(ctx, q.DB, in.QueryID, o); err != nil {
		return err
	}
	q.dropEarlier(ctx, rec)
	return nil
}
