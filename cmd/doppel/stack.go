package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/config"
	"github.com/doppel-dev/doppel/devserver"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/telemetry"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	metering "github.com/doppel-dev/doppel/usage"
	"github.com/doppel-dev/doppel/webhook"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// stack holds the concrete parts a server process runs on; close releases them in reverse order.
type stack struct {
	cfg *config.Config
	log *slog.Logger
	// logOut is where log's lines go (buffered per log.flush_every): flushed after a line that says the process
	// is ready, which scripts and supervisors wait for.
	logOut   *telemetry.LogOutput
	db       *bun.DB
	blobs    blob.Store
	dev      *devserver.Server
	temporal client.Client
	// locals are the twins this process serves itself (twin.driver=inproc, once the worker has started): the API and
	// the session activities call them directly.
	locals  rpc.Locals
	closers []func() error
	plane   *toolplane.Plane
	// metrics is this process's registry (nil: metrics.enabled is off); tracing its tracer provider (off unless
	// otel.endpoint or OTEL_EXPORTER_OTLP_ENDPOINT says where spans go).
	metrics *telemetry.Metrics
	tracing *telemetry.Tracing
	// meters reads usage from the database; gate enforces the plans with it (nil: usage.enforce is off).
	meters *metering.Source
	gate   *metering.Gate
	hooks  *wfclient.Webhooks
	// tagged says the namespace has doppel's search attributes: the workflows this process starts carry them.
	tagged bool
	// otlp is the OTLP trace ingest the API serves at /v1/traces, shared with OTLP/gRPC (filled when the API is built).
	otlp api.TraceIngest
}

// usageSource is the process's usage reader, over the configured plans and period.
func (s *stack) usageSource() *metering.Source {
	if s.meters == nil {
		plans := metering.Plans{ByName: maps.Clone(s.cfg.Plans), Default: s.cfg.Usage.DefaultPlan}
		s.meters = &metering.Source{DB: s.db, Plans: plans, Period: s.cfg.Usage.Period, EnvBytesCap: s.cfg.Collect.MaxEnvBytes,
			Idle: s.cfg.Session.Idle}
	}
	return s.meters
}

// usageGate is the process's plan enforcement, nil when usage.enforce is off.
func (s *stack) usageGate() *metering.Gate {
	if !s.cfg.Usage.Enforce {
		return nil
	}
	if s.gate == nil {
		s.gate = &metering.Gate{Source: s.usageSource(), Refresh: s.cfg.Usage.Refresh, Thresholds: thresholdEvents{s.events()}}
	}
	return s.gate
}

// thresholdEvents records usage.threshold events, deduplicated per workspace, period, meter and threshold, and
// starts their deliveries.
type thresholdEvents struct{ log *activities.EventLog }

func (t thresholdEvents) Threshold(ctx context.Context, ws *schema.Workspace, r *metering.Reading, m metering.Value, percent int) error {
	ev, err := store.NewEvent(ws.ID, events.UsageThreshold, ws.ID, metering.ThresholdKey(ws.ID, r.Start, m.Name, percent),
		events.UsageData{Meter: m.Name, Percent: percent, Used: m.Used, Limit: m.Limit, Unit: m.Unit, PeriodStart: r.Start, PeriodEnd: r.End})
	if err != nil {
		return err
	}
	ids, err := t.log.Record(ctx, nil, ev)
	if err != nil {
		return err
	}
	t.log.Kick(ids)
	return nil
}

// webhookStarter starts webhook deliveries' workflows, for every part of this process that records events.
func (s *stack) webhookStarter() *wfclient.Webhooks {
	if s.hooks == nil {
		w := s.cfg.Webhooks
		s.hooks = &wfclient.Webhooks{Conn: s.conn(),
			Dispatched: func(ctx context.Context, ids []string) error { return store.MarkDispatched(ctx, s.db, ids) },
			Workspaces: func(ctx context.Context, ids []string) (map[string]string, error) {
				return store.DeliveryWorkspaces(ctx, s.db, ids)
			},
			Log: s.log.With("component", "webhooks"), Policy: workflows.DeliveryPolicy{Window: w.RetryWindow,
				Initial: w.BackoffInitial, Max: w.BackoffMax, Attempt: w.AttemptTimeout + 15*time.Second}}
	}
	return s.hooks
}

// conn is the process's connection to its workflows.
func (s *stack) conn() wfclient.Conn {
	return wfclient.Conn{Client: s.temporal, TaskQueue: s.cfg.Temporal.TaskQueue, Tagged: s.tagged}
}

// events records events with the changes they report and starts their deliveries.
func (s *stack) events() *activities.EventLog {
	return &activities.EventLog{DB: s.db, Dispatch: s.webhookStarter()}
}

// webhookGuard is the server-side request forgery guard of webhook URLs (webhooks.allow_cidrs).
func (s *stack) webhookGuard() (*webhook.Guard, error) {
	allow, err := s.cfg.Webhooks.AllowedCIDRs()
	if err != nil {
		return nil, fmt.Errorf("webhooks.allow_cidrs: %w", err)
	}
	return &webhook.Guard{Allow: allow}, nil
}

// tracer is the tracer provider the parts get: nil when tracing is off, so they skip spans at no cost.
func (s *stack) tracer() trace.TracerProvider {
	if !s.tracing.Enabled() {
		return nil
	}
	return s.tracing.Provider()
}

// dbStates reads the gauges /metrics takes from the database.
type dbStates struct{ db *bun.DB }

func (d dbStates) OpenSessions(ctx context.Context) (int64, error) {
	return store.CountOpenSessions(ctx, d.db)
}
func (d dbStates) TwinStates(ctx context.Context) (map[string]int64, error) {
	return store.CountTwinStates(ctx, d.db)
}

// toolPlane is the process's one tool plane (made on first use, with its call journal): the API serves sessions
// through it and the worker's reaper expires them through it.
func (s *stack) toolPlane() (*toolplane.Plane, error) {
	if s.plane != nil {
		return s.plane, nil
	}
	var co journal.CallOptions
	if s.db.Dialect().Name() == dialect.SQLite {
		// Only SQLite's journal lingers: on PostgreSQL, whose commits wait on the server, batches already hold
		// 27-28 calls at peak, and the linger only added idle time (9,468-10,398 calls/s with it against
		// 10,972-11,135 without, three pairs; see journal.DefaultLinger).
		co.Linger, co.LingerStep, co.LingerFrom = journal.DefaultLinger, journal.DefaultLingerStep, journal.DefaultLingerFrom
	}
	if s.metrics != nil {
		co.OnCommit = s.metrics.JournalCommit
	}
	calls, err := journal.NewCalls(s.db, co)
	if err != nil {
		return nil, fmt.Errorf("call journal: %w", err)
	}
	s.onClose(calls.Close)
	o := toolplane.Options{DB: s.db, Opener: sessionWorkflows(s), Twins: twinDirectory(s),
		Journal: calls, Bundles: &toolplane.Bundles{Blob: s.blobs}, Idle: s.cfg.Session.Idle, Locals: s.locals,
		MaxGroup: s.cfg.Session.MaxGroup, Log: s.log.With("component", "toolplane"), Tracer: s.tracer(), Events: s.events()}
	if g := s.usageGate(); g != nil {
		o.Quota = g
	}
	s.plane = toolplane.New(o)
	return s.plane, nil
}

// queries is the process's query service: it runs queries' workflows and reads their rows.
func (s *stack) queries() *query.Service {
	q := &query.Service{DB: s.db, Runner: &wfclient.Queries{Conn: s.conn(), TwinWait: s.cfg.Twin.Wait}, Model: queryModel(s.cfg), Wait: s.cfg.Query.Wait,
		MaxSteps: s.cfg.Query.MaxSteps, Deadline: s.cfg.Query.Deadline, Log: s.log.With("component", "queries")}
	if g := s.usageGate(); g != nil {
		q.Quota = g
	}
	return q
}

// queryModel is the configured model's name, or "" when no model endpoint is configured (queries replay).
func queryModel(cfg *config.Config) string {
	if cfg.Model.BaseURL == "" {
		return ""
	}
	return cfg.Model.Name
}

// modelClient is the configured model endpoint's client, or nil when none is configured.
func modelClient(cfg *config.Config) (*llm.Client, error) {
	if cfg.Model.BaseURL == "" {
		return nil, nil
	}
	c, err := llm.New(llm.Options{BaseURL: cfg.Model.BaseURL, APIKey: cfg.Model.APIKey, Model: cfg.Model.Name, Timeout: cfg.Model.Timeout})
	if err != nil {
		return nil, &config.FieldError{Key: "model.base_url", Reason: err.Error()}
	}
	return c, nil
}

func (s *stack) onClose(f func() error) { s.closers = append(s.closers, f) }

func (s *stack) close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

func openDB(ctx context.Context, cfg *config.Config) (*bun.DB, error) {
	if cfg.DB.Driver == "sqlite" {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
		}
	}
	db, err := schema.Open(ctx, schema.Options{Driver: cfg.DB.Driver, DSN: cfg.DB.DSN})
	if err != nil {
		return nil, fmt.Errorf("db (%s): %w", cfg.DB.Driver, err)
	}
	return db, nil
}

func openBlobs(ctx context.Context, cfg *config.Config) (blob.Store, error) {
	switch cfg.Blob.Driver {
	case "s3":
		s, err := blob.NewS3(ctx, blob.S3Options{
			Endpoint: cfg.Blob.Endpoint, AccessKey: cfg.Blob.AccessKey, SecretKey: cfg.Blob.SecretKey,
			Bucket: cfg.Blob.Bucket, Region: cfg.Blob.Region, UseSSL: cfg.Blob.UseSSL,
		})
		if err != nil {
			return nil, fmt.Errorf("blob store (s3 %s): %w", cfg.Blob.Endpoint, err)
		}
		return s, nil
	default:
		l, err := blob.NewLocal(cfg.Blob.Dir)
		if err != nil {
			return nil, fmt.Errorf("blob store (local %s): %w", cfg.Blob.Dir, err)
		}
		return l, nil
	}
}

// startStack opens the database (migrating it when migrate is set), the blob store and Temporal — an in-process
// dev server when dev is set, else the configured frontend — with the process's metrics and tracing. environ is
// the process environment (for OTEL_EXPORTER_OTLP_*).
func startStack(ctx context.Context, cfg *config.Config, environ []string, logger *slog.Logger, dev, migrate bool) (*stack, error) {
	s := &stack{cfg: cfg, log: logger}
	fail := func(err error) (*stack, error) {
		_ = s.close()
		return nil, err
	}

	tr, err := telemetry.NewTracing(ctx, telemetry.TracingOptions{Endpoint: cfg.OTel.Endpoint, Environ: environ,
		ServiceName: cfg.OTel.ServiceName, SampleRatio: cfg.OTel.SampleRatio})
	if err != nil {
		return fail(&config.FieldError{Key: "otel.endpoint", Reason: err.Error()})
	}
	s.tracing = tr
	s.onClose(func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return tr.Shutdown(sctx)
	})
	if cfg.Metrics.Enabled {
		s.metrics = telemetry.NewMetrics()
	}

	db, err := openDB(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	s.db = db
	s.onClose(db.Close)
	if s.metrics != nil {
		s.metrics.WatchStates(dbStates{db}, 2*time.Second, logger.With("component", "metrics"))
	}
	if migrate {
		if err := schema.Migrate(ctx, db); err != nil {
			return fail(fmt.Errorf("migrate: %w", err))
		}
	}

	if s.blobs, err = openBlobs(ctx, cfg); err != nil {
		return fail(err)
	}

	addr := cfg.Temporal.Address
	if dev {
		srv, err := devserver.Start(ctx, devserver.Options{
			DataDir: cfg.DataDir, FrontendAddr: cfg.Temporal.DevAddr, UIAddr: cfg.Temporal.UIAddr,
			Namespace: cfg.Temporal.Namespace, Logger: logger.With("component", "temporal"),
			SearchAttributes: wfclient.SearchAttributes(),
		})
		if err != nil {
			return fail(fmt.Errorf("temporal dev server: %w", err))
		}
		s.dev = srv
		s.onClose(srv.Stop)
		addr = srv.FrontendAddr()
	}
	if addr == "" {
		return fail(&config.FieldError{Key: "temporal.address", Reason: "is required outside `doppel dev`"})
	}
	copts := client.Options{
		HostPort: addr, Namespace: cfg.Temporal.Namespace,
		Logger: log.NewStructuredLogger(logger.With("component", "temporal-client")),
	}
	if s.dev != nil {
		// The in-process dev server is on loopback: gzip (the SDK's default) would only cost CPU on both ends, 6% of
		// the process's samples while sessions open (docs/notes/performance.md).
		copts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
	if s.metrics != nil {
		h, mp, err := s.metrics.TemporalHandler(logger.With("component", "temporal-metrics"))
		if err != nil {
			return fail(fmt.Errorf("temporal metrics: %w", err))
		}
		copts.MetricsHandler = h
		s.onClose(func() error { return mp.Shutdown(context.Background()) })
	}
	ti, err := tr.TemporalInterceptor()
	if err != nil {
		return fail(fmt.Errorf("temporal tracing: %w", err))
	}
	if ti != nil {
		copts.Interceptors = append(copts.Interceptors, ti) // the worker made from this client traces too
	}
	c, err := client.DialContext(ctx, copts)
	if err != nil {
		return fail(fmt.Errorf("temporal %s: %w", addr, err))
	}
	s.temporal = c
	s.onClose(func() error { c.Close(); return nil })
	s.tagged = searchAttributesReady(ctx, c, cfg.Temporal.Namespace, logger)
	return s, nil
}

// searchAttributesReady reports whether the namespace has doppel's search attributes, so the workflows this process
// starts can carry them. Without them doppel runs, its workflows untagged, and says so: the attributes let an
// operator filter workflows in the Temporal UI, nothing depends on them, and refusing to start would turn an
// upgrade whose operator has not registered them yet into an outage.
func searchAttributesReady(ctx context.Context, c client.Client, namespace string, logger *slog.Logger) bool {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	missing, err := wfclient.MissingSearchAttributes(cctx, c, namespace, wfclient.SearchAttributes())
	switch {
	case err != nil:
		logger.Warn("could not check the namespace's search attributes: doppel's workflows start without them",
			"namespace", namespace, "error", err)
		return false
	case len(missing) > 0:
		logger.Warn("the namespace lacks doppel's search attributes: its workflows start without them and cannot be "+
			"filtered by workspace, environment or build in the Temporal UI; register them (docs/temporal.md) and restart",
			"namespace", namespace, "missing", missing, "commands", wfclient.CreateCommands(namespace, missing))
		return false
	}
	return true
}

// twinDriver is the driver twin.driver names; unset, `doppel dev` (one process, st.dev set) runs its twins in
// process, where calls reach them without HTTP, and a worker runs them as child processes, which outlive its
// restarts.
func twinDriver(st *stack) string {
	switch {
	case st.cfg.Twin.Driver != "":
		return st.cfg.Twin.Driver
	case st.dev != nil:
		return "inproc"
	}
	return "process"
}

// openDriver makes the twin driver twin.driver names. Twins left by an earlier run with the same state dir or
// owner are found again by the TwinWorkflow's reaper.
func openDriver(ctx context.Context, st *stack) (driver.Driver, error) {
	cfg := st.cfg
	logger := st.log.With("component", "twins")
	switch twinDriver(st) {
	case "docker":
		c, err := driver.NewDockerClient(cfg.Twin.DockerHost)
		if err != nil {
			return nil, err
		}
		st.onClose(c.Close)
		d, err := driver.NewDocker(driver.DockerOptions{Client: c, Host: cfg.Twin.DockerHost, Image: cfg.Twin.Image,
			Owner: cfg.Twin.Owner, Blobs: st.blobs, Logger: logger, Network: cfg.Twin.Network, Route: cfg.Twin.Route,
			Env: twinEnv(cfg), MemoryBytes: cfg.Twin.Memory})
		if err != nil {
			return nil, fmt.Errorf("twin.driver docker: %w", err)
		}
		return d, nil
	case "inproc":
		opts, err := twinRuntimeOptions(cfg)
		if err != nil {
			return nil, err
		}
		d, err := driver.NewInproc(driver.InprocOptions{Owner: cfg.Twin.Owner, Blobs: st.blobs, Logger: logger,
			Memory: memoryReturner(cfg),
			Load: func(_ context.Context, bundle []byte) (rpc.Runtime, error) {
				return rpc.NewTwinRuntime(bundle, opts)
			}})
		if err != nil {
			return nil, fmt.Errorf("twin.driver inproc: %w", err)
		}
		st.locals = d
		return d, nil
	default:
		bin := cfg.Twin.Binary
		if bin == "" {
			exe, err := os.Executable()
			if err != nil {
				return nil, &config.FieldError{Key: "twin.binary", Reason: "not set and this executable's path is unknown: " + err.Error()}
			}
			bin = exe
		}
		d, err := driver.NewProcess(driver.ProcessOptions{Binary: bin, StateDir: filepath.Join(cfg.DataDir, "twins"),
			Owner: cfg.Twin.Owner, Blobs: st.blobs, Logger: logger, Env: append(os.Environ(), twinProcessEnv(cfg)...)})
		if err != nil {
			return nil, fmt.Errorf("twin.driver process: %w", err)
		}
		return d, nil
	}
}

// modelEnv passes the model settings to twins (containers inherit nothing; child processes would miss settings
// given by file or flag), so their simulate rung reaches the same model.
func modelEnv(cfg *config.Config) []string {
	if cfg.Model.BaseURL == "" {
		return nil
	}
	return []string{"DOPPEL_MODEL_BASE_URL=" + cfg.Model.BaseURL, "DOPPEL_MODEL_API_KEY=" + cfg.Model.APIKey,
		"DOPPEL_MODEL_NAME=" + cfg.Model.Name, "DOPPEL_MODEL_TIMEOUT=" + cfg.Model.Timeout.String()}
}

// twinEnv is what a twin gets of this process's configuration: the model settings, the GC target, and its
// own memory limit (twin.memory_bytes) as its soft limit in place of this process's runtime.memory_bytes.
func twinEnv(cfg *config.Config) []string {
	return append(modelEnv(cfg), fmt.Sprintf("DOPPEL_RUNTIME_GC_PERCENT=%d", cfg.Runtime.GCPercent),
		fmt.Sprintf("DOPPEL_RUNTIME_MEMORY_BYTES=%d", cfg.Twin.Memory))
}

// twinProcessEnv is what a process twin gets beyond this process's environment: twinEnv and its memory limit
// (GOMEMLIMIT: the Go runtime collects harder as the twin nears it).
func twinProcessEnv(cfg *config.Config) []string {
	env := twinEnv(cfg)
	if cfg.Twin.Memory > 0 {
		env = append(env, fmt.Sprintf("GOMEMLIMIT=%d", cfg.Twin.Memory))
	}
	return env
}
