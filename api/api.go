// Package api serves doppel's HTTP API: REST routes on Huma, auth, the error envelope, health, the registry and the docs.
package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/uptrace/bun"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/schema"
)

// Checker answers nil when a dependency is ready.
type Checker = func(ctx context.Context) error

// Options configures the API handler.
type Options struct {
	// DB is the metadata database. It may be nil only to render the OpenAPI document.
	DB *bun.DB
	// Logger receives the access log and internal errors (nil: discarded).
	Logger *slog.Logger
	// Readiness names the checks GET /readyz runs (e.g. "db", "blob", "temporal"); it answers 200
	// only when every one returns nil.
	Readiness map[string]Checker
	// ReadyTimeout bounds each readiness check (default 2s).
	ReadyTimeout time.Duration
	// Routes register further route groups (collect, sessions, build, wake, tRPC, MCP, …) without
	// editing this package. Each is called once, after the built-in routes, with the API and Deps.
	Routes []func(huma.API, *Deps)
	// Title and Version label the OpenAPI document (defaults "doppel API", "dev").
	Title, Version string
	// TwinState, when set, answers an environment's live twin state (stopped, booting or ready) for the single
	// environment read; without it the read shows the last state recorded in the database.
	TwinState func(ctx context.Context, envID string) (string, error)
	// BodyBudget is the most request-body bytes the API holds at once over all requests (0: DefaultBodyBudget;
	// negative: no budget). A request it cannot hold answers 503 with Retry-After; one whose Content-Length alone
	// passes it answers 413.
	BodyBudget int64
	// BodyLimits are the body budget's shares and read rate (its Size is BodyBudget's; zero fields: the defaults).
	BodyLimits BodyLimits
	// FailedCredentialsPerMinute and FailedCredentialBurst budget each client address's credentials that do not
	// resolve, on every route (0: DefaultFailedCredentialsPerMinute, DefaultFailedCredentialBurst; negative: off).
	FailedCredentialsPerMinute float64
	FailedCredentialBurst      int
	// TRPCMaxBatch is the most procedures one tRPC batch may name (0: DefaultTRPCMaxBatch); a larger batch answers
	// 413 PAYLOAD_TOO_LARGE before any runs.
	TRPCMaxBatch int
	// ReturnMemoryEvery is the shortest time between two returns of free memory to the OS, made once no large
	// body is in flight (0: DefaultReturnMemoryEvery; negative: never).
	ReturnMemoryEvery time.Duration
	// Observer, when set, is told what the API serves (telemetry.Metrics is one).
	Observer Observer
	// Metrics, when set, is served at GET /metrics on the API listener (unauthenticated).
	Metrics http.Handler
	// Tracer, when set, makes a server span of each request, continuing a trace its traceparent header names
	// (Propagator reads it); handlers' spans are its children.
	Tracer     trace.TracerProvider
	Propagator propagation.TextMapPropagator
	// WebSecret signs the console's web session JWTs (config console.secret; at least 32 bytes). Empty: a secret
	// generated once and kept in the database.
	WebSecret []byte
	// WebSessionTTL is how long a console sign-in lasts (0: DefaultWebSessionTTL).
	WebSessionTTL time.Duration
	// KeyCacheTTL, when positive, caches what workspace keys and MCP tokens resolve to for that long
	// (DefaultKeyCacheTTL in doppel serve and dev): a key revoked, or a workspace changed, by another process is
	// refused within it; by this one at once. 0: every request reads its key from the database.
	KeyCacheTTL time.Duration
}

// Observer is told what the API serves, for metrics. Its methods must be cheap: Call runs on every session call.
type Observer interface {
	BudgetObserver
	// Call records an answered session call: its transport (rest, trpc, mcp), fidelity and rung, and its stage
	// times (the Server-Timing stages).
	Call(transport, fidelity, rung string, auth, twin, journal, total time.Duration)
	// Collected records an accepted collect batch of n body bytes.
	Collected(n int64)
}

// Deps is what a route group gets from the API.
type Deps struct {
	DB     *bun.DB
	Logger *slog.Logger
	// Auth resolves credentials; huma operations get this for free by setting Security
	// (WorkspaceKeyAuth, SessionAuth, MCPAuth) and reading PrincipalFrom(ctx).
	Auth *Authenticator
	// TwinState is Options.TwinState (may be nil).
	TwinState func(ctx context.Context, envID string) (string, error)
	// Mux takes plain net/http routes (e.g. tRPC, MCP, streaming). They get the request id,
	// panic recovery and access log too; write errors with WriteError.
	Mux *http.ServeMux
	// Observer is Options.Observer (may be nil).
	Observer Observer
	// Tracer is Options.Tracer (nil: no tracing).
	Tracer trace.TracerProvider

	srv *server // BodyCap records plain routes' caps on it
}

// New builds the API: every built-in route, then each of opts.Routes.
func New(opts Options) (http.Handler, huma.API) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Title == "" {
		opts.Title = "doppel API"
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	mux := http.NewServeMux()
	var budgetObs BudgetObserver
	if opts.Observer != nil {
		budgetObs = opts.Observer
	}
	limits := opts.BodyLimits
	limits.Size = opts.BodyBudget
	srv := &server{mux: mux, logger: logger, budget: newBodyBudget(limits, opts.ReturnMemoryEvery, budgetObs), caps: map[string]int64{}}
	if opts.Tracer != nil {
		srv.tracer = opts.Tracer.Tracer("doppel/api")
		srv.prop = opts.Propagator
		if srv.prop == nil {
			srv.prop = propagation.TraceContext{}
		}
	}
	// The adapter serves through srv, so humatest and every other caller of
	// humaAPI.Adapter() get the request id, recovery and envelope 404/405s too.
	humaAPI := huma.NewAPI(config(opts.Title, opts.Version), &adapter{Adapter: humago.NewAdapter(mux, ""), srv: srv})
	serveDocuments(mux, humaAPI.OpenAPI())
	web := &WebSessions{DB: opts.DB, Secret: opts.WebSecret, TTL: opts.WebSessionTTL}
	auth := &Authenticator{DB: opts.DB, FailedPerMinute: opts.FailedCredentialsPerMinute, FailedBurst: opts.FailedCredentialBurst}
	srv.auth, srv.web = auth, web
	if opts.KeyCacheTTL > 0 && opts.DB != nil {
		auth.keys = newKeyCache(opts.DB, opts.KeyCacheTTL)
	}
	humaAPI.UseMiddleware(auth.middleware(humaAPI), checkBodyStrings)
	deps := &Deps{DB: opts.DB, Logger: logger, Auth: auth, Mux: mux, TwinState: opts.TwinState, Observer: opts.Observer, srv: srv}
	if opts.Tracer != nil {
		deps.Tracer = opts.Tracer
	}
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", opts.Metrics)
	}

	registerHealth(humaAPI, opts)
	registerEnvs(humaAPI, deps)
	registerKeys(humaAPI, deps)
	registerRegistry(humaAPI)
	for _, r := range opts.Routes {
		r(humaAPI, deps)
	}
	srv.trpc = newTRPC(mux, humaAPI, web, opts.TRPCMaxBatch)
	registerDocs(mux, humaAPI)
	registerConsole(mux, auth, web)
	for pattern, n := range plainRouteCaps {
		if _, set := srv.caps[pattern]; !set {
			srv.setCap(pattern, n)
		}
	}

	return srv, humaAPI
}

// adapter is humago's adapter serving through the server wrapper.
type adapter struct {
	huma.Adapter
	srv *server
}

func (a *adapter) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.srv.ServeHTTP(w, r) }

// Handle records the operation's body cap for admission, then registers it as humago does (same pattern).
func (a *adapter) Handle(op *huma.Operation, handler func(huma.Context)) {
	// huma refuses a body of MaxBodyBytes or more; an operation without a Body field (a raw body read by the route,
	// as collect's) keeps 0 and is bounded by the route itself and the budget.
	n := op.MaxBodyBytes - 1
	if op.MaxBodyBytes <= 0 {
		n = 0
	}
	a.srv.setCap(strings.ToUpper(op.Method)+" "+op.Path, n)
	a.Adapter.Handle(op, handler)
}

func config(title, version string) huma.Config {
	c := huma.DefaultConfig(title, version)
	c.CreateHooks = nil // no $schema links in bodies
	c.SchemasPath = ""
	c.OpenAPIPath = "" // the documents are served by serveDocuments, the 3.0 one translated (openapi_compat.go)
	c.DocsPath = ""    // our own, self-contained /docs
	c.RejectUnknownQueryParameters = true
	c.Formats = map[string]huma.Format{
		"application/json": huma.DefaultJSONFormat,
		"json":             huma.DefaultJSONFormat,
	}
	c.Transformers = []huma.Transformer{fillRequestID}
	c.Info.Description = apiDescription()
	c.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		SchemeWorkspaceKey: {Type: "http", Scheme: "bearer", Description: "Workspace key, `mk_live_…`. Environment routes, collect, key management."},
		SchemeSessionToken: {Type: "http", Scheme: "bearer", Description: "Session token, `ms_…`, returned once when a session opens. Session routes only; revoked when the session ends."},
		SchemeMCPToken:     {Type: "http", Scheme: "bearer", Description: "MCP access token, `mcp_at_…`. The MCP server."},
		SchemeAdminKey:     {Type: "http", Scheme: "bearer", Description: "The admin key (config `admin.key`). Admin verbs only; any other credential there is a 403."},
	}
	c.OnAddOperation = append(c.OnAddOperation, documentErrors, nameGenerated)
	return c
}

// documentErrors adds the envelope to every operation's responses: the codes its inputs and
// auth can produce, 500, and a default.
func documentErrors(oapi *huma.OpenAPI, op *huma.Operation) {
	ref := oapi.Components.Schemas.Schema(typeOfEnvelope, true, "Envelope")
	add := func(status int) {
		key := statusKey(status)
		if _, ok := op.Responses[key]; ok {
			return
		}
		op.Responses[key] = &huma.Response{
			Description: http.StatusText(status),
			Content:     map[string]*huma.MediaType{"application/json": {Schema: ref}},
		}
	}
	if len(op.Security) > 0 {
		add(http.StatusUnauthorized)
		add(http.StatusForbidden)
	}
	hasPath := strings.Contains(op.Path, "{")
	if hasPath || len(op.Security) > 0 {
		add(http.StatusNotFound)
	}
	if len(op.Parameters) > 0 || op.RequestBody != nil {
		add(http.StatusUnprocessableEntity)
	}
	if op.RequestBody != nil {
		add(http.StatusRequestEntityTooLarge)
	}
	add(http.StatusInternalServerError)
	if _, ok := op.Responses["default"]; !ok {
		op.Responses["default"] = &huma.Response{
			Description: "Any error: the envelope {detail, code, requestId}.",
			Content:     map[string]*huma.MediaType{"application/json": {Schema: ref}},
		}
	}
}

// server wraps the mux with the request id, panic recovery, the access log, and envelope 404/405s.
type server struct {
	mux    *http.ServeMux
	trpc   http.Handler // owns every path under /trpc/, unclean ones included
	logger *slog.Logger
	budget *bodyBudget // nil: no body budget
	auth   *Authenticator
	web    *WebSessions
	// trustForwarded takes client addresses from X-Forwarded-For (WebSessions.TrustForwardedFor).
	trustForwarded bool
	capsMu         sync.RWMutex
	caps           map[string]int64 // body cap of each mux pattern (0: only the budget's)
	tracer         trace.Tracer     // nil: no spans
	prop           propagation.TextMapPropagator
}

type reqInfo struct {
	id        string
	logger    *slog.Logger
	start     time.Time     // when the request reached the API
	transport string        // rest, trpc or mcp
	auth      time.Duration // time the credential took to resolve
	addr      string        // the client's address (failed credentials are counted per address)
}

// requestInfo is the request's reqInfo (nil outside a request).
func requestInfo(ctx context.Context) *reqInfo {
	ri, _ := ctx.Value(reqKey{}).(*reqInfo)
	return ri
}

// transportOf names the transport a request path belongs to.
func transportOf(path string) string {
	switch {
	case strings.HasPrefix(path, "/trpc/"):
		return "trpc"
	case path == "/mcp" || strings.HasPrefix(path, "/mcp/"):
		return "mcp"
	}
	return "rest"
}

type reqKey struct{}

// newRequest returns ctx carrying a request of its own: an id (req_…) for the envelopes answered in it, and logger.
// For work an outer request does not frame, e.g. an MCP tool call on a session's stream.
func newRequest(ctx context.Context, logger *slog.Logger) context.Context {
	ri := &reqInfo{id: schema.NewID(schema.PrefixRequest), logger: logger, start: time.Now(), transport: "mcp"}
	return context.WithValue(ctx, reqKey{}, ri)
}

// RequestID returns the request's id (req_…), "" outside a request.
func RequestID(ctx context.Context) string {
	if ri, ok := ctx.Value(reqKey{}).(*reqInfo); ok {
		return ri.id
	}
	return ""
}

// requestLogger is loggerFrom with the request's id, for services that log on a request's behalf.
func requestLogger(ctx context.Context) *slog.Logger {
	return loggerFrom(ctx).With(slog.String("request_id", RequestID(ctx)))
}

func loggerFrom(ctx context.Context) *slog.Logger {
	if ri, ok := ctx.Value(reqKey{}).(*reqInfo); ok {
		return ri.logger
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// accessLog writes a request's line, as InfoContext would with the same attributes, but without looking up the
// caller's program counter, which no handler of ours prints (none sets AddSource).
func (s *server) accessLog(r *http.Request, id string, status int, start time.Time) {
	h := s.logger.Handler()
	if !h.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	now := time.Now()
	rec := slog.NewRecord(now, slog.LevelInfo, "request", 0)
	rec.AddAttrs(slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.Duration("dur", now.Sub(start)))
	_ = h.Handle(r.Context(), rec)
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ri := &reqInfo{id: schema.NewID(schema.PrefixRequest), logger: s.logger, start: start, transport: transportOf(r.URL.Path),
		addr: clientAddress(r.RemoteAddr, r.Header.Get("X-Forwarded-For"), s.trustForwarded)}
	ctx := context.WithValue(r.Context(), reqKey{}, ri)
	pattern := ""
	if ri.transport != "trpc" {
		_, pattern = s.mux.Handler(r)
	}
	var span trace.Span
	if s.tracer != nil {
		ctx, span = s.startSpan(ctx, r, pattern, ri.id)
	}
	r = r.WithContext(ctx)
	w.Header().Set("X-Request-Id", ri.id)
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		if span != nil {
			endSpan(span, sw.status())
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.logger.ErrorContext(r.Context(), "panic", slog.String("request_id", ri.id), slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			if !sw.wrote {
				e := NewError(http.StatusInternalServerError, "internal error; quote request id "+ri.id+" when reporting it")
				e.RequestID = ri.id
				writeEnvelope(sw, http.StatusInternalServerError, e)
			}
		}
		s.accessLog(r, ri.id, sw.status(), start)
	}()
	if e := checkURL(r); e != nil {
		e.RequestID = ri.id
		if strings.HasPrefix(r.URL.Path, "/trpc/") {
			trpcFail(sw, r, e) // a tRPC client reads tRPC's error shape
			return
		}
		writeEnvelope(sw, e.status, e)
		return
	}
	if s.budget != nil && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		adm, e := s.budget.admit(w, r, s.routeCap(r, pattern), s.clientOf(r))
		if e != nil {
			e.RequestID = ri.id
			refuse(sw, r, e)
			return
		}
		if adm == nil {
			adm = &admission{release: func() {}, routeDeadline: func(time.Time) {}}
		}
		defer adm.release()
		sw.onReadDeadline = adm.routeDeadline
		// A body that ran out of budget while read (unknown length) is answered 503, one that arrived under the
		// minimum rate 408, whatever its handler made of the failed read.
		sw.intercept = func() (int, bool) {
			var e *Envelope
			switch {
			case adm.slow.Load():
				e = s.budget.slowRefusal()
			case adm.over.Load():
				e = s.budget.refusal()
			default:
				return 0, false
			}
			e.RequestID = ri.id
			refuse(sw.ResponseWriter, r, e)
			return e.status, true
		}
	}
	if pattern == "POST "+oauthAuthorize {
		// The consent form checks a workspace key: an address out of failed credentials is refused before the form
		// is read, as every other credential check refuses it (the consent page itself would answer 401).
		if err := s.auth.failureGate(r.Context()); err != nil {
			WriteError(sw, r, err)
			return
		}
	}
	if s.trpc != nil && strings.HasPrefix(r.URL.Path, "/trpc/") {
		// tRPC answers its own 404s and never redirects: a client reads tRPC's shape.
		s.trpc.ServeHTTP(sw, r)
		return
	}
	if pattern == "" {
		s.unrouted(sw, r, ri.id)
		return
	}
	s.mux.ServeHTTP(sw, r)
}

// unrouted answers a request no route matches: 405 with Allow when the path exists under other methods, else 404.
func (s *server) unrouted(w http.ResponseWriter, r *http.Request, rid string) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	var e *Envelope
	status := http.StatusNotFound
	if len(allow) > 0 {
		status = http.StatusMethodNotAllowed
		w.Header().Set("Allow", strings.Join(allow, ", "))
		e = Errorf(status, "method %s not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allow, ", "))
	} else {
		e = NotFound("no route %s %s", r.Method, r.URL.Path)
	}
	e.RequestID = rid
	writeEnvelope(w, status, e)
}

// statusWriter records whether and with what status the response was started.
type statusWriter struct {
	http.ResponseWriter
	wrote bool
	code  int
	// intercept, when set, may answer in the handler's stead as the response starts; it reports whether it did,
	// and the handler's answer is then dropped.
	intercept func() (int, bool)
	dropped   bool
	// onReadDeadline, when set, is told of a read deadline the handler sets (the body budget keeps it).
	onReadDeadline func(time.Time)
}

// start records the response's start; false means it was intercepted.
func (w *statusWriter) start(code int) bool {
	if w.wrote {
		return !w.dropped
	}
	w.wrote = true
	if w.intercept != nil {
		if status, ok := w.intercept(); ok {
			w.code, w.dropped = status, true
			return false
		}
	}
	w.code = code
	return true
}

func (w *statusWriter) WriteHeader(code int) {
	if w.start(code) {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.start(http.StatusOK) {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) status() int {
	if !w.wrote {
		return http.StatusOK
	}
	return w.code
}

// Flush lets streaming routes flush through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.start(http.StatusOK) {
			f.Flush()
		}
	}
}

// SetReadDeadline passes a handler's read deadline on (http.ResponseController finds it here), telling the body
// budget of it first.
func (w *statusWriter) SetReadDeadline(t time.Time) error {
	if w.onReadDeadline != nil {
		w.onReadDeadline(t)
	}
	return http.NewResponseController(w.ResponseWriter).SetReadDeadline(t)
}

// Unwrap exposes the underlying writer to http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func jsonEncode(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

func statusKey(status int) string { return strconv.Itoa(status) }
