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
