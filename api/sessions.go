package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/faults"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
)

// SessionRoutes serve sessions and the tool plane over REST: open, call, read, transcript, close, and the tools
// listing. The work is the tool plane's; these hold I/O types and error mapping.
type SessionRoutes struct {
	Plane *toolplane.Plane
	// Model says a model is configured, so the simulate rung answers (the tools listing leaves out tools nothing
	// else can answer when it is not).
	Model bool
	// MCPBase is the MCP server's public base URL (api.public_url): open and fork answers carry each session's own
	// MCP address on it (mcp_url). Empty: they carry none.
	MCPBase string

	obs Observer
}

// Register adds the session and tool routes.
func (sr *SessionRoutes) Register(a huma.API, d *Deps) {
	if sr.Plane == nil {
		sr.Plane = toolplane.New(toolplane.Options{DB: d.DB})
	}
	d.Auth.Tokens = sr.Plane.Tokens()
	sr.obs = d.Observer
	registerTools(a, d.DB, sr.Plane.Bundles(), sr.Model)
	sr.registerWorlds(a, d)
	sr.registerList(a, d)
	Declare(a, Verb[OpenSessionInput, OpenSessionOutput]{
		Name:    "sessions.open",
		Method:  http.MethodPost,
		Path:    "/v1/envs/{slug}/sessions",
		Status:  http.StatusCreated,
		Summary: "Open a session",
		Description: "Opens an isolated world on the environment's twin and mints its session token (`ms_…`, shown " +
			"only here). The world is a pure function of the build, `seed`, the seed instructions (or `scenario`) " +
			"and `clock`: the same inputs give the same `world_hash` on any machine. The open waits for the twin " +
			"(waking it when stopped) and runs as a Temporal workflow. The body accepts both naming variants " +
			"(`seed_instructions` or `seedInstructions`; both given and different is a 422); the answer carries " +
			"both sets of names. Seed words that cannot become rows open the unseeded world with " +
			"`receipts.seeded: false` and a `note`. With `trace` (a trace the environment holds, by id, or one in the " +
			"collect format) the session opens on the world that conversation saw instead: see `trace`.",
		Tags:     []string{"sessions"},
		Security: WorkspaceKeyAuth(),
		Errors:   []int{http.StatusPaymentRequired, http.StatusConflict, http.StatusServiceUnavailable},
		Handler:  sr.open,
	})

	Declare(a, Verb[CallInput, CallOutput]{
		Name:    "sessions.call",
		Method:  http.MethodPost,
		Path:    "/v1/sessions/{session_id}/call",
		Summary: "Call a tool in a session",
		Description: "Runs one tool call in the session's world down the rung ladder (provided → twin → replay → " +
			"infer → simulate) and answers with the tool's text, its fidelity label and the rung that answered. " +
			"The call is journaled durably before it is answered. A tool's own error is a 200 with `error: true`, " +
			"and so are arguments whose values break the tool's input schema (answered by the twin in the style of " +
			"the tool's recorded errors, the world unchanged). Only arguments that are not a JSON object are a 422 " +
			"naming the field, and then nothing is journaled. A tool the twin cannot route is a 404 " +
			"naming it; a closed or expired session is a 404; a booting twin is a 409 `notReady`.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Errors:   []int{http.StatusPaymentRequired, http.StatusConflict, http.StatusServiceUnavailable},
		FastBody: true,
		Handler:  sr.call,
	})

	Declare(a, Verb[SessionPath, SessionOutput]{
		Name:    "sessions.get",
		Method:  http.MethodGet,
		Path:    "/v1/sessions/{session_id}",
		Summary: "Show a session",
		Description: "The session's calls, errors, fidelity mix, world state hash and seeding receipts. The key " +
			"that opened a session can read it after it ended; its token cannot.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Handler:  sr.get,
	})

	Declare(a, Verb[TranscriptInput, TranscriptOutput]{
		Name:    "sessions.transcript",
		Method:  http.MethodGet,
		Path:    "/v1/sessions/{session_id}/transcript",
		Summary: "A session's transcript",
		Description: "Every call in call order with its arguments, fidelity, rung, latency and requestor. Tool " +
			"output (`result`) is carried only when the session was opened with `recordOutputs: true`.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Handler:  sr.transcript,
	})

	Declare(a, Verb[SessionPath, CloseOutput]{
		Name:    "sessions.close",
		Method:  http.MethodDelete,
		Path:    "/v1/sessions/{session_id}",
		Summary: "Close a session",
		Description: "Ends the session: its token is revoked at once and its world dropped. `existed` is true when " +
			"the session was open.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Handler:  sr.close,
	})
}

// ---- open ----

// OpenSessionBody is the body of POST /v1/envs/{slug}/sessions, in either naming variant.
type OpenSessionBody struct {
	SeedInstructionsA *string              `json:"seed_instructions,omitempty" maxLength:"20000" doc:"Plain-language preconditions (variant A name). Omitted: the world the environment was built with."`
	SeedInstructions  *string              `json:"seedInstructions,omitempty" maxLength:"20000" doc:"Plain-language preconditions (variant B name)."`
	Seed              *int64               `json:"seed,omitempty" minimum:"0" maximum:"9007199254740991" doc:"Pins generated values. Omitted: a fresh draw, returned in the answer."`
	RecordOutputs     *bool                `json:"recordOutputs,omitempty" doc:"Keep each call's result in the transcript (default false: arguments, fidelity and latency only)."`
	RecordOutputsA    *bool                `json:"record_outputs,omitempty" doc:"recordOutputs, variant A name."`
	Scenario          *string              `json:"scenario,omitempty" maxLength:"200" doc:"Name of a scenario from the environment's build config, used instead of seed instructions (never combined with them)."`
	Clock             *string              `json:"clock,omitempty" format:"date-time" doc:"Fixes the world's time, RFC 3339 (e.g. 2025-03-01T09:00:00Z). Omitted: the build's clock."`
	World             *string              `json:"world,omitempty" enum:"open,closed" doc:"World policy for ids the world does not hold: open (an unknown id in the recorded id format is made up from the seed and the id, consistent with what the recordings imply, and labelled B_inferred) or closed (production's own not-found error). Omitted: the build's (config.world, default open)."`
	Trace             SessionTrace         `json:"trace,omitempty"`
	Task              *EpisodeTask         `json:"task,omitempty" doc:"Open the session as an episode: graded on these expectations when it is done (after max_steps calls, or a call of one of the build config's terminal_tools). Each call then answers done and, when done, the reward with each expectation's verdict; a call after done is a 409."`
	N                 *int                 `json:"n,omitempty" minimum:"1" doc:"Open n identical worlds (one spec and one seed, drawn once when not given: the same world hash) as n sessions in one call, each with its own id and token, copy-on-write on the twin; the answer is then an array of n open answers. The plan admits all n or none (402), and each is billed. At most config session.max_group (default 256)."`
	Faults            map[string]FaultRule `json:"faults,omitempty" maxProperties:"1000" doc:"Injected faults per tool name (\"*\": every tool not named): recorded error answers, timeouts and added latency, drawn from the session's seed so the same seed fails the same calls. Each injected fault is labelled in the call's answer and the transcript."`
}

// FaultRule is one tool's injected faults.
type FaultRule struct {
	ErrorRate   float64       `json:"error_rate,omitempty" minimum:"0" maximum:"1" doc:"Fraction of calls answered with one of the tool's recorded error answers instead of running (the world unchanged). A named tool needs recorded errors; \"*\" applies it to the tools that have them."`
	TimeoutRate float64       `json:"timeout_rate,omitempty" minimum:"0" maximum:"1" doc:"Fraction of calls that time out: after timeout_ms they answer a timeout error without running. error_rate + timeout_rate ≤ 1."`
	TimeoutMs   int64         `json:"timeout_ms,omitempty" minimum:"0" maximum:"300000" doc:"How long a timed-out call hangs (default 10000)."`
	Latency     *FaultLatency `json:"latency,omitempty" doc:"Latency added to the tool's calls (timeouts excepted)."`
}

// FaultLatency is added latency drawn from a named distribution, in milliseconds.
type FaultLatency struct {
	Dist     string  `json:"dist" enum:"fixed,uniform,normal,exponential,lognormal" doc:"fixed (ms), uniform (min_ms–max_ms), normal (mean_ms, stddev_ms; clamped at 0), exponential (mean_ms), lognormal (median_ms, sigma)."`
	Ms       float64 `json:"ms,omitempty" minimum:"0" maximum:"60000"`
	MinMs    float64 `json:"min_ms,omitempty" minimum:"0" maximum:"60000"`
	MaxMs    float64 `json:"max_ms,omitempty" minimum:"0" maximum:"60000"`
	MeanMs   float64 `json:"mean_ms,omitempty" minimum:"0" maximum:"60000"`
	StddevMs float64 `json:"stddev_ms,omitempty" minimum:"0" maximum:"60000"`
	MedianMs float64 `json:"median_ms,omitempty" minimum:"0" maximum:"60000"`
	Sigma    float64 `json:"sigma,omitempty" minimum:"0" maximum:"5"`
}

func faultSpec(rules map[string]FaultRule) faults.Spec {
	if len(rules) == 0 {
		return nil
	}
	sp := make(faults.Spec, len(rules))
	for tool, r := range rules {
		t := faults.Tool{ErrorRate: r.ErrorRate, TimeoutRate: r.TimeoutRate, TimeoutMs: r.TimeoutMs}
		if r.Latency != nil {
			l := faults.Latency(*r.Latency)
			t.Latency = &l
		}
		sp[tool] = t
	}
	return sp
}

// OpenSessionInput is POST /v1/envs/{slug}/sessions.
type OpenSessionInput struct {
	Slug string           `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	Body *OpenSessionBody `required:"false"`
}

// SessionReceipts are a session's seeding receipts (spec §2.3, variant B names).
type SessionReceipts struct {
	Seeded    bool    `json:"seeded" doc:"Whether seed instructions (or a scenario) became rows."`
	Seed      int64   `json:"seed" doc:"The world seed, given or drawn."`
	Scenario  *string `json:"scenario" doc:"The scenario used, or null."`
	WorldHash string  `json:"worldHash" doc:"sha256: hash of the canonical world at open: the reproducibility receipt." example:"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"`
	Note      *string `json:"note" doc:"Why seed words could not become rows, or null."`
	Clock     string  `json:"clock" doc:"The world's time, RFC 3339: with the seed and instructions, it fixes the world."`
	World     string  `json:"world,omitempty" doc:"The session's world policy: open or closed."`
	// Trace is set when the session was opened from a trace.
	Trace *TraceReceipt `json:"trace,omitempty" doc:"The trace the world was opened from, when it was."`
}

// OpenSessionBodyOut answers a session open in both naming variants.
type OpenSessionBodyOut struct {
	// Variant A.
	SessionToken string `json:"session_token" doc:"The session token (ms_…), shown only in this answer." example:"ms_0123456789abcdefghjkmnpqrstvwxyz0123456789ab"`
	SessionIDA   string `json:"session_id" doc:"The session id (variant A name)." example:"ses_0123456789abcdef"`
	Seed         int64  `json:"seed" doc:"The world seed, given or drawn."`
	WorldHash    string `json:"world_hash" doc:"sha256: hash of the world at open."`
	// Variant B.
	SessionID string          `json:"sessionId" doc:"The session id." example:"ses_0123456789abcdef"`
	Token     string          `json:"token" doc:"The session token again (variant B name)."`
	Receipts  SessionReceipts `json:"receipts"`
	ExpiresAt time.Time       `json:"expiresAt" doc:"When the session expires if unused (it moves with every call)."`
	// Both.
	Pinned  map[string][]string `json:"pinned" doc:"Entity name → ids the seed instructions created or fixed."`
	MCPURLA string              `json:"mcp_url,omitempty" doc:"The session's own MCP address (variant A name): the environment's tools in this session, over every MCP version the server speaks, the stateless 2026-07-28 included, with the session token as the bearer." example:"https://doppel.example.com/mcp/envs/retail/sessions/ses_0123456789abcdef"`
	MCPURL  string              `json:"mcpUrl,omitempty" doc:"The session's own MCP address (variant B name)." example:"https://doppel.example.com/mcp/envs/retail/sessions/ses_0123456789abcdef"`
}

// OpenSessionOutput is the 201 answer of a session open.
type OpenSessionOutput struct {
	Body OpenAnswer
}

func (sr *SessionRoutes) open(ctx context.Context, in *OpenSessionInput) (*OpenSessionOutput, error) {
	p := PrincipalFrom(ctx)
	body := in.Body
	if body == nil {
		body = &OpenSessionBody{}
	}
	instr, err := oneOf("seed_instructions", body.SeedInstructionsA, "seedInstructions", body.SeedInstructions)
	if err != nil {
		return nil, err
	}
	record, err := oneOfBool("record_outputs", body.RecordOutputsA, "recordOutputs", body.RecordOutputs)
	if err != nil {
		return nil, err
	}
	req := toolplane.OpenRequest{WorkspaceID: p.Workspace.ID, KeyID: p.Key.ID, Env: in.Slug, Seed: body.Seed,
		SeedInstructions: instr, RecordOutputs: record, Faults: faultSpec(body.Faults)}
	if body.Scenario != nil {
		req.Scenario = *body.Scenario
	}
	if body.Clock != nil {
		req.Clock = *body.Clock
	}
	if body.World != nil {
		req.World = *body.World
	}
	if req.Trace, err = toolplane.ParseTraceParam("body.trace", body.Trace); err != nil {
		return nil, err
	}
	req.Task = body.Task.task()
	if body.N != nil {
		os, err := sr.Plane.OpenGroup(ctx, req, *body.N)
		if err != nil {
			return nil, err
		}
		out := &OpenSessionOutput{Body: OpenAnswer{Many: make([]OpenSessionBodyOut, len(os))}}
		for i, o := range os {
			out.Body.Many[i] = openedOut(o, sessionMCPURL(sr.MCPBase, o.Env, o.Session.ID))
		}
		return out, nil
	}
	o, err := sr.Plane.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	one := openedOut(o, sessionMCPURL(sr.MCPBase, o.Env, o.Session.ID))
	return &OpenSessionOutput{Body: OpenAnswer{One: &one}}, nil
}

// oneOf merges a field given under its two variant names: both given and different is a 422.
func oneOf(nameA string, a *string, nameB string, b *string) (string, error) {
	switch {
	case a != nil && b != nil && *a != *b:
		return "", Invalid("body."+nameB, fmt.Sprintf("differs from body.%s: give one of the two names, or the same value under both", nameA))
	case a != nil:
		return *a, nil
	case b != nil:
		return *b, nil
	}
	return "", nil
}

func oneOfBool(nameA string, a *bool, nameB string, b *bool) (bool, error) {
	switch {
	case a != nil && b != nil && *a != *b:
		return false, Invalid("body."+nameB, fmt.Sprintf("differs from body.%s: give one of the two names, or the same value under both", nameA))
	case a != nil:
		return *a, nil
	case b != nil:
		return *b, nil
	}
	return false, nil
}

// ---- call ----

// ToolArguments are a call's arguments: a JSON object, kept byte for byte.
type ToolArguments json.RawMessage

// Schema documents ToolArguments as an object.
func (ToolArguments) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeObject, AdditionalProperties: true,
		Description: "The tool's arguments, a JSON object checked against the tool's input schema."}
}

// UnmarshalJSON keeps the raw bytes.
func (a *ToolArguments) UnmarshalJSON(b []byte) error {
	*a = append((*a)[:0], b...)
	return nil
}

// MarshalJSON writes the raw bytes.
func (a ToolArguments) MarshalJSON() ([]byte, error) {
	if len(a) == 0 {
		return []byte("{}"), nil
	}
	return a, nil
}

// CallBody is the body of POST /v1/sessions/{session_id}/call.
type CallBody struct {
	Name      string        `json:"name" minLength:"1" maxLength:"200" doc:"Tool name (the production tool's name)." example:"get_order_details"`
	Arguments ToolArguments `json:"arguments"`
	Requestor string        `json:"requestor,omitempty" enum:"assistant,user" doc:"Who asked: assistant (the model) or user (a person or harness). Recorded, not enforced."`
}

// CallInput is POST /v1/sessions/{session_id}/call.
type CallInput struct {
	SessionID string `path:"session_id" doc:"Session id (ses_…)."`
	Body      CallBody
}

// CallResult is a tool call's answer (spec §2.5).
type CallResult struct {
	Content    string     `json:"content" doc:"The tool's answer as text, as the agent should see it."`
	Error      bool       `json:"error" doc:"True when the tool answered with its own error, as production would."`
	Fidelity   string     `json:"fidelity" enum:"A_executed,B_twin,B_replayed,B_inferred,B_simulated" doc:"A_executed: provided code ran; B_twin: the world model answered; B_replayed: a recorded answer; B_inferred: the nearest recording adapted; B_simulated: a model imagined it."`
	Rung       string     `json:"rung" enum:"provided,twin,replay,infer,simulate" doc:"The rung that answered."`
	Downgraded bool       `json:"downgraded" doc:"True when the tool's bound rung could not answer and a lower one did."`
	CallID     string     `json:"callId" doc:"The call's id in the transcript." example:"call_0123456789abcdef"`
	Ms         int64      `json:"ms" doc:"Latency of the tool answer in milliseconds."`
	Fault      *CallFault `json:"fault,omitempty" doc:"Set when the session's fault plan injected a fault into this call."`
	// Episode fields: set only for a session opened with a task.
	Done     *bool          `json:"done,omitempty" doc:"Episodes only: true when this call ended the episode (its step limit reached, or a terminal tool called); a call after done is a 409."`
	Steps    *int64         `json:"steps,omitempty" doc:"Episodes only: calls the episode has taken, this one included (a fork counts its parent's calls before it)."`
	Reason   string         `json:"done_reason,omitempty" enum:"max_steps,terminal_tool" doc:"Episodes only, when done: why."`
	Reward   *float64       `json:"reward,omitempty" doc:"Episodes only, when done: the reward, 0…1: the fraction of the task's expectations that pass, or with reward mode all, 1 when every one passes and else 0."`
	Verdicts []AssertResult `json:"verdicts,omitempty" doc:"Episodes only, when done: each expectation's verdict, as sessions.assert answers it."`
}

// CallFault labels an injected fault.
type CallFault struct {
	Kind      string `json:"kind" enum:"error,timeout,latency" doc:"error: a recorded error answer of the tool answered instead of it; timeout: the call hung latency_ms and failed; neither ran, and the world is unchanged. latency: the call ran, latency_ms later."`
	LatencyMs int64  `json:"latency_ms" doc:"Milliseconds the fault added before the answer."`
}

func callFault(f *toolplane.Fault) *CallFault {
	if f == nil {
		return nil
	}
	return &CallFault{Kind: f.Kind, LatencyMs: f.LatencyMs}
}

// CallOutput answers a call.
type CallOutput struct {
	// ServerTiming breaks the call's time in this process down by stage (W3C Server-Timing), for finding
	// where a slow call spent its time: auth (resolving the credential), twin (the twin's answer, with the
	// RPC), journal (the durable commit), total (from the request reaching the API, its authentication and
	// decoding included, to the answer being ready to send). GET /metrics has the same stages as histograms.
	ServerTiming string `header:"Server-Timing" doc:"Time per stage in milliseconds: auth;dur=…, twin;dur=…, journal;dur=…, total;dur=…."`
	Body         CallResult
}

func (sr *SessionRoutes) call(ctx context.Context, in *CallInput) (*CallOutput, error) {
	begun, transport, auth := time.Now(), "rest", time.Duration(0)
	if ri := requestInfo(ctx); ri != nil {
		begun, transport, auth = ri.start, ri.transport, ri.auth
	}
	res, err := sr.Plane.Call(ctx, PrincipalFrom(ctx).Session, toolplane.CallRequest{Tool: in.Body.Name,
		Arguments: in.Body.Arguments, Requestor: in.Body.Requestor})
	if err != nil {
		return nil, err
	}
	total := time.Since(begun)
	if sr.obs != nil {
		sr.obs.Call(transport, res.Fidelity, res.Rung, auth, res.Twin, res.Journal, total)
	}
	out := &CallOutput{
		ServerTiming: serverTiming(auth, res.Twin, res.Journal, total),
		Body: CallResult{Content: res.Content, Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
			Downgraded: res.Downgraded, CallID: res.CallID, Ms: res.Ms, Fault: callFault(res.Fault)},
	}
	if ep := res.Episode; ep != nil {
		out.Body.Done, out.Body.Steps, out.Body.Reason, out.Body.Reward = &ep.Done, &ep.Steps, ep.Reason, ep.Reward
		if ep.Done {
			out.Body.Verdicts = verdicts(PrincipalFrom(ctx).Session, ep.Outcomes)
		}
	}
	return out, nil
}

// serverTiming formats a call's stage times as a Server-Timing header value, in milliseconds with microsecond
// precision.
func serverTiming(auth, twinD, journalD, total time.Duration) string {
	b := make([]byte, 0, 80)
	for i, st := range [...]struct {
		name string
		d    time.Duration
	}{{"auth", auth}, {"twin", twinD}, {"journal", journalD}, {"total", total}} {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, st.name...)
		b = append(b, ";dur="...)
		b = strconv.AppendFloat(b, float64(st.d.Microseconds())/1000, 'f', -1, 64)
	}
	return string(b)
}

// ---- read, transcript, close ----

// SessionPath names a session in the path.
type SessionPath struct {
	SessionID string `path:"session_id" doc:"Session id (ses_…)."`
}

// FidelityMix counts a session's calls by fidelity label.
type FidelityMix struct {
	AExecuted  int64 `json:"A_executed"`
	BTwin      int64 `json:"B_twin"`
	BReplayed  int64 `json:"B_replayed"`
	BInferred  int64 `json:"B_inferred"`
	BSimulated int64 `json:"B_simulated"`
}

// SessionReceiptsFull are the receipts of a session read: the open's receipts plus what was pinned and asked.
type SessionReceiptsFull struct {
	SessionReceipts
	Pinned           map[string][]string `json:"pinned" doc:"Entity name → ids the seed instructions created or fixed."`
	SeedInstructions string              `json:"seedInstructions" doc:"The effective seed instructions (a scenario's, when one was named)."`
}

// SessionView answers GET /v1/sessions/{session_id}.
type SessionView struct {
	ID            string               `json:"id" example:"ses_0123456789abcdef"`
	Status        string               `json:"status" enum:"open,closed,expired,broken" doc:"open; closed (DELETE); expired (idle past the limit); broken (a rebuild from the journal diverged)."`
	EnvID         string               `json:"env_id"`
	BuildID       string               `json:"build_id" doc:"The build whose twin serves the session."`
	NCalls        int64                `json:"n_calls" doc:"Calls journaled."`
	NErrors       int64                `json:"n_errors" doc:"Calls the tool answered with its own error."`
	NDowngraded   int64                `json:"n_downgraded" doc:"Calls answered below their tool's bound rung."`
	Fidelity      FidelityMix          `json:"fidelity" doc:"Calls per fidelity label."`
	StateHash     string               `json:"state_hash" doc:"sha256: hash of the session's world now; changes when the world changes."`
	WorldHash     string               `json:"world_hash" doc:"sha256: hash of the world at open."`
	Receipts      SessionReceiptsFull  `json:"receipts"`
	RecordOutputs bool                 `json:"record_outputs" doc:"Whether the transcript carries results."`
	CreatedAt     time.Time            `json:"created_at"`
	LastUsedAt    time.Time            `json:"last_used_at" doc:"The last call (or the open)."`
	ExpiresAt     time.Time            `json:"expires_at" doc:"When the session expires if unused from now on."`
	ClosedAt      *time.Time           `json:"closed_at,omitempty"`
	ForkedFrom    *ForkedFromA         `json:"forked_from,omitempty" doc:"Set on a fork: the session it was forked from and the call it was forked after. n_calls counts the fork's own calls (numbered from at_call + 1)."`
	Faults        map[string]FaultRule `json:"faults,omitempty" doc:"The session's fault plan, when it has one."`
	Episode       *EpisodeView         `json:"episode,omitempty" doc:"Set on an episode (a session opened with a task): its task as kept, with the terminal tools as they were at open. Grade it with sessions.assert and these expectations."`
}

// SessionOutput wraps SessionView.
type SessionOutput struct {
	Body SessionView
}

func (sr *SessionRoutes) get(ctx context.Context, in *SessionPath) (*SessionOutput, error) {
	p := PrincipalFrom(ctx)
	s := p.Session
	st, err := sr.Plane.Read(ctx, s)
	if err != nil {
		return nil, err
	}
	if p.Key == nil {
		// The session's own token reads it only while it is open (the read may just have expired it).
		if err := SessionGone(s); err != nil {
			return nil, err
		}
	}
	v := SessionView{ID: s.ID, Status: s.Status, EnvID: s.EnvID, BuildID: s.BuildID, StateHash: st.StateHash,
		WorldHash: s.WorldHash, RecordOutputs: s.RecordOutputs, CreatedAt: s.CreatedAt, ClosedAt: s.ClosedAt,
		NCalls: st.NCalls, NErrors: st.NErrors, NDowngraded: st.NDowngraded, LastUsedAt: st.LastUsedAt, ExpiresAt: st.ExpiresAt}
	if s.ForkedFrom != "" {
		v.ForkedFrom = &ForkedFromA{SessionID: s.ForkedFrom, AtCall: s.ForkedAt}
	}
	if len(s.Faults) > 0 {
		if err := json.Unmarshal(s.Faults, &v.Faults); err != nil {
			return nil, fmt.Errorf("fault plan of session %s: %w", s.ID, err)
		}
	}
	if len(s.Episode) > 0 && string(s.Episode) != "null" {
		var ep toolplane.Episode
		if err := json.Unmarshal(s.Episode, &ep); err != nil {
			return nil, fmt.Errorf("episode of session %s: %w", s.ID, err)
		}
		if ep.TerminalTools == nil {
			ep.TerminalTools = []string{}
		}
		v.Episode = &EpisodeView{MaxSteps: ep.MaxSteps, TerminalTools: ep.TerminalTools, Reward: ep.Reward,
			Expect: make([]Expectation, len(ep.Expect))}
		for i, e := range ep.Expect {
			v.Episode.Expect[i] = expectationOut(e)
		}
	}
	for _, c := range st.Counts {
		switch c.Fidelity {
		case schema.FidelityAExecuted:
			v.Fidelity.AExecuted = c.N
		case schema.FidelityBTwin:
			v.Fidelity.BTwin = c.N
		case schema.FidelityBReplayed:
			v.Fidelity.BReplayed = c.N
		case schema.FidelityBInferred:
			v.Fidelity.BInferred = c.N
		case schema.FidelityBSimulated:
			v.Fidelity.BSimulated = c.N
		}
	}
	rc := st.Receipts
	v.Receipts = SessionReceiptsFull{
		SessionReceipts: SessionReceipts{Seeded: s.Seeded, Seed: s.Seed, Scenario: rc.Scenario, WorldHash: s.WorldHash, Note: rc.Note,
			Clock: s.Clock, World: rc.World, Trace: traceReceipt(rc.Trace)},
		Pinned:           rc.Pinned,
		SeedInstructions: rc.SeedInstructions,
	}
	return &SessionOutput{Body: v}, nil
}

// TranscriptEntry is one call in a transcript.
type TranscriptEntry struct {
	CallID     string          `json:"callId" example:"call_0123456789abcdef"`
	Seq        int64           `json:"seq" doc:"1, 2, … in call order."`
	Name       string          `json:"name" doc:"Tool name."`
	Arguments  json.RawMessage `json:"arguments" doc:"The call's arguments."`
	Fidelity   string          `json:"fidelity" enum:"A_executed,B_twin,B_replayed,B_inferred,B_simulated"`
	Rung       string          `json:"rung" enum:"provided,twin,replay,infer,simulate"`
	Downgraded bool            `json:"downgraded"`
	Error      bool            `json:"error" doc:"The tool answered with its own error."`
	Ms         int64           `json:"ms" doc:"Latency in milliseconds."`
	Requestor  string          `json:"requestor,omitempty" enum:"assistant,user"`
	StateHash  string          `json:"stateHash" doc:"The world's hash after the call."`
	CreatedAt  time.Time       `json:"createdAt"`
	Result     *string         `json:"result,omitempty" doc:"The tool's answer text; only when the session was opened with recordOutputs: true."`
	Fault      *CallFault      `json:"fault,omitempty" doc:"Set when an injected fault answered or delayed the call."`
}

// TranscriptInput is GET /v1/sessions/{session_id}/transcript.
type TranscriptInput struct {
	SessionID string `path:"session_id" doc:"Session id (ses_…)."`
	After     int64  `query:"after" minimum:"0" doc:"Only calls with seq greater than this (for paging)."`
	Limit     int    `query:"limit" minimum:"0" maximum:"10000" doc:"At most this many calls (0: all)."`
}

// TranscriptBody answers GET /v1/sessions/{session_id}/transcript.
type TranscriptBody struct {
	SessionID     string            `json:"sessionId"`
	RecordOutputs bool              `json:"recordOutputs" doc:"Whether entries carry result."`
	Calls         []TranscriptEntry `json:"calls" doc:"In call order."`
	ForkedFrom    *ForkedFrom       `json:"forkedFrom,omitempty" doc:"Set on a fork: its world began as this session's after atCall; its own calls follow, numbered from atCall + 1 (the parent's transcript holds the calls before)."`
}

// TranscriptOutput wraps TranscriptBody.
type TranscriptOutput struct {
	Body TranscriptBody
}

func (sr *SessionRoutes) transcript(ctx context.Context, in *TranscriptInput) (*TranscriptOutput, error) {
	s := PrincipalFrom(ctx).Session
	calls, err := sr.Plane.Transcript(ctx, s, in.After, in.Limit)
	if err != nil {
		return nil, err
	}
	out := TranscriptBody{SessionID: s.ID, RecordOutputs: s.RecordOutputs, Calls: make([]TranscriptEntry, 0, len(calls))}
	if s.ForkedFrom != "" {
		out.ForkedFrom = &ForkedFrom{SessionID: s.ForkedFrom, AtCall: s.ForkedAt}
	}
	for _, c := range calls {
		e := TranscriptEntry{CallID: c.ID, Seq: c.Seq, Name: c.Tool, Arguments: c.Arguments, Fidelity: c.Fidelity,
			Rung: c.Rung, Downgraded: c.Downgraded, Error: c.Error, Ms: c.Ms, Requestor: c.Requestor,
			StateHash: c.StateHash, CreatedAt: c.CreatedAt}
		if len(c.Fault) > 0 {
			var f CallFault
			if err := json.Unmarshal(c.Fault, &f); err == nil {
				e.Fault = &f
			}
		}
		if s.RecordOutputs {
			content := c.Content
			e.Result = &content
		}
		out.Calls = append(out.Calls, e)
	}
	return &TranscriptOutput{Body: out}, nil
}

// CloseOutput answers DELETE /v1/sessions/{session_id}.
type CloseOutput struct {
	Body struct {
		Existed bool `json:"existed" doc:"True when the session was open."`
	}
}

func (sr *SessionRoutes) close(ctx context.Context, in *SessionPath) (*CloseOutput, error) {
	existed, err := sr.Plane.Close(ctx, PrincipalFrom(ctx).Session)
	if err != nil {
		return nil, err
	}
	out := &CloseOutput{}
	out.Body.Existed = existed
	return out, nil
}
