package activities

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"testing"

	"github.com/klauspost/compress/zstd"
	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/trace"
)

// A build reads its traces batch blob by batch blob, of every blob format: a batch stored as gzip, one as zstd
// and one as collect stores a body now (S2) build the bundle infer.Build makes of the traces, each trace taken
// from the batch that first stored it (the later batches' copies of five traces each, which collect counted as
// duplicates, say another model).
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
	imposters := func(ts []trace.Trace) []trace.Trace {
		out := append([]trace.Trace(nil), ts...)
		for i := range 5 {
			out[i].Model = "imposter"
		}
		return out
	}
	const legacyFormat = "doppel collect batch v1" // the name blobs carried before S2
	// The first batch as the gzip encoder wrote it.
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Comment = legacyFormat
	zw.Write(ingest.AppendJSON(nil, &trace.Batch{Project: "air", Traces: traces[:15]}))
	zw.Close()
	storeBatch(t, db, blobs, env, gz.Bytes(), ids(traces[:15]))
	// The second as the zstd encoder did: a skippable frame naming the format, then one zstd frame.
	second := imposters(traces[10:25])
	ze, _ := zstd.NewWriter(nil)
	frame := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x184D2A50), uint32(len(legacyFormat)))
	storeBatch(t, db, blobs, env, ze.EncodeAll(ingest.AppendJSON(nil, &trace.Batch{Project: "air", Traces: second}), append(frame, legacyFormat...)), ids(second))
	// The third as collect stores a body.
	third := imposters(traces[20:])
	data, err := ingest.EncodeBodyBlob(ingest.AppendJSON(nil, &trace.Batch{Project: "air", Traces: third}))
	if err != nil {
		t.Fatal(err)
	}
	storeBatch(t, db, blobs, env, data, ids(third))

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
		t.Fatalf("the bundle built from three batches (%d bytes) differs from infer.Build of the traces (%d bytes)", len(got), len(wantData))
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
