package otlp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/trace"
)

// assembleAll decodes bodies, stages their spans per project, groups and assembles every conversation.
func assembleAll(t *testing.T, bodies [][]byte, encoding string, opts Options) (map[string]map[string]*ingest.Assembled, int) {
	t.Helper()
	byProject := map[string][]ingest.Span{}
	spans := 0
	for _, b := range bodies {
		req, err := Decode(b, encoding)
		if err != nil {
			t.Fatal(err)
		}
		ex := Extract(req, opts)
		if len(ex.Rejected) > 0 {
			t.Fatalf("rejected: %v", ex.Rejected)
		}
		spans += ex.Spans
		for _, p := range ex.Projects {
			for _, st := range p.Spans {
				span, err := Span(st.Data)
				if err != nil {
					t.Fatal(err)
				}
				byProject[p.Name] = append(byProject[p.Name], span)
			}
		}
	}
	out := map[string]map[string]*ingest.Assembled{}
	for name, ss := range byProject {
		meta := make([]ingest.SpanMeta, len(ss))
		for i, s := range ss {
			meta[i] = ingest.SpanMeta{TraceID: s.TraceID, SpanID: s.SpanID, Parent: s.Parent, Conversation: s.Conversation()}
		}
		groups := map[string][]ingest.Span{}
		for i, k := range ingest.Conversations(meta) {
			groups[k] = append(groups[k], ss[i])
		}
		out[name] = map[string]*ingest.Assembled{}
		for k, g := range groups {
			a, err := ingest.Assemble(ingest.TraceID(k, g, opts.TaskAttr), g)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			out[name][a.Trace.ID] = a
		}
	}
	return out, spans
}

// TestRealExporterTau instruments an agent loop replaying tau retail's traces with the official OpenTelemetry Go
// SDK and its OTLP/HTTP exporter, once with the GenAI conventions and once with OpenInference's, and assembles
// the spans it sends: every trace comes back as collected (arguments spelled compactly, no messages after the
// last model call), with the tool definitions. The same exports re-encoded as OTLP JSON (the official types
// through protojson, ids in hex) decode to the same requests.
func TestRealExporterTau(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// OpenInference flattens every message into attributes: a long conversation passes the SDK's default of 128
	// attributes a span (OTEL_ATTRIBUTE_COUNT_LIMIT), which its users raise; GenAI's JSON attributes do not.
	limits := sdktrace.NewSpanLimits()
	limits.AttributeCountLimit = 1 << 16
	for _, style := range []struct {
		name   string
		style  int
		limits []sdktrace.TracerProviderOption
	}{{"genai", tauformats.GenAI, nil}, {"openinference", tauformats.OpenInference, []sdktrace.TracerProviderOption{sdktrace.WithSpanLimits(limits)}}} {
		t.Run(style.name, func(t *testing.T) {
			bodies := otlptest.Bodies(t, "tau-retail", func(tr oteltrace.Tracer) {
				for i, tt := range traces {
					tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Style: style.style, Conversation: tt.ID,
						Tools: tools, Start: base.Add(time.Duration(i) * time.Hour)})
				}
			}, style.limits...)
			got, spans := assembleAll(t, bodies, ContentTypeProtobuf, Options{})
			checkTau(t, got["tau-retail"], traces, tools, style.style == tauformats.GenAI)
			t.Logf("%s: %d spans in %d protobuf exports → %d traces equal to the collected ones", style.name, spans, len(bodies), len(got["tau-retail"]))

			for i, b := range bodies {
				req := &coltracepb.ExportTraceServiceRequest{}
				if err := proto.Unmarshal(b, req); err != nil {
					t.Fatal(err)
				}
				js := otlptest.JSON(t, b)
				back, err := Decode(js, ContentTypeJSON)
				if err != nil {
					t.Fatalf("export %d as JSON: %v", i, err)
				}
				if !proto.Equal(req, back) {
					t.Fatalf("export %d: the JSON encoding decodes to another request", i)
				}
				if i == 0 {
					// protobuf's own JSON mapping (ids in base64) is read too.
					plain, _ := protojson.Marshal(req)
					if back, err := Decode(plain, ContentTypeJSON); err != nil || !proto.Equal(req, back) {
						t.Fatalf("base64 ids: %v", err)
					}
				}
			}
		})
	}
}

func checkTau(t *testing.T, got map[string]*ingest.Assembled, traces []trace.Trace, tools []tauformats.Tool, compactArgs bool) {
	t.Helper()
	if len(got) != len(traces) {
		t.Fatalf("%d traces assembled, want %d", len(got), len(traces))
	}
	for _, tt := range traces {
		a := got[tt.ID]
		if a == nil {
			t.Fatalf("trace %s missing", tt.ID)
		}
		want := tauformats.Comparable(tt, compactArgs)
		if !reflect.DeepEqual(a.Trace, want) {
			t.Fatalf("%s: %s", tt.ID, traceDiff(a.Trace, want))
		}
		if len(a.Tools) != len(tools) {
			t.Fatalf("%s: %d tools", tt.ID, len(a.Tools))
		}
		for i, d := range a.Tools {
			var want bytes.Buffer
			json.Compact(&want, tools[i].Parameters)
			if d.Name != tools[i].Name || d.Description != tools[i].Description || string(d.InputSchema) != want.String() {
				t.Fatalf("tool %d: %+v", i, d)
			}
		}
	}
}

// traceDiff says where two traces first differ.
func traceDiff(got, want trace.Trace) string {
	if got.ID != want.ID || got.Model != want.Model {
		return fmt.Sprintf("id/model %q %q, want %q %q", got.ID, got.Model, want.ID, want.Model)
	}
	for i := range min(len(got.Messages), len(want.Messages)) {
		if !reflect.DeepEqual(got.Messages[i], want.Messages[i]) {
			gj, _ := json.Marshal(got.Messages[i])
			wj, _ := json.Marshal(want.Messages[i])
			return fmt.Sprintf("message %d:\n got %.600s\nwant %.600s", i, gj, wj)
		}
	}
	return fmt.Sprintf("%d messages, want %d", len(got.Messages), len(want.Messages))
}

// TestTaskAndConversationFallback: spans naming no conversation make one trace per OpenTelemetry trace, named by
// its id, and a task attribute leads the id so the self-check can hold trials of a task out together.
func TestTaskAndConversationFallback(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:6]
	bodies := otlptest.Bodies(t, "shop", func(tr oteltrace.Tracer) {
		for i, tt := range traces {
			tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{TaskAttr: "doppel.task", Task: taskOf(tt.ID), Start: time.Unix(int64(i)*100, 0)})
		}
	})
	got, _ := assembleAll(t, bodies, ContentTypeProtobuf, Options{TaskAttr: "doppel.task"})
	var ids []string
	for id, a := range got["shop"] {
		ids = append(ids, id)
		prefix, rest, _ := bytes.Cut([]byte(id), []byte("/"))
		if len(rest) != 32 {
			t.Errorf("id %s: want task/<32 hex digits>", id)
		}
		found := false
		for _, tt := range traces {
			if taskOf(tt.ID) == string(prefix) && reflect.DeepEqual(a.Trace.Messages, tauformats.Comparable(tt, true).Messages) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s matches no trace of its task", id)
		}
	}
	sort.Strings(ids)
	if len(ids) != len(traces) {
		t.Fatalf("ids %v", ids)
	}
	t.Logf("ids: %v", ids)
}

// taskOf is the task-N segment of a tau trace id.
func taskOf(id string) string {
	for _, seg := range bytes.Split([]byte(id), []byte("/")) {
		if bytes.HasPrefix(seg, []byte("task-")) {
			return string(seg)
		}
	}
	return ""
}

func TestDecompress(t *testing.T) {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(bytes.Repeat([]byte("a"), 1000))
	zw.Close()
	if out, err := Decompress(zb.Bytes(), "gzip", 1000); err != nil || len(out) != 1000 {
		t.Errorf("gzip at the limit: %d, %v", len(out), err)
	}
	if _, err := Decompress(zb.Bytes(), "gzip", 999); err != ErrTooLarge {
		t.Errorf("gzip over the limit: %v", err)
	}
	if _, err := Decompress([]byte("xx"), "gzip", 10); err == nil {
		t.Error("bad gzip accepted")
	}
	if _, err := Decompress([]byte("xx"), "br", 10); err == nil {
		t.Error("brotli accepted")
	}
	if _, err := Decompress([]byte("xxx"), "", 2); err != ErrTooLarge {
		t.Errorf("plain over the limit: %v", err)
	}
}

func TestEncoding(t *testing.T) {
	for ct, want := range map[string]string{"application/x-protobuf": ContentTypeProtobuf, "application/json; charset=utf-8": ContentTypeJSON,
		"APPLICATION/JSON": ContentTypeJSON, "text/plain": "", "": ""} {
		got, err := Encoding(ct)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("Encoding(%q) = %q, %v", ct, got, err)
		}
	}
}
