package journal

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// What a session's calls tell, read from the calls table the journal writes (its one home): counts per fidelity,
// the last call, the last activity, the calls in order and the last seq.

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
		return nil, fmt.Errorf("journal: count calls of session %s: %w", sessionID, err)
	}
	return out, nil
}

// LastCall returns a session's last journaled call (its state hash and time only), nil when it has none.
func LastCall(ctx context.Context, db bun.IDB, sessionID string) (*schema.Call, error) {
	var last []schema.Call
	if err := db.NewSelect().Model(&last).Column("state_hash", "created_at").Where("session_id = ?", sessionID).
		Order("seq DESC").Limit(1).Scan(ctx); err != nil {
		return nil, fmt.Errorf("journal: last call of session %s: %w", sessionID, err)
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

// ListCalls returns a session's calls with seq > afterSeq in seq order; limit ≤ 0 means all.
func ListCalls(ctx context.Context, db bun.IDB, sessionID string, afterSeq int64, limit int) ([]schema.Call, error) {
	out := []schema.Call{}
	q := db.NewSelect().Model(&out).Where("session_id = ? AND seq > ?", sessionID, afterSeq).Order("seq ASC")
	if limit > 0 {
		q = q.Limit(int64(limit))
	}
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("journal: list calls of session %q: %w", sessionID, err)
	}
	return out, nil
}

// LastSeq returns the highest seq journaled for a session, 0 when none.
func LastSeq(ctx context.Context, db bun.IDB, sessionID string) (int64, error) {
	var seq int64
	err := db.NewSelect().Model((*schema.Call)(nil)).ColumnExpr("COALESCE(MAX(seq), 0)").
		Where("session_id = ?", sessionID).Scan(ctx, &seq)
	if err != nil {
		return 0, fmt.Errorf("journal: last seq of session %q: %w", sessionID, err)
	}
	return seq, nil
}

// SessionCallCount is one session's journaled calls with one fidelity label.
type SessionCallCount struct {
	SessionID string `bun:"session_id"`
	FidelityCount
}

// SessionLastCall is a session's last journaled call: its state hash and time.
type SessionLastCall struct {
	SessionID string    `bun:"session_id"`
	StateHash string    `bun:"state_hash"`
	CreatedAt time.Time `bun:"created_at"`
}

// CountSessionsCalls counts the journaled calls of several sessions per fidelity label, and finds each one's last
// call, in two queries (the journal is the record: the session rows' counters may lag it).
func CountSessionsCalls(ctx context.Context, db bun.IDB, ids []string) ([]SessionCallCount, []SessionLastCall, error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	var counts []SessionCallCount
	err := db.NewSelect().Model((*schema.Call)(nil)).
		ColumnExpr("session_id, fidelity, COUNT(*) AS n").
		ColumnExpr("SUM(CASE WHEN error THEN 1 ELSE 0 END) AS errors").
		ColumnExpr("SUM(CASE WHEN downgraded THEN 1 ELSE 0 END) AS downgraded").
		Where("session_id IN (?)", bun.In(ids)).Group("session_id", "fidelity").Order("session_id", "fidelity").Scan(ctx, &counts)
	if err != nil {
		return nil, nil, fmt.Errorf("journal: count calls of %d sessions: %w", len(ids), err)
	}
	var last []SessionLastCall
	err = db.NewSelect().TableExpr("calls AS c").ColumnExpr("c.session_id, c.state_hash, c.created_at").
		Join("JOIN (SELECT session_id, MAX(seq) AS seq FROM calls WHERE session_id IN (?) GROUP BY session_id) AS m", bun.In(ids)).
		JoinOn("m.session_id = c.session_id AND m.seq = c.seq").Scan(ctx, &last)
	if err != nil {
		return nil, nil, fmt.Errorf("journal: last calls of %d sessions: %w", len(ids), err)
	}
	return counts, last, nil
}
