package store

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// FidelityCount is a session's calls with one fidelity label: how many, how many the tool answered with its own
// error, how many were downgraded.
type FidelityCount struct {
	Fidelity   string `bun:"fidelity"`
	N          int64  `bun:"n"`
	Errors     int64  `bun:"errors"`
	Downgraded int64  `bun:"downgraded"`
}

// CountCalls counts a session's journaled calls per fidelity label, in label order.
func CountCalls(ctx context.Context, db bun.IDB, sessionID string) ([]FidelityCount, error) {
	var out []FidelityCount
	err := db.NewSelect().Model((*schema.Call)(nil)).
		ColumnExpr("fidelity, COUNT(*) AS n").
		ColumnExpr("SUM(CASE WHEN error THEN 1 ELSE 0 END) AS errors").
		ColumnExpr("SUM(CASE WHEN downgraded THEN 1 ELSE 0 END) AS downgraded").
		Where("session_id = ?", sessionID).Group("fidelity").Order("fidelity").Scan(ctx, &out)
	if err != nil {
		return nil, fmt.Errorf("store: count calls of session %s: %w", sessionID, err)
	}
	return out, nil
}

// LastCall returns a session's last journaled call (its state hash and time only), nil when it has none.
func LastCall(ctx context.Context, db bun.IDB, sessionID string) (*schema.Call, error) {
	var last []schema.Call
	if err := db.NewSelect().Model(&last).Column("state_hash", "created_at").Where("session_id = ?", sessionID).
		Order("seq DESC").Limit(1).Scan(ctx); err != nil {
		return nil, fmt.Errorf("store: last call of session %s: %w", sessionID, err)
	}
	if len(last) == 0 {
		return nil, nil
	}
	return &last[0], nil
}

// LastActivity is when a session was last used: its last journaled call, else its last_used_at.
func LastActivity(ctx context.Context, db bun.IDB, s *schema.Session) (time.Time, error) {
	c, err := LastCall(ctx, db, s.ID)
	if err != nil {
		return time.Time{}, err
	}
	last := s.LastUsedAt
	if c != nil && c.CreatedAt.After(last) {
		last = c.CreatedAt
	}
	return last.UTC(), nil
}

// DueSessions returns open sessions whose recorded expiry is before now, oldest expiry first, at most limit.
func DueSessions(ctx context.Context, db bun.IDB, now time.Time, limit int) ([]schema.Session, error) {
	return DueSessionsOf(ctx, db, "", now, limit)
}

// DueSessionsOf is DueSessions of one environment ("" for every environment).
func DueSessionsOf(ctx context.Context, db bun.IDB, envID string, now time.Time, limit int) ([]schema.Session, error) {
	var due []schema.Session
	q := db.NewSelect().Model(&due).Where("status = ? AND expires_at < ?", schema.SessionOpen, now)
	if envID != "" {
		q = q.Where("env_id = ?", envID)
	}
	err := q.Order("expires_at ASC").Limit(int64(limit)).Scan(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: find idle sessions: %w", err)
	}
	return due, nil
}

// ExtendSession moves an open session's expiry to until and records its last use.
func ExtendSession(ctx context.Context, db bun.IDB, id string, until, lastUsed time.Time) error {
	if _, err := db.NewUpdate().Model((*schema.Session)(nil)).
		Set("expires_at = ?", until).Set("last_used_at = ?", lastUsed).
		Where("id = ? AND status = ?", id, schema.SessionOpen).Exec(ctx); err != nil {
		return fmt.Errorf("store: extend session %s: %w", id, err)
	}
	return nil
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
	if err != nil {
		return fmt.Errorf("store: snapshot session %s: %w", id, err)
	}
	return nil
}
