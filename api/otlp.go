package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/otlp"
)

// Paths and headers of OTLP ingest.
const (
	tracesPath = "/v1/traces"
	// projectHeader and projectQuery name the project of every span of a request, over the resources'
	// service.name.
	projectHeader = "X-Doppel-Project"
	projectQuery  = "project"
	// unavailableRetryAfter is the Retry-After (seconds) of a 503: the database or blob store is not answering.
	unavailableRetryAfter = 5
	// maxRejectionsTold bounds the rejections a partial success spells out.
	maxRejectionsTold = 3
)

// SpanSettler is told that an environment has newly staged spans; the implementation assembles each conversation
// once it has settled. It is called after the spans are durable; an error is logged, not answered (a restart
// schedules what was missed).
type SpanSettler interface {
	ScheduleSettle(ctx context.Context, workspaceID, envID string) error
}

// TracesOptions configure OTLP trace ingest (POST /v1/traces, and the OTLP/gRPC service when it is served).
type TracesOptions struct {
	// Collect gives the caps and the rate limit, collect's: MaxRequestBytes (also after gzip), MaxEnvBytes,
	// MaxTraces (conversations a request), RatePerSecond, RateBurst, TrustForwardedFor, Now. Its Blobs store the
	// build inputs tool definitions join.
	Collect CollectOptions
	// Settler, when set, is told of each environment that staged spans.
	Settler SpanSettler
	// TaskAttribute is the span attribute naming a trace's task (config otlp.task_attribute).
	TaskAttribute string
}

// TracesRoutes returns the route group that registers POST /v1/traces, for Options.Routes. With g non-nil, g is
// given the same ingest to serve OTLP/gRPC with (NewTraceService).
func TracesRoutes(opts TracesOptions, g *TraceIngest) func(huma.API, *Deps) {
	return func(a huma.API, d *Deps) {
		t := newTraceIngest(opts, d)
		if g != nil {
			*g = *t
		}
		d.BodyCap("POST "+tracesPath, t.opts.Collect.MaxRequestBytes)
		d.Mux.HandleFunc("POST "+tracesPath, t.serveHTTP)
		documentTraces(a)
	}
}

// TraceIngest stages OTLP trace exports: the one ingest POST /v1/traces and the OTLP/gRPC service share.
type TraceIngest struct {
	opts    TracesOptions
	deps    *Deps
	limiter *keyedLimiter
	spans   *control.Spans
}

func newTraceIngest(opts TracesOptions, d *Deps) *TraceIngest {
	opts.Collect = opts.Collect.withDefaults()
	t := &TraceIngest{opts: opts, deps: d}
	t.spans = &control.Spans{DB: d.DB, MaxEnvBytes: opts.Collect.MaxEnvBytes, Log: t.logger}
	if opts.Collect.RatePerSecond > 0 {
		t.limiter = newKeyedLimiter(opts.Collect.RatePerSecond, opts.Collect.RateBurst, opts.Collect.Now)
	}
	return t
}

// traceError is a refused export: the envelope, and the seconds to wait before retrying (0: none said).
type traceError struct {
	env        *Envelope
	retryAfter int
}

func (t *TraceIngest) logger(ctx context.Context) *slog.Logger {
	if t.deps.Logger != nil {
		return t.deps.Logger
	}
	return loggerFrom(ctx)
}

// admit applies the per-address rate limit.
func (t *TraceIngest) admit(address string) *traceError {
	if t.limiter == nil {
		return nil
	}
	if ok, wait := t.limiter.allow(address); !ok {
		e := RateLimited(fmt.Sprintf("over %g trace exports a second from this address; retry after %s", t.opts.Collect.RatePerSecond, wait.Round(time.Millisecond)))
		return &traceError{env: e, retryAfter: int(math.Ceil(wait.Seconds()))}
	}
	return nil
}

// authenticate resolves the workspace key.
func (t *TraceIngest) authenticate(ctx context.Context, authorization string) (*Principal, *traceError) {
	p, err := t.deps.Auth.Workspace(ctx, authorization)
	if err != nil {
		var e *Envelope
		if !errors.As(err, &e) {
			t.logger(ctx).WarnContext(ctx, "traces: resolve key", slog.Any("error", err))
			e = Unavailable("the metadata database is not answering; nothing was stored, retry")
		}
		return nil, t.fail(e)
	}
	return p, nil
}

// fail is a traceError of e, with OTLP's Retry-After for statuses clients retry.
func (t *TraceIngest) fail(e *Envelope) *traceError {
	te := &traceError{env: e}
	if e.status == http.StatusServiceUnavailable {
		te.retryAfter = unavailableRetryAfter
	}
	return te
}

// export stages req's spans in p's workspace: project is the request's own naming of the project ("": each
// resource's service.name). It answers the spans rejected and why, in partial_success's terms.
func (t *TraceIngest) export(ctx context.Context, p *Principal, project string, req *coltracepb.ExportTraceServiceRequest, size int64) (*coltracepb.ExportTraceServiceResponse, *traceError) {
	if t.deps.DB == nil {
		return nil, t.fail(Unavailable("trace ingest is not configured with a database"))
	}
	ex := otlp.Extract(req, otlp.Options{Project: project, TaskAttr: t.opts.TaskAttribute})
	convs := map[string]bool{}
	for _, pr := range ex.Projects {
		for i := range pr.Spans {
			s := &pr.Spans[i]
			if c := s.Conversation; c != "" {
				convs[pr.Name+"\x00c:"+c] = true
			} else {
				convs[pr.Name+"\x00t:"+s.TraceID] = true
			}
		}
	}
	if len(convs) > t.opts.Collect.MaxTraces {
		return nil, t.fail(TooLarge("the export holds spans of %d conversations, more than the limit of %d a request; export in smaller batches",
			len(convs), t.opts.Collect.MaxTraces))
	}
	envs, err := t.spans.Stage(ctx, p.Workspace.ID, ex)
	if err != nil {
		var e *Envelope
		if errors.As(mapError(err), &e) {
			return nil, t.fail(e)
		}
		if ctx.Err() != nil {
			return nil, t.fail(Unavailable("request ended before the spans were stored: %v", ctx.Err()))
		}
		t.logger(ctx).WarnContext(ctx, "traces: stage spans", slog.String("request_id", RequestID(ctx)), slog.Any("error", err))
		return nil, t.fail(Unavailable("the database is not answering; nothing was stored, retry"))
	}
	if t.deps.Observer != nil {
		t.deps.Observer.Collected(size)
	}
	if t.opts.Settler != nil {
		// The spans are stored: schedule their settling even if the client has gone meanwhile.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), scheduleTimeout)
		for _, id := range envs {
			if err := t.opts.Settler.ScheduleSettle(sctx, p.Workspace.ID, id); err != nil {
				t.logger(ctx).WarnContext(ctx, "traces: schedule settle", slog.String("env", id), slog.Any("error", err))
			}
		}
		cancel()
	}
	return otlp.Response(int64(len(ex.Rejected)), partialMessage(ex)), nil
}

// partialMessage explains rejected spans (the first few, by path) and warns of spans whose sender dropped
// attributes; "" when there is nothing to say.
func partialMessage(ex *otlp.Extracted) string {
	var parts []string
	if n := len(ex.Rejected); n > 0 {
		told := make([]string, 0, maxRejectionsTold)
		for _, r := range ex.Rejected[:min(n, maxRejectionsTold)] {
			told = append(told, r.String())
		}
		msg := fmt.Sprintf("%d of %d spans rejected: %s", n, ex.Spans, strings.Join(told, "; "))
		if n > maxRejectionsTold {
			msg += fmt.Sprintf("; and %d more", n-maxRejectionsTold)
		}
		parts = append(parts, msg)
	}
	if ex.Truncated > 0 {
		parts = append(parts, fmt.Sprintf("%d spans arrived with attributes or events dropped by the sender's limits; what they lost "+
			"cannot be assembled: raise OTEL_ATTRIBUTE_COUNT_LIMIT (OpenInference flattens every message into attributes)", ex.Truncated))
	}
	return strings.Join(parts, ". ")
}

// serveHTTP is POST /v1/traces: OTLP/HTTP, protobuf or JSON, gzip or not. It answers as OTLP/HTTP specifies, in
// the request's encoding: 200 with an ExportTraceServiceResponse (partial_success naming rejected spans), or a
// google.rpc.Status carrying the error envelope's fields (see writeTraceError).
func (t *TraceIngest) serveHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	enc, err := otlp.Encoding(r.Header.Get("Content-Type"))
	if err != nil {
		t.writeError(w, r, otlp.ContentTypeJSON, &traceError{env: Errorf(http.StatusUnsupportedMediaType, "%s", strings.TrimPrefix(err.Error(), "otlp: "))})
		return
	}
	if te := t.admit(clientAddress(r.RemoteAddr, r.Header.Get("X-Forwarded-For"), t.opts.Collect.TrustForwardedFor)); te != nil {
		t.writeError(w, r, enc, te)
		return
	}
	p, te := t.authenticate(ctx, r.Header.Get("Authorization"))
	if te != nil {
		t.writeError(w, r, enc, te)
		return
	}
	raw, te := t.readBody(w, r)
	if te != nil {
		t.writeError(w, r, enc, te)
		return
	}
	body, err := otlp.Decompress(raw, r.Header.Get("Content-Encoding"), t.opts.Collect.MaxRequestBytes)
	switch {
	case errors.Is(err, otlp.ErrTooLarge):
		t.writeError(w, r, enc, &traceError{env: TooLarge("the body is over the cap of %d bytes after decompression; export in smaller batches", t.opts.Collect.MaxRequestBytes)})
		return
	case errors.Is(err, otlp.ErrContentEncoding):
		t.writeError(w, r, enc, &traceError{env: Errorf(http.StatusUnsupportedMediaType, "%s", strings.TrimPrefix(err.Error(), "otlp: "))})
		return
	case err != nil:
		t.writeError(w, r, enc, &traceError{env: Invalid("body", err.Error())})
		return
	}
	req, err := otlp.Decode(body, enc)
	if err != nil {
		t.writeError(w, r, enc, &traceError{env: Invalid("body", strings.TrimPrefix(err.Error(), "otlp: "))})
		return
	}
	project := strings.TrimSpace(r.Header.Get(projectHeader))
	if q := strings.TrimSpace(r.URL.Query().Get(projectQuery)); q != "" {
		if project != "" && q != project {
			t.writeError(w, r, enc, &traceError{env: Invalid("query.project", "differs from the "+projectHeader+" header: give one")})
			return
		}
		project = q
	}
	resp, te := t.export(ctx, p, project, req, int64(len(body)))
	if te != nil {
		t.writeError(w, r, enc, te)
		return
	}
	out, err := otlp.Encode(resp, enc)
	if err != nil {
		t.writeError(w, r, enc, &traceError{env: internal(ctx, err)})
		return
	}
	w.Header().Set("Content-Type", enc)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// readBody reads the request body whole, at most MaxRequestBytes (413 beyond, before reading when the declared
// length says so), within collect's read timeout.
func (t *TraceIngest) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *traceError) {
	limit := t.opts.Collect.MaxRequestBytes
	tooLarge := &traceError{env: TooLarge("the body is over the cap of %d bytes; export in smaller batches", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(collectBodyReadTimeout))
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, &traceError{env: Invalid("body", "could not read the body: "+err.Error())}
	}
	if int64(len(data)) > limit {
		return nil, tooLarge
	}
	return data, nil
}

// writeError answers a refused export as OTLP/HTTP asks: the status (422 becomes 400, OTLP's bad data), a
// Retry-After where one is due, and a google.rpc.Status in the request's encoding holding the envelope.
func (t *TraceIngest) writeError(w http.ResponseWriter, r *http.Request, enc string, te *traceError) {
	e := te.env
	if e.RequestID == "" {
		e.RequestID = RequestID(r.Context())
	}
	status := httpStatusOf(e)
	if e.status == http.StatusInternalServerError {
		e = internal(r.Context(), e)
	}
	st, err := traceStatus(e, te.retryAfter)
	var body []byte
	if err == nil {
		body, err = otlp.Encode(st, enc)
	}
	if err != nil {
		WriteError(w, r, err)
		return
	}
	if te.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(te.retryAfter))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	w.Header().Set("Content-Type", enc)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeTraceRefusal answers a request to /v1/traces the body budget refused (Retry-After already set on a 503) with
// the google.rpc.Status of its envelope, in the request's encoding (JSON when it names none OTLP knows).
func writeTraceRefusal(w http.ResponseWriter, r *http.Request, e *Envelope) {
	enc, err := otlp.Encoding(r.Header.Get("Content-Type"))
	if err != nil {
		enc = otlp.ContentTypeJSON
	}
	retry := 0
	if e.status == http.StatusServiceUnavailable {
		retry = budgetRetryAfter
	}
	(&TraceIngest{}).writeError(w, r, enc, &traceError{env: e, retryAfter: retry})
}
