package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// VersionResult is what InsertTraceVersions stored.
type VersionResult struct {
	Batch *schema.TraceBatch
	// Inserted are the trace ids new to the environment; Replaced those it held, whose row now names this batch
	// (a new version of the trace). Both in batch order.
	Inserted, Replaced []string
	// Env is the environment's row after its counters grew, read under the row lock the update takes.
	Env *schema.Environment
}

// InsertTraceVersions records a batch of traces assembled from spans (POST /v1/traces): the batch row, a trace row
// for each id new to the environment, and for each id it holds already the row pointed at this batch, so a build
// reads the newest version (a conversation that grew after it was first assembled). The environment's n_traces
// grows by the new ids only; collected_bytes by batch.Bytes. batch.NTraces counts new and replaced traces. All or
// nothing, in one transaction (a savepoint inside db's). traceIDs must be unique.
func InsertTraceVersions(ctx context.Context, db bun.IDB, batch *schema.TraceBatch, traceIDs []string) (*VersionResult, error) {
	if batch.EnvID == "" || batch.BlobKey == "" {
		return nil, fmt.Errorf("store: insert trace versions: %w: env id and blob key are required", ErrInvalid)
	}
	if batch.ID == "" {
		batch.ID = schema.NewID(schema.PrefixTraceBatch)
	}
	batch.CreatedAt = now()
	rows := make([]schema.Trace, 0, len(traceIDs))
	for i, id := range traceIDs {
		if id == "" {
			return nil, fmt.Errorf("store: insert trace versions: %w: traces[%d].id is empty", ErrInvalid, i)
		}
		rows = append(rows, schema.Trace{EnvID: batch.EnvID, TraceID: id, BatchID: batch.ID, Idx: int64(i), CreatedAt: batch.CreatedAt})
	}
	slices.SortFunc(rows, func(a, b schema.Trace) int { return cmp.Compare(a.TraceID, b.TraceID) })
	for i := 1; i < len(rows); i++ {
		if rows[i].TraceID == rows[i-1].TraceID {
			return nil, fmt.Errorf("store: insert trace versions: %w: trace id %q given twice", ErrInvalid, rows[i].TraceID)
		}
	}
	res := &VersionResult{Batch: batch}
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		fresh := map[string]bool{}
		for start := 0; start < len(rows); start += insertChunk {
			chunk := rows[start:min(start+insertChunk, len(rows))]
			var got []string
			if err := tx.NewInsert().Model(&chunk).On("CONFLICT (env_id, trace_id) DO NOTHING").Returning("trace_id").Scan(ctx, &got); err != nil {
				return wrap(err, "insert traces for env %q", batch.EnvID)
			}
			for _, id := range got {
				fresh[id] = true
			}
		}
		for _, r := range rows {
			if fresh[r.TraceID] {
				continue
			}
			_, err := tx.NewUpdate().Model((*schema.Trace)(nil)).Set("batch_id = ?", batch.ID).Set("idx = ?", r.Idx).
				Where("env_id = ? AND trace_id = ?", batch.EnvID, r.TraceID).Exec(ctx)
			if err != nil {
				return wrap(err, "point trace %q of env %q at its new version", r.TraceID, batch.EnvID)
			}
		}
		for _, id := range traceIDs {
			if fresh[id] {
				res.Inserted = append(res.Inserted, id)
			} else {
				res.Replaced = append(res.Replaced, id)
			}
		}
		batch.NTraces, batch.NDuplicates = int64(len(traceIDs)), 0
		if _, err := tx.NewInsert().Model(batch).Exec(ctx); err != nil {
			return wrap(err, "insert trace batch for env %q", batch.EnvID)
		}
		env, err := countBatch(ctx, tx, batch, int64(len(res.Inserted)), batch.Bytes)
		res.Env = env
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// SetEnvInputs makes inputsKey the environment's current build inputs when its inputs are still prevKey (the ones
// the caller read and built inputsKey from); otherwise it changes nothing and fails with ErrConflict.
func SetEnvInputs(ctx context.Context, db bun.IDB, envID, prevKey, inputsKey string) error {
	res, err := db.NewUpdate().Model((*schema.Environment)(nil)).
		Set("inputs_key = ?", inputsKey).Set("updated_at = ?", now()).
		Where("id = ? AND inputs_key = ?", envID, prevKey).Exec(ctx)
	if err != nil {
		return wrap(err, "set inputs of env %q", envID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: set inputs of env %q: %w: its inputs changed since they were read, or it is gone", envID, ErrConflict)
	}
	return nil
}
