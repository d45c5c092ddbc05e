package activities

import (
	"context"
	"encoding/json"
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
	"github.com/doppel-dev/doppel/twinrpc"
	"github.com/doppel-dev/doppel/twinrpc/twinrpctest"
)

// oneTwin is a twin directory over one real twin (the bank bundle behind the real RPC server): it stands in
// for the TwinWorkflow, which is tested in workflows/.
type oneTwin struct {
	mu      sync.Mutex
	addr    string
	handle  string
	wakes   []TwinWake
	failing bool
}

func (d *oneTwin) WakeTwin(_ context.Context, w TwinWake) (TwinState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wakes = append(d.wakes, w)
	if d.failing {
		return TwinState{State: TwinStateFailed, Error: "image missing"}, nil
	}
	return TwinState{State: TwinStateReady, Addr: d.addr, HandleID: d.handle, BuildID: w.Active.BuildID}, nil
}

func (d *oneTwin) RunningTwins(context.Context, string) (map[string]TwinState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return map[string]TwinState{}, nil
}

func bankTwin(t *testing.T) string {
	t.Helper()
	data, err := twinrpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twinrpc.NewTwinRuntime(data, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := twinrpc.NewServer(twinrpc.ServerOptions{})
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
	spec := twinrpc.SessionSpec{Seed: 3}
	res, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_a", Spec: spec})
	if err != nil || res.Receipts.WorldHash == "" || res.StateHash != res.Receipts.WorldHash {
		t.Fatalf("open = %+v, %v", res, err)
	}
	// A retried open (its answer lost) reads the session back instead of failing.
	again, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_a", Spec: spec})
	if err != nil || again.Receipts.WorldHash != res.Receipts.WorldHash {
		t.Fatalf("retried open = %+v, %v", again, err)
	}
	if _, err := a.OpenOnTwin(ctx, OpenOnTwinInput{Addr: dir.addr, SessionID: "ses_b", Spec: twinrpc.SessionSpec{Scenario: "nope"}}); appType(err) != ErrTypeSessionSpec {
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
	if _, err := twinrpc.NewClient(dir.addr, nil).Session(ctx, "ses_a"); !errors.Is(err, twinrpc.ErrUnknownSession) {
		t.Fatalf("closed session still on the twin: %v", err)
	}
}

func TestReapIdleSessions(t *testing.T) {
	for _, d := range schematest.Drivers() {
		t.Run(d, func(t *testing.T) { testReapIdleSessions(t, d) })
	}
}

func testReapIdleSessions(t *testing.T, driver string) {
	ctx := context.Background()
	a, _, env := sessionsEnvOn(t, driver)
	activate(t, a, env)
	open := func() *schema.Session {
		s := &schema.Session{EnvID: env.ID, BuildID: env.ActiveBuildID}
		if _, err := store.CreateSession(ctx, a.DB, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	quiet, used, closed := open(), open(), open()
	if _, err := store.EndSession(ctx, a.DB, closed.ID, schema.SessionClosed); err != nil {
		t.Fatal(err)
	}
	t0 := quiet.CreatedAt
	for seq, fid := range []string{schema.FidelityBTwin, schema.FidelityBReplayed} {
		c := schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: used.ID, Seq: int64(seq + 1), Tool: "get_account",
			Arguments: json.RawMessage(`{"id":"a1"}`), Error: seq == 1, Fidelity: fid, StateHash: "sha256:s" + fid,
			CreatedAt: t0.Add(50 * time.Minute)}
		if _, err := a.DB.NewInsert().Model(&c).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.ReapIdleSessions(ctx, ReapInput{Now: t0, Idle: 0}); appType(err) != ErrTypeBadInput {
		t.Fatalf("idle 0: %v", err)
	}
	// 30 minutes in: nothing is due.
	res, err := a.ReapIdleSessions(ctx, ReapInput{Now: t0.Add(30 * time.Minute), Idle: time.Hour})
	if err != nil || len(res.Expired) != 0 || res.Extended != 0 {
		t.Fatalf("early reap = %+v, %v", res, err)
	}
	// 70 minutes in: quiet expires; used (last call at 50 minutes) gets its expiry moved to 110 minutes.
	res, err = a.ReapIdleSessions(ctx, ReapInput{Now: t0.Add(70 * time.Minute), Idle: time.Hour})
	if err != nil || len(res.Expired) != 1 || res.Expired[0] != quiet.ID || res.Extended != 1 {
		t.Fatalf("reap = %+v, %v", res, err)
	}
	got, err := store.GetSessionByID(ctx, a.DB, used.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schema.SessionOpen || !got.ExpiresAt.Equal(t0.Add(110*time.Minute)) {
		t.Fatalf("used session = %s expiring %v, want open until %v", got.Status, got.ExpiresAt, t0.Add(110*time.Minute))
	}
	got, err = store.GetSessionByID(ctx, a.DB, quiet.ID)
	if err != nil || got.Status != schema.SessionExpired {
		t.Fatalf("quiet session = %+v, %v", got, err)
	}
	// 111 minutes in: used expires too, and its counters are snapshotted into its row.
	res, err = a.ReapIdleSessions(ctx, ReapInput{Now: t0.Add(111 * time.Minute), Idle: time.Hour})
	if err != nil || len(res.Expired) != 1 || res.Expired[0] != used.ID {
		t.Fatalf("late reap = %+v, %v", res, err)
	}
	got, err = store.GetSessionByID(ctx, a.DB, used.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schema.SessionExpired || got.NCalls != 2 || got.NErrors != 1 || got.NBTwin != 1 || got.NBReplayed != 1 ||
		got.StateHash != "sha256:s"+schema.FidelityBReplayed {
		t.Fatalf("expired session row = %+v", got)
	}
	if s, _ := store.GetSessionByID(ctx, a.DB, closed.ID); s.Status != schema.SessionClosed {
		t.Fatalf("closed session became %s", s.Status)
	}
}
