// Package toolplane serves sessions to every transport: opens, tool calls on the session's twin, reads,
// transcripts, closes, idle expiry, the idle reaper and session-token lookup.
package toolplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/faults"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// SessionOpener opens sessions' worlds on their environments' twins: the session-open workflow (wfclient.Sessions
// runs it on Temporal). Its refusals are *Error: a spec the twin refused is Invalid naming its field, an
// environment gone NotFound, a twin that did not come up Unavailable.
type SessionOpener interface {
	Open(ctx context.Context, w OpenWorld) (OpenedWorld, error)
}

// OpenWorld is a world to open: the session (its id chosen by the plane), its environment and its world spec. The
// workspace and the environment's active build when the open began name the open (its search attributes).
type OpenWorld struct {
	SessionID   string
	EnvID       string
	Spec        rpc.SessionSpec
	WorkspaceID string `json:",omitempty"`
	BuildID     string `json:",omitempty"`
}

// OpenedWorld is an opened world: where its twin answers, the build it runs, and its receipts.
type OpenedWorld struct {
	TwinAddr  string
	BuildID   string
	Receipts  rpc.Receipts
	StateHash string
}

// EventLog records events in the transaction of the change they report, and starts their webhook deliveries once
// it commits (activities.EventLog is one).
type EventLog interface {
	// Record records ev with its deliveries in db (the caller's transaction) and answers the deliveries' ids.
	Record(ctx context.Context, db bun.IDB, ev *schema.Event) ([]string, error)
	// Kick starts the deliveries' workflows; it does not block.
	Kick(ids []string)
}

// CallJournal durably records a call before it is answered (journal.Writer[schema.Call] is one).
type CallJournal interface {
	Submit(ctx context.Context, c schema.Call) error
}

// TwinDirectory finds environments' twins (wfclient.TwinDirectory, over the TwinWorkflow, is it).
type TwinDirectory interface {
	// WakeTwin boots the wanted build's twin if it is stopped and answers its state.
	WakeTwin(ctx context.Context, w twinstate.Wake) (twinstate.Status, error)
	// RunningTwins answers the environment's twins that are ready, by build id, without booting any.
	RunningTwins(ctx context.Context, envID string) (map[string]twinstate.Status, error)
}

// Quota holds workspaces to their plans before work starts (usage.Gate is one). Its refusals pass through
// unchanged (usage.LimitError).
type Quota interface {
	// AdmitOpen answers nil when the workspace may open a session, with the most sessions it may have open at
	// once (0: no cap), which the open holds to as it writes the session row.
	AdmitOpen(ctx context.Context, workspaceID string) (maxOpen int, err error)
	// AdmitCall answers nil when a tool call may run.
	AdmitCall(ctx context.Context, workspaceID string) error
	// Called counts an answered call until the durable records the quota reads hold it.
	Called(workspaceID string)
}

// Options are a Plane's dependencies.
type Options struct {
	DB *bun.DB
	// Opener runs session opens (nil: opens answer 503).
	Opener SessionOpener
	// Twins finds a session's twin and wakes it when stopped (nil: calls that need a twin answer 503).
	Twins   TwinDirectory
	Journal CallJournal
	// Quota, when set, refuses opens and calls past the workspace's plan (nil: no limits).
	Quota Quota
	// Bundles caches decoded bundles (nil: bundles cannot be read).
	Bundles *Bundles
	// Idle is how long an unused session stays open (config session.idle; default store.DefaultSessionIdle).
	Idle time.Duration
	// HTTP is the twin RPC client (nil: rpc.NewHTTPClient()).
	HTTP *http.Client
	// Locals finds twins served in this process (the inproc driver): calls reach them directly, without HTTP.
	Locals rpc.Locals
	// TokenTTL bounds how long a session-token resolution is trusted (default 5s).
	TokenTTL time.Duration
	Log      *slog.Logger
	// Tracer, when set, makes spans of each call's twin answer and journal commit (nil: none, at no cost).
	Tracer trace.TracerProvider
	// Events records session.opened, session.closed and session.expired in the transaction of the change, and
	// starts their webhook deliveries (nil: no events).
	Events EventLog
	// MaxGroup is the most sessions one group open or group fork makes (config session.max_group; default
	// DefaultMaxGroup).
	MaxGroup int
}

// Plane is the tool plane. Calls never touch Temporal: twin RPC → journal group commit → answer.
type Plane struct {
	db      *bun.DB
	opener  SessionOpener
	twins   TwinDirectory
	journal CallJournal
	quota   Quota
	bundles *Bundles
	idle    time.Duration
	hc      *http.Client
	locals  rpc.Locals
	log     *slog.Logger
	tokens  *Tokens
	tracer  trace.Tracer // nil: no spans
	events  EventLog
	// maxGroup is the most sessions a group open or fork makes.
	maxGroup int

	mu      sync.Mutex
	live    map[string]*liveSession
	clients map[string]*twinEntry // build id → its ready twin
	// errAnswers caches each build's recorded error answers per tool, for fault injection.
	errAnswers map[string]map[string][]string
}

// New builds a Plane.
func New(o Options) *Plane {
	p := &Plane{db: o.DB, opener: o.Opener, twins: o.Twins, journal: o.Journal, quota: o.Quota, bundles: o.Bundles, idle: o.Idle,
		hc: o.HTTP, locals: o.Locals, log: o.Log, events: o.Events,
		live: map[string]*liveSession{}, clients: map[string]*twinEntry{}, errAnswers: map[string]map[string][]string{}}
	if p.maxGroup = o.MaxGroup; p.maxGroup <= 0 {
		p.maxGroup = DefaultMaxGroup
	}
	if p.idle <= 0 {
		p.idle = store.DefaultSessionIdle
	}
	if p.hc == nil {
		p.hc = rpc.NewHTTPClient()
	}
	if p.bundles == nil {
		p.bundles = &Bundles{}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.tokens = NewTokens(o.DB, o.TokenTTL)
	if o.Tracer != nil {
		p.tracer = o.Tracer.Tracer("doppel/toolplane")
	}
	return p
}

// Idle is how long an unused session stays open.
func (p *Plane) Idle() time.Duration { return p.idle }

// Tokens resolves session tokens, cached for a few seconds.
func (p *Plane) Tokens() *Tokens { return p.tokens }

// Bundles is the bundle cache.
func (p *Plane) Bundles() *Bundles { return p.bundles }

// twinEntry is a build's ready twin as last found.
type twinEntry struct {
	c        *rpc.Client
	handleID string
}

// liveSession is what this process keeps about a session it serves: the lock that orders its calls, the journal
// length, and when it was last used.
type liveSession struct {
	mu       sync.Mutex
	calls    int64 // journaled calls; -1: unknown (read from the journal on next use)
	lastUsed time.Time
	build    *schema.Build
	faults   faults.Spec // the session's fault plan, decoded on first use
	// episode is the session's episode spec, decoded on first use (nil: not yet, or not an episode); lastTool the
	// tool of call number calls, when lastToolKnown.
	episode       *Episode
	lastTool      string
	lastToolKnown bool
}

func (p *Plane) liveOf(id string) *liveSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.live[id]
	if l == nil {
		if len(p.live) >= 50_000 {
			p.prune()
		}
		l = &liveSession{calls: -1}
		p.live[id] = l
	}
	return l
}

// prune drops what this process keeps about sessions it has not served for an idle period (they are read from the
// database again if they come back). p.mu is held.
func (p *Plane) prune() {
	cutoff := time.Now().Add(-p.idle)
	for id, l := range p.live {
		if l.mu.TryLock() {
			if l.lastUsed.Before(cutoff) {
				delete(p.live, id)
			}
			l.mu.Unlock()
		}
	}
}

// forget drops what this process keeps about an ended session, its token resolution included.
func (p *Plane) forget(id string) {
	p.mu.Lock()
	delete(p.live, id)
	p.mu.Unlock()
	p.tokens.Forget(id)
}

// Kind says what kind of refusal an Error is; each transport maps it to its own status.
type Kind int

// Kinds of Error.
const (
	NotFound    Kind = iota + 1 // no such session, environment or tool (404)
	Invalid                     // the input did not validate; Field names it (422)
	NotReady                    // the twin is booting or the environment has no build yet (409 notReady)
	Conflict                    // the request conflicts with the state, e.g. a broken session (409)
	Unavailable                 // a dependency (twin, Temporal, blob store) is not answering (503)
	BadGateway                  // an upstream the request needed (the model endpoint) failed or refused (502)
	TooLarge                    // over a size cap, e.g. an environment's collected bytes (413)
)

// Error is a refusal of the tool plane.
type Error struct {
	Kind Kind
	// Field locates invalid input as a path (body.arguments.order_id), for Invalid.
	Field  string
	Detail string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Detail
	}
	return e.Detail
}

func errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Detail: fmt.Sprintf(format, args...)}
}

func invalid(field, detail string) *Error { return &Error{Kind: Invalid, Field: field, Detail: detail} }

// notFoundOr turns store.ErrNotFound into a NotFound naming what; other errors pass unchanged.
func notFoundOr(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return errorf(NotFound, "%s not found", what)
	}
	return err
}

// span starts a child span of ctx when tracing is on; without a tracer it answers ctx and a nil span.
func (p *Plane) span(ctx context.Context, name string) (context.Context, trace.Span) {
	if p.tracer == nil {
		return ctx, nil
	}
	return p.tracer.Start(ctx, name)
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
