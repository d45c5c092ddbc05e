package wfclient_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// TestSessionOpenOnRealTemporal runs the session-open workflow and the TwinWorkflow on a real Temporal frontend
// (DOPPEL_TEST_TEMPORAL=host:port, e.g. the dev server of `doppel dev`; skipped without one), with the real
// session and twin activities over the inproc driver: the open wakes a cold twin through TwinDirectory, a second
// open is warm, RunningTwins lists the twin, and an open after the twin died finds it restarted.
func TestSessionOpenOnRealTemporal(t *testing.T) {
	addr := testenv.Temporal(t)
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	blobs, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	key := blob.ContentKey("bundles", data)
	if err := blobs.Put(ctx, key, bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	ws, err := store.CreateWorkspace(ctx, db, "w")
	if err != nil {
		t.Fatal(err)
	}
	env, err := store.UpsertEnvByProject(ctx, db, ws.ID, "bank")
	if err != nil {
		t.Fatal(err)
	}
	b := &schema.Build{EnvID: env.ID, Status: schema.BuildSucceeded, BundleKey: key, BundleHash: twin.HashBytes(data)}
	if err := store.CreateBuild(ctx, db, b); err != nil {
		t.Fatal(err)
	}
	env.ActiveBuildID = b.ID
	if err := store.UpdateEnv(ctx, db, env, "active_build_id"); err != nil {
		t.Fatal(err)
	}

	drv, err := driver.NewInproc(driver.InprocOptions{Blobs: blobs, Load: func(_ context.Context, d []byte) (rpc.Runtime, error) {
		return rpc.NewTwinRuntime(d, twin.RuntimeOptions{})
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queue := "test-sessions-" + schema.NewID("")
	dir := &wfclient.TwinDirectory{Conn: wfclient.Conn{Client: c, TaskQueue: queue}, Input: workflows.TwinInput{Idle: time.Hour}}
	w := sdkworker.New(c, queue, sdkworker.Options{})
	worker.Register(w, worker.Deps{Twins: &activities.Twins{Driver: drv}, Sessions: &activities.Sessions{DB: db, Twins: dir}})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	defer func() { _ = c.SignalWorkflow(ctx, workflows.TwinWorkflowID(env.ID), "", workflows.StopTwinSignal, nil) }()
	sessions := &wfclient.Sessions{Conn: wfclient.Conn{Client: c, TaskQueue: queue}, TwinWait: time.Minute}

	open := func(id string) toolplane.OpenedWorld {
		t.Helper()
		res, err := sessions.Open(ctx, toolplane.OpenWorld{SessionID: id, EnvID: env.ID, Spec: rpc.SessionSpec{Seed: 1}})
		if err != nil {
			t.Fatalf("open %s: %v", id, err)
		}
		if res.BuildID != b.ID || res.TwinAddr == "" || res.Receipts.WorldHash == "" {
			t.Fatalf("open %s = %+v", id, res)
		}
		return res
	}
	first := open("ses_cold")
	second := open("ses_warm")
	if first.TwinAddr != second.TwinAddr || first.Receipts.WorldHash != second.Receipts.WorldHash {
		t.Fatalf("warm open: %+v vs %+v", first, second)
	}
	running, err := dir.RunningTwins(ctx, env.ID)
	if err != nil || running[b.ID].Addr != first.TwinAddr {
		t.Fatalf("RunningTwins = %+v, %v", running, err)
	}
	// The twin dies: the next open finds the address dead, reports it, and opens on the restarted twin.
	hs, _ := drv.List(ctx)
	for _, h := range hs {
		if err := drv.Stop(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	third := open("ses_after_crash")
	if third.TwinAddr == first.TwinAddr {
		t.Fatal("opened on the dead twin's address")
	}
	if _, err := rpc.NewClient(third.TwinAddr, nil).Session(ctx, "ses_after_crash"); err != nil {
		t.Fatalf("session not on the restarted twin: %v", err)
	}
}
