package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Defaults of CollectOptions.
const (
	DefaultCollectMaxRequestBytes = 32 << 20
	DefaultCollectMaxEnvBytes     = 4 << 30
	DefaultCollectRatePerSecond   = 50
	DefaultCollectRateBurst       = 100
	DefaultCollectBlobPrefix      = "batches"
	collectBodyReadTimeout        = time.Minute
	collectPath                   = "/api/collect"
	scheduleTimeout               = 10 * time.Second
)

// BuildScheduler is told that an environment has new traces; the implementation debounces the
// rebuild. It is called after the batch is durable; an error is logged, not answered.
type BuildScheduler interface {
	ScheduleBuild(ctx context.Context, workspaceID, envID string) error
}

// CollectOptions configure POST /api/collect. Zero values mean the defaults.
type CollectOptions struct {
	// Blobs keeps each accepted batch as one compressed, content-addressed blob. Required to serve;
	// without it (e.g. only to render the OpenAPI document) every request answers 503.
	Blobs blob.Store
	// Scheduler, when set, is told after each batch that added traces to an environment.
	Scheduler BuildScheduler
	// MaxRequestBytes caps a request body (default 32 MiB); larger bodies answer 413.
	MaxRequestBytes int64
	// MaxEnvBytes caps the body bytes collected into one environment (default 4 GiB); a batch whose new
	// traces would pass it answers 413. Traces the environment already holds never count.
	MaxEnvBytes int64
	// MaxTraces caps the traces of one request (default ingest.DefaultMaxTraces, 1000); more answer 413.
	MaxTraces int
	// RatePerSecond and RateBurst shape the per-client-address token bucket (defaults 50 and 100);
	// a request over it answers 429 with Retry-After. A negative RatePerSecond turns the limit off.
	RatePerSecond float64
	RateBurst     int
	// TrustForwardedFor takes the client address from X-Forwarded-For's first entry (set it only
	// behind a proxy that writes that header); by default the connection's address counts.
	TrustForwardedFor bool
	// BlobPrefix prefixes blob keys: <prefix>/<workspace id>/<hex sha256 of the blob> (default "batches").
	BlobPrefix string
	// Now is the rate limiter's clock (default time.Now).
	Now func() time.Time
}

func (o CollectOptions) withDefaults() CollectOptions {
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultCollectMaxRequestBytes
	}
	if o.MaxEnvBytes <= 0 {
		o.MaxEnvBytes = DefaultCollectMaxEnvBytes
	}
	if o.MaxTraces <= 0 {
		o.MaxTraces = ingest.DefaultMaxTraces
	}
	if o.RatePerSecond == 0 {
		o.RatePerSecond = DefaultCollectRatePerSecond
	}
	if o.RateBurst <= 0 {
		o.RateBurst = DefaultCollectRateBurst
	}
	if o.BlobPrefix == "" {
		o.BlobPrefix = DefaultCollectBlobPrefix
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// CollectAccepted is the answer to an accepted batch. Not CollectResponse: generated clients name the wrapper of
// operation collect so (see openapi_names.go).
type CollectAccepted struct {
	Accepted   int    `json:"accepted" doc:"Traces of the batch stored now and counted in the environment's n_traces."`
	Duplicates int    `json:"duplicates" doc:"Traces whose id the environment already held: neither stored nor counted again, so resending a batch after a timeout is safe."`
	Env        string `json:"env" doc:"Slug of the project's environment (created, status collecting, by its first batch)." example:"tau-retail"`
	Batch      string `json:"batch" doc:"Id of the stored batch." example:"tb_0123456789abcdef"`
}

// collectInput has no body field: gate reads the body (readCollectBody), and document describes it.
type collectInput struct {
	Framework string `header:"X-Doppel-Framework" maxLength:"64" doc:"The agent's framework, when the sender knows it (e.g. langgraph); detected from the traces and User-Agent otherwise."`
	Language  string `header:"X-Doppel-Language" maxLength:"64" doc:"The agent's language, when the sender knows it (e.g. python); detected from the User-Agent otherwise."`
}

type collectOutput struct {
	Status int
	Body   CollectAccepted
}

// The request body as documented; requests are decoded by ingest.Decode, not by these types.
type collectBody struct {
	Project string         `json:"project" minLength:"1" maxLength:"128" doc:"Project the traces belong to; one per agent. Its slug (lower-case ASCII letters and digits joined by '-') names the environment, so it must hold at least one ASCII letter or digit." example:"tau-retail"`
	Traces  []collectTrace `json:"traces" minItems:"1" maxItems:"1000" doc:"The batch. Trace ids are unique within it."`
}

type collectTrace struct {
	ID       string           `json:"id" minLength:"1" maxLength:"512" doc:"Unique per trace within the project: a trace id the environment already holds is skipped and counted as a duplicate."`
	Model    string           `json:"model,omitempty" maxLength:"256"`
	Messages []collectMessage `json:"messages" minItems:"1" doc:"OpenAI-style chat messages."`
}

type collectMessage struct {
	Role       string            `json:"role" enum:"system,user,assistant,tool"`
	Content    *string           `json:"content" required:"false" nullable:"true" doc:"Text. null (or absent) only on an assistant message that has tool_calls."`
	ToolCalls  []collectToolCall `json:"tool_calls,omitempty" doc:"Assistant messages only. Also accepted as toolCalls."`
	ToolCallID string            `json:"tool_call_id,omitempty" doc:"Required on tool messages, only there: the id of the earlier tool call this answers. Also accepted as toolCallId."`
	Name       string            `json:"name,omitempty"`
}

type collectToolCall struct {
	ID       string          `json:"id" minLength:"1" maxLength:"256" doc:"Unique within its message."`
	Type     string          `json:"type,omitempty" enum:"function"`
	Function collectFunction `json:"function"`
}

type collectFunction struct {
	Name      string `json:"name" minLength:"1" maxLength:"256" doc:"The tool's name, no white space."`
	Arguments string `json:"arguments" minLength:"1" doc:"A string holding JSON, e.g. \"{\\\"order_id\\\": \\\"#W1\\\"}\"." example:"{\"order_id\": \"#W1\"}"`
}

// errEnvFull rolls back a batch that would take its environment past MaxEnvBytes.
var errEnvFull = errors.New("environment full")

type uaKey struct{}

// CollectRoutes returns the route group that registers POST /api/collect, for Options.Routes.
func CollectRoutes(opts CollectOptions) func(huma.API, *Deps) {
	return func(a huma.API, d *Deps) { RegisterCollect(a, d, opts) }
}

// RegisterCollect registers POST /api/collect (spec §4.12): a workspace key and a collect body
// {project, traces}. The body is checked field by field (422 names every bad field's path); an
// accepted body is stored as it came, as one compressed blob keyed by its SHA-256, and then, in one transaction,
// as a batch row, one row per trace id new to the environment (created on the project's first
// batch) and the environment's counters. Nothing is acknowledged before both are durable.
func RegisterCollect(a huma.API, d *Deps, opts CollectOptions) {
	opts = opts.withDefaults()
	c := &collect{opts: opts, deps: d}
	if opts.RatePerSecond > 0 {
		c.limiter = newKeyedLimiter(opts.RatePerSecond, opts.RateBurst, opts.Now)
	}
	huma.Register(a, huma.Operation{
		OperationID: "collect",
		Method:      http.MethodPost,
		Path:        collectPath,
		Summary:     "Collect traces",
		Description: "Stores a batch of an agent's traces under its project's environment, creating the " +
			"environment (status `collecting`) on the project's first batch. Trace ids are unique per " +
			"environment: traces already held are skipped and counted as duplicates, so a collector may " +
			"resend a batch after a timeout. A batch is stored whole or not at all, and answered only once " +
			"it is durable.\n\nLimits: the request body (default 32 MiB) and the traces per request (1000) " +
			"answer 413, as does a batch whose new traces would take the environment past its collected-bytes " +
			"cap (default 4 GiB; traces it already holds never count, so a resend always answers 202); each " +
			"client address may send 50 requests a second with bursts of 100 (defaults), above which 429 " +
			"answers with Retry-After. 503 means the blob store or the database is not answering: nothing was " +
			"stored, retry.",
		Tags:          []string{"collect"},
		DefaultStatus: http.StatusAccepted,
		Metadata:      map[string]any{metaRawStrings: true, MetaVerb: false}, // ingest.Check checks the text it stores; plain HTTP (spec §1), not a verb
		Middlewares:   huma.Middlewares{c.gate},
	}, c.handle)
	document(a)
}

// document fills in what huma cannot infer for a raw-body operation: the body schema, the security
// and the error answers of the gate. It documents a copy of the operation: the operation huma
// runs keeps no Security, so the API's auth middleware (which answers 500 when the database is
// down) leaves the key to gate (which answers 503, a status collectors retry).
func document(a huma.API) {
	oapi := a.OpenAPI()
	item := oapi.Paths[collectPath]
	if item == nil || item.Post == nil {
		return
	}
	op := *item.Post
	op.Security = WorkspaceKeyAuth()
	bodySchema := oapi.Components.Schemas.Schema(reflect.TypeOf(collectBody{}), true, "")
	documentFormats(oapi, bodySchema)
	op.RequestBody = &huma.RequestBody{
		Description: "A collect body (spec §2.7), its traces in any of three formats.",
		Required:    true,
		Content: map[string]*huma.MediaType{"application/json": {
			Schema: bodySchema,
		}},
	}
	ref := oapi.Components.Schemas.Schema(typeOfEnvelope, true, "Envelope")
	responses := make(map[string]*huma.Response, len(op.Responses)+6)
	for k, v := range op.Responses {
		responses[k] = v
	}
	for status, desc := range map[int]string{
		http.StatusUnauthorized:          "No or invalid workspace key.",
		http.StatusForbidden:             "Workspace access pending or denied.",
		http.StatusRequestEntityTooLarge: "The body, its trace count, or the environment's collected bytes is over its cap.",
		http.StatusUnprocessableEntity:   "A field is invalid; `errors` lists each as body.<path> (e.g. body.traces[3].messages[2].role).",
		http.StatusTooManyRequests:       "Over the per-address rate; Retry-After says when to retry.",
		http.StatusServiceUnavailable:    "The blob store or the database is not answering; nothing was stored.",
	} {
		r := &huma.Response{Description: desc, Content: map[string]*huma.MediaType{"application/json": {Schema: ref}}}
		if status == http.StatusTooManyRequests {
			r.Headers = map[string]*huma.Param{"Retry-After": {Description: "Seconds to wait.", Schema: &huma.Schema{Type: "integer"}}}
		}
		responses[strconv.Itoa(status)] = r
	}
	op.Responses = responses
	item.Post = &op
}

type collect struct {
	opts    CollectOptions
	deps    *Deps
	limiter *keyedLimiter
}

// gate runs the rate limit, then checks the workspace key, then reads the body. A key that cannot be checked
// because the database does not answer is a 503 (the collector retries), not a 500.
func (c *collect) gate(ctx huma.Context, next func(huma.Context)) {
	if c.limiter != nil {
		if ok, wait := c.limiter.allow(c.address(ctx)); !ok {
			ctx.SetHeader("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			writeHumaError(ctx, RateLimited(fmt.Sprintf("over %g collect requests a second from this address; retry after %s", c.opts.RatePerSecond, wait.Round(time.Millisecond))))
			return
		}
	}
	p, err := c.deps.Auth.Workspace(ctx.Context(), ctx.Header("Authorization"))
	if err != nil {
		var e *Envelope
		if !errors.As(err, &e) {
			c.logger(ctx.Context()).WarnContext(ctx.Context(), "collect: resolve key", slog.Any("error", err))
			err = Unavailable("the metadata database is not answering; nothing was stored, retry")
		}
		writeHumaError(ctx, err)
		return
	}
	body, release, err := readCollectBody(ctx, c.opts.MaxRequestBytes)
	if err != nil {
		writeHumaError(ctx, err)
		return
	}
	defer release() // the answer is written: nothing holds the body any more
	ctx = huma.WithValue(ctx, principalKey{}, p)
	ctx = huma.WithValue(ctx, bodyKey{}, body)
	next(huma.WithValue(ctx, uaKey{}, ctx.Header("User-Agent")))
}

func (c *collect) address(ctx huma.Context) string {
	return clientAddress(ctx.RemoteAddr(), ctx.Header("X-Forwarded-For"), c.opts.TrustForwardedFor)
}

func (c *collect) logger(ctx context.Context) *slog.Logger {
	if c.deps.Logger != nil {
		return c.deps.Logger
	}
	return loggerFrom(ctx)
}

func (c *collect) handle(ctx context.Context, in *collectInput) (*collectOutput, error) {
	p := PrincipalFrom(ctx)
	if p == nil {
		return nil, Unauthorized("missing credential")
	}
	if c.opts.Blobs == nil || c.deps.DB == nil {
		return nil, Unavailable("collect is not configured with a blob store and a database")
	}
	body, err := c.fromUpload(ctx, p.Workspace.ID, requestBody(ctx))
	if err != nil {
		return nil, err
	}
	body, tools, err := normalizeCollect(body)
	if err != nil {
		return nil, err
	}
	env, res, err := c.storeBatch(ctx, p.Workspace.ID, body, ingest.Hints{UserAgent: userAgent(ctx), Framework: in.Framework, Language: in.Language})
	if err != nil {
		return nil, err
	}
	addTools(context.WithoutCancel(ctx), c.logger(ctx), c.deps.DB, c.opts.Blobs, env.ID, tools)
	if c.deps.Observer != nil {
		c.deps.Observer.Collected(int64(len(body)))
	}
	if len(res.Inserted) > 0 && c.opts.Scheduler != nil {
		// The batch is stored: schedule its rebuild even if the client has gone meanwhile.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), scheduleTimeout)
		err := c.opts.Scheduler.ScheduleBuild(sctx, env.WorkspaceID, env.ID)
		cancel()
		if err != nil {
			c.logger(ctx).WarnContext(ctx, "collect: schedule build", slog.String("env", env.ID), slog.Any("error", err))
		}
	}
	return &collectOutput{Status: http.StatusAccepted, Body: CollectAccepted{
		Accepted: len(res.Inserted), Duplicates: len(res.Duplicates), Env: env.Slug, Batch: res.Batch.ID,
	}}, nil
}

// storeBatch stores a collect body in workspace ws: decoded and checked, as one content-addressed blob, then in one
// transaction a batch row, a row per trace new to the project's environment (created by its first batch) and the
// environment's counters. Nothing is acknowledged before both are durable.
func (c *collect) storeBatch(ctx context.Context, ws string, body []byte, hints ingest.Hints) (*schema.Environment, *store.BatchResult, error) {
	db := c.deps.DB
	// The body is stored as it came, so its texts need checking but no copy.
	parsed, err := ingest.Check(body, ingest.Options{MaxTraces: c.opts.MaxTraces})
	if err != nil {
		return nil, nil, decodeError(err)
	}
	n := int64(len(body))

	// A cheap early refusal of a batch its environment has no room for, before the blob is written. Only the
	// traces new to the environment count: a resent batch costs nothing, however full the environment is.
	// The transaction below checks again, under the environment's row lock.
	env, err := store.GetEnv(ctx, db, ws, parsed.Slug)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, nil, c.unavailable(ctx, "database", err)
	case env.CollectedBytes+n > c.opts.MaxEnvBytes:
		cost, err := newBytes(ctx, db, env.ID, parsed, n)
		if err != nil {
			return nil, nil, c.unavailable(ctx, "database", err)
		}
		if env.CollectedBytes+cost > c.opts.MaxEnvBytes {
			return nil, nil, c.envFull(env.Slug, env.CollectedBytes, cost)
		}
	}

	data, err := ingest.EncodeBodyBlob(body)
	if err != nil {
		return nil, nil, err
	}
	key, err := blob.PutContent(ctx, c.opts.Blobs, c.opts.BlobPrefix+"/"+ws, data, ingest.BlobContentType)
	if err != nil {
		return nil, nil, c.unavailable(ctx, "blob store", err)
	}

	agent := ingest.Detect(&parsed.Batch, hints)
	var res *store.BatchResult
	write := func(ctx context.Context, tx bun.Tx) error {
		var err error
		if env == nil {
			// The project's first batch: its environment is made with it, and rolled back with it.
			if env, err = store.UpsertEnvByProject(ctx, tx, ws, parsed.Batch.Project); err != nil {
				return err
			}
		}
		// An environment that exists is locked only at the end, by its counters' update: concurrent batches of one
		// environment wait for each other only from there to their commit.
		batch := &schema.TraceBatch{EnvID: env.ID, BlobKey: key, Bytes: n, ToolsSeen: parsed.Tools}
		res, err = store.InsertTraceBatchSized(ctx, tx, batch, parsed.TraceIDs(), parsed.TraceBytes)
		if err != nil {
			return err
		}
		env = res.Env // as it is now, locked until the transaction ends
		if env.CollectedBytes > c.opts.MaxEnvBytes {
			return errEnvFull // rolls the batch back
		}
		var cols []string
		if agent.Framework != "" && (env.Framework == "" || hints.Framework != "") && env.Framework != agent.Framework {
			env.Framework = agent.Framework
			cols = append(cols, "framework")
		}
		if agent.Language != "" && (env.Language == "" || hints.Language != "") && env.Language != agent.Language {
			env.Language = agent.Language
			cols = append(cols, "language")
		}
		// Until a build counts the tool catalog, n_tools is at least the tools one batch called.
		if int64(len(parsed.Tools)) > env.NTools {
			env.NTools = int64(len(parsed.Tools))
			cols = append(cols, "n_tools")
		}
		if len(cols) > 0 {
			return store.UpdateEnv(ctx, tx, env, cols...)
		}
		return nil
	}
	existed := env != nil
	err = db.RunInTx(ctx, nil, write)
	if existed && errors.Is(err, store.ErrNotFound) {
		// The environment was deleted since it was looked up: the batch makes it anew, as a first batch does.
		env = nil
		err = db.RunInTx(ctx, nil, write)
	}
	switch {
	case errors.Is(err, errEnvFull):
		return nil, nil, c.envFull(env.Slug, env.CollectedBytes-res.Bytes, res.Bytes)
	case err != nil:
		if e := StoreError(err, "environment"); e != err {
			return nil, nil, e
		}
		return nil, nil, c.unavailable(ctx, "database", err)
	}
	return env, res, nil
}

func userAgent(ctx context.Context) string {
	s, _ := ctx.Value(uaKey{}).(string)
	return s
}

// decodeError turns ingest's field errors into the 422 envelope (413 when over MaxTraces).
func decodeError(err error) error {
	var ie *ingest.Error
	if !errors.As(err, &ie) {
		return Invalid("body", err.Error())
	}
	status := http.StatusUnprocessableEntity
	if ie.OverLimit {
		status = http.StatusRequestEntityTooLarge
	}
	e := NewError(status, "")
	for _, f := range ie.Fields {
		loc := "body"
		if f.Path != "body" {
			loc = "body." + f.Path
		}
		e.Errors = append(e.Errors, FieldError{Location: loc, Message: f.Message})
	}
	first := e.Errors[0]
	e.Detail = first.Location + ": " + first.Message
	if more := len(e.Errors) - 1; more > 0 {
		e.Detail += fmt.Sprintf(" (and %d more", more)
		if ie.Truncated {
			e.Detail += "; stopped after these"
		}
		e.Detail += ")"
	}
	return e
}

func (c *collect) envFull(slug string, have, n int64) error {
	return TooLarge("environment %s holds %d collected bytes; the %d bytes of this batch's new traces would pass its cap of %d",
		slug, have, n, c.opts.MaxEnvBytes)
}

// newBytes is what a batch of n body bytes would add to its environment's collected bytes: the body less the
// traces the environment already holds, nothing when it holds them all (store.InsertTraceBatchSized's rule).
func newBytes(ctx context.Context, db bun.IDB, envID string, parsed *ingest.Parsed, n int64) (int64, error) {
	ids := parsed.TraceIDs()
	held, err := store.HeldTraceIDs(ctx, db, envID, ids)
	if err != nil {
		return 0, err
	}
	if len(held) == len(ids) {
		return 0, nil
	}
	for i, id := range ids {
		if held[id] {
			n -= parsed.TraceBytes[i]
		}
	}
	return max(n, 0), nil
}

func (c *collect) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return Unavailable("request ended before the batch was stored: %v", ctx.Err())
	}
	c.logger(ctx).WarnContext(ctx, "collect: "+what+" failed", slog.String("request_id", RequestID(ctx)), slog.Any("error", err))
	return Unavailable("the %s is not answering; nothing was stored, retry", what)
}
