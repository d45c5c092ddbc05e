package api_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/klauspost/compress/gzip"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

// settleRecorder records the environments POST /v1/traces asks to settle.
type settleRecorder struct {
	mu   sync.Mutex
	envs []string
}

func (s *settleRecorder) ScheduleSettle(_ context.Context, _, envID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envs = append(s.envs, envID)
	return nil
}

func (s *settleRecorder) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.envs...)
}

// newTracesFx serves collect and POST /v1/traces over the backend, with collect's options for both.
func newTracesFx(t testing.TB, driver string, opts api.CollectOptions) (*collectFx, *settleRecorder) {
	t.Helper()
	settle := &settleRecorder{}
	traces := api.TracesRoutes(api.TracesOptions{Collect: opts, Settler: settle, TaskAttribute: "doppel.task"}, nil)
	return newCollectServer(t, driver, opts, nil, api.Options{Routes: []func(huma.API, *api.Deps){traces}}), settle
}

// stagedCount counts the staged spans of the workspace's environment slug (and the pending ones).
func stagedCount(t testing.TB, fx *collectFx, slug string) (all, pending int) {
	t.Helper()
	env, err := store.GetEnv(context.Background(), fx.db, fx.ws.ID, slug)
	if err != nil {
		t.Fatalf("env %s: %v", slug, err)
	}
	n, err := fx.db.NewSelect().Model((*schema.StagedSpan)(nil)).Where("env_id = ?", env.ID).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p, err := fx.db.NewSelect().Model((*schema.StagedSpan)(nil)).Where("env_id = ? AND pending", env.ID).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n), int(p)
}

// TestTracesRealExporter sends tau retail's agent loop, instrumented with the official OpenTelemetry Go SDK, to
// POST /v1/traces through the official OTLP/HTTP exporter — protobuf with gzip, and JSON — on both backends: every
// span is staged once (the second exporter's spans are the same spans: nothing doubles), the project is the
// resource's service.name, and its environment is asked to settle.
func TestTracesRealExporter(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:30]
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			fx, settle := newTracesFx(t, be.driver, api.CollectOptions{RatePerSecond: -1})
			// One recording of the loop, exported twice: once as protobuf (gzip), once as JSON.
			rec := tracetestRecorder(t, traces, tools)
			for _, enc := range []otlptracehttp.Encoding{otlptracehttp.EncodingProtobuf, otlptracehttp.EncodingJSON} {
				exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(fx.url+"/v1/traces"),
					otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + fx.key}),
					otlptracehttp.WithCompression(otlptracehttp.GzipCompression), otlptracehttp.WithEncoding(enc),
					otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
				if err != nil {
					t.Fatal(err)
				}
				for start := 0; start < len(rec); start += 400 {
					if err := exp.ExportSpans(context.Background(), rec[start:min(start+400, len(rec))]); err != nil {
						t.Fatalf("export (encoding %d): %v", enc, err)
					}
				}
				_ = exp.Shutdown(context.Background())
			}
			all, pending := stagedCount(t, fx, "tau-retail")
			if all != len(rec) || pending != len(rec) {
				t.Fatalf("%d spans staged (%d pending), want %d: each once", all, pending, len(rec))
			}
			env, _ := store.GetEnv(context.Background(), fx.db, fx.ws.ID, "tau-retail")
			if calls := settle.calls(); len(calls) == 0 || calls[0] != env.ID {
				t.Fatalf("settle calls %v, want %s", calls, env.ID)
			}
			if env.Language != "go" {
				t.Errorf("language %q, want go (telemetry.sdk.language)", env.Language)
			}
			t.Logf("%d spans of %d traces staged once from two exports", all, len(traces))
		})
	}
}

// tracetestRecorder replays traces through an OpenTelemetry SDK tracer and answers the spans it ended, as an
// exporter receives them.
func tracetestRecorder(t testing.TB, traces []trace.Trace, tools []tauformats.Tool) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := &spanCollector{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "tau-retail"), attribute.String("telemetry.sdk.language", "go"))))
	tr := tp.Tracer("tau-agent")
	for i, tt := range traces {
		tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Conversation: tt.ID, Tools: tools,
			Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Hour)})
	}
	_ = tp.Shutdown(context.Background())
	return rec.spans
}

// spanCollector is a span exporter keeping what it is given.
type spanCollector struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func (c *spanCollector) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = append(c.spans, spans...)
	return nil
}

func (c *spanCollector) Shutdown(context.Context) error { return nil }

// otlpReply is an answer of POST /v1/traces.
type otlpReply struct {
	status int
	header http.Header
	body   []byte
}

func (fx *collectFx) postTraces(t testing.TB, body []byte, contentType string, headers ...string) otlpReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fx.url+"/v1/traces", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+fx.key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return otlpReply{status: res.StatusCode, header: res.Header, body: data}
}

// status decodes an error answer as google.rpc.Status in its content type, and checks the envelope's fields ride
// in it: the message holds the detail, code and request id; an ErrorInfo carries the code and request id.
func (r otlpReply) rpcStatus(t testing.TB, want int, code string) (*status.Status, map[string]string) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d: %s", r.status, want, r.body)
	}
	st := &status.Status{}
	var err error
	if r.header.Get("Content-Type") == "application/json" {
		err = protojson.Unmarshal(r.body, st)
	} else {
		err = proto.Unmarshal(r.body, st)
	}
	if err != nil {
		t.Fatalf("error body is not a google.rpc.Status (%s): %v: %q", r.header.Get("Content-Type"), err, r.body)
	}
	rid := r.header.Get("X-Request-Id")
	if !strings.Contains(st.Message, code) || !strings.Contains(st.Message, rid) || rid == "" {
		t.Errorf("message %q lacks code %s or request id %s", st.Message, code, rid)
	}
	var meta map[string]string
	for _, d := range st.Details {
		m, err := d.UnmarshalNew()
		if err != nil {
			t.Fatalf("detail %s: %v", d.TypeUrl, err)
		}
		if info, ok := m.(*errdetails.ErrorInfo); ok {
			meta = info.Metadata
			if info.Reason != code || info.Domain != "doppel.dev" || meta["requestId"] != rid || meta["detail"] == "" {
				t.Errorf("ErrorInfo %v", info)
			}
		}
	}
	if meta == nil {
		t.Errorf("no ErrorInfo in %v", st.Details)
	}
	return st, meta
}

// export is a protobuf export of spans under a resource of service.
func export(service string, spans ...*tracepb.Span) []byte {
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", service)}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}},
	}}}
	b, _ := proto.Marshal(req)
	return b
}

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func toolSpan(trace, span byte, callID string) *tracepb.Span {
	return &tracepb.Span{TraceId: bytes.Repeat([]byte{trace}, 16), SpanId: bytes.Repeat([]byte{span}, 8), Name: "execute_tool get_order",
		StartTimeUnixNano: uint64(span) * 1e6, EndTimeUnixNano: uint64(span)*1e6 + 1,
		Attributes: []*commonpb.KeyValue{strAttr("gen_ai.operation.name", "execute_tool"), strAttr("gen_ai.tool.name", "get_order"),
			strAttr("gen_ai.tool.call.id", callID), strAttr("gen_ai.tool.call.arguments", `{"id":7}`), strAttr("gen_ai.tool.call.result", "shipped")}}
}

// TestTracesAnswers: OTLP/HTTP's answers, in the request's encoding — partial success for spans refused one by
// one, idempotent resends, the project header, and a google.rpc.Status carrying the envelope for each failure,
// with Retry-After on the statuses exporters retry. Nothing is staged by a refused export.
func TestTracesAnswers(t *testing.T) {
	fx, _ := newTracesFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: -1, MaxRequestBytes: 64 << 10, MaxTraces: 3})
	good := export("shop", toolSpan(1, 1, "c1"), toolSpan(1, 2, "c2"), &tracepb.Span{TraceId: []byte{1, 2}, SpanId: bytes.Repeat([]byte{3}, 8)},
		&tracepb.Span{TraceId: bytes.Repeat([]byte{4}, 16), SpanId: bytes.Repeat([]byte{5}, 8), Name: "GET /"})
	for round := range 2 {
		r := fx.postTraces(t, good, "application/x-protobuf")
		if r.status != 200 || r.header.Get("Content-Type") != "application/x-protobuf" {
			t.Fatalf("round %d: %d %s %q", round, r.status, r.header.Get("Content-Type"), r.body)
		}
		resp := &coltracepb.ExportTraceServiceResponse{}
		if err := proto.Unmarshal(r.body, resp); err != nil {
			t.Fatal(err)
		}
		ps := resp.GetPartialSuccess()
		if ps.GetRejectedSpans() != 1 || !strings.Contains(ps.GetErrorMessage(), "resourceSpans[0].scopeSpans[0].spans[2].traceId: must be 16 bytes") {
			t.Fatalf("partial success %v", ps)
		}
		if all, pending := stagedCount(t, fx, "shop"); all != 2 || pending != 2 {
			t.Fatalf("round %d: %d staged, %d pending; want 2 (the HTTP span is dropped, the bad one rejected, a resend adds nothing)", round, all, pending)
		}
	}
	// JSON in, JSON out; the header names the project over service.name.
	js, _ := protojson.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", "ignored")}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{toolSpan(9, 9, "c9")}}}}}})
	js = bytes.ReplaceAll(js, []byte(`"CQkJCQkJCQkJCQkJCQkJCQ=="`), []byte(`"`+hex.EncodeToString(bytes.Repeat([]byte{9}, 16))+`"`))
	r := fx.postTraces(t, js, "application/json", "X-Doppel-Project", "named")
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" || string(r.body) != "{}" {
		t.Fatalf("JSON export: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	if all, _ := stagedCount(t, fx, "named"); all != 1 {
		t.Fatalf("named project: %d staged", all)
	}

	before := rowCounts(t, fx.db)
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(bytes.Repeat([]byte{0}, 65<<10))
	zw.Close()
	cases := []struct {
		name, ct string
		body     []byte
		headers  []string
		want     int
		code     string
	}{
		{"not protobuf", "application/x-protobuf", []byte("\xff\xff\xff"), nil, 400, api.CodeInvalid},
		{"not JSON", "application/json", []byte(`{"resourceSpans":`), nil, 400, api.CodeInvalid},
		{"content type", "text/plain", good, nil, 415, api.CodeInvalid},
		{"content encoding", "application/x-protobuf", good, []string{"Content-Encoding", "br"}, 415, api.CodeInvalid},
		{"no key", "application/x-protobuf", good, []string{"Authorization", ""}, 401, api.CodeUnauthorized},
		{"another key", "application/json", good, []string{"Authorization", "Bearer mk_live_nope"}, 401, api.CodeUnauthorized},
		{"body over the cap", "application/x-protobuf", bytes.Repeat([]byte{0}, 65<<10), nil, 413, api.CodeTooLarge},
		{"gzip over the cap", "application/x-protobuf", zb.Bytes(), []string{"Content-Encoding", "gzip"}, 413, api.CodeTooLarge},
		{"too many conversations", "application/x-protobuf", export("shop", toolSpan(1, 1, "a"), toolSpan(2, 1, "a"), toolSpan(3, 1, "a"), toolSpan(4, 1, "a")), nil, 413, api.CodeTooLarge},
		{"header and query differ", "application/x-protobuf", good, []string{"X-Doppel-Project", "a"}, 400, api.CodeInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := ""
			if c.name == "header and query differ" {
				path = "?project=b"
			}
			req, _ := http.NewRequest(http.MethodPost, fx.url+"/v1/traces"+path, bytes.NewReader(c.body))
			req.Header.Set("Content-Type", c.ct)
			req.Header.Set("Authorization", "Bearer "+fx.key)
			for i := 0; i+1 < len(c.headers); i += 2 {
				req.Header.Set(c.headers[i], c.headers[i+1])
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(res.Body)
			res.Body.Close()
			r := otlpReply{status: res.StatusCode, header: res.Header, body: data}
			st, _ := r.rpcStatus(t, c.want, c.code)
			if c.want == 400 {
				found := false
				for _, d := range st.Details {
					if m, _ := d.UnmarshalNew(); m != nil {
						_, found = m.(*errdetails.BadRequest)
						if found {
							break
						}
					}
				}
				if !found {
					t.Errorf("bad data without a BadRequest detail: %v", st.Details)
				}
			}
			if r.header.Get("Retry-After") != "" {
				t.Errorf("Retry-After on %d", c.want)
			}
		})
	}
	if after := rowCounts(t, fx.db); !equalCounts(before, after) {
		t.Errorf("refused exports changed rows: %v → %v", before, after)
	}
}

// TestTracesRateLimitAndOutage: over the per-address rate an export answers 429 with Retry-After and RetryInfo,
// which the official exporter reads as retryable: it waits the Retry-After and its retry is staged. With the
// database gone the answer is 503 with Retry-After, whose Status message the exporter reports.
func TestTracesRateLimitAndOutage(t *testing.T) {
	spans := spansOf(t, 7)
	fx, _ := newTracesFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: 0.5, RateBurst: 1})
	body := export("shop", toolSpan(1, 1, "c1"))
	if r := fx.postTraces(t, body, "application/x-protobuf"); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := fx.postTraces(t, body, "application/x-protobuf")
	st, _ := r.rpcStatus(t, 429, api.CodeRateLimited)
	if r.header.Get("Retry-After") != "2" {
		t.Errorf("Retry-After %q, want 2", r.header.Get("Retry-After"))
	}
	retry := false
	for _, d := range st.Details {
		if m, _ := d.UnmarshalNew(); m != nil {
			if ri, ok := m.(*errdetails.RetryInfo); ok && ri.RetryDelay.AsDuration() == 2*time.Second {
				retry = true
			}
		}
	}
	if !retry {
		t.Errorf("no RetryInfo of 2s: %v", st.Details)
	}
	// The official exporter, sending at once, is refused too; it retries after the Retry-After, and succeeds.
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(fx.url+"/v1/traces"),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + fx.key}),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: 10 * time.Millisecond, MaxInterval: 3 * time.Second, MaxElapsedTime: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := exp.ExportSpans(context.Background(), spans); err != nil {
		t.Fatalf("the exporter gave up: %v", err)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("the exporter succeeded after %s, before the Retry-After of 2s", waited)
	}
	if all, _ := stagedCount(t, fx, "tau-retail"); all != len(spans) {
		t.Errorf("%d staged after the retry, want %d", all, len(spans))
	}

	// The database gone: 503 with Retry-After, and the exporter's error says so.
	down, _ := newTracesFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: -1})
	_ = down.db.Close()
	r = down.postTraces(t, body, "application/json")
	r.rpcStatus(t, 503, api.CodeUnavailable)
	if r.header.Get("Retry-After") != "5" {
		t.Errorf("503 Retry-After %q", r.header.Get("Retry-After"))
	}
	exp2, _ := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(down.url+"/v1/traces"),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + down.key}), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	err = exp2.ExportSpans(context.Background(), spans)
	if err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Errorf("exporter error %v, want the Status's message", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timed out rather than answered")
	}
}

// spansOf records the first n tau traces' spans.
func spansOf(t testing.TB, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	return tracetestRecorder(t, traces[:n], nil)
}

// TestTracesGRPC: OTLP/gRPC on its own listener, over the same ingest: the official gRPC exporter (gzip) stages its
// spans in the workspace its key names; a wrong key is UNAUTHENTICATED, and nothing is staged twice on a resend.
func TestTracesGRPC(t *testing.T) {
	var ingest api.TraceIngest
	settle := &settleRecorder{}
	traces := api.TracesRoutes(api.TracesOptions{Collect: api.CollectOptions{RatePerSecond: -1}, Settler: settle}, &ingest)
	fx := newCollectServer(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: -1}, nil, api.Options{Routes: []func(huma.API, *api.Deps){traces}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewGRPCServer(api.NewTraceService(&ingest), 0)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	spans := spansOf(t, 5)
	for round := range 2 {
		exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(ln.Addr().String()), otlptracegrpc.WithInsecure(),
			otlptracegrpc.WithCompressor("gzip"), otlptracegrpc.WithHeaders(map[string]string{"authorization": "Bearer " + fx.key}))
		if err != nil {
			t.Fatal(err)
		}
		if err := exp.ExportSpans(context.Background(), spans); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		_ = exp.Shutdown(context.Background())
		if all, _ := stagedCount(t, fx, "tau-retail"); all != len(spans) {
			t.Fatalf("round %d: %d staged, want %d", round, all, len(spans))
		}
	}
	if len(settle.calls()) != 1 {
		t.Errorf("settle calls %v, want one (the resend staged nothing)", settle.calls())
	}
	exp, _ := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(ln.Addr().String()), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithHeaders(map[string]string{"authorization": "Bearer mk_live_wrong"}), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	err = exp.ExportSpans(context.Background(), spans)
	if err == nil || !strings.Contains(err.Error(), "Unauthenticated") || !strings.Contains(err.Error(), "unauthorized") {
		t.Errorf("wrong key over gRPC: %v", err)
	}
}

// TestTracesAcrossReplicas: two API processes over one PostgreSQL and MinIO, an exporter's requests spread over
// both, its spans shuffled: staging is shared, and the spans settle into traces equal to the collected ones.
func TestTracesAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverPostgres)
	blobs := blobtest.NewS3(t)
	ws, err := store.CreateWorkspace(ctx, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "k")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range 2 {
		h, _ := api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){
			api.TracesRoutes(api.TracesOptions{Collect: api.CollectOptions{Blobs: blobs, RatePerSecond: -1}}, nil)}})
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:20]
	spans := tracetestRecorder(t, traces, nil)
	r := rand.New(rand.NewPCG(2, 3))
	r.Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
	for i, start := 0, 0; start < len(spans); i, start = i+1, start+50 {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(urls[i%2]+"/v1/traces"),
			otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + key}))
		if err != nil {
			t.Fatal(err)
		}
		if err := exp.ExportSpans(ctx, spans[start:min(start+50, len(spans))]); err != nil {
			t.Fatal(err)
		}
	}
	env, err := store.GetEnv(ctx, db, ws.ID, "tau-retail")
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	s := &activities.Spans{DB: db, Blobs: blobs, Now: func() time.Time { return later }}
	res, err := s.AssembleSettled(ctx, env.ID, time.Minute)
	if err != nil || res.Assembled != len(traces) || res.Failed != 0 {
		t.Fatalf("settle: %+v, %v", res, err)
	}
	rows, _ := store.ListTraces(ctx, db, env.ID)
	batches, _ := store.ListTraceBatches(ctx, db, env.ID)
	if len(rows) != len(traces) || len(batches) != 1 {
		t.Fatalf("%d traces in %d batches", len(rows), len(batches))
	}
	rc, err := blobs.Get(ctx, batches[0].BlobKey)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	b, err := ingest.DecodeBlob(data)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]trace.Trace{}
	for _, tr := range b.Traces {
		byID[tr.ID] = tr
	}
	for _, tt := range traces {
		if !reflect.DeepEqual(byID[tt.ID], tauformats.Comparable(tt, true)) {
			t.Fatalf("%s differs", tt.ID)
		}
	}
}

// TestTracesExporterFromEnvironment: the exporter set up only by the environment variables docs/sending-traces.md
// gives (endpoint, and the Authorization header percent-encoded as OTel's header lists are) reaches doppel.
func TestTracesExporterFromEnvironment(t *testing.T) {
	fx, _ := newTracesFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: -1})
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", fx.url+"/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "Authorization=Bearer%20"+fx.key)
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	spans := spansOf(t, 2)
	if err := exp.ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	if all, _ := stagedCount(t, fx, "tau-retail"); all != len(spans) {
		t.Errorf("%d staged, want %d", all, len(spans))
	}
}

// TestTracesBodyBudgetRefusal: a body the API's body budget refuses answers OTLP's google.rpc.Status too.
func TestTracesBodyBudgetRefusal(t *testing.T) {
	fx, _ := newTracesFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: -1})
	h, _ := api.New(api.Options{DB: fx.db, BodyBudget: 1 << 10, Routes: []func(huma.API, *api.Deps){
		api.TracesRoutes(api.TracesOptions{Collect: api.CollectOptions{RatePerSecond: -1}}, nil)}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	fx.url = srv.URL
	r := fx.postTraces(t, bytes.Repeat([]byte{0}, 4<<10), "application/x-protobuf")
	r.rpcStatus(t, http.StatusRequestEntityTooLarge, api.CodeTooLarge)
	if r.header.Get("Content-Type") != "application/x-protobuf" {
		t.Errorf("Content-Type %q", r.header.Get("Content-Type"))
	}
}

// An export whose spans would take an environment past collect's per-environment byte cap is refused whole (413,
// as google.rpc.Status naming the environment), nothing of it staged; under the cap the same export is staged.
func TestTracesEnvByteCap(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			body := export("shop", toolSpan(1, 1, "c1"), toolSpan(1, 2, "c2"))
			full, _ := newTracesFx(t, be.driver, api.CollectOptions{MaxEnvBytes: 10, RatePerSecond: -1})
			_, meta := full.postTraces(t, body, "application/x-protobuf").rpcStatus(t, http.StatusRequestEntityTooLarge, api.CodeTooLarge)
			if !strings.Contains(meta["detail"], "environment shop") || !strings.Contains(meta["detail"], "cap of 10") {
				t.Errorf("detail %q", meta["detail"])
			}
			if rc := full.rows(t); rc.envs != 0 { // the refused export changed nothing, not even made the environment
				t.Errorf("rows after the refused export: %+v", rc)
			}
			roomy, _ := newTracesFx(t, be.driver, api.CollectOptions{MaxEnvBytes: 1 << 20, RatePerSecond: -1})
			if r := roomy.postTraces(t, body, "application/x-protobuf"); r.status != http.StatusOK {
				t.Fatalf("under the cap: %d %s", r.status, r.body)
			}
			if all, _ := stagedCount(t, roomy, "shop"); all != 2 {
				t.Errorf("%d spans staged under the cap, want 2", all)
			}
		})
	}
}
