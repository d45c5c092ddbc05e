package workflows_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/internal/replaytest"
	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// Recorders of the histories under testdata/ (see its README): each runs a workflow on a real Temporal server
// (DOPPEL_TEST_TEMPORAL) with stand-in activities and writes its history as JSON.

// TestRecordTwinHistory records a twin workflow's history (boot on a wake, idle stop, stop signal) on a real
// Temporal server with stand-in activities, into RECORD_OUT. Skipped unless RECORD_OUT is set.
func TestRecordTwinHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_OUT", "record-twin-")
	ctx := context.Background()
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.StartTwinInput) (twinstate.Handle, error) {
		return twinstate.Handle{Driver: "process", ID: "twin-1", EnvID: in.EnvID, BuildID: in.Build.BuildID, Addr: "http://127.0.0.1:1"}, nil
	}, activity.RegisterOptions{Name: "StartTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, h twinstate.Handle) (activities.TwinHealth, error) {
		return activities.TwinHealth{State: driver.StateReady, IdleFor: time.Hour}, nil
	}, activity.RegisterOptions{Name: "InspectTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, h twinstate.Handle) error { return nil }, activity.RegisterOptions{Name: "StopTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.ReapTwinsInput) error { return nil }, activity.RegisterOptions{Name: "ReapTwins"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in any) error { return nil }, activity.RegisterOptions{Name: "RecordTwinEvent"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	in := workflows.TwinInput{EnvID: "env_record", Active: twinstate.Build{BuildID: "bld_record", BundleKey: "bundles/x", BundleHash: "sha256:x"},
		Idle: 2 * time.Second, HealthEvery: time.Second}
	st, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", in, workflows.WakeRequest{Wait: true})
	if err != nil || st.State != twinstate.Ready {
		t.Fatalf("wake: %+v %v", st, err)
	}
	id := workflows.TwinWorkflowID(in.EnvID)
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := c.QueryWorkflow(ctx, id, "", workflows.TwinStatusQuery)
		var s workflows.TwinStatus
		if err == nil && v.Get(&s) == nil && s.State == twinstate.Stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the twin did not idle out")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.SignalWorkflow(ctx, id, "", workflows.StopTwinSignal, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.GetWorkflow(ctx, id, "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, id, out)
}

// TestRecordTwinSuspectHistory records a twin workflow whose ready twin dies: a wake without Wait names it as the
// suspect, the inspection finds it gone, it is restarted, and the stop signal ends the workflow; into
// RECORD_OUT_SUSPECT. Skipped unless it is set.
func TestRecordTwinSuspectHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_OUT_SUSPECT", "record-suspect-")
	ctx := context.Background()
	var starts atomic.Int32
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.StartTwinInput) (twinstate.Handle, error) {
		n := starts.Add(1)
		return twinstate.Handle{Driver: "process", ID: fmt.Sprintf("twin-%d", n), EnvID: in.EnvID, BuildID: in.Build.BuildID,
			Addr: fmt.Sprintf("http://127.0.0.1:%d", n)}, nil
	}, activity.RegisterOptions{Name: "StartTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, h twinstate.Handle) (activities.TwinHealth, error) {
		if h.ID == "twin-1" {
			return activities.TwinHealth{State: twinstate.Gone, Detail: "no such container"}, nil
		}
		return activities.TwinHealth{State: driver.StateReady}, nil
	}, activity.RegisterOptions{Name: "InspectTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, h twinstate.Handle) error { return nil }, activity.RegisterOptions{Name: "StopTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.ReapTwinsInput) error { return nil }, activity.RegisterOptions{Name: "ReapTwins"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in any) error { return nil }, activity.RegisterOptions{Name: "RecordTwinEvent"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	in := workflows.TwinInput{EnvID: "env_record_suspect", Active: twinstate.Build{BuildID: "bld_record", BundleKey: "bundles/x", BundleHash: "sha256:x"},
		Idle: time.Hour, HealthEvery: time.Hour}
	st, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", in, workflows.WakeRequest{Wait: true})
	if err != nil || st.State != twinstate.Ready {
		t.Fatalf("wake: %+v %v", st, err)
	}
	if _, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", in, workflows.WakeRequest{Suspect: st.Handle.ID}); err != nil {
		t.Fatalf("suspect wake: %v", err)
	}
	if st, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", in, workflows.WakeRequest{Wait: true}); err != nil || st.State != twinstate.Ready || st.Handle.ID == "twin-1" {
		t.Fatalf("wake after the restart: %+v %v", st, err)
	}
	id := workflows.TwinWorkflowID(in.EnvID)
	if err := c.SignalWorkflow(ctx, id, "", workflows.StopTwinSignal, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.GetWorkflow(ctx, id, "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, id, out)
}

// TestRecordWebhookDeliveryHistory records a delivery whose first attempt (the local activity) fails and whose
// retry succeeds, into RECORD_OUT_WEBHOOK. Skipped unless it is set.
func TestRecordWebhookDeliveryHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_OUT_WEBHOOK", "record-hook-")
	ctx := context.Background()
	attempts := 0
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.DeliverInput) error {
		attempts++
		if attempts == 1 {
			return temporal.NewApplicationError("HTTP 503: down", activities.ErrTypeDeliveryFailed)
		}
		return nil
	}, activity.RegisterOptions{Name: "Deliver"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	id := wfclient.WebhookDeliveryWorkflowID("whd_record" + time.Now().Format("150405"))
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, workflows.WebhookDeliveryWorkflowName,
		workflows.WebhookDeliveryInput{DeliveryID: "whd_record", Policy: workflows.DeliveryPolicy{Initial: 200 * time.Millisecond, Max: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, id, out)
}

// recorder is a recording's setup: the output file outVar names (the test is skipped when it is unset), a client
// of the Temporal server at DOPPEL_TEST_TEMPORAL, and a worker with every workflow registered on a fresh task queue
// named from prefix. The client closes with the test.
func recorder(t *testing.T, outVar, prefix string) (out string, c client.Client, queue string, w worker.Worker) {
	t.Helper()
	out = os.Getenv(outVar)
	if out == "" {
		t.Skip(outVar + " not set")
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv("DOPPEL_TEST_TEMPORAL")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	queue = prefix + time.Now().Format("150405.000000")
	w = worker.New(c, queue, worker.Options{})
	workflows.Register(w)
	return out, c, queue, w
}

func writeHistory(t *testing.T, c client.Client, id, out string) {
	t.Helper()
	replaytest.Record(t, c, id, "", out)
}
