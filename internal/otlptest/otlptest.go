// Package otlptest records what the official OpenTelemetry Go SDK sends through its OTLP/HTTP exporter, for tests.
package otlptest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/klauspost/compress/gzip"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Bodies runs emit against a tracer of service whose spans the official OTLP/HTTP exporter (protobuf, gzip)
// sends to a local receiver, and answers the bodies it received, gzip undone. opts add to the tracer provider's
// (span limits, say).
func Bodies(t testing.TB, service string, emit func(oteltrace.Tracer), opts ...sdktrace.TracerProviderOption) [][]byte {
	t.Helper()
	var mu sync.Mutex
	var bodies [][]byte
	var bad string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(data))
			if err == nil {
				data, err = io.ReadAll(zr)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		mu.Lock()
		bodies = append(bodies, data)
		if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			bad = ct
		}
		mu.Unlock()
		resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	defer srv.Close()
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"), otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp, sdktrace.WithMaxExportBatchSize(512)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service)))}, opts...)...)
	emit(tp.Tracer("tau-agent"))
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if bad != "" {
		t.Fatalf("the exporter sent %q", bad)
	}
	return bodies
}
