package api

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/schema"
)

// Defaults of the per-workspace query rate limit (query.rate_per_second, query.burst).
const (
	DefaultQueryRatePerSecond = 1.0
	DefaultQueryBurst         = 10
)

// QueryRoutes serve one-shot queries: POST /v1/envs/{slug}/query (envs.query) and GET /v1/queries/{query_id}
// (queries.get). The work is the query service's; these hold I/O types, the rate limit and error mapping.
type QueryRoutes struct {
	Queries *query.Service
	// RatePerSecond and Burst shape each workspace's token bucket of query requests (defaults
	// DefaultQueryRatePerSecond and DefaultQueryBurst); a negative RatePerSecond turns the limit off.
	RatePerSecond float64
	Burst         int

	once    sync.Once
	limiter *keyedLimiter
}

// allow takes a token from the workspace's bucket, or answers how long until one is free.
func (qr *QueryRoutes) allow(workspaceID string) (bool, time.Duration) {
	if qr.RatePerSecond < 0 {
		return true, 0
	}
	qr.once.Do(func() {
		r, b := qr.RatePerSecond, qr.Burst
		if r == 0 {
			r = DefaultQueryRatePerSecond
		}
		if b <= 0 {
			b = DefaultQueryBurst
		}
		qr.limiter = newKeyedLimiter(r, b, nil)
	})
	return qr.limiter.allow(workspaceID)
}

// QueryBody is the body of POST /v1/envs/{slug}/query, in either naming variant.
type QueryBody struct {
	Input             string  `json:"input" minLength:"1" maxLength:"100000" doc:"The user message to run."`
	SeedInstructionsA *string `json:"seed_instructions,omitempty" maxLength:"20000" doc:"Plain-language world-seeding instructions (variant A name). The world is built to satisfy them."`
	SeedInstructions  *string `json:"seedInstructions,omitempty" maxLength:"20000" doc:"The same, variant B name."`
	Seed              *int64  `json:"seed,omitempty" minimum:"0" maximum:"9007199254740991" doc:"World seed. Same seed plus instructions gives a byte-identical world. Omitted: a fresh draw, returned."`
	AutoSeedA         *bool   `json:"auto_seed,omitempty" doc:"Derive seed instructions from what the input names (order ids, e-mail addresses) when none are given; the derived instructions come back in seed_instructions."`
	AutoSeed          *bool   `json:"autoSeed,omitempty" doc:"The same, variant B name."`
	Model             *string `json:"model,omitempty" maxLength:"200" doc:"Model id to run the agent on (default: the configured model). \"replay\" (the default without a configured model) replays the recorded run whose first user message is closest to the input; no model runs."`
}

// QueryInput is POST /v1/envs/{slug}/query.
type QueryInput struct {
	Slug string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	Body QueryBody
}

// QuerySpan is one step of a query's trace.
type QuerySpan struct {
	Kind       string `json:"kind" enum:"tool,ok" doc:"tool: a tool call; ok: the final answer."`
	Label      string `json:"label" doc:"The tool's name, or \"final answer\"."`
	Dur        string `json:"dur" doc:"How long the step took, as text (e.g. 1.2ms)." example:"3ms"`
	Detail     string `json:"detail" doc:"For a tool span, the call's JSON arguments; may be empty."`
	Result     string `json:"result,omitempty" doc:"For a tool span, the tool's answer as the agent saw it."`
	Error      bool   `json:"error,omitempty" doc:"The tool answered with its own error (or could not be routed)."`
	Fidelity   string `json:"fidelity,omitempty" enum:"A_executed,B_twin,B_replayed,B_inferred,B_simulated" doc:"The answer's fidelity label; empty for a call the twin could not run."`
	Rung       string `json:"rung,omitempty" doc:"The rung that answered."`
	Downgraded bool   `json:"downgraded,omitempty"`
	Replayed   bool   `json:"replayed,omitempty" doc:"The step was replayed from a recorded run (replay mode), not decided by a model."`
}

// QueryFidelity counts tool spans by fidelity.
type QueryFidelity struct {
	High int `json:"high" doc:"Spans answered by code, the world model or a recording of the same call (A_executed, B_twin, B_replayed)."`
	Low  int `json:"low" doc:"Spans answered by adapting the nearest recording or by a model (B_inferred, B_simulated), or not answered."`
}

// QueryUsage is what a query's model cost.
type QueryUsage struct {
	ModelCalls       int64 `json:"model_calls" doc:"Model requests."`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// QueryError is why a failed query failed.
type QueryError struct {
	Detail string `json:"detail"`
	Code   string `json:"code"`
	Status int    `json:"status" doc:"The HTTP status the query request would have answered."`
}

// QueryView is a query: its result (spec §2.2) once it finished, its id and status always.
type QueryView struct {
	ID     string `json:"id" example:"qry_0123456789abcdef"`
	Status string `json:"status" enum:"running,succeeded,failed" doc:"running: poll GET /v1/queries/{id}."`
	Poll   string `json:"poll,omitempty" doc:"Where to read the query (GET)."`

	Response          string              `json:"response" doc:"The agent's final answer text."`
	Trace             []QuerySpan         `json:"trace" doc:"Every step in order."`
	NSpans            int                 `json:"n_spans"`
	Fidelity          QueryFidelity       `json:"fidelity"`
	Seed              int64               `json:"seed" doc:"The world seed used, given or drawn."`
	Seeded            bool                `json:"seeded" doc:"Whether seed instructions became rows."`
	WorldHash         string              `json:"world_hash" doc:"sha256: hash of the world at open: the reproducibility receipt."`
	Pinned            map[string][]string `json:"pinned" doc:"Entity name → ids the seed instructions created or fixed."`
	SeedInstructions  string              `json:"seed_instructions" doc:"The effective seed instructions (derived ones with auto_seed)."`
	SeedInstructionsB string              `json:"seedInstructions" doc:"The same, variant B name."`
	SeedNote          *string             `json:"seed_note" doc:"A note about seeding, or null."`

	Mode          string      `json:"mode,omitempty" enum:"model,replay" doc:"model: a model ran the agent; replay: a recorded run was replayed."`
	Model         string      `json:"model" doc:"The model id, or \"replay\"."`
	ReplayedTrace string      `json:"replayed_trace,omitempty" doc:"Replay mode: the recorded trace replayed."`
	ReplayScore   float64     `json:"replay_score,omitempty" doc:"Replay mode: its TF-IDF cosine similarity to the input (0..1)."`
	Steps         int         `json:"steps" doc:"Model turns (model mode) or replayed calls (replay mode)."`
	Stopped       string      `json:"stopped,omitempty" enum:"answered,step_limit,deadline" doc:"Why the run ended."`
	SessionID     string      `json:"session_id,omitempty" doc:"The query's session (closed), readable with sessions.get and sessions.transcript."`
	BuildID       string      `json:"build_id,omitempty"`
	Usage         QueryUsage  `json:"usage"`
	Error         *QueryError `json:"error,omitempty" doc:"Why a failed query failed."`
}

// QueryOutput answers a query: 200 with the result, or 202 while it runs.
type QueryOutput struct {
	Status int
	Body   QueryView
}

// QueryPath names a query.
type QueryPath struct {
	QueryID string `path:"query_id" maxLength:"64" doc:"Query id (qry_…)."`
}

// Register adds the query routes.
func (qr *QueryRoutes) Register(a huma.API, d *Deps) {
	if qr.Queries == nil {
		qr.Queries = &query.Service{DB: d.DB}
	}
	schemaRef := a.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[QueryView](), true, "QueryView")
	Declare(a, Verb[QueryInput, QueryOutput]{
		Name:    "envs.query",
		Method:  http.MethodPost,
		Path:    "/v1/envs/{slug}/query",
		Summary: "Run a one-shot query",
		Description: "Runs the agent once against a fresh seeded world and answers its final response and every " +
			"step. The agent is the one the traces show (its system prompt and tools) on the configured model, or, " +
			"with `model: \"replay\"` (the default when no model is configured), the recorded run whose first user " +
			"message is closest to the input (TF-IDF cosine), its tool calls replayed against the seeded world and " +
			"its recorded final answer returned, every span marked `replayed`. The session is opened as sessions.open " +
			"opens one (same seed and instructions, same `world_hash`) and closed at the end. The query runs as a " +
			"Temporal workflow (id `query/<id>`): the request waits for it up to query.wait (60 s) and otherwise " +
			"answers 202 with the id to poll at GET /v1/queries/{id}. Rate limited per workspace (429 with " +
			"Retry-After). A model endpoint that is down or refuses answers 502.",
		Tags:     []string{"envs"},
		Security: WorkspaceKeyAuth(),
		Status:   http.StatusOK,
		Errors:   []int{http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable},
		Responses: map[string]*huma.Response{
			"202": {Description: "The query is still running: poll `poll`.", Content: map[string]*huma.MediaType{
				"application/json": {Schema: schemaRef},
			}},
		},
		Handler: qr.query,
	})
	Declare(a, Verb[QueryPath, QueryOutput]{
		Name:    "queries.get",
		Method:  http.MethodGet,
		Path:    "/v1/queries/{query_id}",
		Summary: "Show a query",
		Description: "A query's status and, once it finished, its result (as envs.query answered it) or its error. " +
			"Another workspace's query is a 404.",
		Tags:     []string{"envs"},
		Security: WorkspaceKeyAuth(),
		Handler:  qr.get,
	})
}

func (qr *QueryRoutes) query(ctx context.Context, in *QueryInput) (*QueryOutput, error) {
	p := PrincipalFrom(ctx)
	if !p.Workspace.HasEntitlement(schema.EntitlementQuery) {
		return nil, Forbidden(AccessDenied, "this workspace is not entitled to queries (entitlement query)")
	}
	if ok, wait := qr.allow(p.Workspace.ID); !ok {
		secs := int(math.Ceil(wait.Seconds()))
		return nil, huma.ErrorWithHeaders(RateLimited(fmt.Sprintf("over the workspace's query rate; retry after %s",
			wait.Round(time.Millisecond))), http.Header{"Retry-After": {strconv.Itoa(secs)}})
	}
	b := in.Body
	instr, err := oneOf("seed_instructions", b.SeedInstructionsA, "seedInstructions", b.SeedInstructions)
	if err != nil {
		return nil, err
	}
	auto, err := oneOfBool("auto_seed", b.AutoSeedA, "autoSeed", b.AutoSeed)
	if err != nil {
		return nil, err
	}
	req := query.Request{WorkspaceID: p.Workspace.ID, KeyID: p.Key.ID, Env: in.Slug, Input: b.Input,
		Seed: b.Seed, SeedInstructions: instr, AutoSeed: auto}
	if b.Model != nil {
		req.Model = *b.Model
	}
	ans, err := qr.Queries.Run(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &QueryOutput{Status: http.StatusOK, Body: queryView(ans)}
	if ans.Result == nil {
		out.Status = http.StatusAccepted
	}
	return out, nil
}

func (qr *QueryRoutes) get(ctx context.Context, in *QueryPath) (*QueryOutput, error) {
	ans, err := qr.Queries.Get(ctx, PrincipalFrom(ctx).Workspace.ID, in.QueryID)
	if err != nil {
		return nil, err
	}
	return &QueryOutput{Status: http.StatusOK, Body: queryView(ans)}, nil
}

func queryView(ans *query.Answer) QueryView {
	v := QueryView{ID: ans.ID, Status: ans.Status, Poll: "/v1/queries/" + ans.ID, Seed: ans.Seed, Model: ans.Model,
		Trace: []QuerySpan{}, Pinned: map[string][]string{},
		Usage: QueryUsage{ModelCalls: ans.Usage.ModelCalls, PromptTokens: ans.Usage.PromptTokens, CompletionTokens: ans.Usage.CompletionTokens}}
	if ans.Err != nil {
		e := planeEnvelope(ans.Err)
		v.Error = &QueryError{Detail: e.Detail, Code: e.Code, Status: e.GetStatus()}
	}
	r := ans.Result
	if r == nil {
		return v
	}
	v.Response, v.NSpans, v.Seed, v.Seeded, v.WorldHash = r.Response, r.NSpans, r.Seed, r.Seeded, r.WorldHash
	v.Fidelity = QueryFidelity{High: r.Fidelity.High, Low: r.Fidelity.Low}
	v.SeedInstructions, v.SeedInstructionsB, v.SeedNote = r.SeedInstructions, r.SeedInstructions, r.SeedNote
	v.Mode, v.Model, v.ReplayedTrace, v.ReplayScore = r.Mode, r.Model, r.ReplayedTrace, r.ReplayScore
	v.Steps, v.Stopped, v.SessionID, v.BuildID = r.Steps, r.Stopped, r.SessionID, r.BuildID
	if r.Pinned != nil {
		v.Pinned = r.Pinned
	}
	for _, s := range r.Trace {
		v.Trace = append(v.Trace, QuerySpan{Kind: s.Kind, Label: s.Label, Dur: s.Dur, Detail: s.Detail, Result: s.Result,
			Error: s.Error, Fidelity: s.Fidelity, Rung: s.Rung, Downgraded: s.Downgraded, Replayed: s.Replayed})
	}
	return v
}
