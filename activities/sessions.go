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

// TwinEndpoint is where an environment's ready twin answers, and the build it serves.
type TwinEndpoint struct {
	Addr    string
	BuildID string
}

// TwinWaiter wakes an environment's twin when it is stopped and waits until it is ready: the TwinWorkflow's
// wake, seen from a session open.
type TwinWaiter interface {
	WaitTwin(ctx context.Context, envID string) (TwinEndpoint, error)
}

// Sessions holds the dependencies of the session activities: opening a session on its twin, closing it,
// and reaping idle ones.
type Sessions struct {
	DB *bun.DB
	// Twins wakes and waits for twins; nil means only a twin the database already reports ready is used.
	Twins TwinWaiter
	// HTTP is the twin RPC client; nil means twinrpc.NewHTTPClient().
	HTTP *http.Client
	Log  *slog.Logger

	once sync.Once
	hc   *http.Client
}

func (a *Sessions) rpc(addr string) *twinrpc.Client {
	a.once.Do(func() {
		a.hc = a.HTTP
		if a.hc == nil {
			a.hc = twinrpc.NewHTTPClient()
		}
	})
	return twinrpc.NewClient(addr, a.hc)
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
	// Wake skips the database's report and asks Twins (the reported twin did not answer).
	Wake bool
}

// FindTwin answers where the environment's twin is: the ready endpoint the database holds (cheap: the warm
// path), or, when there is none or in.Wake is set, the endpoint Twins reports after waking it.
func (a *Sessions) FindTwin(ctx context.Context, in FindTwinInput) (TwinEndpoint, error) {
	env, err := store.GetEnvByID(ctx, a.DB, in.EnvID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return TwinEndpoint{}, temporal.NewNonRetryableApplicationError("environment "+in.EnvID+" not found", ErrTypeBadInput, err)
		}
		return TwinEndpoint{}, err
	}
	if !in.Wake && env.TwinState == schema.TwinReady && env.TwinEndpoint != "" {
		return TwinEndpoint{Addr: env.TwinEndpoint, BuildID: env.ActiveBuildID}, nil
	}
	if a.Twins == nil {
		return TwinEndpoint{}, temporal.NewApplicationError("twin of "+in.EnvID+" is "+env.TwinState+" and no twin waiter is configured", ErrTypeTwinUnavailable)
	}
	ep, err := a.Twins.WaitTwin(ctx, in.EnvID)
	if err != nil {
		return TwinEndpoint{}, fmt.Errorf("wait for twin of %s: %w", in.EnvID, err)
	}
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
		if env, err := store.GetEnvByID(ctx, a.DB, s.EnvID); err == nil && env.TwinEndpoint != "" {
			if err := a.CloseOnTwin(ctx, CloseOnTwinInput{Addr: env.TwinEndpoint, SessionID: s.ID}); err != nil {
				a.log().Warn("expired session's world not dropped on its twin", "session", s.ID, "err", err)
			}
		}
	}
	return res, nil
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
