package otlp

import (
	"context"
	"testing"
	"time"

	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
)

// BenchmarkDecodeExtract measures what an OTLP/HTTP request costs before the database: decoding an export of the
// official exporter (512 spans of tau retail's agent loop, GenAI content captured) and making its staged spans.
func BenchmarkDecodeExtract(b *testing.B) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		b.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		b.Fatal(err)
	}
	bodies := otlptest.Bodies(b, "bench", func(tr oteltrace.Tracer) {
		for i, tt := range traces {
			tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Conversation: tt.ID, Tools: tools, Start: time.Unix(int64(i)*3600, 0)})
		}
	})
	body := bodies[0]
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	staged := 0
	for b.Loop() {
		req, err := Decode(body, ContentTypeProtobuf)
		if err != nil {
			b.Fatal(err)
		}
		ex := Extract(req, Options{TaskAttr: "doppel.task"})
		staged = 0
		for _, p := range ex.Projects {
			for _, s := range p.Spans {
				staged += len(s.Data)
			}
		}
	}
	b.ReportMetric(float64(staged)/float64(len(body)), "staged_ratio")
}
