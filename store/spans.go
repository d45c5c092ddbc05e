package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// StageSpans stages spans (EnvID, ids, ConversationID, Bytes and Span set by the caller; ReceivedAt and Pending
// are set here), skipping those already staged: a span's ids are its key, so a resent export stages nothing
// twice. It answers how many were new. Rows are written in key order, so concurrent exports take their locks in
// one order.
func StageSpans(ctx context.Context, db bun.IDB, spans []schema.StagedSpan) (int, error) {
	if len(spans) == 0 {
		return 0, nil
	}
	rows := slices.Clone(spans)
	t := now()
	for i := range rows {
		if rows[i].EnvID == "" || rows[i].TraceID == "" || rows[i].SpanID == "" {
			return 0, fmt.Errorf("store: stage spans: %w: env, trace and span ids are required", ErrInvalid)
		}
		rows[i].ReceivedAt, rows[i].Pending = t, true
	}
	slices.SortFunc(rows, func(a, b schema.StagedSpan) int {
		if c := compareStr(a.EnvID, b.EnvID); c != 0 {
			return c
		}
		if c := compareStr(a.TraceID, b.TraceID); c != 0 {
			return c
		}
		return compareStr(a.SpanID, b.SpanID)
	})
	rows = slices.CompactFunc(rows, func(a, b schema.StagedSpan) bool {
		return a.EnvID == b.EnvID && a.TraceID == b.TraceID && a.SpanID == b.SpanID
	})
	added := 0
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		for start := 0; start < len(rows); start += insertChunk {
			chunk := rows[start:min(start+insertChunk, len(rows))]
			var got []string
			err := tx.NewInsert().Model(&chunk).On("CONFLICT (env_id, trace_id, span_id) DO NOTHING").
				Returning("span_id").Scan(ctx, &got)
			if err != nil {
				return wrap(err, "stage spans")
			}
			added += len(got)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return added, nil
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// EnvsWithPendingSpans answers the environments holding spans no trace was made from yet, by id.
func EnvsWithPendingSpans(ctx context.Context, db bun.IDB) ([]string, error) {
	var ids []string
	err := db.NewSelect().Model((*schema.StagedSpan)(nil)).ColumnExpr("DISTINCT env_id").Where("pending").
		Order("env_id").Scan(ctx, &ids)
	if err != nil {
		return nil, wrap(err, "environments with pending spans")
	}
	return ids, nil
}

// SpanRef is what grouping reads of a staged span.
type SpanRef struct {
	TraceID        string    `bun:"trace_id"`
	SpanID         string    `bun:"span_id"`
	ParentID       string    `bun:"parent_id"`
	ConversationID string    `bun:"conversation_id"`
	ReceivedAt     time.Time `bun:"received_at"`
	Pending        bool      `bun:"pending"`
}

// maxClosureRounds bounds PendingSpanClosure's widening.
const maxClosureRounds = 4

// PendingSpanClosure answers an environment's pending spans and every span sharing an OpenTelemetry trace or a
// conversation with them, transitively (a conversation spans traces, a trace spans conversations): the spans that
// decide which conversations the pending ones belong to and when those last grew. limit bounds the pending spans
// read, oldest first (0: all).
func PendingSpanClosure(ctx context.Context, db bun.IDB, envID string, limit int) ([]SpanRef, error) {
	var pending []SpanRef
	q := db.NewSelect().Model((*schema.StagedSpan)(nil)).
		Column("trace_id", "span_id", "parent_id", "conversation_id", "received_at", "pending").
		Where("env_id = ? AND pending", envID).Order("received_at", "trace_id", "span_id")
	if limit > 0 {
		q = q.Limit(int64(limit))
	}
	if err := q.Scan(ctx, &pending); err != nil {
		return nil, wrap(err, "pending spans of env %q", envID)
	}
	seen := map[[2]string]bool{}
	out := make([]SpanRef, 0, len(pending))
	traces, convs := map[string]bool{}, map[string]bool{}
	add := func(refs []SpanRef) (grew bool) {
		for _, r := range refs {
			k := [2]string{r.TraceID, r.SpanID}
			if seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, r)
			if !traces[r.TraceID] {
				traces[r.TraceID], grew = true, true
			}
			if r.ConversationID != "" && !convs[r.ConversationID] {
				convs[r.ConversationID], grew = true, true
			}
		}
		return grew
	}
	grew := add(pending)
	for round := 0; grew && round < maxClosureRounds; round++ {
		tids, cids := keys(traces), keys(convs)
		var more []SpanRef
		for start := 0; start < max(len(tids), len(cids)); start += insertChunk {
			t := tids[min(start, len(tids)):min(start+insertChunk, len(tids))]
			c := cids[min(start, len(cids)):min(start+insertChunk, len(cids))]
			q := db.NewSelect().Model((*schema.StagedSpan)(nil)).
				Column("trace_id", "span_id", "parent_id", "conversation_id", "received_at", "pending").
				Where("env_id = ?", envID).
				WhereGroup(" AND ", func(q *bun.SelectQuery) *bun.SelectQuery {
					if len(t) > 0 {
						q = q.WhereOr("trace_id IN (?)", bun.In(t))
					}
					if len(c) > 0 {
						q = q.WhereOr("conversation_id IN (?)", bun.In(c))
					}
					return q
				})
			var got []SpanRef
			if err := q.Scan(ctx, &got); err != nil {
				return nil, wrap(err, "spans related to pending ones in env %q", envID)
			}
			more = append(more, got...)
		}
		grew = add(more)
	}
	return out, nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// SpanKey names a staged span in an environment.
type SpanKey struct{ TraceID, SpanID string }

// StagedSpans reads the named spans of an environment, in key order.
func StagedSpans(ctx context.Context, db bun.IDB, envID string, keys []SpanKey) ([]schema.StagedSpan, error) {
	byTrace := map[string][]string{}
	for _, k := range keys {
		byTrace[k.TraceID] = append(byTrace[k.TraceID], k.SpanID)
	}
	var out []schema.StagedSpan
	for _, tid := range sortedKeys(byTrace) {
		ids := byTrace[tid]
		for start := 0; start < len(ids); start += insertChunk {
			var rows []schema.StagedSpan
			err := db.NewSelect().Model(&rows).Where("env_id = ? AND trace_id = ? AND span_id IN (?)", envID, tid,
				bun.In(ids[start:min(start+insertChunk, len(ids))])).Order("span_id").Scan(ctx)
			if err != nil {
				return nil, wrap(err, "staged spans of env %q", envID)
			}
			out = append(out, rows...)
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// MarkSpansAssembled clears pending on the named spans: a trace version was made from them.
func MarkSpansAssembled(ctx context.Context, db bun.IDB, envID string, keys []SpanKey) error {
	byTrace := map[string][]string{}
	for _, k := range keys {
		byTrace[k.TraceID] = append(byTrace[k.TraceID], k.SpanID)
	}
	for _, tid := range sortedKeys(byTrace) {
		ids := byTrace[tid]
		for start := 0; start < len(ids); start += insertChunk {
			_, err := db.NewUpdate().Model((*schema.StagedSpan)(nil)).Set("pending = ?", false).
				Where("env_id = ? AND trace_id = ? AND span_id IN (?) AND pending", envID, tid, bun.In(ids[start:min(start+insertChunk, len(ids))])).
				Exec(ctx)
			if err != nil {
				return wrap(err, "mark spans of env %q assembled", envID)
			}
		}
	}
	return nil
}

// StagedBytes answers the bytes of an environment's pending spans.
func StagedBytes(ctx context.Context, db bun.IDB, envID string) (int64, error) {
	var n int64
	err := db.NewSelect().Model((*schema.StagedSpan)(nil)).ColumnExpr("COALESCE(SUM(bytes), 0)").
		Where("env_id = ? AND pending", envID).Scan(ctx, &n)
	if err != nil {
		return 0, wrap(err, "staged bytes of env %q", envID)
	}
	return n, nil
}
