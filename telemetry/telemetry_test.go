package telemetry

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpTestReceiver is a test stand-in for an OpenTelemetry collector: it accepts OTLP/HTTP protobuf exports on
// POST /v1/traces and keeps the spans' names, ids and parents.
type otlpTestReceiver struct {
	mu    sync.Mutex
	spans map[string]receivedSpan // by name
	paths []string
}

type receivedSpan struct {
	traceID, spanID, parentID string
	service                   string
}

func (rcv *otlpTestReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	rcv.paths = append(rcv.paths, r.URL.Path)
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				rcv.spans[sp.Name] = receivedSpan{traceID: hex.EncodeToString(sp.TraceId), spanID: hex.EncodeToString(sp.SpanId),
					parentID: hex.EncodeToString(sp.ParentSpanId), service: service}
			}
		}
	}
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Tracing configured with an endpoint exports over OTLP/HTTP to <endpoint>/v1/traces, keeping parent links; and
// a record logged under a span carries its trace and span ids.
func TestTracingExportsOverOTLP(t *testing.T) {
	rcv := &otlpTestReceiver{spans: map[string]receivedSpan{}}
	srv := httptest.NewServer(rcv)
	defer srv.Close()

	tr, err := NewTracing(t.Context(), TracingOptions{Endpoint: srv.URL, ServiceName: "doppel-test"})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() {
		t.Fatal("tracing with an endpoint is off")
	}
	tracer := tr.Provider().Tracer("test")
	ctx, parent := tracer.Start(t.Context(), "api")
	_, child := tracer.Start(ctx, "twin.call")

	var logs bytes.Buffer
	slog.New(LogHandler(slog.NewTextHandler(&logs, nil))).InfoContext(ctx, "request")
	child.End()
	parent.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	api, twin := rcv.spans["api"], rcv.spans["twin.call"]
	if api.spanID == "" || twin.spanID == "" {
		t.Fatalf("received spans %v at %v, want api and twin.call", rcv.spans, rcv.paths)
	}
	if twin.parentID != api.spanID || twin.traceID != api.traceID || api.service != "doppel-test" {
		t.Errorf("twin.call %+v, api %+v: want twin.call a child of api in its trace, service doppel-test", twin, api)
	}
	if rcv.paths[0] != "/v1/traces" {
		t.Errorf("exported to %s, want /v1/traces", rcv.paths[0])
	}
	if want := "trace_id=" + api.traceID + " span_id=" + api.spanID; !strings.Contains(logs.String(), want) {
		t.Errorf("log line %q lacks %q", logs.String(), want)
	}
}

// Without an endpoint or OTEL_EXPORTER_OTLP_ENDPOINT, tracing is off; the variable turns it on.
func TestTracingOffUnlessConfigured(t *testing.T) {
	tr, err := NewTracing(t.Context(), TracingOptions{Environ: []string{"PATH=/bin"}})
	if err != nil || tr.Enabled() || tr.Propagator() != nil {
		t.Fatalf("no endpoint: enabled %v, err %v; want off", tr.Enabled(), err)
	}
	if ti, err := tr.TemporalInterceptor(); ti != nil || err != nil {
		t.Errorf("off: Temporal interceptor %v, %v; want none", ti, err)
	}
	tr, err = NewTracing(t.Context(), TracingOptions{Environ: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1"}})
	if err != nil || !tr.Enabled() {
		t.Fatalf("OTEL_EXPORTER_OTLP_ENDPOINT set: enabled %v, err %v; want on", tr.Enabled(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = tr.Shutdown(ctx) // nothing was recorded; nothing to send
}

// A nil *Metrics records nothing (metrics.enabled off); a real one serves what it recorded, the Temporal SDK's
// metrics included.
func TestMetrics(t *testing.T) {
	var off *Metrics
	off.Call("rest", "B_twin", "twin", time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond)
	off.JournalCommit(3, time.Millisecond, nil)
	off.BuildFinished(true)

	m := NewMetrics()
	m.Call("rest", "B_twin", "twin", time.Millisecond, 2*time.Millisecond, time.Millisecond, 5*time.Millisecond)
	m.Call("mcp", "B_weird", "weird", 0, 0, 0, 0) // labels outside the pre-resolved ones still count
	m.Collected(1234)
	m.BuildStarted()
	m.BuildFinished(false)
	m.JournalCommit(3, time.Millisecond, io.ErrUnexpectedEOF)
	m.BodyBytesInFlight(42)
	m.BodyRefused()
	m.WatchStates(fakeStates{}, time.Second, slog.New(slog.DiscardHandler))
	h, mp, err := m.TemporalHandler(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	h.WithTags(map[string]string{"namespace": "default"}).Counter("temporal_request").Inc(2)

	w := httptest.NewRecorder()
	m.Handler(slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`doppel_calls_total{fidelity="B_twin",rung="twin",transport="rest"} 1`,
		`doppel_calls_total{fidelity="B_weird",rung="weird",transport="mcp"} 1`,
		`doppel_call_stage_seconds_count{stage="total"} 2`,
		`doppel_ingest_bytes_total 1234`,
		`doppel_builds_total{outcome="started"} 1`,
		`doppel_builds_total{outcome="failed"} 1`,
		`doppel_journal_commit_seconds_count 1`,
		`doppel_journal_commit_failures_total 1`,
		`doppel_request_body_bytes_in_flight 42`,
		`doppel_request_body_refused_total 1`,
		`doppel_sessions_open 3`,
		`doppel_twin_states{state="ready"} 2`,
		`temporal_request_total{namespace="default"} 2`,
	} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(w.Body.String())
	}
}

type fakeStates struct{}

func (fakeStates) OpenSessions(context.Context) (int64, error) { return 3, nil }
func (fakeStates) TwinStates(context.Context) (map[string]int64, error) {
	return map[string]int64{"ready": 2, "stopped": 1}, nil
}
