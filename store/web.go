package store

import (
	"context"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// WebSecret returns the web session secret named id, storing candidate as it when none is stored yet: every process
// that asks gets the one stored first, and a restart gets it again.
func WebSecret(ctx context.Context, db bun.IDB, id, candidate string) (string, error) {
	row := &schema.WebSecret{ID: id, Secret: candidate, CreatedAt: now()}
	if _, err := db.NewInsert().Model(row).On("CONFLICT (id) DO NOTHING").Exec(ctx); err != nil {
		return "", wrap(err, "store web secret %q", id)
	}
	got := new(schema.WebSecret)
	if err := db.NewSelect().Model(got).Where("id = ?", id).Scan(ctx); err != nil {
		return "", wrap(err, "read web secret %q", id)
	}
	return got.Secret, nil
}

// SignOutWeb records that the web session jti was signed out; its JWT expires at exp. Signing out twice is no error.
// Records of sessions that have expired since are dropped.
func SignOutWeb(ctx context.Context, db bun.IDB, jti string, exp time.Time) error {
	row := &schema.WebSignout{JTI: jti, ExpiresAt: exp.UTC()}
	if _, err := db.NewInsert().Model(row).On("CONFLICT (jti) DO NOTHING").Exec(ctx); err != nil {
		return wrap(err, "sign out web session")
	}
	if _, err := db.NewDelete().Model((*schema.WebSignout)(nil)).Where("expires_at < ?", now()).Exec(ctx); err != nil {
		return wrap(err, "drop expired web sign-outs")
	}
	return nil
}

// GetWebKey returns the key a web session was signed in with (by id, whatever its workspace: the caller checks it)
// and whether the session jti was signed out, in one query.
func GetWebKey(ctx context.Context, db bun.IDB, keyID, jti string) (*schema.APIKey, bool, error) {
	var row struct {
		schema.APIKey `bun:",extend"`
		SignedOut     bool `bun:"signed_out"`
	}
	err := db.NewSelect().Model(&row).ColumnExpr("?TableAlias.*").
		ColumnExpr("EXISTS (SELECT 1 FROM web_signouts AS o WHERE o.jti = ?) AS signed_out", jti).
		Where("?TableAlias.id = ?", keyID).Scan(ctx)
	if err != nil {
		return nil, false, wrap(err, "get key %q", keyID)
	}
	return &row.APIKey, row.SignedOut, nil
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
		return nil, nil, wrap(err, "count calls of %d sessions", len(ids))
	}
	var last []SessionLastCall
	err = db.NewSelect().TableExpr("calls AS c").ColumnExpr("c.session_id, c.state_hash, c.created_at").
		Join("JOIN (SELECT session_id, MAX(seq) AS seq FROM calls WHERE session_id IN (?) GROUP BY session_id) AS m", bun.In(ids)).
		JoinOn("m.session_id = c.session_id AND m.seq = c.seq").Scan(ctx, &last)
	if err != nil {
		return nil, nil, wrap(err, "last calls of %d sessions", len(ids))
	}
	return counts, last, nil
}
