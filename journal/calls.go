package journal

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// InsertCalls writes a batch of transcript entries with one multi-row INSERT. It does not touch the
// sessions rows: a session's counters, fidelity mix, last state hash and last activity are read from its
// calls, so the hot path costs one statement per batch whatever the number of sessions in it.
func InsertCalls(ctx context.Context, db bun.IDB, calls []schema.Call) error {
	if len(calls) == 0 {
		return nil
	}
	if _, err := db.NewInsert().Model(&calls).Exec(ctx); err != nil {
		return fmt.Errorf("insert %d calls: %w", len(calls), err)
	}
	return nil
}

// CallOptions tune a calls journal; zero values take Writer's defaults.
type CallOptions struct {
	MaxBatch      int
	Linger        time.Duration
	Workers       int
	CommitTimeout time.Duration
}

// NewCalls returns a group-commit Writer of transcript entries into db's calls table.
func NewCalls(db bun.IDB, o CallOptions) (*Writer[schema.Call], error) {
	return New(Options[schema.Call]{
		DB:            db,
		Insert:        InsertCalls,
		Direct:        true, // InsertCalls is one multi-row INSERT
		MaxBatch:      o.MaxBatch,
		Linger:        o.Linger,
		Workers:       o.Workers,
		CommitTimeout: o.CommitTimeout,
	})
}
