package activities

import (
	"bytes"
	"compress/gzip"
	"context"
	"testing"

	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/trace"
)

// A build reads its traces batch blob by batch blob: a batch stored as gzip before zstd and one stored as zstd
// build the bundle infer.Build makes of the traces, each trace taken from the batch that first stored it (the
// second batch's copies of five traces, which collect counted as duplicates, say another model).
func TestInferBundleFromBatches(t *testing.T) {
	ctx := context.Background()
	db, blobs, env := buildFixture(t, t.TempDir(), "air")
	traces := airlineTraces(t, 40)
	ids := func(ts []trace.Trace) []string {
		out := make([]string, len(ts))
		for i, tr := range ts {
			out[i] = tr.ID
		}
		return out
	}
	// The first batch as the gzip encoder wrote it.
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Comment = ingest.BlobFormat
	zw.Write(ingest.AppendJSON(nil, &trace.Batch{Project: "air", Traces: traces[:25]}))
	zw.Close()
	storeBatch(t, db, blobs, env, gz.Bytes(), ids(traces[:25]))
	second := append([]trace.Trace(nil), traces[20:]...)
	for i := range 5 {
		second[i].Model = "imposter"
	}
	data, err := ingest.EncodeBlob(&trace.Batch{Project: "air", Traces: second})
	if err != nil {
		t.Fatal(err)
	}
	storeBatch(t, db, blobs, env, data, ids(second))

	b := &Builds{DB: db, Blobs: blobs}
	plan := planBuild(t, b, env)
	var s testsuite.WorkflowTestSuite
	aenv := s.NewTestActivityEnvironment()
	aenv.RegisterActivity(b)
	v, err := aenv.ExecuteActivity(b.InferBundle, plan)
	if err != nil {
		t.Fatal(err)
	}
	var inf Inferred
	if err := v.Get(&inf); err != nil {
		t.Fatal(err)
	}
	got, err := b.readBlob(ctx, inf.BundleKey)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := infer.Build(traces, infer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantData, err := want.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wantData) {
		t.Fatalf("the bundle built from two batches (%d bytes) differs from infer.Build of the traces (%d bytes)", len(got), len(wantData))
	}
	if det := ingest.Detect(&trace.Batch{Traces: traces}, ingest.Hints{}); inf.DetectedFramework != det.Framework {
		t.Errorf("detected framework %q, want %q", inf.DetectedFramework, det.Framework)
	}

	v, err = aenv.ExecuteActivity(b.SelfCheck, plan, inf)
	if err != nil {
		t.Fatal(err)
	}
	var chk SelfChecked
	if err := v.Get(&chk); err != nil {
		t.Fatal(err)
	}
	rep, err := infer.SelfCheck(traces, infer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if chk.Calls != rep.Calls || chk.Agreement != rep.AgreementPct {
		t.Errorf("self-check from batches: %d calls, %.4f%% agreement; infer.SelfCheck: %d, %.4f%%", chk.Calls, chk.Agreement, rep.Calls, rep.AgreementPct)
	}
}
