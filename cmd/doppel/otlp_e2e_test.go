package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/trace"
)

// otlpSettle is the settle time the OTLP end-to-end tests run with.
const otlpSettle = "2s"

// otlpClient is what the OTLP acceptance needs of a running doppel: its URL and key, plain requests, and its
// database (read directly: whether spans are still pending is not something the API shows).
type otlpClient struct {
	url, key string
	http     *http.Client
	db       *bun.DB
}

// openDBForRead opens a running doppel's database for reading, closed when the test ends.
func openDBForRead(t *testing.T, driver, dsn string) *bun.DB {
	t.Helper()
	db, err := schema.Open(context.Background(), schema.Options{Driver: driver, DSN: dsn})
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// settled reports whether an environment has no staged span pending and its newest build was queued after its
// newest batch: whatever settles next will not change what that build read.
func (c *otlpClient) settled(t *testing.T, slug string) (bool, string) {
	t.Helper()
	ctx := context.Background()
	var env schema.Environment
	if err := c.db.NewSelect().Model(&env).Where("slug = ?", slug).Scan(ctx); err != nil {
		return false, "no environment yet"
	}
	pending, err := c.db.NewSelect().Model((*schema.StagedSpan)(nil)).Where("env_id = ? AND pending", env.ID).Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pending > 0 {
		return false, fmt.Sprintf("%d spans pending", pending)
	}
	var build schema.Build
	var tb schema.TraceBatch
	if err := c.db.NewSelect().Model(&tb).Where("env_id = ?", env.ID).Order("created_at DESC").Limit(1).Scan(ctx); err != nil {
		return false, "no batch yet"
	}
	if err := c.db.NewSelect().Model(&build).Where("env_id = ?", env.ID).Order("created_at DESC").Limit(1).Scan(ctx); err != nil {
		return false, "no build yet"
	}
	if build.CreatedAt.Before(tb.CreatedAt) {
		return false, "the newest batch came after the newest build"
	}
	return true, ""
}

func (c *otlpClient) do(t *testing.T, method, path string, body []byte, contentType string, want int, out any, headers ...string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, c.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d, want %d: %.400s", method, path, resp.StatusCode, want, buf.Bytes())
	}
	if out != nil {
		if err := json.Unmarshal(buf.Bytes(), out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return buf.Bytes()
}

// exporter is the official OTLP/HTTP exporter pointed at doppel with the workspace key (protobuf, gzip).
func (c *otlpClient) exporter(t *testing.T, opts ...otlptracehttp.Option) *otlptrace.Exporter {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), append([]otlptracehttp.Option{otlptracehttp.WithEndpointURL(c.url + "/v1/traces"),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + c.key}), otlptracehttp.WithCompression(otlptracehttp.GzipCompression)},
		opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return exp
}

// recordSpans replays traces through an SDK tracer of service and answers its ended spans, as exporters get them.
func recordSpans(traces []trace.Trace, tools []tauformats.Tool, service string, style int) []sdktrace.ReadOnlySpan {
	rec := &spanRecorder{}
	limits := sdktrace.NewSpanLimits()
	limits.AttributeCountLimit = 1 << 16 // OpenInference flattens messages into attributes (see docs/sending-traces.md)
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		panic(err) // two schemaless resources merge
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec), sdktrace.WithSpanLimits(limits), sdktrace.WithResource(res))
	tr := tp.Tracer("tau-agent")
	for i, tt := range traces {
		tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Style: style, Conversation: tt.ID, Tools: tools,
			Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Hour)})
	}
	_ = tp.Shutdown(context.Background())
	return rec.spans
}

type spanRecorder struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func (r *spanRecorder) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, s...)
	return nil
}

func (r *spanRecorder) Shutdown(context.Context) error { return nil }

// exportSpans sends spans through exp in requests of size spans.
func exportSpans(t *testing.T, exp *otlptrace.Exporter, spans []sdktrace.ReadOnlySpan, size int) {
	t.Helper()
	for start := 0; start < len(spans); start += size {
		if err := exp.ExportSpans(context.Background(), spans[start:min(start+size, len(spans))]); err != nil {
			t.Fatalf("export: %v", err)
		}
	}
}

// collectBody is a collect body of project whose traces are objects in any format.
func collectBody(t *testing.T, project string, traces []map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"project": project, "traces": traces})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// twinFigures are what the acceptance compares of two environments' twins.
type twinFigures struct {
	BundleHash string
	Tools      []map[string]any // native tool listing: name, description, inputSchema, binding, rung
	WorldHash  string           // a session opened with seed 7
	SelfCheck  map[string]any   // the report's self-check, misses aside (they quote arguments as spelled)
	Traces     int
}

// waitBuilt waits until the environment's newest build has succeeded over n traces with nothing queued after it,
// and answers its figures.
func (c *otlpClient) waitBuilt(t *testing.T, slug string, n int) twinFigures {
	t.Helper()
	var f twinFigures
	e2ePoll(t, e2eBuildTimeout, time.Second, "environment "+slug+" built over every trace", func() (bool, string) {
		if ok, why := c.settled(t, slug); !ok {
			return false, why
		}
		var builds []api.BuildSummary
		st, data := c.try(t, "/v1/envs/"+slug+"/builds")
		if st != http.StatusOK || json.Unmarshal(data, &builds) != nil || len(builds) == 0 {
			return false, fmt.Sprintf("builds: %d %.200s", st, data)
		}
		newest := builds[0]
		if newest.Status == "failed" {
			t.Fatalf("%s: build %s failed: %s", slug, newest.ID, newest.Error)
		}
		if newest.Status != "succeeded" {
			return false, "newest build " + newest.Status
		}
		var rep struct {
			Build     *infer.Report  `json:"build"`
			SelfCheck map[string]any `json:"self_check"`
		}
		c.do(t, http.MethodGet, "/v1/envs/"+slug+"/builds/"+newest.ID+"/report", nil, "", http.StatusOK, &rep)
		if rep.Build == nil || rep.Build.NTraces != n {
			return false, fmt.Sprintf("newest build %s over %v traces", newest.ID, rep.Build)
		}
		f = twinFigures{BundleHash: newest.BundleHash, SelfCheck: rep.SelfCheck, Traces: rep.Build.NTraces}
		return true, ""
	})
	if tools, ok := f.SelfCheck["tools"].([]any); ok {
		for _, tc := range tools {
			delete(tc.(map[string]any), "misses")
		}
	}
	c.do(t, http.MethodGet, "/v1/envs/"+slug+"/tools", nil, "", http.StatusOK, &f.Tools)
	for _, tool := range f.Tools {
		for k := range tool {
			switch k {
			case "name", "description", "inputSchema", "binding", "rung":
			default:
				delete(tool, k)
			}
		}
	}
	var opened struct {
		WorldHash string `json:"world_hash"`
	}
	c.do(t, http.MethodPost, "/v1/envs/"+slug+"/sessions", []byte(`{"seed": 7}`), "application/json", http.StatusCreated, &opened)
	f.WorldHash = opened.WorldHash
	return f
}

func (c *otlpClient) try(t *testing.T, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// sameTwin requires got's tools, world hash and self-check figures to equal want's; with sameBundle (a format
// that keeps the arguments' spelling), its bundle too, byte for byte.
func sameTwin(t *testing.T, name string, got, want twinFigures, sameBundle bool) {
	t.Helper()
	if sameBundle && got.BundleHash != want.BundleHash {
		t.Errorf("%s: bundle %s, want the baseline's %s", name, got.BundleHash, want.BundleHash)
	}
	if !reflect.DeepEqual(got.Tools, want.Tools) {
		gj, _ := json.Marshal(got.Tools)
		wj, _ := json.Marshal(want.Tools)
		t.Errorf("%s: tools differ:\n got %.1500s\nwant %.1500s", name, gj, wj)
	}
	if got.WorldHash == "" || got.WorldHash != want.WorldHash {
		t.Errorf("%s: world hash %s, want %s", name, got.WorldHash, want.WorldHash)
	}
	if !reflect.DeepEqual(got.SelfCheck, want.SelfCheck) {
		gj, _ := json.Marshal(got.SelfCheck)
		wj, _ := json.Marshal(want.SelfCheck)
		t.Errorf("%s: self-check differs:\n got %.1500s\nwant %.1500s", name, gj, wj)
	}
	t.Logf("%s: %d traces, %d tools, world %s, self-check %v%% of %v calls; bundle %s (baseline's: %v)", name, got.Traces, len(got.Tools),
		got.WorldHash, got.SelfCheck["agreement_pct"], got.SelfCheck["calls"], got.BundleHash, got.BundleHash == want.BundleHash)
}

// baseline collects the tau traces as a collect body (spec §2.7) into project tau-collect, builds with the tool
// definitions given, and answers that twin's figures.
func (c *otlpClient) baseline(t *testing.T, traces []trace.Trace, tools []tauformats.Tool) twinFigures {
	t.Helper()
	data, err := json.Marshal(map[string]any{"tools": tools})
	if err != nil {
		t.Fatal(err)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	pw, err := mw.CreateFormFile("tools", "tools.json")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = pw.Write(data)
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	enc := make([][]byte, len(traces))
	for i := range traces {
		enc[i] = ingest.AppendTrace(nil, &traces[i])
	}
	c.do(t, http.MethodPost, "/api/collect", ingest.AppendBody(nil, "tau-collect", enc), "application/json", http.StatusAccepted, nil)
	c.do(t, http.MethodPost, "/v1/envs/tau-collect/builds", form.Bytes(), mw.FormDataContentType(), http.StatusAccepted, nil)
	return c.waitBuilt(t, "tau-collect", len(traces))
}

// TestOTLPAcceptance runs the whole dev stack and sends it tau retail's traces as agents already emit them: spans
// of an agent loop instrumented with the official OpenTelemetry Go SDK (GenAI conventions through its OTLP/HTTP
// exporter in protobuf and in JSON; the official OTLP types through protojson; OpenInference; spans shuffled over
// many requests with some sent twice), and collect bodies of OpenAI Responses and Anthropic Messages traces. Each
// settles into an environment whose twin equals the one built from the chat-format collect body with the same
// tool definitions: the same tools and schemas, world hash and self-check figures.
func TestOTLPAcceptance(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: starts the whole dev stack")
	}
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := startE2EStack(t, dir, m.Plaintext, e2eFreeAddr(t), e2eFreeAddr(t), "", "--otlp-settle", otlpSettle)
	c := &otlpClient{url: s.apiURL, key: m.Plaintext, http: &http.Client{Timeout: 2 * time.Minute},
		db: openDBForRead(t, schema.DriverSQLite, "file:"+filepath.Join(dir, "doppel.db"))}
	start := time.Now()
	want := c.baseline(t, traces, tools)
	t.Logf("baseline (collect body, tools uploaded) built in %s", time.Since(start).Round(time.Second))

	// One variant at a time: a build's self-check takes the machine's cores, and its activities heartbeat.
	variants := []struct {
		slug string
		// keeps is true when the format carries arguments as the agent's string (their spelling kept)
		keeps bool
		send  func(t *testing.T) string
	}{
		{"tau-genai", false, func(t *testing.T) string {
			spans := recordSpans(traces, tools, "tau-genai", tauformats.GenAI)
			exportSpans(t, c.exporter(t), spans, 512)
			return fmt.Sprintf("%d GenAI spans, protobuf+gzip, official exporter", len(spans))
		}},
		{"tau-genai-json", false, func(t *testing.T) string {
			spans := recordSpans(traces, tools, "tau-genai-json", tauformats.GenAI)
			exportSpans(t, c.exporter(t, otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON)), spans, 512)
			return fmt.Sprintf("%d GenAI spans, JSON+gzip, official exporter", len(spans))
		}},
		{"tau-protojson", false, func(t *testing.T) string {
			bodies := otlptest.Bodies(t, "ignored", func(tr oteltrace.Tracer) {
				for i, tt := range traces {
					tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Conversation: tt.ID, Tools: tools, Start: time.Unix(int64(i)*3600, 0)})
				}
			})
			for _, b := range bodies {
				c.do(t, http.MethodPost, "/v1/traces?project=tau-protojson", otlptest.JSON(t, b), "application/json", http.StatusOK, nil)
			}
			return fmt.Sprintf("%d bodies of the official OTLP types through protojson, project named by the query", len(bodies))
		}},
		{"tau-openinference", true, func(t *testing.T) string {
			spans := recordSpans(traces, tools, "tau-openinference", tauformats.OpenInference)
			exportSpans(t, c.exporter(t), spans, 512)
			return fmt.Sprintf("%d OpenInference spans", len(spans))
		}},
		{"tau-shuffled", false, func(t *testing.T) string {
			spans := recordSpans(traces, tools, "tau-shuffled", tauformats.GenAI)
			r := rand.New(rand.NewPCG(37, 37))
			r.Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
			again := append([]sdktrace.ReadOnlySpan(nil), spans[:300]...) // resent: counted once
			exportSpans(t, c.exporter(t), append(spans, again...), 97)
			return fmt.Sprintf("%d spans shuffled over %d requests, %d of them sent twice", len(spans), (len(spans)+len(again)+96)/97, len(again))
		}},
		{"tau-responses", true, func(t *testing.T) string {
			var body []map[string]any
			for _, tt := range traces {
				body = append(body, tauformats.Responses(tt, tools))
			}
			c.do(t, http.MethodPost, "/api/collect", collectBody(t, "tau-responses", body), "application/json", http.StatusAccepted, nil)
			return "a collect body of OpenAI Responses traces with their tools"
		}},
		{"tau-messages", false, func(t *testing.T) string {
			var body []map[string]any
			for _, tt := range traces {
				body = append(body, tauformats.Messages(tt, tools))
			}
			c.do(t, http.MethodPost, "/api/collect", collectBody(t, "tau-messages", body), "application/json", http.StatusAccepted, nil)
			return "a collect body of Anthropic Messages traces with their tools"
		}},
	}
	for _, v := range variants {
		began := time.Now()
		what := v.send(t)
		sent := time.Since(began)
		got := c.waitBuilt(t, v.slug, len(traces))
		t.Logf("%s: %s, sent in %s, settled and built in %s", v.slug, what, sent.Round(time.Millisecond), (time.Since(began) - sent).Round(time.Second))
		sameTwin(t, v.slug, got, want, v.keeps)
	}
	var envs []api.EnvSummary
	c.do(t, http.MethodGet, "/v1/envs", nil, "", http.StatusOK, &envs)
	for _, e := range envs {
		if e.NTraces != int64(len(traces)) {
			t.Errorf("%s holds %d traces, want %d: nothing lost, nothing counted twice", e.Slug, e.NTraces, len(traces))
		}
		if strings.HasPrefix(e.Slug, "tau-genai") && e.Language != "go" {
			t.Errorf("%s: language %q, want go (the SDK's)", e.Slug, e.Language)
		}
	}
	t.Logf("all twins built and compared in %s", time.Since(start).Round(time.Second))
}

// TestOTLPKill9 runs the real binary and kills it (SIGKILL) between two OTLP exports: half of tau retail's spans,
// shuffled, are acknowledged before the kill and the other half after the restart. Staged spans survive the kill,
// the restarted process settles them, and the twin equals the one built from the collect body with the same tool
// definitions, nothing lost and nothing counted twice. SQLite with local blobs always; PostgreSQL with MinIO when
// DOPPEL_TEST_POSTGRES and DOPPEL_TEST_S3 name them.
func TestOTLPKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("crash: builds and kills the real binary")
	}
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	bin := crashBuild(t, t.TempDir())
	for _, variant := range []string{"sqlite+local", "postgres+minio"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			var be crashBackend
			if variant == "sqlite+local" {
				be = sqliteBackend(t, dir)
			} else {
				be = realBackend(t, nil, nil)
			}
			m, err := cred.Mint(cred.KindWorkspace)
			if err != nil {
				t.Fatal(err)
			}
			srv := &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t),
				env: append(be.env, "DOPPEL_COLLECT_REBUILD_DEBOUNCE=1s", "DOPPEL_OTLP_SETTLE=3s")}
			c := &otlpClient{url: srv.apiURL(), key: m.Plaintext, http: &http.Client{Timeout: 2 * time.Minute}, db: openDBForRead(t, be.driver, be.dsn)}
			p := srv.start(t)
			want := c.baseline(t, traces, tools)

			spans := recordSpans(traces, tools, "tau-kill9", tauformats.GenAI)
			r := rand.New(rand.NewPCG(9, 9))
			r.Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
			half := len(spans) / 2
			exportSpans(t, c.exporter(t), spans[:half], 200)
			p.kill(t) // kill -9 right after the last acknowledgement, before the spans can settle
			p = srv.start(t)
			t.Logf("killed after %d of %d spans were acknowledged; restarted in %s", half, len(spans), p.ready.Round(time.Millisecond))
			exportSpans(t, c.exporter(t), spans[half:], 200)
			exportSpans(t, c.exporter(t), spans[:100], 100) // a retry of spans sent before the kill: counted once
			sameTwin(t, variant, c.waitBuilt(t, "tau-kill9", len(traces)), want, false)
			var env api.EnvDetail
			c.do(t, http.MethodGet, "/v1/envs/tau-kill9", nil, "", http.StatusOK, &env)
			if env.NTraces != int64(len(traces)) {
				t.Errorf("n_traces %d, want %d", env.NTraces, len(traces))
			}
			p.term(t)
		})
	}
}
