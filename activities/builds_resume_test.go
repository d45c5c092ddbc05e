package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// logLines is a slog handler that keeps each record's message and attributes as text.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// Issue 13, defect 9: a build activity retried after its worker died resumes from its last heartbeat. SelfCheck
// given a checkpoint of some folds checks only the others and reports what an uninterrupted check reports;
// InferBundle given its stored result answers it.
func TestBuildActivitiesResume(t *testing.T) {
	ctx := context.Background()
	db, blobs, env := buildFixture(t, t.TempDir(), "air")
	traces := airlineTraces(t, 30)
	data, err := ingest.EncodeBlob(&trace.Batch{Traces: traces})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(traces))
	for i, tr := range traces {
		ids[i] = tr.ID
	}
	storeBatch(t, db, blobs, env, data, ids)
	logs := &logLines{}
	b := &Builds{DB: db, Blobs: blobs, Log: slog.New(logs)}
	plan := planBuild(t, b, env)
	var s testsuite.WorkflowTestSuite
	run := func(progress any, fn any, args ...any) io.Reader {
		t.Helper()
		aenv := s.NewTestActivityEnvironment()
		aenv.RegisterActivity(b)
		if progress != nil {
			aenv.SetHeartbeatDetails(progress)
		}
		v, err := aenv.ExecuteActivity(fn, args...)
		if err != nil {
			t.Fatal(err)
		}
		var raw json.RawMessage
		if err := v.Get(&raw); err != nil {
			t.Fatal(err)
		}
		return bytes.NewReader(raw)
	}
	decode := func(r io.Reader, v any) {
		t.Helper()
		if err := json.NewDecoder(r).Decode(v); err != nil {
			t.Fatal(err)
		}
	}

	var inf Inferred
	decode(run(nil, b.InferBundle, plan), &inf)
	var again Inferred
	decode(run(inf, b.InferBundle, plan), &again)
	if again != inf || !logs.has("bundle already inferred") {
		t.Errorf("InferBundle given its stored result: %+v, want %+v without inferring again", again, inf)
	}

	var whole SelfChecked
	decode(run(nil, b.SelfCheck, plan, inf), &whole)

	// The interrupted attempt had checkpointed 4 of the 8 leave-one-task-out folds (30 traces, 4 trials a task), in two parts.
	var folds []infer.FoldResult
	if _, err := infer.SelfCheckResume(traces, infer.Options{}, infer.Resume{OnFold: func(fr infer.FoldResult) {
		if fr.Fold < 4 {
			folds = append(folds, fr)
		}
	}}); err != nil {
		t.Fatal(err)
	}
	var cp SelfCheckpoint
	for _, part := range [][]infer.FoldResult{folds[:2], folds[2:]} {
		k, err := b.putJSON(ctx, "checkpoints/selfcheck/"+plan.BuildID+"/", part)
		if err != nil {
			t.Fatal(err)
		}
		cp.Parts = append(cp.Parts, k)
	}
	var resumed SelfChecked
	decode(run(cp, b.SelfCheck, plan, inf), &resumed)
	if !logs.has("build resumes self-check") || !logs.has("folds_done=4") {
		t.Errorf("SelfCheck given a checkpoint of 4 folds did not resume from it: %q", logs.lines)
	}
	if resumed != whole {
		t.Errorf("resumed self-check %+v, uninterrupted %+v (the report key is its content address)", resumed, whole)
	}
	for _, k := range cp.Parts {
		if _, err := blobs.Stat(ctx, k); err == nil {
			t.Errorf("checkpoint %s left behind after the check finished", k)
		}
	}
}

func airlineTraces(t *testing.T, n int) []trace.Trace {
	t.Helper()
	traces, err := sampledata.Traces("airline")
	if err != nil {
		t.Fatal(err)
	}
	if len(traces) < n {
		t.Fatalf("%d traces in the airline sample, want %d", len(traces), n)
	}
	return traces[:n]
}
