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
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twinrpc"
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

// TwinWake asks an environment's twin directory (the TwinWorkflow) for a build's twin, booting it when it is
// stopped.
type TwinWake struct {
	EnvID string
	// Active is the environment's active build; it starts the environment's TwinWorkflow when none runs.
	Active TwinBuild
	// Build is the build whose twin is wanted; zero means Active.
	Build TwinBuild
	// Suspect is the handle id of a twin the caller could not reach: it is checked and restarted if dead.
	Suspect string
	// Wait answers only once the twin is ready or failed.
	Wait bool
}

// TwinState is a build's twin as the directory sees it.
type TwinState struct {
	State    string // stopped, booting, ready or failed (the TwinWorkflow's states)
	Addr     string // when ready
	BuildID  string
	HandleID string
	// Error and ErrorType say why a failed twin failed (ErrorType is one of the twin activities' error types).
	Error     string
	ErrorType string
}

// Twin states a TwinDirectory reports.
const (
	TwinStateReady   = "ready"
	TwinStateBooting = "booting"
	TwinStateFailed  = "failed"
	TwinStateStopped = "stopped"
)

// TwinDirectory finds environments' twins: the TwinWorkflow seen from sessions (workflows.TwinDirectory is it).
type TwinDirectory interface {
	// WakeTwin boots the wanted build's twin if it is stopped and answers its state.
	WakeTwin(ctx context.Context, w TwinWake) (TwinState, error)
	// RunningTwins answers the environment's twins that are ready, by build id, without booting any.
	RunningTwins(ctx context.Context, envID string) (map[string]TwinState, error)
}

// ActiveTwinBuild returns the environment's active build as the twin activities name it, or an error wrapping
// store.ErrNotFound when it has none.
func ActiveTwinBuild(ctx context.Context, db bun.IDB, env *schema.Environment) (TwinBuild, error) {
	if env.ActiveBuildID == "" {
		return TwinBuild{}, fmt.Errorf("environment %s has no active build: %w", env.ID, store.ErrNotFound)
	}
	b, err := store.GetBuildByID(ctx, db, env.ActiveBuildID)
	if err != nil {
		return TwinBuild{}, err
	}
	return TwinBuildOf(b), nil
}

// TwinBuildOf names a build row's bundle for the twin activities.
func TwinBuildOf(b *schema.Build) TwinBuild {
	return TwinBuild{BuildID: b.ID, BundleKey: b.BundleKey, BundleHash: b.BundleHash}
}

// Sessions holds the dependencies of the session activities: opening a session on its twin, closing it,
// and reaping idle ones.
type Sessions struct {
	DB *bun.DB
	// Twins finds, wakes and waits for twins.
	Twins TwinDirectory
	// HTTP is the twin RPC client; nil means twinrpc.NewHTTPClient().
	HTTP *http.Client
	// Locals finds twins served in this process (the inproc driver), reached without HTTP; nil: none.
	Locals twinrpc.Locals
	Log    *slog.Logger

	once sync.Once
	hc   *http.Client
	mu   sync.Mutex
	warm map[string]TwinEndpoint // env id → the active build's ready twin, as last found
}

func (a *Sessions) rpc(addr string) *twinrpc.Client {
	a.once.Do(func() {
		a.hc = a.HTTP
		if a.hc == nil {
			a.hc = twinrpc.NewHTTPClient()
		}
	})
	return twinrpc.Dial(addr, a.hc, a.Locals)
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
	active, err := ActiveTwinBuild(ctx, a.DB, env)
	if errors.Is(err, store.ErrNotFound) {
		return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("environment "+env.Slug+" has no build yet", ErrTypeBadInput, err)
	}
	if err != nil {
		return TwinEndpoint{}, err
	}
	if a.Twins == nil {
		return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("no twin directory is configured", ErrTypeTwinUnavailable, nil)
	}
	st, err := a.Twins.WakeTwin(ctx, TwinWake{EnvID: env.ID, Active: active, Suspect: in.Suspect, Wait: true})
	if err != nil {
		return TwinEndpoint{}, fmt.Errorf("wake twin of %s: %w", env.ID, err)
	}
	if st.State != TwinStateReady || st.Addr == "" {
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
	Spec      twinrpc.SessionSpec
}

// OpenOnTwinResult is the opened session's receipts.
type OpenOnTwinResult struct {
	Receipts  twinrpc.Receipts
	StateHash string
}

// OpenOnTwin opens the session on the twin at in.Addr. A twin that does not answer is a retryable
// ErrTypeTwinUnavailable (the workflow then wakes it); a refused spec is a non-retryable ErrTypeSessionSpec. A
// session that already exists on the twin (a retried open whose answer was lost) is read back, not reopened.
func (a *Sessions) OpenOnTwin(ctx context.Context, in OpenOnTwinInput) (OpenOnTwinResult, error) {
	c := a.rpc(in.Addr)
	res, err := c.Open(ctx, twinrpc.OpenRequest{ID: in.SessionID, Spec: in.Spec})
	switch {
	case err == nil:
		return OpenOnTwinResult{Receipts: res.Receipts, StateHash: res.StateHash}, nil
	case errors.Is(err, twinrpc.ErrSessionExists):
		st, err := c.Session(ctx, in.SessionID)
		if err != nil {
			return OpenOnTwinResult{}, fmt.Errorf("read back session %s: %w", in.SessionID, err)
		}
		return OpenOnTwinResult{Receipts: st.Receipts, StateHash: st.StateHash}, nil
	case errors.Is(err, twinrpc.ErrBadSpec):
		return OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeSessionSpec, err)
	case twinrpc.IsRetryable(err):
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
	if err == nil || errors.Is(err, twinrpc.ErrUnknownSession) || errors.Is(err, twinrpc.ErrUnreachable) {
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

// ReapIdleSessions expires open sessions whose last activity (their last journaled call, or their opening) is
// older than in.Idle, drops their worlds on their twins, and moves the expiry of sessions that are still in
// use to their last call + Idle. The call path journals calls without touching the session row, so the row's
// expires_at is a lower bound this brings up to date.
func (a *Sessions) ReapIdleSessions(ctx context.Context, in ReapInput) (ReapResult, error) {
	if in.Idle <= 0 {
		return ReapResult{}, temporal.NewNonRetryableApplicationError("idle must be positive", ErrTypeBadInput, nil)
	}
	limit := in.Limit
	if limit <= 0 {
		limit = 1000
	}
	now := in.Now.UTC()
	var due []schema.Session
	err := a.DB.NewSelect().Model(&due).
		Where("status = ? AND expires_at < ?", schema.SessionOpen, now).
		Order("expires_at ASC").Limit(int64(limit)).Scan(ctx)
	if err != nil {
		return ReapResult{}, fmt.Errorf("find idle sessions: %w", err)
	}
	var res ReapResult
	for i := range due {
		s := &due[i]
		last, err := LastActivity(ctx, a.DB, s)
		if err != nil {
			return res, err
		}
		if until := last.Add(in.Idle); until.After(now) {
			if _, err := a.DB.NewUpdate().Model((*schema.Session)(nil)).
				Set("expires_at = ?", until).Set("last_used_at = ?", last).
				Where("id = ? AND status = ?", s.ID, schema.SessionOpen).Exec(ctx); err != nil {
				return res, fmt.Errorf("extend session %s: %w", s.ID, err)
			}
			res.Extended++
			continue
		}
		ended, err := store.EndSession(ctx, a.DB, s.ID, schema.SessionExpired)
		if err != nil {
			return res, fmt.Errorf("expire session %s: %w", s.ID, err)
		}
		if !ended {
			continue // closed meanwhile
		}
		res.Expired = append(res.Expired, s.ID)
		if err := SnapshotSession(ctx, a.DB, s.ID); err != nil {
			a.log().Warn("snapshot expired session's counters", "session", s.ID, "err", err)
		}
		a.dropWorld(ctx, s)
	}
	return res, nil
}

// dropWorld drops an ended session's world on its build's twin when that twin runs (a stopped twin holds no
// worlds; none is booted for this).
func (a *Sessions) dropWorld(ctx context.Context, s *schema.Session) {
	if a.Twins == nil {
		return
	}
	running, err := a.Twins.RunningTwins(ctx, s.EnvID)
	if err != nil {
		a.log().Warn("list running twins", "env", s.EnvID, "err", err)
		return
	}
	st, ok := running[s.BuildID]
	if !ok || st.Addr == "" {
		return
	}
	if err := a.CloseOnTwin(ctx, CloseOnTwinInput{Addr: st.Addr, SessionID: s.ID}); err != nil {
		a.log().Warn("expired session's world not dropped on its twin", "session", s.ID, "err", err)
	}
}

// LastActivity is when a session was last used: its last journaled call, else its last_used_at.
func LastActivity(ctx context.Context, db bun.IDB, s *schema.Session) (time.Time, error) {
	var calls []schema.Call
	err := db.NewSelect().Model(&calls).Column("created_at").
		Where("session_id = ?", s.ID).Order("seq DESC").Limit(1).Scan(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("last call of session %s: %w", s.ID, err)
	}
	last := s.LastUsedAt
	if len(calls) == 1 && calls[0].CreatedAt.After(last) {
		last = calls[0].CreatedAt
	}
	return last.UTC(), nil
}

// SnapshotSession writes a session's call counters, fidelity mix, last state hash and last use into its row.
func SnapshotSession(ctx context.Context, db bun.IDB, id string) error {
	_, err := db.NewUpdate().Model((*schema.Session)(nil)).
		Set("n_calls = (SELECT COUNT(*) FROM calls WHERE session_id = ?)", id).
		Set("n_errors = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND error)", id).
		Set("n_downgraded = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND downgraded)", id).
		Set("n_a_executed = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND fidelity = ?)", id, schema.FidelityAExecuted).
		Set("n_b_twin = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND fidelity = ?)", id, schema.FidelityBTwin).
		Set("n_b_replayed = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND fidelity = ?)", id, schema.FidelityBReplayed).
		Set("n_b_inferred = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND fidelity = ?)", id, schema.FidelityBInferred).
		Set("n_b_simulated = (SELECT COUNT(*) FROM calls WHERE session_id = ? AND fidelity = ?)", id, schema.FidelityBSimulated).
		Set("state_hash = COALESCE((SELECT state_hash FROM calls WHERE session_id = ? ORDER BY seq DESC LIMIT 1), state_hash)", id).
		Where("id = ?", id).Exec(ctx)
	return err
}
