package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// insertChunk bounds the rows of one multi-row INSERT.
const insertChunk = 500

// BatchResult is what InsertTraceBatch stored.
type BatchResult struct {
	Batch *schema.TraceBatch
	// Inserted are the trace ids new to the environment, in batch order.
	Inserted []string
	// Duplicates are the trace ids already present (or repeated within the batch), in batch order.
	Duplicates []string
	// Bytes is what the environment's collected_bytes grew by.
	Bytes int64
	// Env is the environment's row after its counters grew, read under the row lock the counters' update takes
	// (the transaction holds it until it ends).
	Env *schema.Environment
}

// InsertTraceBatch records one collect batch for batch.EnvID: the batch row, and a trace row
// for each id not already present in the environment. Ids already present — from an earlier
// batch, a concurrent one, or earlier in this one — are skipped and counted as duplicates.
// The environment's n_traces grows by the new ids, and collected_bytes by batch.Bytes when at
// least one id is new. All or nothing: it runs in one transaction (a savepoint inside db's).
//
// traceIDs are the batch's trace ids in order (Trace.Idx is the position). The caller sets
// EnvID, BlobKey, Bytes and ToolsSeen; ID, CreatedAt, NTraces and NDuplicates are filled in.
func InsertTraceBatch(ctx context.Context, db bun.IDB, batch *schema.TraceBatch, traceIDs []string) (*BatchResult, error) {
	return InsertTraceBatchSized(ctx, db, batch, traceIDs, nil)
}

// InsertTraceBatchSized is InsertTraceBatch knowing the bytes each trace takes in the batch (traceBytes, parallel
// to traceIDs; nil: unknown): duplicates cost nothing, so collected_bytes grows by batch.Bytes less the bytes of
// the duplicate traces, when at least one trace is new.
func InsertTraceBatchSized(ctx context.Context, db bun.IDB, batch *schema.TraceBatch, traceIDs []string, traceBytes []int64) (*BatchResult, error) {
	if traceBytes != nil && len(traceBytes) != len(traceIDs) {
		return nil, fmt.Errorf("store: insert trace batch: %w: %d trace sizes for %d traces", ErrInvalid, len(traceBytes), len(traceIDs))
	}
	if batch.EnvID == "" || batch.BlobKey == "" {
		return nil, fmt.Errorf("store: insert trace batch: %w: env id and blob key are required", ErrInvalid)
	}
	for i, id := range traceIDs {
		if id == "" {
			return nil, fmt.Errorf("store: insert trace batch: %w: traces[%d].id is empty", ErrInvalid, i)
		}
	}
	if batch.ID == "" {
		batch.ID = schema.NewID(schema.PrefixTraceBatch)
	}
	batch.CreatedAt = now()
	batch.NTraces, batch.NDuplicates = 0, 0

	// First occurrence of each id within the batch.
	seen := make(map[string]bool, len(traceIDs))
	rows := make([]schema.Trace, 0, len(traceIDs))
	for i, id := range traceIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		rows = append(rows, schema.Trace{EnvID: batch.EnvID, TraceID: id, BatchID: batch.ID, Idx: int64(i), CreatedAt: batch.CreatedAt})
	}
	// Insert in key order so concurrent batches take row locks in one order (no deadlocks on PostgreSQL).
	slices.SortFunc(rows, func(a, b schema.Trace) int { return cmp.Compare(a.TraceID, b.TraceID) })

	res := &BatchResult{Batch: batch}
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		// The trace rows first (their batch is not a foreign key), so that the batch row is written once, counted.
		fresh := make(map[string]bool, len(rows))
		for start := 0; start < len(rows); start += insertChunk {
			chunk := rows[start:min(start+insertChunk, len(rows))]
			var got []string
			err := tx.NewInsert().Model(&chunk).
				On("CONFLICT (env_id, trace_id) DO NOTHING").
				Returning("trace_id").
				Scan(ctx, &got)
			if err != nil {
				return wrap(err, "insert traces for env %q", batch.EnvID)
			}
			for _, id := range got {
				fresh[id] = true
			}
		}
		dupSeen := map[string]bool{}
		dupBytes := int64(0)
		for i, id := range traceIDs {
			if fresh[id] && !dupSeen[id] {
				res.Inserted = append(res.Inserted, id)
			} else {
				res.Duplicates = append(res.Duplicates, id)
				if traceBytes != nil {
					dupBytes += traceBytes[i]
				}
			}
			dupSeen[id] = true
		}
		batch.NTraces, batch.NDuplicates = int64(len(res.Inserted)), int64(len(res.Duplicates))
		if _, err := tx.NewInsert().Model(batch).Exec(ctx); err != nil {
			return wrap(err, "insert trace batch for env %q", batch.EnvID)
		}
		bytes := int64(0)
		if batch.NTraces > 0 {
			bytes = max(batch.Bytes-dupBytes, 0)
		}
		res.Bytes = bytes
		// Last, so that concurrent batches of one environment wait for its row only from here to their commit.
		env, err := countBatch(ctx, tx, batch, batch.NTraces, bytes)
		res.Env = env
		return err
	})
	if err != nil {
		res.Inserted, res.Duplicates = nil, nil
		return nil, err
	}
	return res, nil
}

// HeldTraceIDs returns which of ids the environment already holds.
func HeldTraceIDs(ctx context.Context, db bun.IDB, envID string, ids []string) (map[string]bool, error) {
	held := map[string]bool{}
	for start := 0; start < len(ids); start += insertChunk {
		var got []string
		err := db.NewSelect().Model((*schema.Trace)(nil)).Column("trace_id").
			Where("env_id = ? AND trace_id IN (?)", envID, bun.In(ids[start:min(start+insertChunk, len(ids))])).
			Scan(ctx, &got)
		if err != nil {
			return nil, wrap(err, "held traces of env %q", envID)
		}
		for _, id := range got {
			held[id] = true
		}
	}
	return held, nil
}

// ListTraceBatches returns an environment's batches, oldest first.
func ListTraceBatches(ctx context.Context, db bun.IDB, envID string) ([]schema.TraceBatch, error) {
	batches := []schema.TraceBatch{}
	if err := db.NewSelect().Model(&batches).Where("env_id = ?", envID).Order("created_at ASC", "id ASC").Scan(ctx); err != nil {
		return nil, wrap(err, "list trace batches of env %q", envID)
	}
	return batches, nil
}

// ListTraces returns where each of an environment's traces is stored, ordered by trace id.
func ListTraces(ctx context.Context, db bun.IDB, envID string) ([]schema.Trace, error) {
	traces := []schema.Trace{}
	if err := db.NewSelect().Model(&traces).Where("env_id = ?", envID).Order("trace_id ASC").Scan(ctx); err != nil {
		return nil, wrap(err, "list traces of env %q", envID)
	}
	return traces, nil
}

// CountTraces returns how many distinct traces an environment holds.
func CountTraces(ctx context.Context, db bun.IDB, envID string) (int64, error) {
	n, err := db.NewSelect().Model((*schema.Trace)(nil)).Where("env_id = ?", envID).Count(ctx)
	if err != nil {
		return 0, wrap(err, "count traces of env %q", envID)
	}
	return int64(n), nil
}

// countBatch grows the environment's counters by a batch's new traces and bytes, stamping it with the batch's time,
// and answers its row as updated (locked until the transaction ends).
func countBatch(ctx context.Context, tx bun.Tx, batch *schema.TraceBatch, traces, bytes int64) (*schema.Environment, error) {
	var envs []schema.Environment
	err := tx.NewUpdate().Model(&envs).
		Set("n_traces = n_traces + ?", traces).
		Set("collected_bytes = collected_bytes + ?", bytes).
		Set("updated_at = ?", batch.CreatedAt).
		Where("id = ?", batch.EnvID).
		Returning("*").
		Scan(ctx)
	if err != nil {
		return nil, wrap(err, "count traces of env %q", batch.EnvID)
	}
	if len(envs) == 0 {
		return nil, fmt.Errorf("store: insert trace batch: env %q: %w", batch.EnvID, ErrNotFound)
	}
	return &envs[0], nil
}
