package store

import (
	"context"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// CountOpenSessions counts the sessions whose status is open, in every workspace (for /metrics).
func CountOpenSessions(ctx context.Context, db bun.IDB) (int64, error) {
	n, err := db.NewSelect().Model((*schema.Session)(nil)).Where("status = ?", schema.SessionOpen).Count(ctx)
	if err != nil {
		return 0, wrap(err, "count open sessions")
	}
	return int64(n), nil
}

// CountTwinStates counts environments by the twin state last recorded for them (for /metrics).
func CountTwinStates(ctx context.Context, db bun.IDB) (map[string]int64, error) {
	var rows []struct {
		State string `bun:"twin_state"`
		N     int64  `bun:"n"`
	}
	err := db.NewSelect().Model((*schema.Environment)(nil)).ColumnExpr("twin_state").ColumnExpr("COUNT(*) AS n").
		Group("twin_state").Scan(ctx, &rows)
	if err != nil {
		return nil, wrap(err, "count twin states")
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.State] = r.N
	}
	return out, nil
}
