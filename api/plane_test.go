package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/humatest"
	"github.com/uptrace/bun"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/usage"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// directOpener runs the session-open workflow's two activities in order, without Temporal: the seam the API
// uses (SessionOpener) over the very activity code the workflow runs, its failures mapped as wfclient.Sessions
// maps the workflow's. The workflow itself is tested with the SDK test suite in workflows/.
type directOpener struct{ a *activities.Sessions }

// swapOpener lets a test change the opener of a plane already serving.
type swapOpener struct {
	mu sync.Mutex
	o  toolplane.SessionOpener
}

func (s *swapOpener) set(o toolplane.SessionOpener) { s.mu.Lock(); s.o = o; s.mu.Unlock() }

func (s *swapOpener) Open(ctx context.Context, in toolplane.OpenWorld) (toolplane.OpenedWorld, error) {
	s.mu.Lock()
	o := s.o
	s.mu.Unlock()
	return o.Open(ctx, in)
}

func (o directOpener) Open(ctx context.Context, in toolplane.OpenWorld) (toolplane.OpenedWorld, error) {
	suspect := ""
	for attempt := 0; ; attempt++ {
		ep, err := o.a.FindTwin(ctx, activities.FindTwinInput{EnvID: in.EnvID, Suspect: suspect})
		if err != nil {
			return toolplane.OpenedWorld{}, wfclient.OpenError(err)
		}
		res, err := o.a.OpenOnTwin(ctx, activities.OpenOnTwinInput{Addr: ep.Addr, SessionID: in.SessionID, Spec: in.Spec})
		var appErr *temporal.ApplicationError
		if err != nil && attempt == 0 && errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeTwinUnavailable {
			suspect = ep.HandleID // as the workflow does: report the twin and try once more
			continue
		}
		if err != nil {
			return toolplane.OpenedWorld{}, wfclient.OpenError(err)
		}
		return toolplane.OpenedWorld{TwinAddr: ep.Addr, BuildID: ep.BuildID, Receipts: res.Receipts, StateHash: res.StateHash}, nil
	}
}

// inprocTwins stands in for the TwinWorkflow (tested on its own in workflows/) as the session routes' twin
// directory, over the real inproc driver: a wake starts the build's twin at once, unless the test has taken the
// twins down, when it answers booting.
type inprocTwins struct {
	drv     *driver.Inproc
	mu      sync.Mutex
	down    bool
	wakes   int
	handles map[string]driver.Handle // by build id
}

func (d *inprocTwins) WakeTwin(ctx context.Context, w twinstate.Wake) (twinstate.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wakes++
	b := w.Build
	if b.IsZero() {
		b = w.Active
	}
	if d.down {
		return twinstate.Status{State: twinstate.Booting, BuildID: b.BuildID}, nil
	}
	h, ok := d.handles[b.BuildID]
	if ok && w.Suspect == h.ID {
		if st, err := d.drv.Inspect(ctx, h); err != nil || st.State != driver.StateReady {
			ok = false
		}
	}
	if !ok {
		var err error
		h, err = d.drv.Start(ctx, driver.Spec{EnvID: w.EnvID, BuildID: b.BuildID, BundleKey: b.BundleKey, BundleHash: b.BundleHash})
		if err != nil {
			return twinstate.Status{State: twinstate.Failed, BuildID: b.BuildID, Error: err.Error()}, nil
		}
		d.handles[b.BuildID] = h
	}
	return twinstate.Status{State: twinstate.Ready, Addr: h.Addr, BuildID: b.BuildID, HandleID: h.ID}, nil
}

func (d *inprocTwins) RunningTwins(ctx context.Context, envID string) (map[string]twinstate.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]twinstate.Status{}
	for b, h := range d.handles {
		if h.EnvID == envID {
			out[b] = twinstate.Status{State: twinstate.Ready, Addr: h.Addr, BuildID: b, HandleID: h.ID}
		}
	}
	return out, nil
}

func (d *inprocTwins) wakeCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wakes
}

// plane is a database, a blob store, an in-process twin (the real twin runtime behind its real RPC, started by
// the inproc driver) and the API with the session routes, serving one bundle.
type plane struct {
	t       testing.TB
	db      *bun.DB
	blobs   blob.Store
	twins   *inprocTwins
	routes  *api.SessionRoutes
	queries *api.QueryRoutes
	qs      *query.Service
	// temporal is the client queries run through on a real Temporal (nil in the SDK's test environment).
	temporal client.Client
	tp       *toolplane.Plane
	opener   *swapOpener
	journal  *journal.Writer[schema.Call]
	h        http.Handler
	api      humatest.TestAPI

	ws, other     *schema.Workspace
	key, key2     string // two keys of ws
	otherKey      string
	env, otherEnv *schema.Environment
	build         *schema.Build
	bundle        *twin.Bundle
	locals        *countingLocals // planeOptions.local: the twins reached directly
	gate          *usage.Gate     // planeOptions.plans: the quota
}

// countingLocals is the inproc driver as the routes' rpc.Locals, counting the clients it made direct: a test
// of the direct path checks it was taken.
type countingLocals struct {
	drv *driver.Inproc
	mu  sync.Mutex
	n   int
}

func (l *countingLocals) Local(baseURL string) (*rpc.Server, bool) {
	s, ok := l.drv.Local(baseURL)
	if ok {
		l.mu.Lock()
		l.n++
		l.mu.Unlock()
	}
	return s, ok
}

// checkTransport fails the test when a plane meant to reach its twin directly never did.
func (p *plane) checkTransport(t *testing.T, local bool) {
	t.Helper()
	if !local {
		return
	}
	p.locals.mu.Lock()
	defer p.locals.mu.Unlock()
	if p.locals.n == 0 {
		t.Fatal("the direct plane never reached its twin directly")
	}
}

type planeOptions struct {
	journal journal.CallOptions
	idle    time.Duration
	// local reaches the in-process twin directly (the routes and the open activity get the driver as their
	// rpc.Locals), as `doppel dev --twin-driver inproc` does; false goes over its HTTP RPC, as to a process or
	// container twin.
	local bool
	// tracer and observer, when set, trace and count what the API and the tool plane serve.
	tracer   oteltrace.TracerProvider
	observer api.Observer
	// query, when set, serves queries (envs.query, queries.get) with these options.
	query *queryOptions
	// plans, when set, meters the workspaces and holds them to these plans (usage.Gate as the plane's quota),
	// and serves GET /v1/usage and the admin verbs with adminKey; now, when set, is the meters' clock.
	plans    *usage.Plans
	adminKey string
	now      func() time.Time
	// extra route groups (e.g. MCP).
	routes []func(huma.API, *api.Deps)
	// events, when set, records session events (and starts their webhook deliveries).
	events toolplane.EventLog
	// logger, when set, gets the API's access log and errors (nil: discarded).
	logger *slog.Logger
}

// eachTransport runs f with the twin reached over its HTTP RPC and directly in process.
func eachTransport(t *testing.T, f func(t *testing.T, local bool)) {
	for _, local := range []bool{false, true} {
		name := "http"
		if local {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) { f(t, local) })
	}
}

func newPlane(t testing.TB, dbDriver string, bundle []byte, o planeOptions) *plane {
	t.Helper()
	ctx := context.Background()
	p := &plane{t: t, db: schematest.Open(t, dbDriver)}
	var err error
	if p.bundle, err = twin.UnmarshalBundle(bundle); err != nil {
		t.Fatal(err)
	}
	if p.blobs, err = blob.NewLocal(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	key := blob.ContentKey("bundles", bundle)
	if err := p.blobs.Put(ctx, key, bytes.NewReader(bundle), int64(len(bundle)), ""); err != nil {
		t.Fatal(err)
	}
	if p.ws, err = store.CreateWorkspace(ctx, p.db, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, p.key, err = store.CreateKey(ctx, p.db, p.ws.ID, cred.KindWorkspace, "ci"); err != nil {
		t.Fatal(err)
	}
	if _, p.key2, err = store.CreateKey(ctx, p.db, p.ws.ID, cred.KindWorkspace, "laptop"); err != nil {
		t.Fatal(err)
	}
	if p.other, err = store.CreateWorkspace(ctx, p.db, "globex"); err != nil {
		t.Fatal(err)
	}
	if _, p.otherKey, err = store.CreateKey(ctx, p.db, p.other.ID, cred.KindWorkspace, "theirs"); err != nil {
		t.Fatal(err)
	}
	p.env, p.build = p.readyEnv(p.ws, "tau2-retail", key, twin.HashBytes(bundle))
	p.otherEnv, _ = p.readyEnv(p.other, "their-shop", key, twin.HashBytes(bundle))

	drv, err := driver.NewInproc(driver.InprocOptions{
		Load: func(_ context.Context, data []byte) (rpc.Runtime, error) {
			return rpc.NewTwinRuntime(data, twin.RuntimeOptions{})
		},
		Blobs: p.blobs,
	})
	if err != nil {
		t.Fatal(err)
	}
	p.twins = &inprocTwins{drv: drv, handles: map[string]driver.Handle{}}
	t.Cleanup(func() {
		hs, _ := drv.List(context.Background())
		for _, h := range hs {
			_ = drv.Stop(context.Background(), h)
		}
	})

	if p.journal, err = journal.NewCalls(p.db, o.journal); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.journal.Close() })
	p.opener = &swapOpener{o: directOpener{a: &activities.Sessions{DB: p.db, Twins: p.twins}}}
	popts := toolplane.Options{DB: p.db, Opener: p.opener, Twins: p.twins, Journal: p.journal,
		Bundles: &toolplane.Bundles{Blob: p.blobs}, Idle: o.idle, Tracer: o.tracer, Events: o.events}
	if o.local {
		p.locals = &countingLocals{drv: drv}
		popts.Locals = p.locals
		p.opener.set(directOpener{a: &activities.Sessions{DB: p.db, Twins: p.twins, Locals: p.locals}})
	}
	routes := []func(huma.API, *api.Deps){}
	if o.plans != nil {
		src := &usage.Source{DB: p.db, Plans: *o.plans, EnvBytesCap: 1 << 20, Idle: o.idle}
		p.gate = &usage.Gate{Source: src, Now: o.now}
		popts.Quota = p.gate
		routes = append(routes, (&api.UsageRoutes{Source: src, Gate: p.gate, AdminKey: o.adminKey, Now: o.now}).Register)
	}
	p.tp = toolplane.New(popts)
	p.routes = &api.SessionRoutes{Plane: p.tp}
	routes = append(routes, p.routes.Register)
	if o.query != nil {
		p.qs = &query.Service{DB: p.db, Runner: o.query.runner, Model: o.query.model, Wait: o.query.wait, MaxSteps: o.query.maxSteps}
		if p.gate != nil {
			p.qs.Quota = p.gate
		}
		p.queries = &api.QueryRoutes{Queries: p.qs, RatePerSecond: o.query.rate, Burst: o.query.burst}
		routes = append(routes, p.queries.Register)
	}
	routes = append(routes, o.routes...)
	h, humaAPI := api.New(api.Options{DB: p.db, Routes: routes, Tracer: o.tracer, Observer: o.observer, Logger: o.logger})
	p.h = h
	p.api = humatest.Wrap(t, humaAPI)
	return p
}

// readyEnv makes an environment with a succeeded, active build of the bundle.
func (p *plane) readyEnv(ws *schema.Workspace, project, key, hash string) (*schema.Environment, *schema.Build) {
	ctx := context.Background()
	env, err := store.UpsertEnvByProject(ctx, p.db, ws.ID, project)
	if err != nil {
		p.t.Fatal(err)
	}
	b := &schema.Build{EnvID: env.ID, Status: schema.BuildSucceeded, BundleKey: key, BundleHash: hash}
	if err := store.CreateBuild(ctx, p.db, b); err != nil {
		p.t.Fatal(err)
	}
	env.Status, env.ActiveBuildID = schema.EnvReady, b.ID
	if err := store.UpdateEnv(ctx, p.db, env, "status", "active_build_id"); err != nil {
		p.t.Fatal(err)
	}
	return env, b
}

// twinAddr is the address of the running twin of the plane's build.
func (p *plane) twinAddr() string {
	p.twins.mu.Lock()
	defer p.twins.mu.Unlock()
	h, ok := p.twins.handles[p.build.ID]
	if !ok {
		p.t.Fatal("no twin runs")
	}
	return h.Addr
}

// stopTwin kills the build's twin; until startTwin, wakes answer booting.
func (p *plane) stopTwin() {
	p.twins.mu.Lock()
	defer p.twins.mu.Unlock()
	if h, ok := p.twins.handles[p.build.ID]; ok {
		if err := p.twins.drv.Stop(context.Background(), h); err != nil {
			p.t.Fatal(err)
		}
		delete(p.twins.handles, p.build.ID)
	}
	p.twins.down = true
}

// startTwin lets wakes start twins again (a new process, at a new address).
func (p *plane) startTwin() {
	p.twins.mu.Lock()
	defer p.twins.mu.Unlock()
	p.twins.down = false
}

// do sends a request straight to the handler (no request log, for loops).
func (p *plane) do(method, path, token string, body any) (int, map[string]any) {
	p.t.Helper()
	var r *http.Request
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			p.t.Fatal(err)
		}
		r = httptest.NewRequest(method, path, bytes.NewReader(b))
		r.Header.Set("Content-Type", "application/json")
	} else {
		r = httptest.NewRequest(method, path, nil)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	var out map[string]any
	if w.Body.Len() > 0 {
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			p.t.Fatalf("%s %s: answer is not a JSON object (%d): %s", method, path, w.Code, w.Body)
		}
	}
	return w.Code, out
}

// session is an opened session as a client sees it.
type session struct {
	ID, Token string
	Open      map[string]any
}

func (p *plane) open(body any) session {
	p.t.Helper()
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, body)
	if code != http.StatusCreated {
		p.t.Fatalf("open: %d %v", code, out)
	}
	return session{ID: out["sessionId"].(string), Token: out["token"].(string), Open: out}
}

func (p *plane) call(s session, name string, args any) (int, map[string]any) {
	p.t.Helper()
	return p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/call", s.Token, map[string]any{"name": name, "arguments": args})
}

func (p *plane) journaled(id string) int {
	p.t.Helper()
	n, err := p.db.NewSelect().Model((*schema.Call)(nil)).Where("session_id = ?", id).Count(context.Background())
	if err != nil {
		p.t.Fatal(err)
	}
	return int(n)
}

// ---- bundles ----

var (
	tauOnce   sync.Once
	tauBundle []byte
	tauTraces []trace.Trace
	tauErr    error
)

// retailBundle builds the tau-retail bundle once per test binary, from the real traces and tool definitions.
func retailBundle(t testing.TB) ([]byte, []trace.Trace) {
	t.Helper()
	tauOnce.Do(func() {
		raw, err := sampledata.Read("tau-retail-dev.json")
		if err != nil {
			tauErr = err
			return
		}
		var b trace.Batch
		if tauErr = json.Unmarshal(raw, &b); tauErr != nil {
			return
		}
		rawTools, err := sampledata.Read("tau-retail-tools.json")
		if err != nil {
			tauErr = err
			return
		}
		defs, err := infer.ParseToolDefs(rawTools)
		if err != nil {
			tauErr = err
			return
		}
		bundle, _, err := infer.Build(b.Traces, infer.Options{Tools: defs})
		if err != nil {
			tauErr = err
			return
		}
		tauBundle, tauErr = bundle.Marshal()
		tauTraces = b.Traces
	})
	if tauErr != nil {
		if os.IsNotExist(tauErr) {
			t.Skipf("tau data not available: %v", tauErr)
		}
		t.Fatalf("tau-retail bundle: %v", tauErr)
	}
	return tauBundle, tauTraces
}

// shopBundle is a small, fixed bundle (hand-written, not inferred) for golden hashes: users and orders with
// provided handlers, so its world hashes change only when the twin's hashing or seeding changes.
func shopBundle(t testing.TB) []byte {
	t.Helper()
	const getOrder = `
def handle(args):
    row = world.get("orders", args["order_id"])
    if row == None:
        return error("Error: order not found")
    return row
`
	const cancel = `
def handle(args):
    row = world.get("orders", args["order_id"])
    if row == None:
        return error("Error: order not found")
    if row["status"] != "pending":
        return error("Error: non-pending order cannot be cancelled")
    row["status"] = "cancelled"
    world.put("orders", args["order_id"], row)
    return row
`
	orderArg := json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`)
	b := &twin.Bundle{
		Format: twin.FormatVersion, SchemaSource: "provided", Clock: "2025-01-01T00:00:00Z",
		Tools: []twin.Tool{
			{Name: "get_order_details", Description: "Get an order.", InputSchema: orderArg, Binding: twin.BindingProvided,
				Rung: twin.RungProvided, Kind: twin.KindRead, Provided: getOrder, Table: "orders", KeyArg: "order_id"},
			{Name: "cancel_pending_order", Description: "Cancel a pending order.", InputSchema: orderArg, Binding: twin.BindingProvided,
				Rung: twin.RungProvided, Kind: twin.KindWrite, Provided: cancel, Table: "orders", KeyArg: "order_id"},
		},
		Tables: []twin.Table{
			{Name: "users", Key: "user_id", KeyInRow: true, KeyShape: "user_9999", Rows: []twin.Row{
				{Key: "user_0001", JSON: `{"user_id": "user_0001", "name": "Ada", "orders": ["#W0000001"]}`},
			}},
			{Name: "orders", Key: "order_id", KeyInRow: true, KeyShape: "#W9999999", Rows: []twin.Row{
				{Key: "#W0000001", JSON: `{"order_id": "#W0000001", "user_id": "user_0001", "status": "delivered", "total": 12.5}`},
			}, Refs: []twin.Ref{{Field: "user_id", Table: "users"}}},
		},
		Scenarios: map[string]string{"busy": "2 orders with status pending"},
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// eachDriver runs fn on SQLite and on the real PostgreSQL (skipped without DOPPEL_TEST_POSTGRES).
func eachDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	for _, d := range schematest.Drivers() {
		t.Run(d, func(t *testing.T) { fn(t, d) })
	}
}

func str(v any) string { s, _ := v.(string); return s }
