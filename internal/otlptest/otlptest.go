// Package otlptest records what the official OpenTelemetry Go SDK sends through its OTLP/HTTP exporter, for tests.
package otlptest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
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
	"google.golang.org/protobuf/encoding/protojson"
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

// JSON re-encodes a protobuf export as OTLP JSON: the official types through protojson, with trace and span ids
// in hex as OTLP's JSON encoding writes them (protojson writes bytes in base64).
func JSON(t testing.TB, body []byte) []byte {
	t.Helper()
	req := &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(body, req); err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && (k == "traceId" || k == "spanId" || k == "parentSpanId") {
					b, err := base64.StdEncoding.DecodeString(s)
					if err != nil {
						t.Fatal(err)
					}
					x[k] = hex.EncodeToString(b)
					continue
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
