package api_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/telemetry"
)

// Issue #13: a session call makes a server span (named by its route, continuing the caller's traceparent) whose
// children are the twin's answer and the journal commit, all in one trace; and it is counted by transport and
// rung, with its stage times, in the metrics GET /metrics serves.
func TestCallTracesAndMetrics(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m := telemetry.NewMetrics()
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{local: true, tracer: tp, observer: m})
	s := p.open(map[string]any{"seed": 7})

	// The caller's own span: the request carries it as traceparent.
	caller, callerSpan := tp.Tracer("test").Start(t.Context(), "agent step")
	r := httptest.NewRequest(http.MethodPost, "/v1/sessions/"+s.ID+"/call",
		strings.NewReader(`{"name":"get_order_details","arguments":{"order_id":"#W0000001"}}`))
	r.Header.Set("Authorization", "Bearer "+s.Token)
	r.Header.Set("Content-Type", "application/json")
	propagation.TraceContext{}.Inject(caller, propagation.HeaderCarrier(r.Header))
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	callerSpan.End()
	if w.Code != http.StatusOK {
		t.Fatalf("call: %d %s", w.Code, w.Body)
	}

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		byName[sp.Name()] = sp
	}
	server, ok := byName["POST /v1/sessions/{session_id}/call"]
	if !ok {
		t.Fatalf("no server span named by the call's route; spans: %v", spanNames(rec.Ended()))
	}
	if server.SpanKind() != trace.SpanKindServer || server.Parent().SpanID() != callerSpan.SpanContext().SpanID() ||
		server.SpanContext().TraceID() != callerSpan.SpanContext().TraceID() {
		t.Errorf("server span: kind %v, parent %v, trace %v; want a server span child of the caller's %v in its trace",
			server.SpanKind(), server.Parent().SpanID(), server.SpanContext().TraceID(), callerSpan.SpanContext().SpanID())
	}
	for _, name := range []string{"twin.call", "journal.commit"} {
		sp, ok := byName[name]
		if !ok {
			t.Errorf("no %s span; spans: %v", name, spanNames(rec.Ended()))
			continue
		}
		if sp.Parent().SpanID() != server.SpanContext().SpanID() || sp.SpanContext().TraceID() != server.SpanContext().TraceID() {
			t.Errorf("%s: parent %v, want the server span %v", name, sp.Parent().SpanID(), server.SpanContext().SpanID())
		}
	}

	// The same call through tRPC counts under its own transport.
	code, out := p.do(http.MethodPost, "/trpc/sessions.call", s.Token,
		map[string]any{"session_id": s.ID, "name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}})
	if code != http.StatusOK {
		t.Fatalf("tRPC call: %d %v", code, out)
	}

	// GET /metrics serves the registry: calls by transport and rung, the stage histograms, the Go runtime's.
	h, _ := api.New(api.Options{Metrics: m.Handler(slog.New(slog.DiscardHandler))})
	mw := httptest.NewRecorder()
	h.ServeHTTP(mw, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`doppel_calls_total{fidelity="A_executed",rung="provided",transport="rest"} 1`,
		`doppel_calls_total{fidelity="A_executed",rung="provided",transport="trpc"} 1`,
		`doppel_call_stage_seconds_count{stage="auth"} 2`,
		`doppel_call_stage_seconds_count{stage="twin"} 2`,
		`doppel_call_stage_seconds_count{stage="journal"} 2`,
		`doppel_call_stage_seconds_count{stage="total"} 2`,
		"go_goroutines",
	} {
		if !strings.Contains(mw.Body.String(), want) {
			t.Errorf("GET /metrics (%d) lacks %q", mw.Code, want)
		}
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name())
	}
	return names
}

// BenchmarkCallTelemetry: one session call served in process (no network) with telemetry off, metrics on, and
// metrics and tracing on (spans batched to a discarding exporter): what recording costs the hot path, in time and
// allocations per call.
func BenchmarkCallTelemetry(b *testing.B) {
	for _, c := range []struct {
		name             string
		metrics, tracing bool
	}{{"off", false, false}, {"metrics", true, false}, {"metrics+tracing", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			o := planeOptions{local: true}
			if c.metrics {
				o.observer = telemetry.NewMetrics()
			}
			if c.tracing {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
				o.tracer = tp
			}
			p := newPlane(b, schema.DriverSQLite, shopBundle(b), o)
			s := p.open(map[string]any{"seed": 7})
			body := `{"name":"get_order_details","arguments":{"order_id":"#W0000001"}}`
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/sessions/"+s.ID+"/call", strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer "+s.Token)
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				p.h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("call: %d %s", w.Code, w.Body)
				}
			}
		})
	}
}
