package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
)

// Application error types of the session activities.
const (
	// ErrTypeSessionSpec: the twin refused the session spec (e.g. an unknown scenario); not retryable.
	ErrTypeSessionSpec = "SessionSpec"
	// ErrTypeTwinUnavailable: the twin could not be reached or woken in time.
	ErrTypeTwinUnavailable = "TwinUnavailable"
)

// TwinEndpoint is where a ready twin answers: its RPC address, the build it serves and its handle id.
type TwinEndpoint struct {
	Addr     string
	BuildID  string
	HandleID string
}

// TwinDirectory finds environments' twins: the TwinWorkflow seen from sessions (wfclient.TwinDirectory is it).
type TwinDirectory interface {
	// WakeTwin boots the wanted build's twin if it is stopped and answers its state.
	WakeTwin(ctx context.Context, w twinstate.Wake) (twinstate.Status, error)
	// RunningTwins answers the environment's twins that are ready, by build id, without booting any.
	RunningTwins(ctx context.Context, envID string) (map[string]twinstate.Status, error)
}

// Sessions holds the dependencies of the session activities: opening a session on its twin, closing it,
// and reaping idle ones.
type Sessions struct {
	DB *bun.DB
	// Twins finds, wakes and waits for twins.
	Twins TwinDirectory
	// HTTP is the twin RPC client; nil means rpc.NewHTTPClient().
	HTTP *http.Client
	// Locals finds twins served in this process (the inproc driver), reached without HTTP; nil: none.
	Locals rpc.Locals
	// Reaper expires idle sessions (the tool plane).
	Reaper Reaper
	Log    *slog.Logger
	// Tracer, when set, makes a span of the open on the twin (a child of the activity's span).
	Tracer trace.TracerProvider

	once sync.Once
	hc   *http.Client
	mu   sync.Mutex
	warm map[string]TwinEndpoint // env id → the active build's ready twin, as last found
}

func (a *Sessions) rpc(addr string) *rpc.Client {
	a.once.Do(func() {
		a.hc = a.HTTP
		if a.hc == nil {
			a.hc = rpc.NewHTTPClient()
		}
	})
	return rpc.Dial(addr, a.hc, a.Locals)
}

func (a *Sessions) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log
}

// FindTwinInput names the environment whose twin a session open needs.
type FindTwinInput struct {
	EnvID string
	// Suspect is the handle id of a twin an open could not reach: the directory checks (and restarts) it.
	Suspect string
}

// FindTwin answers where the twin of the environment's active build answers. The warm path costs one database
// read: the twin this worker last found for the active build. Otherwise (or with a Suspect) it wakes the twin
// through the directory and waits until it is ready.
func (a *Sessions) FindTwin(ctx context.Context, in FindTwinInput) (TwinEndpoint, error) {
	env, err := store.GetEnvByID(ctx, a.DB, in.EnvID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("environment "+in.EnvID+" not found", ErrTypeBadInput, err)
		}
		return TwinEndpoint{}, err
	}
	if in.Suspect == "" {
		a.mu.Lock()
		ep, ok := a.warm[in.EnvID]
		a.mu.Unlock()
		if ok && ep.BuildID == env.ActiveBuildID {
			return ep, nil
		}
	}
	active, err := store.ActiveTwinBuild(ctx, a.DB, env)
	if errors.Is(err, store.ErrNotFound) {
		return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("environment "+env.Slug+" has no build yet", ErrTypeBadInput, err)
	}
	if err != nil {
		return TwinEndpoint{}, err
	}
	if a.Twins == nil {
		return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("no twin directory is configured", ErrTypeTwinUnavailable, nil)
	}
	st, err := a.Twins.WakeTwin(ctx, twinstate.Wake{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Active: active, Suspect: in.Suspect, Wait: true})
	if err != nil {
		return TwinEndpoint{}, fmt.Errorf("wake twin of %s: %w", env.ID, err)
	}
	if st.State != twinstate.Ready || st.Addr == "" {
		msg := fmt.Sprintf("twin of %s build %s is %s: %s", env.ID, active.BuildID, st.State, st.Error)
		return TwinEndpoint{}, temporal.NewNonRetryableApplicationError(msg, ErrTypeTwinUnavailable, nil)
	}
	ep := TwinEndpoint{Addr: st.Addr, BuildID: active.BuildID, HandleID: st.HandleID}
	a.mu.Lock()
	if a.warm == nil {
		a.warm = map[string]TwinEndpoint{}
	}
	a.warm[env.ID] = ep
	a.mu.Unlock()
	return ep, nil
}

// OpenOnTwinInput opens one session on a twin.
type OpenOnTwinInput struct {
	Addr      string
	SessionID string
	Spec      rpc.SessionSpec
}

// OpenOnTwinResult is the opened session's receipts.
type OpenOnTwinResult struct {
	Receipts  rpc.Receipts
	StateHash string
}

// OpenOnTwin opens the session on the twin at in.Addr. A twin that does not answer is a retryable
// ErrTypeTwinUnavailable (the workflow then wakes it); a refused spec is a non-retryable ErrTypeSessionSpec. A
// session that already exists on the twin (a retried open whose answer was lost) is read back, not reopened.
func (a *Sessions) OpenOnTwin(ctx context.Context, in OpenOnTwinInput) (OpenOnTwinResult, error) {
	c := a.rpc(in.Addr)
	var span trace.Span
	if a.Tracer != nil {
		ctx, span = a.Tracer.Tracer("doppel/activities").Start(ctx, "twin.open",
			trace.WithAttributes(attribute.String("doppel.session_id", in.SessionID)))
		defer span.End()
	}
	res, err := c.Open(ctx, rpc.OpenRequest{ID: in.SessionID, Spec: in.Spec})
	if err != nil && span != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	switch {
	case err == nil:
		return OpenOnTwinResult{Receipts: res.Receipts, StateHash: res.StateHash}, nil
	case errors.Is(err, rpc.ErrSessionExists):
		st, err := c.Session(ctx, in.SessionID)
		if err != nil {
			return OpenOnTwinResult{}, fmt.Errorf("read back session %s: %w", in.SessionID, err)
		}
		return OpenOnTwinResult{Receipts: st.Receipts, StateHash: st.StateHash}, nil
	case errors.Is(err, rpc.ErrBadSpec):
		return OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeSessionSpec, err)
	case rpc.IsRetryable(err):
		return OpenOnTwinResult{}, temporal.NewApplicationErrorWithCause(err.Error(), ErrTypeTwinUnavailable, err)
	}
	return OpenOnTwinResult{}, fmt.Errorf("open session %s on %s: %w", in.SessionID, in.Addr, err)
}

// CloseOnTwinInput drops a session's world on its twin.
type CloseOnTwinInput struct {
	Addr      string
	SessionID string
}

// CloseOnTwin drops the session's world on the twin; a twin that is gone or no longer holds it is fine.
func (a *Sessions) CloseOnTwin(ctx context.Context, in CloseOnTwinInput) error {
	_, err := a.rpc(in.Addr).Close(ctx, in.SessionID)
	if err == nil || errors.Is(err, rpc.ErrUnknownSession) || errors.Is(err, rpc.ErrUnreachable) {
		return nil
	}
	return fmt.Errorf("close session %s on %s: %w", in.SessionID, in.Addr, err)
}

// ReapInput asks to expire sessions idle for longer than Idle as of Now.
type ReapInput struct {
	Now  time.Time
	Idle time.Duration
	// Limit bounds how many sessions one run expires (default 1000); the rest wait for the next run.
	Limit int
}

// ReapResult lists what a reap did.
type ReapResult struct {
	Expired  []string
	Extended int
}

// Reaper expires idle sessions and drops their worlds (toolplane.Plane is it).
type Reaper interface {
	Reap(ctx context.Context, now time.Time, idle time.Duration, limit int) (expired []string, extended int, err error)
}

// ReapIdleSessions expires open sessions whose last activity is older than in.Idle, through the tool plane's
// reaper, so the reaper and the world drop exist once.
func (a *Sessions) ReapIdleSessions(ctx context.Context, in ReapInput) (ReapResult, error) {
	if in.Idle <= 0 {
		return ReapResult{}, temporal.NewNonRetryableApplicationError("idle must be positive", ErrTypeBadInput, nil)
	}
	if a.Reaper == nil {
		return ReapResult{}, temporal.NewNonRetryableApplicationError("no session reaper is configured", ErrTypeBadInput, nil)
	}
	expired, extended, err := a.Reaper.Reap(ctx, in.Now, in.Idle, in.Limit)
	return ReapResult{Expired: expired, Extended: extended}, err
}
