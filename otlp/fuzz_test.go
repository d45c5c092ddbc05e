package otlp

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/trace"
)

// FuzzOTLPDecode feeds the OTLP decoder arbitrary bodies, protobuf and JSON, seeded with real exports of tau
// traces (the official SDK's exporter, both conventions). For every body it decodes, extraction accounts for each
// span exactly once (staged, ignored or rejected; staged spans have valid ids), and each conversation assembles
// to the same trace whatever the order its spans come in and however often each is repeated: malformed, partial,
// out-of-order and duplicated batches lose nothing and count nothing twice.
func FuzzOTLPDecode(f *testing.F) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		f.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		f.Fatal(err)
	}
	// Small seeds keep the fuzzer fast: the start of two real conversations, texts cut short.
	short := make([]trace.Trace, 2)
	for i, tt := range traces[:2] {
		short[i] = trace.Trace{ID: tt.ID, Model: tt.Model}
		for _, m := range tt.Messages[:min(len(tt.Messages), 14)] {
			if m.Content != nil && utf8.RuneCountInString(*m.Content) > 120 {
				c := string([]rune(*m.Content)[:120])
				m.Content = &c
			}
			short[i].Messages = append(short[i].Messages, m)
		}
	}
	for _, style := range []int{tauformats.GenAI, tauformats.OpenInference} {
		bodies := otlptest.Bodies(f, "fuzz", func(tr oteltrace.Tracer) {
			for i, tt := range short {
				conv := tt.ID
				if i == 1 {
					conv = "" // grouped by its trace, named by the task
				}
				tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Style: style, Conversation: conv, Tools: tools[:1],
					TaskAttr: "doppel.task", Task: "7", Start: time.Unix(int64(i)*1000, 0)})
			}
		})
		for _, b := range bodies {
			f.Add(b, false, uint64(1))
			req := &coltracepb.ExportTraceServiceRequest{}
			if proto.Unmarshal(b, req) == nil {
				js, _ := protojson.Marshal(req)
				f.Add(js, true, uint64(2))
			}
		}
	}
	f.Add([]byte(`{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"x"}}]},"scopeSpans":[{"spans":[`+
		`{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","name":"chat","attributes":[`+
		`{"key":"gen_ai.operation.name","value":{"stringValue":"chat"}},{"key":"gen_ai.input.messages","value":{"arrayValue":{"values":[`+
		`{"kvlistValue":{"values":[{"key":"role","value":{"stringValue":"user"}},{"key":"parts","value":{"arrayValue":{"values":[`+
		`{"kvlistValue":{"values":[{"key":"type","value":{"stringValue":"text"}},{"key":"content","value":{"stringValue":"hi"}}]}}]}}}]}}]}}}]},`+
		`{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"00","kind":1}]}]}]}`), true, uint64(3))
	f.Add([]byte{0x0a, 0x02, 0x12, 0x00}, false, uint64(4))
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool, seed uint64) {
		enc := ContentTypeProtobuf
		if asJSON {
			enc = ContentTypeJSON
		}
		req, err := Decode(data, enc)
		if err != nil {
			return
		}
		ex := Extract(req, Options{TaskAttr: "doppel.task"})
		staged := 0
		decoded := make([][]ingest.Span, len(ex.Projects))
		for i, p := range ex.Projects {
			staged += len(p.Spans)
			for _, s := range p.Spans {
				if len(s.TraceID) != 32 || len(s.SpanID) != 16 || (s.Parent != "" && len(s.Parent) != 16) {
					t.Fatalf("staged a span with bad ids: %+v", s)
				}
				span, err := Span(s.Data)
				if err != nil || span.TraceID != s.TraceID || span.SpanID != s.SpanID || span.Parent != s.Parent || span.Conversation() != s.Conversation {
					t.Fatalf("a staged span reads back as %+v, %v; staged %+v", span, err, s)
				}
				decoded[i] = append(decoded[i], span)
			}
		}
		if staged+ex.Ignored+len(ex.Rejected) != ex.Spans {
			t.Fatalf("%d spans: %d staged + %d ignored + %d rejected", ex.Spans, staged, ex.Ignored, len(ex.Rejected))
		}
		r := rand.New(rand.NewPCG(seed, seed>>1))
		for pi, p := range ex.Projects {
			meta := make([]ingest.SpanMeta, len(p.Spans))
			for i, s := range p.Spans {
				meta[i] = ingest.SpanMeta{TraceID: s.TraceID, SpanID: s.SpanID, Parent: s.Parent, Conversation: s.Conversation}
			}
			groups := map[string][]ingest.Span{}
			for i, k := range ingest.Conversations(meta) {
				groups[k] = append(groups[k], decoded[pi][i])
			}
			for k, g := range groups {
				g = firstOfEach(g)
				id := ingest.TraceID(k, g, "doppel.task")
				a, err := ingest.Assemble(id, g)
				// The same spans shuffled, some sent twice.
				again := append([]ingest.Span(nil), g...)
				for range r.IntN(len(g) + 1) {
					again = append(again, g[r.IntN(len(g))])
				}
				r.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
				b, err2 := ingest.Assemble(id, again)
				if (err == nil) != (err2 == nil) {
					t.Fatalf("%s: assembled once %v, shuffled with repeats %v", k, err, err2)
				}
				if err == nil && !reflect.DeepEqual(a, b) {
					t.Fatalf("%s: shuffled with repeats assembles to another trace", k)
				}
			}
		}
	})
}

// firstOfEach keeps the first span of each id, as staging does (a span id is a span: a resend is the same span).
func firstOfEach(spans []ingest.Span) []ingest.Span {
	seen := map[string]bool{}
	var out []ingest.Span
	for _, s := range spans {
		if k := s.TraceID + "/" + s.SpanID; !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	return out
}
