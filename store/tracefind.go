package store

import (
	"context"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// FindTrace returns where an environment holds a trace: its row and its batch's. A trace the environment does not
// hold is ErrNotFound.
func FindTrace(ctx context.Context, db bun.IDB, envID, traceID string) (*schema.Trace, *schema.TraceBatch, error) {
	t := &schema.Trace{}
	if err := db.NewSelect().Model(t).Where("env_id = ? AND trace_id = ?", envID, traceID).Scan(ctx); err != nil {
		return nil, nil, wrap(err, "trace %q of env %q", traceID, envID)
	}
	b := &schema.TraceBatch{}
	if err := db.NewSelect().Model(b).Where("id = ?", t.BatchID).Scan(ctx); err != nil {
		return nil, nil, wrap(err, "batch %q of trace %q", t.BatchID, traceID)
	}
	return t, b, nil
}
