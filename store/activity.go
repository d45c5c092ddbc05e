package store

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

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
