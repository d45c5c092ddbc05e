package activities

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
	"github.com/doppel-dev/doppel/twinstate"
)

// oneTwin is a twin directory over one real twin (the bank bundle behind the real RPC server): it stands in
// for the TwinWorkflow, which is tested in workflows/.
type oneTwin struct {
	mu      sync.Mutex
	addr    string
	handle  string
	wakes   []twinstate.Wake
	failing bool
}

func (d *oneTwin) WakeTwin(_ context.Context, w twinstate.Wake) (twinstate.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wakes = append(d.wakes, w)
	if d.failing {
		return twinstate.Status{State: twinstate.Failed, Error: "image missing"}, nil
	}
	return twinstate.Status{State: twinstate.Ready, Addr: d.addr, HandleID: d.handle, BuildID: w.Active.BuildID}, nil
}

func (d *oneTwin) RunningTwins(context.Context, string) (map[string]twinstate.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return map[string]twinstate.Status{}, nil
}

func bankTwin(t *testing.T) string {
	t.Helper()
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rpc.NewTwinRuntime(data, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := rpc.NewServer(rpc.ServerOptions{})
	srv.SetRuntime(rt)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs.URL
}

func sessionsEnv(t *testing.T) (*Sessions, *oneTwin, *schema.Environment) {
	return sessionsEnvOn(t, schema.DriverSQLite)
}

func sessionsEnvOn(t *testing.T, driver string) (*Sessions, *oneTwin, *schema.Environment) {
	t.Helper()
	ctx := context.Background()
	db := schematest.Open(t, driver)
	ws, err := store.CreateWorkspace(ctx, db, "w")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "bank")
	if err != nil {
		t.Fatal(err)
	}
	dir := &oneTwin{addr: bankTwin(t), handle: "twin-1"}
	return &Sessions{DB: db, Twins: dir}, dir, env
}

func activate(t *testing.T, a *Sessions, env *schema.Environment) *schema.Build {
	t.Helper()
	ctx := context.Background()
	b := &schema.Build{EnvID: env.ID, Status: schema.BuildSucceeded, BundleKey: "bundles/x", BundleHash: "sha256:x"}
	if err := store.CreateBuild(ctx, a.DB, b); err != nil {
		t.Fatal(err)
	}
	env.ActiveBuildID, env.Status = b.ID, schema.EnvReady
	if err := store.UpdateEnv(ctx, a.DB, env, "active_build_id", "status"); err != nil {
		t.Fatal(err)
	}
	return b
}

func appType(err error) string {
	var ae *temporal.ApplicationError
	if errors.As(err, &ae) {
		return ae.Type()
	}
	return ""
}

func TestFindTwin(t *testing.T) {
	ctx := context.Background()
	a, dir, env := sessionsEnv(t)
	if _, err := a.FindTwin(ctx, FindTwinInput{EnvID: env.ID}); appType(err) != ErrTypeBadInput {
		t.Fatalf("no build yet: %v, want %s", err, ErrTypeBadInput)
	}
	if _, err := a.FindTwin(ctx, FindTwinInput{EnvID: "env_missing"}); appType(err) != ErrTypeBadInput {
		t.Fatalf("unknown env: %v", err)
	}
	b := activate(t, a, env)
	ep, err := a.FindTwin(ctx, FindTwinInput{EnvID: env.ID})
	if err != nil || ep.Addr != dir.addr || ep.BuildID != b.ID || ep.HandleID != "twin-1" {
		t.Fatalf("FindTwin = %+v, %v", ep, err)
	}
	w := dir.wakes[0]
	if !w.Wait || w.Active.BuildID != b.ID || w.Active.BundleKey != "bundles/x" || !w.Build.IsZero() {
		t.Fatalf("wake = %+v, want a waiting wake of the active build", w)
	}
	// Warm: the twin found last is used without asking the directory.
	if _, err := a.FindTwin(ctx, FindTwinInput{EnvID: env.ID}); err != nil || len(dir.wakes) != 1 {
		t.Fatalf("warm FindTwin: %v, %d wakes", err, len(dir.wakes))
	}
	// A suspect goes to the directory.
	if _, err := a.FindTwin(ctx, FindTwinInput{EnvID: env.ID, Suspect: "twin-1"}); err != nil || len(dir.wakes) != 2 || dir.wakes[1].Suspect != "twin-1" {
		t.Fatalf("suspect FindTwin: %v, wakes %+v", err, dir.wakes)
	}
	// A new active build is not served by the cached twin.
	b2 := activate(t, a, env)
	ep, err = a.FindTwin(ctx, FindTwinInput{EnvID: env.ID})
	if err != nil || ep.BuildID != b2.ID || len(dir.wakes) != 3 {
		t.Fatalf("after a new build: %+v, %v, %d wakes", ep, err, len(dir.wakes))
	}
	dir.failing = true
	if _, err := a.FindTwin(ctx, FindTwinInput{EnvID: env.ID, Suspect: "twin-1"}); appType(err) != ErrTypeTwinUnavailable {
		t.Fatalf("failed twin: %v, want %s", err, ErrTypeTwinUnavailable)
	}
}

func TestOpenAndCloseOnTwin(t *testing.T) {
	ctx := context.Background()
	a, dir, _ := sessionsEnv(t)
	spec := rpc.SessionSpec{Seed: 3}
	res, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_a", Spec: spec})
	if err != nil || res.Receipts.WorldHash == "" || res.StateHash != res.Receipts.WorldHash {
		t.Fatalf("open = %+v, %v", res, err)
	}
	// A retried open (its answer lost) reads the session back instead of failing.
	again, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_a", Spec: spec})
	if err != nil || again.Receipts.WorldHash != res.Receipts.WorldHash {
		t.Fatalf("retried open = %+v, %v", again, err)
	}
	if _, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_b", Spec: rpc.SessionSpec{Scenario: "nope"}}); appType(err) != ErrTypeSessionSpec {
		t.Fatalf("unknown scenario: %v, want %s", err, ErrTypeSessionSpec)
	}
	if _, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: "http://127.0.0.1:1", SessionID: "ses_c", Spec: spec}); appType(err) != ErrTypeTwinUnavailable {
		t.Fatalf("twin down: %v, want %s", err, ErrTypeTwinUnavailable)
	}
	for i := 0; i < 2; i++ { // closing twice, and closing on a twin that is gone, are fine
		if err := a.CloseOnTwin(ctx, CloseOnTwinInput{Addr: dir.addr, SessionID: "ses_a"}); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	if err := a.CloseOnTwin(ctx, CloseOnTwinInput{Addr: "http://127.0.0.1:1", SessionID: "ses_a"}); err != nil {
		t.Fatalf("close on a gone twin: %v", err)
	}
	if _, err := rpc.NewClient(dir.addr, nil).Session(ctx, "ses_a"); !errors.Is(err, rpc.ErrUnknownSession) {
		t.Fatalf("closed session still on the twin: %v", err)
	}
}

// fakeReaper records what the reap activity asked of the tool plane.
type fakeReaper struct {
	now   time.Time
	idle  time.Duration
	limit int
}

func (f *fakeReaper) Reap(_ context.Context, now time.Time, idle time.Duration, limit int) ([]string, int, error) {
	f.now, f.idle, f.limit = now, idle, limit
	return []string{"ses_a"}, 2, nil
}

// TestReapIdleSessions: the activity refuses a zero idle time and hands the rest to the tool plane's reaper (its
// behaviour is tested in toolplane).
func TestReapIdleSessions(t *testing.T) {
	ctx := context.Background()
	r := &fakeReaper{}
	a := &Sessions{Reaper: r}
	if _, err := a.ReapIdleSessions(ctx, ReapInput{Idle: 0}); appType(err) != ErrTypeBadInput {
		t.Fatalf("idle 0: %v", err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	res, err := a.ReapIdleSessions(ctx, ReapInput{Now: t0, Idle: time.Hour, Limit: 7})
	if err != nil || len(res.Expired) != 1 || res.Extended != 2 || !r.now.Equal(t0) || r.idle != time.Hour || r.limit != 7 {
		t.Fatalf("reap = %+v, %v; reaper got %+v", res, err, r)
	}
}
