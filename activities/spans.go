package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/envinputs"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/otlp"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

// Defaults of Spans.
const (
	// DefaultSettleBatch bounds the conversations one AssembleSettled run assembles; the workflow runs it again at
	// once when more were ready.
	DefaultSettleBatch = 500
	// maxPendingRead bounds the pending spans one run reads, oldest first.
	maxPendingRead = 50000
	// batchBlobPrefix is where assembled batches go, beside collect's (api.DefaultCollectBlobPrefix).
	batchBlobPrefix = "batches"
)

// BuildScheduler is told that an environment has new traces (workflows.Starter debounces its rebuild).
type BuildScheduler interface {
	ScheduleBuild(ctx context.Context, workspaceID, envID string) error
}

// Spans holds what span assembly needs: OTLP spans staged by POST /v1/traces become traces once their
// conversation settles. The worker registers a filled one.
type Spans struct {
	DB    *bun.DB
	Blobs envinputs.Blobs
	// Scheduler is told of environments that gained traces (ScheduleRebuild).
	Scheduler BuildScheduler
	// TaskAttribute is the span attribute naming a trace's task (config otlp.task_attribute).
	TaskAttribute string
	// Batch bounds the conversations one run assembles (default DefaultSettleBatch).
	Batch int
	Log   *slog.Logger
	// Now is the clock settling is measured by (default time.Now).
	Now func() time.Time
}

// SettleResult is what one AssembleSettled run did and what it leaves.
type SettleResult struct {
	// Assembled counts the traces stored (new ones, and new versions of traces held); Failed the conversations
	// whose spans could not make a trace (logged; their spans stay staged, so a later span tries them again).
	Assembled, Failed int
	// Pending counts the conversations whose spans have not settled yet; NextIn is how long until the first of
	// them settles (0 when none is pending).
	Pending int
	NextIn  time.Duration
	// More is true when settled conversations were left for the next run (Batch reached).
	More bool
}

func (s *Spans) logger() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Spans) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// settling is one conversation's spans and when the last of them arrived.
type settling struct {
	key     string
	spans   []store.SpanKey
	last    time.Time
	pending bool
}

// AssembleSettled makes a trace of each of the environment's conversations with pending spans of which none
// arrived for settle: all its staged spans are assembled (ingest.Assemble), the traces stored as one batch as
// collect stores one (a conversation assembled before gets a new version of its trace), the spans marked, and the
// tool definitions they carried joined to the environment's build inputs. Conversations still receiving spans
// are left for a later run, whose time it answers.
func (s *Spans) AssembleSettled(ctx context.Context, envID string, settle time.Duration) (SettleResult, error) {
	var res SettleResult
	refs, err := store.PendingSpanClosure(ctx, s.DB, envID, maxPendingRead)
	if err != nil {
		return res, err
	}
	now := s.now()
	ready, waiting := group(refs, now, settle)
	res.Pending = len(waiting)
	for _, w := range waiting {
		if d := w.last.Add(settle).Sub(now); res.NextIn == 0 || d < res.NextIn {
			res.NextIn = max(d, time.Millisecond)
		}
	}
	if len(ready) == 0 {
		return res, nil
	}
	limit := s.Batch
	if limit <= 0 {
		limit = DefaultSettleBatch
	}
	if len(ready) > limit {
		ready, res.More = ready[:limit], true
	}
	env, err := store.GetEnvByID(ctx, s.DB, envID)
	if errors.Is(err, store.ErrNotFound) {
		return SettleResult{}, nil // deleted meanwhile: its spans went with it
	}
	if err != nil {
		return res, fmt.Errorf("settle spans of %s: %w", envID, err)
	}
	var keys []store.SpanKey
	for _, r := range ready {
		keys = append(keys, r.spans...)
	}
	rows, err := store.StagedSpans(ctx, s.DB, envID, keys)
	if err != nil {
		return res, err
	}
	byKey := make(map[store.SpanKey]*schema.StagedSpan, len(rows))
	for i := range rows {
		byKey[store.SpanKey{TraceID: rows[i].TraceID, SpanID: rows[i].SpanID}] = &rows[i]
	}
	var (
		encoded [][]byte
		ids     []string
		tools   []ingest.ToolDef
		called  []string
		size    int
	)
	for _, r := range ready {
		spans := make([]ingest.Span, 0, len(r.spans))
		for _, k := range r.spans {
			row := byKey[k]
			if row == nil {
				continue
			}
			sp, err := otlp.Span(row.Span)
			if err != nil {
				s.logger().Warn("settle: a staged span does not decode", "env", envID, "span", k.SpanID, "error", err)
				continue
			}
			spans = append(spans, sp)
		}
		id := ingest.TraceID(r.key, spans, s.TaskAttribute)
		a, err := ingest.Assemble(id, spans)
		if err != nil {
			res.Failed++
			s.logger().Warn("settle: a conversation's spans make no trace", "env", envID, "conversation", r.key, "spans", len(spans), "error", err)
			continue
		}
		enc := ingest.AppendTrace(nil, &a.Trace)
		encoded, ids = append(encoded, enc), append(ids, a.Trace.ID)
		size += len(enc)
		tools = ingest.AddToolDefs(tools, a.Tools)
		for _, c := range ingestCalls(&a.Trace) {
			if !slices.Contains(called, c) {
				called = append(called, c)
			}
		}
	}
	if len(encoded) > 0 {
		if err := s.store(ctx, env, encoded, ids, called, keys); err != nil {
			return res, err
		}
	} else if err := store.MarkSpansAssembled(ctx, s.DB, envID, keys); err != nil {
		return res, err
	}
	res.Assembled = len(encoded)
	if len(tools) > 0 && s.Blobs != nil {
		if _, err := envinputs.AddTools(ctx, s.DB, s.Blobs, envID, tools); err != nil {
			return res, fmt.Errorf("settle spans of %s: tool definitions: %w", envID, err)
		}
	}
	return res, nil
}

// store writes the assembled traces as one batch blob (a collect body of the environment's project) and records
// it — new traces, new versions of traces held — marking the spans they were made from, in one transaction.
func (s *Spans) store(ctx context.Context, env *schema.Environment, encoded [][]byte, ids, called []string, spans []store.SpanKey) error {
	body := ingest.AppendBody(nil, env.Name, encoded)
	data, err := ingest.EncodeBodyBlob(body)
	if err != nil {
		return err
	}
	key, err := blob.PutContent(ctx, s.Blobs, batchBlobPrefix+"/"+env.WorkspaceID, data, ingest.BlobContentType)
	if err != nil {
		return fmt.Errorf("settle spans of %s: store batch: %w", env.ID, err)
	}
	slices.Sort(called)
	return s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		batch := &schema.TraceBatch{EnvID: env.ID, BlobKey: key, Bytes: int64(len(body)), ToolsSeen: called}
		res, err := store.InsertTraceVersions(ctx, tx, batch, ids)
		if err != nil {
			return err
		}
		if err := store.MarkSpansAssembled(ctx, tx, env.ID, spans); err != nil {
			return err
		}
		if int64(len(called)) > res.Env.NTools { // until a build counts the catalog, as collect does
			res.Env.NTools = int64(len(called))
			return store.UpdateEnv(ctx, tx, res.Env, "n_tools")
		}
		return nil
	})
}

// ingestCalls answers the names of the tools t calls.
func ingestCalls(t *trace.Trace) []string {
	var names []string
	for _, m := range t.Messages {
		for _, tc := range m.ToolCalls {
			names = append(names, tc.Function.Name)
		}
	}
	return names
}

// group splits the spans into conversations (ingest.Conversations) and answers those with pending spans: ready
// when none of their spans arrived within settle of now, in key order, else waiting.
func group(refs []store.SpanRef, now time.Time, settle time.Duration) (ready, waiting []settling) {
	meta := make([]ingest.SpanMeta, len(refs))
	for i, r := range refs {
		meta[i] = ingest.SpanMeta{TraceID: r.TraceID, SpanID: r.SpanID, Parent: r.ParentID, Conversation: r.ConversationID}
	}
	byKey := map[string]*settling{}
	var order []string
	for i, k := range ingest.Conversations(meta) {
		g := byKey[k]
		if g == nil {
			g = &settling{key: k}
			byKey[k] = g
			order = append(order, k)
		}
		r := refs[i]
		g.spans = append(g.spans, store.SpanKey{TraceID: r.TraceID, SpanID: r.SpanID})
		if r.ReceivedAt.After(g.last) {
			g.last = r.ReceivedAt
		}
		g.pending = g.pending || r.Pending
	}
	slices.Sort(order)
	for _, k := range order {
		g := byKey[k]
		switch {
		case !g.pending:
		case !g.last.Add(settle).After(now):
			ready = append(ready, *g)
		default:
			waiting = append(waiting, *g)
		}
	}
	return ready, waiting
}

// ScheduleRebuild tells the build scheduler the environment gained traces (a debounced rebuild, as collect's).
func (s *Spans) ScheduleRebuild(ctx context.Context, envID string) error {
	if s.Scheduler == nil {
		return nil
	}
	env, err := store.GetEnvByID(ctx, s.DB, envID)
	if errors.Is(err, store.ErrNotFound) {
		return nil // deleted meanwhile: nothing to build
	}
	if err != nil {
		return fmt.Errorf("schedule the rebuild of %s: %w", envID, err)
	}
	return s.Scheduler.ScheduleBuild(ctx, env.WorkspaceID, envID)
}
