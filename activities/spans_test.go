package activities

import (
	"context"
	"encoding/json"
	"io"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/envinputs"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/otlp"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

type rebuilds struct {
	mu   sync.Mutex
	envs []string
}

func (r *rebuilds) ScheduleBuild(_ context.Context, _, envID string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.envs = append(r.envs, envID)
	return nil
}

// stageBodies stages the spans of OTLP export bodies in env, as POST /v1/traces does.
func stageBodies(t *testing.T, db bun.IDB, env *schema.Environment, bodies [][]byte) int {
	t.Helper()
	n := 0
	for _, b := range bodies {
		req, err := otlp.Decode(b, otlp.ContentTypeProtobuf)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range otlp.Extract(req, otlp.Options{TaskAttr: "doppel.task"}).Projects {
			rows := make([]schema.StagedSpan, len(p.Spans))
			for i, s := range p.Spans {
				rows[i] = schema.StagedSpan{EnvID: env.ID, TraceID: s.TraceID, SpanID: s.SpanID, ParentID: s.Parent, ConversationID: s.Conversation,
					Bytes: int64(len(s.Data)), Span: s.Data}
			}
			added, err := store.StageSpans(context.Background(), db, rows)
			if err != nil {
				t.Fatal(err)
			}
			n += added
		}
	}
	return n
}

// storedTraces reads every trace the environment holds, each from the batch its row names.
func storedTraces(t *testing.T, db bun.IDB, blobs envinputs.Blobs, envID string) map[string]trace.Trace {
	t.Helper()
	ctx := context.Background()
	rows, err := store.ListTraces(ctx, db, envID)
	if err != nil {
		t.Fatal(err)
	}
	batches, err := store.ListTraceBatches(ctx, db, envID)
	if err != nil {
		t.Fatal(err)
	}
	keyOf := map[string]string{}
	for _, b := range batches {
		keyOf[b.ID] = b.BlobKey
	}
	out := map[string]trace.Trace{}
	for _, r := range rows {
		rc, err := blobs.Get(ctx, keyOf[r.BatchID])
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(rc)
		rc.Close()
		b, err := ingest.DecodeBlob(data)
		if err != nil {
			t.Fatal(err)
		}
		out[r.TraceID] = b.Traces[r.Idx]
	}
	return out
}

// TestAssembleSettled stages tau retail's spans as the official SDK's exporter sends them and settles them on both
// backends: conversations whose last span is older than the settle time become traces equal to the collected
// ones, stored as collect stores a batch, with their tool definitions joined to the build inputs and the rebuild
// due; the rest wait, and the run says for how long. Running again stores nothing; a span arriving later makes a
// new version of its trace, counted once.
func TestAssembleSettled(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:12]
	schematest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		var blobs envinputs.Blobs
		if db.Dialect().Name().String() == "pg" {
			blobs = blobtest.NewS3(t)
		} else {
			l, err := blob.NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			blobs = l
		}
		ws, _ := store.CreateWorkspace(ctx, db, "acme")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "tau-retail")
		bodies := otlptest.Bodies(t, "tau-retail", func(tr oteltrace.Tracer) {
			for i, tt := range traces {
				tauformats.Emit(ctx, tr, tt, tauformats.EmitOptions{Conversation: tt.ID, Tools: tools, Start: time.Unix(int64(i)*3600, 0)})
			}
		})
		staged := stageBodies(t, db, env, bodies)
		now := time.Now()
		s := &Spans{DB: db, Blobs: blobs, Scheduler: &rebuilds{}, TaskAttribute: "doppel.task", Now: func() time.Time { return now }}

		// Not settled yet: nothing stored, the first is due in about the settle time.
		res, err := s.AssembleSettled(ctx, env.ID, time.Minute)
		if err != nil || res.Assembled != 0 || res.Pending != len(traces) || res.NextIn <= 50*time.Second || res.NextIn > time.Minute {
			t.Fatalf("before settling: %+v, %v", res, err)
		}
		now = now.Add(2 * time.Minute)
		s.Batch = 5 // in three runs
		total := 0
		for run := 0; ; run++ {
			res, err = s.AssembleSettled(ctx, env.ID, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			total += res.Assembled
			if !res.More {
				break
			}
		}
		if total != len(traces) || res.Failed != 0 || res.Pending != 0 {
			t.Fatalf("settled %d traces (%+v), want %d", total, res, len(traces))
		}
		got := storedTraces(t, db, blobs, env.ID)
		for _, tt := range traces {
			if !reflect.DeepEqual(got[tt.ID], tauformats.Comparable(tt, true)) {
				t.Fatalf("%s stored differently", tt.ID)
			}
		}
		e, _ := store.GetEnvByID(ctx, db, env.ID)
		if e.NTraces != int64(len(traces)) || e.InputsKey == "" {
			t.Fatalf("env after settling: n_traces %d, inputs %q", e.NTraces, e.InputsKey)
		}
		rc, _ := blobs.Get(ctx, e.InputsKey)
		var up infer.Upload
		_ = json.NewDecoder(rc).Decode(&up)
		rc.Close()
		defs, err := infer.ParseToolDefs(up.Tools)
		if err != nil || len(defs) != len(tools) || defs[0].Description == "" {
			t.Fatalf("inputs' tools: %d, %v", len(defs), err)
		}
		if res, err := s.AssembleSettled(ctx, env.ID, time.Minute); err != nil || res != (SettleResult{}) {
			t.Fatalf("again: %+v, %v", res, err)
		}

		// A later turn of the first conversation: a new version of its trace.
		first := traces[0]
		longer := first
		longer.Messages = append(slices.Clone(first.Messages), trace.Message{Role: trace.RoleAssistant, Content: strPtr("Anything else?")})
		more := otlptest.Bodies(t, "tau-retail", func(tr oteltrace.Tracer) {
			tauformats.Emit(ctx, tr, longer, tauformats.EmitOptions{Conversation: first.ID, Start: time.Unix(99999, 0)})
		})
		added := stageBodies(t, db, env, more)
		// And the old spans resent: nothing new from them.
		if again := stageBodies(t, db, env, bodies); again != 0 {
			t.Fatalf("resent spans staged %d", again)
		}
		now = now.Add(2 * time.Minute)
		res, err = s.AssembleSettled(ctx, env.ID, time.Minute)
		if err != nil || res.Assembled != 1 {
			t.Fatalf("late span: %+v, %v", res, err)
		}
		got = storedTraces(t, db, blobs, env.ID)
		last := got[first.ID].Messages[len(got[first.ID].Messages)-1]
		if last.Content == nil || *last.Content != "Anything else?" {
			t.Fatalf("the new version lacks the late turn: %+v", last)
		}
		e, _ = store.GetEnvByID(ctx, db, env.ID)
		if e.NTraces != int64(len(traces)) {
			t.Fatalf("n_traces %d after a new version, want %d", e.NTraces, len(traces))
		}
		if n, _ := store.CountTraces(ctx, db, env.ID); n != int64(len(traces)) {
			t.Fatalf("%d trace rows", n)
		}
		t.Logf("%d spans staged → %d traces in runs of 5; a later turn (%d spans) made one new version", staged, len(traces), added)
	})
}

func strPtr(s string) *string { return &s }
