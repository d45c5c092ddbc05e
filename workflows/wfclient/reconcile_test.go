package wfclient_test

import (
	"bytes"
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
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
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// TestReconcileTwins: on a real Temporal frontend, with real twin processes, a twin no TwinWorkflow holds (left by
// a crashed worker) is removed and a twin a running TwinWorkflow holds is kept.
func TestReconcileTwins(t *testing.T) {
	addr := testenv.Temporal(t)
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "twinmain")
	if out, err := exec.Command("go", "build", "-o", bin, "../../driver/internal/twinmain").CombinedOutput(); err != nil {
		t.Fatalf("build the twin binary: %v\n%s", err, out)
	}
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
	drv, err := driver.NewProcess(driver.ProcessOptions{Binary: bin, StateDir: t.TempDir(), Owner: "reconcile-test", Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	build := twinstate.Build{BuildID: schema.NewID(schema.PrefixBuild), BundleKey: key, BundleHash: twin.HashBytes(data)}

	stray, err := drv.Start(ctx, driver.Spec{EnvID: schema.NewID(schema.PrefixEnv), BuildID: build.BuildID, BundleKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Stop(context.Background(), stray) })

	c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queue := "test-reconcile-" + schema.NewID("")
	w := sdkworker.New(c, queue, sdkworker.Options{})
	worker.Register(w, worker.Deps{Twins: &activities.Twins{Driver: drv}})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	heldEnv := schema.NewID(schema.PrefixEnv)
	st, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", workflows.TwinInput{EnvID: heldEnv, Active: build, Idle: time.Hour}, workflows.WakeRequest{Wait: true})
	if err != nil || st.State != twinstate.Ready || st.Handle == nil {
		t.Fatalf("wake: %+v, %v", st, err)
	}
	t.Cleanup(func() {
		_ = c.SignalWorkflow(context.Background(), workflows.TwinWorkflowID(heldEnv), "", workflows.StopTwinSignal, nil)
		_ = drv.Stop(context.Background(), *st.Handle)
	})

	removed, err := (wfclient.Conn{Client: c, TaskQueue: queue}).ReconcileTwins(ctx, drv, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].ID != stray.ID {
		t.Fatalf("removed %+v, want only the stray twin %s", removed, stray.ID)
	}
	left, err := drv.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].ID != st.Handle.ID {
		t.Fatalf("left %+v, want only the held twin %s", left, st.Handle.ID)
	}
}
