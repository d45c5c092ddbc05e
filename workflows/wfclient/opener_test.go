package wfclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// TestOpensPastTheServersInFlightBound: 48 opens at once on one opener of a real Temporal server, which admits 10
// updates in flight a workflow (history.maxInFlightUpdates' default), and whose opens stay in flight a while (the
// stand-in twin takes 30 ms). Each answers its own world. With one opener, no bound of its own and no resend,
// `doppel bench` saw 1,023 of 1,024 opens refused (ResourceExhausted: "limit on number of concurrent in-flight
// updates has been reached", "Workflow is busy"); this test, on that code, failed one run of two (an open's update
// not answered within a minute).
func TestOpensPastTheServersInFlightBound(t *testing.T) {
	addr := testenv.Temporal(t)
	ctx := context.Background()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queue := "opener-" + schema.NewID("")
	w := sdkworker.New(c, queue, sdkworker.Options{})
	workflows.Register(w)
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.FindTwinInput) (activities.TwinEndpoint, error) {
		return activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_1"}, nil
	}, activity.RegisterOptions{Name: "FindTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
		time.Sleep(30 * time.Millisecond)
		return activities.OpenOnTwinResult{Receipts: rpc.Receipts{Seed: in.Spec.Seed, Seeded: true,
			WorldHash: fmt.Sprintf("sha256:%d", in.Spec.Seed)}, StateHash: "sha256:s-" + in.SessionID}, nil
	}, activity.RegisterOptions{Name: "OpenOnTwin"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	env := schema.NewID("env")
	sessions := &wfclient.Sessions{Conn: wfclient.Conn{Client: c, TaskQueue: queue}, TwinWait: time.Minute,
		OpenerShards: 1, OpenerIdle: 5 * time.Second}
	const n = 48
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("ses_%s_%d", env, i)
			res, err := sessions.Open(ctx, toolplane.OpenWorld{SessionID: id, EnvID: env, Spec: rpc.SessionSpec{Seed: int64(i)}})
			switch {
			case err != nil:
				errs[i] = err
			case res.Receipts.WorldHash != fmt.Sprintf("sha256:%d", i) || res.StateHash != "sha256:s-"+id || res.BuildID != "bld_1":
				errs[i] = fmt.Errorf("answered %+v", res)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("open %d: %v", i, err)
		}
	}
	// One opener took them all; it ends once idle.
	if err := c.GetWorkflow(ctx, sessions.OpenerID(env, "any"), "").Get(ctx, nil); err != nil {
		t.Fatalf("the opener: %v", err)
	}
}
