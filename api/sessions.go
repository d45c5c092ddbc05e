package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/model"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twinrpc"
	"github.com/doppel-dev/doppel/workflows"
)

// SessionOpener runs the session-open workflow (workflows.Sessions does, on Temporal).
type SessionOpener interface {
	Open(ctx context.Context, in workflows.SessionOpenInput) (workflows.SessionOpenResult, error)
}

// CallJournal durably records a call before it is answered (journal.Writer[schema.Call] is one).
type CallJournal interface {
	Submit(ctx context.Context, c schema.Call) error
}

// SessionRoutes serve sessions and the tool plane: open, call, read, transcript, close, and the tools listing.
// Calls never touch Temporal: credential → twin RPC → journal group commit → answer.
type SessionRoutes struct {
	Opener SessionOpener
	// Twins finds a session's twin (the TwinWorkflow: workflows.TwinDirectory) and wakes it when stopped.
	Twins   activities.TwinDirectory
	Journal CallJournal
	Bundles *Bundles
	// Idle is how long an unused session stays open (config session.idle; default one hour).
	Idle time.Duration
	// HTTP is the twin RPC client (nil: twinrpc.NewHTTPClient()).
	HTTP *http.Client
	// Locals finds twins served in this process (the inproc driver): calls reach them directly, without HTTP.
	Locals twinrpc.Locals
	// Tokens caches session-token resolutions (nil: one is made over the database). The Authenticator uses it
	// for ms_ tokens once wired to it; the routes forget sessions they end.
	Tokens *SessionTokens

	db      *bun.DB
	mu      sync.Mutex
	live    map[string]*liveSession
	twins   map[string]*twinEntry // build id → its ready twin
	schemas model.SchemaCache     // tools' input schemas, decoded once
}

// twinEntry is a build's ready twin as last found.
type twinEntry struct {
	c        *twinrpc.Client
	handleID string
}

// liveSession is what the API process keeps about a session it serves: the lock that orders its calls, the
// journal length, and when it was last used.
type liveSession struct {
	mu       sync.Mutex
	calls    int64 // journaled calls; -1: unknown (read from the journal on next use)
	lastUsed time.Time
	build    *schema.Build
}

// Register adds the session and tool routes.
func (sr *SessionRoutes) Register(a huma.API, d *Deps) {
	sr.db = d.DB
	sr.live = map[string]*liveSession{}
	sr.twins = map[string]*twinEntry{}
	if sr.Idle <= 0 {
		sr.Idle = store.DefaultSessionIdle
	}
	if sr.HTTP == nil {
		sr.HTTP = twinrpc.NewHTTPClient()
	}
	if sr.Bundles == nil {
		sr.Bundles = &Bundles{}
	}
	if sr.Tokens == nil {
		sr.Tokens = &SessionTokens{DB: d.DB}
	}
	d.Auth.Tokens = sr.Tokens
	registerTools(a, d.DB, sr.Bundles)

	huma.Register(a, huma.Operation{
		OperationID:   "sessions.open",
		Method:        http.MethodPost,
		Path:          "/v1/envs/{slug}/sessions",
		DefaultStatus: http.StatusCreated,
		Summary:       "Open a session",
		Description: "Opens an isolated world on the environment's twin and mints its session token (`ms_…`, shown " +
			"only here). The world is a pure function of the build, `seed`, the seed instructions (or `scenario`) " +
			"and `clock`: the same inputs give the same `world_hash` on any machine. The open waits for the twin " +
			"(waking it when stopped) and runs as a Temporal workflow. The body accepts both naming variants " +
			"(`seed_instructions` or `seedInstructions`; both given and different is a 422); the answer carries " +
			"both sets of names. Seed words that cannot become rows open the unseeded world with " +
			"`receipts.seeded: false` and a `note`.",
		Tags:     []string{"sessions"},
		Security: WorkspaceKeyAuth(),
		Errors:   []int{http.StatusConflict, http.StatusServiceUnavailable},
	}, sr.open)

	huma.Register(a, huma.Operation{
		OperationID: "sessions.call",
		Method:      http.MethodPost,
		Path:        "/v1/sessions/{session_id}/call",
		Summary:     "Call a tool in a session",
		Description: "Runs one tool call in the session's world down the rung ladder (provided → twin → replay → " +
			"infer → simulate) and answers with the tool's text, its fidelity label and the rung that answered. " +
			"The call is journaled durably before it is answered. A tool's own error is a 200 with `error: true`. " +
			"Arguments that are not an object, or whose values have the wrong JSON type for the tool's input " +
			"schema, are a 422 naming the field, and nothing is journaled. A tool the twin cannot route is a 404 " +
			"naming it; a closed or expired session is a 404; a booting twin is a 409 `notReady`.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
		Errors:   []int{http.StatusConflict, http.StatusServiceUnavailable},
	}, sr.call)

	huma.Register(a, huma.Operation{
		OperationID: "sessions.get",
		Method:      http.MethodGet,
		Path:        "/v1/sessions/{session_id}",
		Summary:     "Show a session",
		Description: "The session's calls, errors, fidelity mix, world state hash and seeding receipts. The key " +
			"that opened a session can read it after it ended; its token cannot.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
	}, sr.get)

	huma.Register(a, huma.Operation{
		OperationID: "sessions.transcript",
		Method:      http.MethodGet,
		Path:        "/v1/sessions/{session_id}/transcript",
		Summary:     "A session's transcript",
		Description: "Every call in call order with its arguments, fidelity, rung, latency and requestor. Tool " +
			"output (`result`) is carried only when the session was opened with `recordOutputs: true`.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
	}, sr.transcript)

	huma.Register(a, huma.Operation{
		OperationID: "sessions.close",
		Method:      http.MethodDelete,
		Path:        "/v1/sessions/{session_id}",
		Summary:     "Close a session",
		Description: "Ends the session: its token is revoked at once and its world dropped. `existed` is true when " +
			"the session was open.",
		Tags:     []string{"sessions"},
		Security: SessionAuth(),
	}, sr.close)
}

// ---- open ----

// OpenSessionBody is the body of POST /v1/envs/{slug}/sessions, in either naming variant.
type OpenSessionBody struct {
	SeedInstructionsA *string `json:"seed_instructions,omitempty" maxLength:"20000" doc:"Plain-language preconditions (variant A name). Omitted: the world the environment was built with."`
	SeedInstructions  *string `json:"seedInstructions,omitempty" maxLength:"20000" doc:"Plain-language preconditions (variant B name)."`
	Seed              *int64  `json:"seed,omitempty" minimum:"0" maximum:"9007199254740991" doc:"Pins generated values. Omitted: a fresh draw, returned in the answer."`
	RecordOutputs     *bool   `json:"recordOutputs,omitempty" doc:"Keep each call's result in the transcript (default false: arguments, fidelity and latency only)."`
	RecordOutputsA    *bool   `json:"record_outputs,omitempty" doc:"recordOutputs, variant A name."`
	Scenario          *string `json:"scenario,omitempty" maxLength:"200" doc:"Name of a scenario from the environment's build config, used instead of seed instructions (never combined with them)."`
	Clock             *string `json:"clock,omitempty" format:"date-time" doc:"Fixes the world's time, RFC 3339 (e.g. 2025-03-01T09:00:00Z). Omitted: the build's clock."`
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
	Pinned map[string][]string `json:"pinned" doc:"Entity name → ids the seed instructions created or fixed."`
}

// OpenSessionOutput is the 201 answer of a session open.
type OpenSessionOutput struct {
	Body OpenSessionBodyOut
}

func drawSeed() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) & (1<<53 - 1)) // a JSON-safe integer
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
	spec := twinrpc.SessionSpec{SeedInstructions: instr}
	if body.Scenario != nil && *body.Scenario != "" {
		if strings.TrimSpace(instr) != "" {
			return nil, Invalid("body.scenario", "a scenario is used instead of seed instructions: give one or the other")
		}
		spec.Scenario = *body.Scenario
	}
	if body.Clock != nil && *body.Clock != "" {
		t, err := time.Parse(time.RFC3339Nano, *body.Clock)
		if err != nil {
			return nil, Invalid("body.clock", "expected an RFC 3339 time such as 2025-03-01T09:00:00Z")
		}
		spec.Clock = t.UTC().Format(time.RFC3339Nano)
	}
	if body.Seed != nil {
		spec.Seed = *body.Seed
	} else {
		spec.Seed = drawSeed()
	}

	env, err := store.GetEnv(ctx, sr.db, p.Workspace.ID, in.Slug)
	if err != nil {
		return nil, StoreError(err, "environment "+in.Slug)
	}
	if env.ActiveBuildID == "" {
		return nil, NotReady("environment %s has no build yet (status %s)", env.Slug, env.Status)
	}
	if sr.Opener == nil {
		return nil, Unavailable("sessions cannot be opened: no workflow client configured")
	}
	id := schema.NewID(schema.PrefixSession)
	res, err := sr.Opener.Open(ctx, workflows.SessionOpenInput{SessionID: id, EnvID: env.ID, Spec: spec})
	if err != nil {
		return nil, openError(err)
	}
	rc := res.Receipts
	receipts, err := json.Marshal(rc)
	if err != nil {
		return nil, err
	}
	s := &schema.Session{
		ID: id, EnvID: env.ID, WorkspaceID: env.WorkspaceID, BuildID: res.BuildID, OpenedByKeyID: p.Key.ID,
		Seed: spec.Seed, SeedInstructions: spec.SeedInstructions, Scenario: spec.Scenario,
		Clock: rc.Clock, RecordOutputs: record, Seeded: rc.Seeded, SeedNote: deref(rc.Note),
		WorldHash: rc.WorldHash, StateHash: res.StateHash, Receipts: receipts,
		ExpiresAt: schema.Now().Add(sr.Idle),
	}
	if s.BuildID == "" {
		s.BuildID = env.ActiveBuildID
	}
	token, err := store.CreateSession(ctx, sr.db, s)
	if err != nil {
		// The world exists on the twin but no row does: drop it.
		sr.dropOnTwin(context.WithoutCancel(ctx), env.ID, res.BuildID, id)
		return nil, err
	}
	sr.mu.Lock()
	sr.live[id] = &liveSession{calls: 0, lastUsed: s.CreatedAt}
	if res.TwinAddr != "" && sr.twins[s.BuildID] == nil {
		sr.twins[s.BuildID] = &twinEntry{c: twinrpc.Dial(res.TwinAddr, sr.HTTP, sr.Locals)}
	}
	sr.mu.Unlock()
	pinned := rc.Pinned
	if pinned == nil {
		pinned = map[string][]string{}
	}
	return &OpenSessionOutput{Body: OpenSessionBodyOut{
		SessionToken: token, SessionIDA: id, Seed: spec.Seed, WorldHash: rc.WorldHash,
		SessionID: id, Token: token, ExpiresAt: s.ExpiresAt, Pinned: pinned,
		Receipts: SessionReceipts{Seeded: rc.Seeded, Seed: rc.Seed, Scenario: rc.Scenario, WorldHash: rc.WorldHash, Note: rc.Note},
	}}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
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

// openError turns a failed session-open workflow into the answer: a refused spec is a 422 naming its field,
// a twin that never came up a 503.
func openError(err error) error {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		msg := appErr.Message()
		switch appErr.Type() {
		case activities.ErrTypeSessionSpec:
			for _, f := range []string{"scenario", "clock", "seed_instructions", "seed"} {
				if i := strings.Index(msg, f+":"); i >= 0 {
					return Invalid("body."+f, strings.TrimSpace(msg[i+len(f)+1:]))
				}
			}
			return Invalid("body", msg)
		case activities.ErrTypeBadInput:
			return NotFound("%s", msg)
		}
		if strings.HasPrefix(appErr.Type(), "Twin") { // the twin activities' error types: it did not come up
			return Unavailable("the environment's twin is not available: %s", msg)
		}
	}
	var te *twinrpc.Error
	if errors.As(err, &te) && errors.Is(err, twinrpc.ErrBadSpec) {
		return openError(temporal.NewApplicationError(te.Detail, activities.ErrTypeSessionSpec))
	}
	if twinrpc.IsRetryable(err) {
		return Unavailable("the environment's twin is not available: %v", err)
	}
	return fmt.Errorf("open session: %w", err)
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
	Content    string `json:"content" doc:"The tool's answer as text, as the agent should see it."`
	Error      bool   `json:"error" doc:"True when the tool answered with its own error, as production would."`
	Fidelity   string `json:"fidelity" enum:"A_executed,B_twin,B_replayed,B_inferred,B_simulated" doc:"A_executed: provided code ran; B_twin: the world model answered; B_replayed: a recorded answer; B_inferred: the nearest recording adapted; B_simulated: a model imagined it."`
	Rung       string `json:"rung" enum:"provided,twin,replay,infer,simulate" doc:"The rung that answered."`
	Downgraded bool   `json:"downgraded" doc:"True when the tool's bound rung could not answer and a lower one did."`
	CallID     string `json:"callId" doc:"The call's id in the transcript." example:"call_0123456789abcdef"`
	Ms         int64  `json:"ms" doc:"Latency of the tool answer in milliseconds."`
}

// CallOutput answers a call.
type CallOutput struct {
	// ServerTiming breaks the call's time in this process down by stage (W3C Server-Timing), for finding
	// where a slow call spent its time: twin (the twin's answer, with the RPC), journal (the durable
	// commit), total (from the request reaching the API, its authentication and decoding included, to the
	// answer being ready to send).
	ServerTiming string `header:"Server-Timing" doc:"Time per stage in milliseconds: twin;dur=…, journal;dur=…, total;dur=…."`
	Body         CallResult
}

func (sr *SessionRoutes) liveOf(id string) *liveSession {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	l := sr.live[id]
	if l == nil {
		if len(sr.live) >= 50_000 {
			sr.prune()
		}
		l = &liveSession{calls: -1}
		sr.live[id] = l
	}
	return l
}

// prune drops what this process keeps about sessions it has not served for an idle period (they are read
// from the database again if they come back). sr.mu is held.
func (sr *SessionRoutes) prune() {
	cutoff := time.Now().Add(-sr.Idle)
	for id, l := range sr.live {
		if l.mu.TryLock() {
			if l.lastUsed.Before(cutoff) {
				delete(sr.live, id)
			}
			l.mu.Unlock()
		}
	}
}

func (sr *SessionRoutes) forget(id string) {
	sr.mu.Lock()
	delete(sr.live, id)
	sr.mu.Unlock()
	sr.Tokens.Forget(id)
}

func (sr *SessionRoutes) call(ctx context.Context, in *CallInput) (*CallOutput, error) {
	begun := requestStart(ctx)
	if begun.IsZero() {
		begun = time.Now()
	}
	p := PrincipalFrom(ctx)
	s := p.Session
	if err := SessionGone(s); err != nil {
		return nil, err
	}
	args := bytes.TrimSpace(in.Body.Arguments)
	if len(args) == 0 || args[0] != '{' {
		return nil, Invalid("body.arguments", "expected a JSON object")
	}
	l := sr.liveOf(s.ID)
	l.mu.Lock()
	defer l.mu.Unlock()

	now := schema.Now()
	if err := sr.checkIdle(ctx, s, l, now); err != nil {
		return nil, err
	}
	if l.build == nil {
		b, err := store.GetBuildByID(ctx, sr.db, s.BuildID)
		if err != nil {
			return nil, StoreError(err, "build "+s.BuildID)
		}
		l.build = b
	}
	bundle, err := sr.Bundles.Get(ctx, l.build)
	if err != nil {
		return nil, err
	}
	tool, ok := bundle.ToolByName(in.Body.Name)
	if !ok {
		return nil, NotFound("tool %q not found: the twin cannot route it (GET /v1/envs/{slug}/tools lists the tools)", in.Body.Name)
	}
	if err := sr.checkArguments(tool, args); err != nil {
		return nil, err
	}
	if l.calls < 0 {
		n, err := store.LastSeq(ctx, sr.db, s.ID)
		if err != nil {
			return nil, err
		}
		l.calls = n
	}

	req := twinrpc.CallRequest{Tool: in.Body.Name, Arguments: json.RawMessage(args), Requestor: in.Body.Requestor}
	started := time.Now()
	res, err := sr.callTwin(ctx, s, l, req)
	if err != nil {
		return nil, err
	}
	ms := time.Since(started).Milliseconds()
	c := schema.Call{
		ID: schema.NewSortableID(schema.PrefixCall, now), SessionID: s.ID, Seq: l.calls + 1, Tool: req.Tool,
		Arguments: json.RawMessage(args), Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
		Downgraded: res.Downgraded, Ms: ms, Requestor: req.Requestor, StateHash: res.StateHash, CreatedAt: now,
	}
	// Outputs are kept when asked for, and always for simulated answers: a rebuilt session replays those from
	// the journal instead of asking the model again.
	if s.RecordOutputs || res.Rung == twin.RungSimulate {
		c.Content = res.Content
	}
	journaled := time.Now()
	if err := sr.Journal.Submit(context.WithoutCancel(ctx), c); err != nil {
		// The twin applied a call the journal does not hold: drop the twin's copy so the next call rebuilds
		// the session from the journal, and do not answer.
		l.calls = -1
		sr.dropOnTwin(context.WithoutCancel(ctx), s.EnvID, s.BuildID, s.ID)
		return nil, Unavailable("the call could not be journaled, so it was not answered; retry: %v", err)
	}
	l.calls++
	l.lastUsed = now
	done := time.Now()
	return &CallOutput{
		ServerTiming: serverTiming(journaled.Sub(started), done.Sub(journaled), done.Sub(begun)),
		Body: CallResult{Content: res.Content, Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung,
			Downgraded: res.Downgraded, CallID: c.ID, Ms: ms},
	}, nil
}

// serverTiming formats a call's stage times as a Server-Timing header value, in milliseconds with microsecond
// precision.
func serverTiming(twinD, journalD, total time.Duration) string {
	b := make([]byte, 0, 64)
	for i, st := range [...]struct {
		name string
		d    time.Duration
	}{{"twin", twinD}, {"journal", journalD}, {"total", total}} {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, st.name...)
		b = append(b, ";dur="...)
		b = strconv.AppendFloat(b, float64(st.d.Microseconds())/1000, 'f', -1, 64)
	}
	return string(b)
}

// checkArguments checks argument values against the JSON types of the tool's input schema (see
// model.CheckTypes; the schema is decoded once, in sr.schemas); the error names the field, e.g.
// body.arguments.order_id.
func (sr *SessionRoutes) checkArguments(tool *twin.Tool, args []byte) error {
	v, err := model.DecodeJSON(args)
	if err != nil {
		return Invalid("body.arguments", "not valid JSON: "+err.Error())
	}
	if _, ok := v.(map[string]any); !ok {
		return Invalid("body.arguments", "expected a JSON object")
	}
	sch, err := sr.schemas.Get(tool.InputSchema)
	if err == nil {
		err = sch.CheckTypes(v)
	}
	if err != nil {
		msg := err.Error()
		loc, rest, found := strings.Cut(msg, ": ")
		if !found || !strings.HasPrefix(loc, "$") {
			return Invalid("body.arguments", msg)
		}
		return Invalid("body.arguments"+strings.TrimPrefix(loc, "$"), rest)
	}
	return nil
}

// checkIdle answers 404 for a session idle past sr.Idle, expiring it (the reaper would, later).
func (sr *SessionRoutes) checkIdle(ctx context.Context, s *schema.Session, l *liveSession, now time.Time) error {
	if !l.lastUsed.IsZero() && now.Sub(l.lastUsed) <= sr.Idle {
		return nil
	}
	// This process has not seen the session used recently (or at all): ask the journal.
	act, err := activities.LastActivity(ctx, sr.db, s)
	if err != nil {
		return err
	}
	l.lastUsed = act
	if now.Sub(act) <= sr.Idle {
		return nil
	}
	if _, err := store.EndSession(ctx, sr.db, s.ID, schema.SessionExpired); err != nil {
		return err
	}
	sr.dropOnTwin(context.WithoutCancel(ctx), s.EnvID, s.BuildID, s.ID)
	sr.forget(s.ID)
	return NotFound("session %s expired after %s idle", s.ID, sr.Idle)
}

// callTwin runs the call on the twin of the session's build, recovering what can be recovered: a twin that lost
// the session (restart) gets it rebuilt from the journal; a stale journal length is re-read; a twin that does not
// answer is reported to the TwinWorkflow (which restarts it if dead). A twin that is stopped or booting is woken
// and answered 409 notReady.
func (sr *SessionRoutes) callTwin(ctx context.Context, s *schema.Session, l *liveSession, req twinrpc.CallRequest) (twinrpc.CallResult, error) {
	suspect := ""
	for attempt := 0; ; attempt++ {
		te, err := sr.twin(ctx, s, l, suspect)
		if err != nil {
			return twinrpc.CallResult{}, err
		}
		expect := l.calls
		req.ExpectCalls = &expect
		res, err := te.c.Call(ctx, s.ID, req)
		if err == nil {
			if res.Calls != expect+1 {
				return twinrpc.CallResult{}, fmt.Errorf("twin reports %d calls after call %d of session %s", res.Calls, expect+1, s.ID)
			}
			return res, nil
		}
		last := attempt >= 2
		switch {
		case errors.Is(err, twinrpc.ErrUnknownTool):
			return twinrpc.CallResult{}, NotFound("tool %q not found: the twin cannot route it", req.Tool)
		case errors.Is(err, twinrpc.ErrNoAnswer):
			return twinrpc.CallResult{}, NotFound("tool %q cannot be answered by this twin: %s", req.Tool, twinDetail(err))
		case errors.Is(err, twinrpc.ErrBadArguments):
			return twinrpc.CallResult{}, Invalid("body.arguments", twinDetail(err))
		case errors.Is(err, twinrpc.ErrUnknownSession) && !last:
			if err := sr.rebuild(ctx, te.c, s, l); err != nil {
				return twinrpc.CallResult{}, err
			}
		case errors.Is(err, twinrpc.ErrCallsMismatch) && !last:
			if err := sr.resync(ctx, te.c, s, l); err != nil {
				return twinrpc.CallResult{}, err
			}
		case twinrpc.IsRetryable(err) && suspect == "" && !last:
			// The twin did not answer: have the directory check it (and restart it if dead), then try again.
			sr.dropTwin(s.BuildID)
			suspect = te.handleID
			if suspect == "" {
				suspect = "unreachable"
			}
		case twinrpc.IsRetryable(err):
			sr.dropTwin(s.BuildID)
			return twinrpc.CallResult{}, NotReady("the session's twin is starting; retry in a moment")
		default:
			return twinrpc.CallResult{}, fmt.Errorf("call %s in session %s: %w", req.Tool, s.ID, err)
		}
	}
}

func twinDetail(err error) string {
	var te *twinrpc.Error
	if errors.As(err, &te) {
		return te.Detail
	}
	return err.Error()
}

// rebuild reopens a session its twin no longer holds from its spec and journal. A rebuilt state that differs
// from the journal's marks the session broken.
func (sr *SessionRoutes) rebuild(ctx context.Context, tc *twinrpc.Client, s *schema.Session, l *liveSession) error {
	// The twin may have dropped the world because the session ended (closed through another API process, or
	// reaped): never bring an ended session back.
	cur, err := store.GetSessionByID(ctx, sr.db, s.ID)
	if err != nil {
		return err
	}
	if cur.Status != schema.SessionOpen {
		sr.forget(s.ID)
		return NotFound("session %s is %s", s.ID, cur.Status)
	}
	calls, err := store.ListCalls(ctx, sr.db, s.ID, 0, 0)
	if err != nil {
		return err
	}
	journal := make([]twinrpc.JournalEntry, len(calls))
	for i, c := range calls {
		journal[i] = twinrpc.JournalEntry{Tool: c.Tool, Arguments: c.Arguments, Content: c.Content, Error: c.Error,
			Fidelity: c.Fidelity, Rung: c.Rung, StateHash: c.StateHash}
	}
	_, err = tc.Open(context.WithoutCancel(ctx), twinrpc.OpenRequest{ID: s.ID, Spec: specOf(s), Journal: journal})
	switch {
	case err == nil, errors.Is(err, twinrpc.ErrSessionExists):
		l.calls = int64(len(calls))
		return nil
	case errors.Is(err, twinrpc.ErrDiverged):
		if _, eerr := store.EndSession(ctx, sr.db, s.ID, schema.SessionBroken); eerr != nil {
			return eerr
		}
		sr.forget(s.ID)
		return Conflict("session %s is broken: rebuilding it from its journal gave another world (%s); open a new session", s.ID, twinDetail(err))
	}
	return fmt.Errorf("rebuild session %s: %w", s.ID, err)
}

// resync makes the journal length and the twin's agree after a calls mismatch: equal counts just refresh
// ours; a twin ahead of the journal (a call applied but never journaled) loses its copy and is rebuilt.
func (sr *SessionRoutes) resync(ctx context.Context, tc *twinrpc.Client, s *schema.Session, l *liveSession) error {
	n, err := store.LastSeq(ctx, sr.db, s.ID)
	if err != nil {
		return err
	}
	st, err := tc.Session(ctx, s.ID)
	if err != nil && !errors.Is(err, twinrpc.ErrUnknownSession) {
		return fmt.Errorf("read session %s on its twin: %w", s.ID, err)
	}
	if err == nil && st.Calls == n {
		l.calls = n
		return nil
	}
	if err == nil {
		if _, err := tc.Close(ctx, s.ID); err != nil && !errors.Is(err, twinrpc.ErrUnknownSession) {
			return err
		}
	}
	return sr.rebuild(ctx, tc, s, l)
}

// specOf is the spec that rebuilds a session's world: its open's inputs, plus the rows a Seeder made then (kept in
// its receipts), so the rebuild never asks the model again. Receipts that do not decode give no rows; a world that
// needed them then diverges, and the session is marked broken rather than served a different world.
func specOf(s *schema.Session) twinrpc.SessionSpec {
	spec := twinrpc.SessionSpec{Seed: s.Seed, SeedInstructions: s.SeedInstructions, Scenario: s.Scenario, Clock: s.Clock}
	var rc twinrpc.Receipts
	if len(s.Receipts) > 0 && json.Unmarshal(s.Receipts, &rc) == nil {
		spec.SeedRows = rc.SeedRows
	}
	return spec
}

// twin returns the ready twin of the session's build: as last found, or from the directory, which wakes it when it
// is stopped (then the answer is 409 notReady; a twin that failed to start is 503). suspect names a twin that did
// not answer, for the directory to check.
func (sr *SessionRoutes) twin(ctx context.Context, s *schema.Session, l *liveSession, suspect string) (*twinEntry, error) {
	if suspect == "" {
		sr.mu.Lock()
		te := sr.twins[s.BuildID]
		sr.mu.Unlock()
		if te != nil {
			return te, nil
		}
	}
	if sr.Twins == nil {
		return nil, Unavailable("no twin directory is configured")
	}
	env, err := store.GetEnvByID(ctx, sr.db, s.EnvID)
	if err != nil {
		return nil, StoreError(err, "environment")
	}
	active, err := activities.ActiveTwinBuild(ctx, sr.db, env)
	if errors.Is(err, store.ErrNotFound) {
		active = activities.TwinBuildOf(l.build)
	} else if err != nil {
		return nil, err
	}
	st, err := sr.Twins.WakeTwin(ctx, activities.TwinWake{EnvID: env.ID, Active: active, Build: activities.TwinBuildOf(l.build), Suspect: suspect})
	if err != nil {
		return nil, Unavailable("the session's twin cannot be found: %v", err)
	}
	switch st.State {
	case activities.TwinStateReady:
		if st.Addr == "" {
			return nil, NotReady("the session's twin is starting; retry in a moment")
		}
		te := &twinEntry{c: twinrpc.Dial(st.Addr, sr.HTTP, sr.Locals), handleID: st.HandleID}
		sr.mu.Lock()
		sr.twins[s.BuildID] = te
		sr.mu.Unlock()
		return te, nil
	case activities.TwinStateFailed:
		return nil, Unavailable("the session's twin failed to start: %s", st.Error)
	}
	return nil, NotReady("the session's twin is %s; it is being started, retry in a moment", st.State)
}

func (sr *SessionRoutes) dropTwin(buildID string) {
	sr.mu.Lock()
	te := sr.twins[buildID]
	delete(sr.twins, buildID)
	sr.mu.Unlock()
	if te != nil {
		te.c.CloseIdle()
	}
}

// dropOnTwin drops a session's world on its build's twin if that twin runs, best effort.
func (sr *SessionRoutes) dropOnTwin(ctx context.Context, envID, buildID, sessionID string) {
	sr.mu.Lock()
	te := sr.twins[buildID]
	sr.mu.Unlock()
	var tc *twinrpc.Client
	if te != nil {
		tc = te.c
	} else if sr.Twins != nil {
		running, err := sr.Twins.RunningTwins(ctx, envID)
		if err != nil {
			loggerFrom(ctx).Warn("list running twins", "env", envID, "err", err)
			return
		}
		st, ok := running[buildID]
		if !ok || st.Addr == "" {
			return // no twin runs that build: nothing holds the world
		}
		tc = twinrpc.Dial(st.Addr, sr.HTTP, sr.Locals)
	} else {
		return
	}
	if _, err := tc.Close(ctx, sessionID); err != nil && !errors.Is(err, twinrpc.ErrUnknownSession) && !errors.Is(err, twinrpc.ErrUnreachable) {
		loggerFrom(ctx).Warn("drop session world on twin", "session", sessionID, "err", err)
	}
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
	Clock            string              `json:"clock" doc:"The world's time, RFC 3339."`
}

// SessionView answers GET /v1/sessions/{session_id}.
type SessionView struct {
	ID            string              `json:"id" example:"ses_0123456789abcdef"`
	Status        string              `json:"status" enum:"open,closed,expired,broken" doc:"open; closed (DELETE); expired (idle past the limit); broken (a rebuild from the journal diverged)."`
	EnvID         string              `json:"env_id"`
	BuildID       string              `json:"build_id" doc:"The build whose twin serves the session."`
	NCalls        int64               `json:"n_calls" doc:"Calls journaled."`
	NErrors       int64               `json:"n_errors" doc:"Calls the tool answered with its own error."`
	NDowngraded   int64               `json:"n_downgraded" doc:"Calls answered below their tool's bound rung."`
	Fidelity      FidelityMix         `json:"fidelity" doc:"Calls per fidelity label."`
	StateHash     string              `json:"state_hash" doc:"sha256: hash of the session's world now; changes when the world changes."`
	WorldHash     string              `json:"world_hash" doc:"sha256: hash of the world at open."`
	Receipts      SessionReceiptsFull `json:"receipts"`
	RecordOutputs bool                `json:"record_outputs" doc:"Whether the transcript carries results."`
	CreatedAt     time.Time           `json:"created_at"`
	LastUsedAt    time.Time           `json:"last_used_at" doc:"The last call (or the open)."`
	ExpiresAt     time.Time           `json:"expires_at" doc:"When the session expires if unused from now on."`
	ClosedAt      *time.Time          `json:"closed_at,omitempty"`
}

// SessionOutput wraps SessionView.
type SessionOutput struct {
	Body SessionView
}

type callAgg struct {
	Fidelity   string `bun:"fidelity"`
	N          int64  `bun:"n"`
	Errors     int64  `bun:"errors"`
	Downgraded int64  `bun:"downgraded"`
}

func (sr *SessionRoutes) get(ctx context.Context, in *SessionPath) (*SessionOutput, error) {
	s := PrincipalFrom(ctx).Session
	var aggs []callAgg
	err := sr.db.NewSelect().Model((*schema.Call)(nil)).
		ColumnExpr("fidelity, COUNT(*) AS n").
		ColumnExpr("SUM(CASE WHEN error THEN 1 ELSE 0 END) AS errors").
		ColumnExpr("SUM(CASE WHEN downgraded THEN 1 ELSE 0 END) AS downgraded").
		Where("session_id = ?", s.ID).Group("fidelity").Order("fidelity").Scan(ctx, &aggs)
	if err != nil {
		return nil, fmt.Errorf("count calls of session %s: %w", s.ID, err)
	}
	v := SessionView{ID: s.ID, Status: s.Status, EnvID: s.EnvID, BuildID: s.BuildID, StateHash: s.WorldHash,
		WorldHash: s.WorldHash, RecordOutputs: s.RecordOutputs, CreatedAt: s.CreatedAt, ClosedAt: s.ClosedAt}
	for _, a := range aggs {
		v.NCalls += a.N
		v.NErrors += a.Errors
		v.NDowngraded += a.Downgraded
		switch a.Fidelity {
		case schema.FidelityAExecuted:
			v.Fidelity.AExecuted = a.N
		case schema.FidelityBTwin:
			v.Fidelity.BTwin = a.N
		case schema.FidelityBReplayed:
			v.Fidelity.BReplayed = a.N
		case schema.FidelityBInferred:
			v.Fidelity.BInferred = a.N
		case schema.FidelityBSimulated:
			v.Fidelity.BSimulated = a.N
		}
	}
	var last []schema.Call
	if err := sr.db.NewSelect().Model(&last).Column("state_hash", "created_at").Where("session_id = ?", s.ID).
		Order("seq DESC").Limit(1).Scan(ctx); err != nil {
		return nil, fmt.Errorf("last call of session %s: %w", s.ID, err)
	}
	v.LastUsedAt = s.CreatedAt
	if len(last) == 1 {
		v.StateHash = last[0].StateHash
		v.LastUsedAt = last[0].CreatedAt
	}
	if s.LastUsedAt.After(v.LastUsedAt) {
		v.LastUsedAt = s.LastUsedAt
	}
	v.ExpiresAt = v.LastUsedAt.Add(sr.Idle)
	if s.Status != schema.SessionOpen && s.ClosedAt != nil {
		v.ExpiresAt = *s.ClosedAt
	}
	var rc twinrpc.Receipts
	if len(s.Receipts) > 0 {
		if err := json.Unmarshal(s.Receipts, &rc); err != nil {
			return nil, fmt.Errorf("receipts of session %s: %w", s.ID, err)
		}
	}
	if rc.Pinned == nil {
		rc.Pinned = map[string][]string{}
	}
	v.Receipts = SessionReceiptsFull{
		SessionReceipts:  SessionReceipts{Seeded: s.Seeded, Seed: s.Seed, Scenario: rc.Scenario, WorldHash: s.WorldHash, Note: rc.Note},
		Pinned:           rc.Pinned,
		SeedInstructions: rc.SeedInstructions,
		Clock:            s.Clock,
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
}

// TranscriptOutput wraps TranscriptBody.
type TranscriptOutput struct {
	Body TranscriptBody
}

func (sr *SessionRoutes) transcript(ctx context.Context, in *TranscriptInput) (*TranscriptOutput, error) {
	s := PrincipalFrom(ctx).Session
	calls, err := store.ListCalls(ctx, sr.db, s.ID, in.After, in.Limit)
	if err != nil {
		return nil, err
	}
	out := TranscriptBody{SessionID: s.ID, RecordOutputs: s.RecordOutputs, Calls: make([]TranscriptEntry, 0, len(calls))}
	for _, c := range calls {
		e := TranscriptEntry{CallID: c.ID, Seq: c.Seq, Name: c.Tool, Arguments: c.Arguments, Fidelity: c.Fidelity,
			Rung: c.Rung, Downgraded: c.Downgraded, Error: c.Error, Ms: c.Ms, Requestor: c.Requestor,
			StateHash: c.StateHash, CreatedAt: c.CreatedAt}
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
	s := PrincipalFrom(ctx).Session
	l := sr.liveOf(s.ID)
	l.mu.Lock() // wait for a call in flight
	existed, err := store.EndSession(ctx, sr.db, s.ID, schema.SessionClosed)
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	sr.forget(s.ID)
	if existed {
		sr.dropOnTwin(context.WithoutCancel(ctx), s.EnvID, s.BuildID, s.ID)
		sr.snapshot(context.WithoutCancel(ctx), s.ID)
	}
	out := &CloseOutput{}
	out.Body.Existed = existed
	return out, nil
}

// snapshot writes an ended session's counters into its row (the call path journals calls only).
func (sr *SessionRoutes) snapshot(ctx context.Context, id string) {
	if err := activities.SnapshotSession(ctx, sr.db, id); err != nil {
		loggerFrom(ctx).Warn("snapshot session counters", "session", id, "err", err)
	}
}

// ---- token cache ----

// SessionTokens caches what a session token resolves to (its session and workspace), so the tool plane's hot
// path does not read the database twice per call. The Authenticator consults it for ms_ tokens when wired
// (see SessionRoutes.Tokens). Resolutions are trusted for TTL; the session routes forget a session the moment
// this process closes, expires or breaks it, so its token is refused at once here, and another API process
// refuses it within TTL (sooner: its next call finds the world dropped and the row ended).
type SessionTokens struct {
	DB *bun.DB
	// TTL bounds how long a resolution is trusted (default 5s).
	TTL time.Duration

	mu   sync.RWMutex
	byID map[string]string // session id → token hash
	m    map[string]tokenEntry
}

type tokenEntry struct {
	s   *schema.Session
	ws  *schema.Workspace
	exp time.Time
}

// Resolve returns the session and workspace of an ms_ token, whatever the session's status (callers decide what
// an ended session answers); unknown tokens are store.ErrNotFound.
func (c *SessionTokens) Resolve(ctx context.Context, token string) (*schema.Session, *schema.Workspace, error) {
	h := cred.Hash(token)
	now := time.Now()
	c.mu.RLock()
	e, ok := c.m[h]
	c.mu.RUnlock()
	if ok && now.Before(e.exp) {
		return e.s, e.ws, nil
	}
	s, err := store.SessionByToken(ctx, c.DB, token)
	if err != nil {
		return nil, nil, err
	}
	ws, err := store.GetWorkspace(ctx, c.DB, s.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	c.mu.Lock()
	if c.m == nil {
		c.m, c.byID = map[string]tokenEntry{}, map[string]string{}
	}
	if len(c.m) > 100_000 { // bound memory: start over rather than track recency
		c.m, c.byID = map[string]tokenEntry{}, map[string]string{}
	}
	c.m[h] = tokenEntry{s: s, ws: ws, exp: now.Add(ttl)}
	c.byID[s.ID] = h
	c.mu.Unlock()
	return s, ws, nil
}

// Forget drops a session's resolution: its next request reads the database again.
func (c *SessionTokens) Forget(sessionID string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if h, ok := c.byID[sessionID]; ok {
		delete(c.m, h)
		delete(c.byID, sessionID)
	}
	c.mu.Unlock()
}
