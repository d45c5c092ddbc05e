package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/config"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/devserver"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/query/flow"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// devKeyFile keeps the dev workspace key under the data dir, so `doppel dev` prints the same key every start.
const devKeyFile = "workspace-key"

func runDev(ctx context.Context, e env) error {
	cfg, _, err := parseConfig(e, "dev", nil)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	started := time.Now()
	logger, logOut := newLogger(cfg, os.Stderr)
	defer logOut.Close() // last: what the stack logs while it closes is written too
	st, err := startStack(ctx, cfg, e.environ, logger, true, true)
	if err != nil {
		return err
	}
	defer st.close()
	st.logOut = logOut

	key, err := devKey(cfg)
	if err != nil {
		return err
	}
	if _, _, err := store.Bootstrap(ctx, st.db, store.BootstrapOptions{Key: key}); err != nil {
		return fmt.Errorf("bootstrap workspace key: %w", err)
	}

	w, drv, err := startWorker(ctx, st)
	if err != nil {
		return err
	}
	defer w.Stop()
	defer stopChildTwins(st, drv)

	return serveHTTP(ctx, st, func(addr string) {
		fmt.Fprintf(e.stdout, "doppel dev is ready in %s\n", time.Since(started).Round(time.Millisecond))
		fmt.Fprintf(e.stdout, "  API          %s  (docs %s/docs)\n", publicURL(cfg, addr), publicURL(cfg, addr))
		fmt.Fprintf(e.stdout, "  Console      %s/  (sign in with the workspace key)\n", publicURL(cfg, addr))
		if st.dev != nil && st.dev.UIURL() != "" {
			fmt.Fprintf(e.stdout, "  Temporal UI  %s\n", st.dev.UIURL())
		}
		fmt.Fprintf(e.stdout, "  Workspace key %s\n", key)
		fmt.Fprintf(e.stdout, "  Data         %s\n", cfg.DataDir)
		fmt.Fprintf(e.stdout, "  Twins        %s\n", twinsLine(st))
		fmt.Fprintln(e.stdout, "Ctrl-C stops.")
	})
}

// stopChildTwins stops the process twins `doppel dev` started, when it stops gracefully: dev is one process, and
// its child twins would otherwise run on with nothing to reap them until the next start. Sessions lose nothing: each
// is rebuilt from its journal on its next call after a restart, as with in-process twins. Other drivers' twins are
// left as they are (in-process twins end with the process; containers are reconciled).
func stopChildTwins(st *stack, drv driver.Driver) {
	if twinDriver(st) != "process" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	hs, err := drv.List(ctx)
	if err != nil {
		st.log.Warn("list twins to stop", "error", err)
		return
	}
	for _, h := range hs {
		if err := drv.Stop(ctx, h); err != nil {
			st.log.Warn("stop twin", "twin", h.ID, "error", err)
		}
	}
}

// twinsLine says where `doppel dev` runs its twins.
func twinsLine(st *stack) string {
	switch d := twinDriver(st); d {
	case "inproc":
		return "in this process (--twin-driver process or docker to isolate them)"
	case "process":
		return "as child processes (doppel twin)"
	default:
		return "as " + d + " containers of " + st.cfg.Twin.Image
	}
}

// devKey is the bootstrap key if configured, else the key kept under the data dir (minted on first start).
func devKey(cfg *config.Config) (string, error) {
	if cfg.BootstrapKey != "" {
		return cfg.BootstrapKey, nil
	}
	path := filepath.Join(cfg.DataDir, devKeyFile)
	if data, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(data)), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(m.Plaintext+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return m.Plaintext, nil
}

func publicURL(cfg *config.Config, bound string) string {
	if cfg.API.PublicURL != "" && !strings.HasSuffix(cfg.API.Addr, ":0") {
		return cfg.API.PublicURL
	}
	return "http://" + bound
}

// openServer starts what `serve` and `worker` run on: the configured database (already migrated), blob store and
// Temporal frontend. --help answers errHelp.
func openServer(ctx context.Context, e env, name string) (*stack, error) {
	cfg, _, err := parseConfig(e, name, nil)
	if err != nil {
		return nil, err
	}
	logger, logOut := newLogger(cfg, os.Stderr)
	st, err := startStack(ctx, cfg, e.environ, logger, false, false)
	if err != nil {
		_ = logOut.Close()
		return nil, err
	}
	st.logOut = logOut
	st.onClose(logOut.Close) // the stack's closers run last to first: lines logged after this one go out at once
	if err := checkSchema(ctx, st.db); err != nil {
		_ = st.close()
		return nil, err
	}
	return st, nil
}

func runServe(ctx context.Context, e env) error {
	st, err := openServer(ctx, e, "serve")
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	defer st.close()
	cfg, logger := st.cfg, st.log
	if cfg.BootstrapKey != "" {
		if _, _, err := store.Bootstrap(ctx, st.db, store.BootstrapOptions{Key: cfg.BootstrapKey}); err != nil {
			return fmt.Errorf("bootstrap workspace key: %w", err)
		}
	}
	return serveHTTP(ctx, st, func(addr string) {
		logger.Info("doppel API listening", "addr", addr, "url", publicURL(cfg, addr))
		_ = st.logOut.Flush()
	})
}

func runWorker(ctx context.Context, e env) error {
	st, err := openServer(ctx, e, "worker")
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	defer st.close()
	cfg, logger := st.cfg, st.log
	w, _, err := startWorker(ctx, st)
	if err != nil {
		return err
	}
	defer w.Stop()
	// The worker has no API listener: its metrics get one of their own.
	addr := cfg.Metrics.Addr
	if addr == "" {
		addr = cfg.Metrics.WorkerAddr
	}
	if st.metrics != nil && addr != "" {
		stop, err := serveMetrics(st, "metrics.addr", addr)
		if err != nil {
			return err
		}
		defer stop()
	}
	stopPprof, err := servePprof(st)
	if err != nil {
		return err
	}
	defer stopPprof()
	logger.Info("doppel worker polling", "task_queue", cfg.Temporal.TaskQueue, "namespace", cfg.Temporal.Namespace)
	_ = st.logOut.Flush()
	<-ctx.Done()
	return nil
}

// serveMetrics serves GET /metrics alone on addr (key names the setting, for errors) until stop is called.
func serveMetrics(st *stack, key, addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &config.FieldError{Key: key, Reason: err.Error()}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", st.metrics.Handler(st.log.With("component", "metrics")))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(st.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	st.log.Info("metrics listening", "addr", ln.Addr().String(), "path", "/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

func runOpenAPI(_ context.Context, e env) error {
	opts, err := apiOptions(nil, "")
	if err != nil {
		return err
	}
	_, h := api.New(opts)
	data, err := json.MarshalIndent(api.DocumentView(h.OpenAPI()), "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.stdout, string(data))
	return err
}

// startWorker starts the Temporal worker with the twin driver, then the duties of a starting worker: the idle
// session reaper, rebuilds a crash left unscheduled, and removing twins nobody holds. The caller stops it.
func startWorker(ctx context.Context, st *stack) (sdkworker.Worker, driver.Driver, error) {
	drv, err := openDriver(ctx, st)
	if err != nil {
		return nil, nil, err
	}
	w, err := newWorker(st, drv)
	if err != nil {
		return nil, nil, err
	}
	if err := w.Start(); err != nil {
		return nil, nil, fmt.Errorf("temporal worker: %w", err)
	}
	if err := startReaper(ctx, st); err != nil {
		w.Stop()
		return nil, nil, err
	}
	if err := scheduleMissedBuilds(ctx, st); err != nil {
		w.Stop()
		return nil, nil, fmt.Errorf("schedule missed rebuilds: %w", err)
	}
	if err := scheduleMissedSettles(ctx, st); err != nil {
		w.Stop()
		return nil, nil, fmt.Errorf("schedule span settling: %w", err)
	}
	reconcileTwins(ctx, st, drv)
	return w, drv, nil
}

func newWorker(st *stack, drv driver.Driver) (sdkworker.Worker, error) {
	plane, err := st.toolPlane()
	if err != nil {
		return nil, err
	}
	builds := &activities.Builds{DB: st.db, Blobs: st.blobs, Log: st.log.With("component", "builds")}
	if st.metrics != nil {
		builds.Observer = st.metrics
	}
	queries := &flow.Activities{DB: st.db, Plane: plane, Bundles: plane.Bundles(), Blobs: st.blobs, Log: st.log.With("component", "queries")}
	mc, err := modelClient(st.cfg)
	if err != nil {
		return nil, err
	}
	if mc != nil {
		queries.Model = mc
	}
	builds.Events = st.events()
	guard, err := st.webhookGuard()
	if err != nil {
		return nil, err
	}
	hooks := &activities.Webhooks{DB: st.db, Sender: webhook.NewSender(guard, st.cfg.Webhooks.AttemptTimeout),
		Dispatch: st.webhookStarter(), Log: st.log.With("component", "webhooks")}
	spans := &activities.Spans{DB: st.db, Blobs: st.blobs, Scheduler: buildStarter(st), TaskAttribute: st.cfg.OTLP.TaskAttribute,
		Log: st.log.With("component", "spans")}
	return worker.New(st.temporal, st.cfg.Temporal.TaskQueue, worker.Deps{
		Queries:  queries,
		Builds:   builds,
		Webhooks: hooks,
		Spans:    spans,
		Twins:    &activities.Twins{Driver: drv, Events: st.events()},
		Sessions: &activities.Sessions{DB: st.db, Twins: twinDirectory(st), Locals: st.locals, Reaper: plane,
			Log: st.log.With("component", "sessions"), Tracer: st.tracer()},
	}), nil
}

// twinDirectory finds environments' twins through their TwinWorkflows, starting one with the configured idle time.
func twinDirectory(st *stack) *wfclient.TwinDirectory {
	return &wfclient.TwinDirectory{Conn: st.conn(), Input: workflows.TwinInput{Idle: st.cfg.Twin.Idle}}
}

// sessionWorkflows starts session opens and the reaper.
func sessionWorkflows(st *stack) *wfclient.Sessions {
	s := &wfclient.Sessions{Conn: st.conn(), TwinWait: st.cfg.Twin.Wait}
	if st.dev != nil {
		// doppel dev's own server admits devserver.MaxInFlightUpdates a workflow: fewer openers, each taking larger
		// batches of opens in one workflow task.
		s.OpenerShards, s.OpenerInFlight = 2, devserver.MaxInFlightUpdates*7/8
	}
	return s
}

// buildStarter starts builds and schedules rebuilds.
func buildStarter(st *stack) *wfclient.Builds {
	return &wfclient.Builds{Conn: st.conn(), Debounce: st.cfg.Collect.RebuildDebounce}
}

// spanSettler starts and signals environments' span settling.
func spanSettler(st *stack) *wfclient.Spans {
	return &wfclient.Spans{Conn: st.conn(), Settle: st.cfg.OTLP.Settle}
}

// scheduleMissedSettles starts span settling for every environment holding staged spans no trace was made from:
// a process that died between staging an export and signalling its settling leaves such spans behind. Starting
// one that runs only signals it.
func scheduleMissedSettles(ctx context.Context, st *stack) error {
	ids, err := store.EnvsWithPendingSpans(ctx, st.db)
	if err != nil {
		return err
	}
	for _, id := range ids {
		env, err := store.GetEnvByID(ctx, st.db, id)
		if err != nil {
			return err
		}
		if err := spanSettler(st).ScheduleSettle(ctx, env.WorkspaceID, id); err != nil {
			return err
		}
	}
	if len(ids) > 0 {
		st.log.Info("scheduled span settling of environments with pending spans", "envs", len(ids))
	}
	return nil
}

// scheduleMissedBuilds schedules the rebuild of every environment holding traces no build was queued after: a
// process that died between committing a batch and scheduling its rebuild leaves such traces behind.
func scheduleMissedBuilds(ctx context.Context, st *stack) error {
	ids, err := store.EnvsNeedingBuild(ctx, st.db)
	if err != nil {
		return err
	}
	starter := buildStarter(st)
	for _, id := range ids {
		env, err := store.GetEnvByID(ctx, st.db, id)
		if err != nil {
			return err
		}
		if err := starter.ScheduleBuild(ctx, env.WorkspaceID, id); err != nil {
			return err
		}
		st.log.Info("scheduled a rebuild missed before a restart", "env", id)
	}
	return nil
}

// twinStartGrace keeps twins a start in flight may still be returning from the start-up reconcile.
const twinStartGrace = 4 * time.Minute

// reconcileTwins removes twins of this deployment no TwinWorkflow holds (left by a crashed worker). Start-up goes
// on when it fails: the TwinWorkflows reap their own environments' strays as they run.
func reconcileTwins(ctx context.Context, st *stack, drv driver.Driver) {
	rec, ok := drv.(interface {
		driver.Driver
		driver.Reconciler
	})
	if !ok {
		return // a driver that cannot reconcile is left alone
	}
	removed, err := st.conn().ReconcileTwins(ctx, rec, twinStartGrace)
	if err != nil {
		st.log.Warn("reconcile twins at start", "error", err)
	}
	for _, h := range removed {
		st.log.Info("removed a twin no environment holds", "twin", h.ID, "env", h.EnvID, "build", h.BuildID)
	}
}

// startReaper makes sure the idle-session reaper runs (one per namespace; starting it again is a no-op).
func startReaper(ctx context.Context, st *stack) error {
	if err := sessionWorkflows(st).StartReaper(ctx, workflows.SessionReaperInput{Idle: st.cfg.Session.Idle}); err != nil {
		return fmt.Errorf("session reaper: %w", err)
	}
	if err := st.webhookStarter().StartSweeper(ctx, workflows.WebhookSweeperInput{Every: st.cfg.Webhooks.SweepEvery, Retention: st.cfg.Webhooks.Retention}); err != nil {
		return fmt.Errorf("webhook sweeper: %w", err)
	}
	return nil
}

// apiOptions assembles the API over st, reached at public (its public URL); a nil st gives the routes only (for
// the OpenAPI document).
func apiOptions(st *stack, public string) (api.Options, error) {
	opts := api.Options{Title: "doppel API", Version: "v1"}
	if st == nil {
		opts.Routes = docRoutes()
		return opts, nil
	}
	opts.DB = st.db
	opts.Logger = st.log.With("component", "api")
	opts.Readiness = map[string]api.Checker{
		"db":   func(ctx context.Context) error { return st.db.PingContext(ctx) },
		"blob": st.blobs.Ping,
		"temporal": func(ctx context.Context) error {
			_, err := st.temporal.CheckHealth(ctx, &client.CheckHealthRequest{})
			return err
		},
	}
	plane, err := st.toolPlane()
	if err != nil {
		return opts, err
	}
	starter := buildStarter(st)
	c := st.cfg.Collect
	builds := &api.BuildRoutes{Blobs: st.blobs, Starter: starter, MaxUploadBytes: c.MaxRequestBytes, Bundles: plane.Bundles(),
		Traces: api.CollectOptions{MaxRequestBytes: c.MaxRequestBytes, MaxEnvBytes: c.MaxEnvBytes}}
	sessions := &api.SessionRoutes{Plane: plane, Model: st.cfg.Model.BaseURL != "", MCPBase: strings.TrimRight(public, "/")}
	collect := api.CollectOptions{Blobs: st.blobs, Scheduler: starter, MaxRequestBytes: c.MaxRequestBytes,
		MaxEnvBytes: c.MaxEnvBytes, RatePerSecond: c.RatePerSecond, RateBurst: c.RateBurst}
	wake := &api.WakeRoutes{Plane: plane}
	queries := &api.QueryRoutes{Queries: st.queries(), RatePerSecond: st.cfg.Query.RatePerSecond, Burst: st.cfg.Query.Burst}
	usageRoutes := &api.UsageRoutes{Source: st.usageSource(), Gate: st.usageGate(), AdminKey: st.cfg.Admin.Key}
	// Every URL the MCP server and its OAuth emit is built on the public URL (api.public_url, or the address the API
	// is bound to), never on a request's Host or X-Forwarded-* headers.
	origins, err := st.cfg.MCP.Origins()
	if err != nil {
		return opts, &config.FieldError{Key: "mcp.allowed_origins", Reason: err.Error()}
	}
	mcpRoutes := &api.MCPRoutes{Plane: plane, Model: sessions.Model, TokenTTL: st.cfg.MCP.TokenTTL,
		RefreshTTL: st.cfg.MCP.RefreshTokenTTL, PublicURL: public, AllowedOrigins: origins}
	opts.TwinState = twinDirectory(st).State
	opts.WebSecret, opts.WebSessionTTL = []byte(st.cfg.Console.Secret), st.cfg.Console.SessionTTL
	opts.BodyBudget, opts.ReturnMemoryEvery = st.cfg.API.BodyBudget, st.cfg.Runtime.ReturnMemoryEvery
	opts.KeyCacheTTL = api.DefaultKeyCacheTTL
	a := st.cfg.API
	opts.BodyLimits = api.BodyLimits{PerCredential: a.BodyPerCredential, PerAddress: a.BodyPerAddress,
		ReadGrace: a.BodyReadGrace, MinRate: a.BodyMinRate}
	if opts.BodyLimits.MinRate == 0 {
		opts.BodyLimits.MinRate = -1 // api.body_min_rate_bytes 0: no minimum
	}
	opts.FailedCredentialsPerMinute, opts.FailedCredentialBurst = a.FailedCredentialsPerMinute, a.FailedCredentialBurst
	opts.TRPCMaxBatch = a.TRPCMaxBatch
	if opts.BodyBudget == 0 {
		opts.BodyBudget = -1 // api.body_budget_bytes 0: no budget
	}
	if opts.ReturnMemoryEvery == 0 {
		opts.ReturnMemoryEvery = -1
	}
	if st.metrics != nil {
		opts.Observer = st.metrics
		if st.cfg.Metrics.Addr == "" {
			opts.Metrics = st.metrics.Handler(st.log.With("component", "metrics"))
		}
	}
	if tp := st.tracer(); tp != nil {
		opts.Tracer, opts.Propagator = tp, st.tracing.Propagator()
	}
	guard, err := st.webhookGuard()
	if err != nil {
		return opts, err
	}
	mcpRoutes.ClientMetadataGuard = guard // Client ID Metadata Documents are fetched as webhooks are sent
	hooks := &api.WebhookRoutes{Guard: guard, Deliveries: st.webhookStarter()}
	uploads := &api.UploadRoutes{Blobs: st.blobs, MaxFileBytes: st.cfg.Uploads.MaxFileBytes}
	tracesOpts := api.TracesOptions{Collect: collect, Settler: spanSettler(st), TaskAttribute: st.cfg.OTLP.TaskAttribute}
	opts.Routes = []func(huma.API, *api.Deps){
		func(a huma.API, d *api.Deps) { api.RegisterCollect(a, d, collect) },
		api.TracesRoutes(tracesOpts, st.traceIngest()),
		builds.Register,
		sessions.Register,
		wake.Register,
		queries.Register,
		mcpRoutes.Register,
		(&api.OpenEnvRoutes{Plane: plane, Model: sessions.Model}).Register,
		usageRoutes.Register,
		hooks.Register,
		uploads.Register,
	}
	return opts, nil
}

// docRoutes registers every route group for the OpenAPI document only: none of them is ever called.
func docRoutes() []func(huma.API, *api.Deps) {
	builds := &api.BuildRoutes{Blobs: docOnlyBlobs{}}
	sessions := &api.SessionRoutes{}
	return []func(huma.API, *api.Deps){
		func(a huma.API, d *api.Deps) { api.RegisterCollect(a, d, api.CollectOptions{Blobs: docOnlyBlobs{}}) },
		api.TracesRoutes(api.TracesOptions{}, nil),
		builds.Register,
		sessions.Register,
		(&api.WakeRoutes{}).Register,
		(&api.QueryRoutes{}).Register,
		(&api.UsageRoutes{}).Register,
		(&api.WebhookRoutes{}).Register,
		(&api.UploadRoutes{Blobs: docOnlyBlobs{}}).Register,
	}
}

// serveHTTP serves the API until ctx ends, then shuts down gracefully.
func serveHTTP(ctx context.Context, st *stack, ready func(addr string)) error {
	ln, err := net.Listen("tcp", st.cfg.API.Addr)
	if err != nil {
		return &config.FieldError{Key: "api.addr", Reason: err.Error()}
	}
	opts, err := apiOptions(st, publicURL(st.cfg, ln.Addr().String()))
	if err != nil {
		_ = ln.Close()
		return err
	}
	handler, _ := api.New(opts)
	srv := api.NewHTTPServer(handler, api.ConnLimits{ReadHeader: st.cfg.API.ReadHeaderTimeout, Idle: st.cfg.API.IdleTimeout},
		slog.NewLogLogger(st.log.Handler(), slog.LevelWarn))
	if st.metrics != nil && st.cfg.Metrics.Addr != "" {
		stop, err := serveMetrics(st, "metrics.addr", st.cfg.Metrics.Addr)
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer stop()
	}
	stopPprof, err := servePprof(st)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer stopPprof()
	stopGRPC, err := serveOTLPGRPC(st)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer stopGRPC()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready(ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	return nil
}

// checkSchema refuses to run serve or worker against a database that lacks migrations.
func checkSchema(ctx context.Context, db *bun.DB) error {
	ms, err := schema.Migrations(db.Dialect().Name().String())
	if err != nil {
		return err
	}
	have, err := schema.Version(ctx, db)
	if err != nil {
		return fmt.Errorf("%w (run `doppel migrate`)", err)
	}
	if want := ms[len(ms)-1].Version; have < want {
		return fmt.Errorf("database schema is at version %d, this doppel needs %d: run `doppel migrate`", have, want)
	}
	return nil
}

// docOnlyBlobs stands where no blob store is opened: rendering the OpenAPI document registers routes, never runs them.
type docOnlyBlobs struct{}

var errDocOnly = errors.New("no blob store: this API only renders its OpenAPI document")

func (docOnlyBlobs) Put(context.Context, string, io.Reader, int64, string) error { return errDocOnly }
func (docOnlyBlobs) Get(context.Context, string) (io.ReadCloser, error)          { return nil, errDocOnly }
func (docOnlyBlobs) Stat(context.Context, string) (blob.Info, error)             { return blob.Info{}, errDocOnly }
func (docOnlyBlobs) Delete(context.Context, string) error                        { return errDocOnly }
func (docOnlyBlobs) Ping(context.Context) error                                  { return errDocOnly }
