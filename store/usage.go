package store

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// Meter names.
const (
	MeterTaskMinutes = "task_minutes"
	MeterSessions    = "sessions"
	MeterCalls       = "calls"
	MeterQueries     = "queries"
)

// Period is the usage period a time falls in: its UTC month, "2006-01".
func Period(t time.Time) string { return t.UTC().Format("2006-01") }

// AddUsage adds amount to a workspace's meter for a period, creating the meter at 0 first.
// Concurrent adds are summed, never lost.
func AddUsage(ctx context.Context, db bun.IDB, workspaceID, period, meter string, amount float64) error {
	if period == "" || meter == "" {
		return fmt.Errorf("store: add usage: %w: period and meter are required", ErrInvalid)
	}
	m := &schema.UsageMeter{WorkspaceID: workspaceID, Period: period, Meter: meter, Amount: amount, UpdatedAt: now()}
	_, err := db.NewInsert().Model(m).
		On("CONFLICT (workspace_id, period, meter) DO UPDATE").
		Set("amount = ?TableAlias.amount + EXCLUDED.amount").
		Set("updated_at = EXCLUDED.updated_at").
		Exec(ctx)
	if err != nil {
		return wrap(err, "add usage %s/%s", period, meter)
	}
	return nil
}

// ListUsage returns a workspace's meters for a period, by meter name.
func ListUsage(ctx context.Context, db bun.IDB, workspaceID, period string) ([]schema.UsageMeter, error) {
	out := []schema.UsageMeter{}
	if err := db.NewSelect().Model(&out).Where("workspace_id = ? AND period = ?", workspaceID, period).Order("meter ASC").Scan(ctx); err != nil {
		return nil, wrap(err, "list usage %s", period)
	}
	return out, nil
}
