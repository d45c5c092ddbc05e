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
	twinStandIns{
		start: func(in activities.StartTwinInput) twinstate.Handle {
			return twinstate.Handle{Driver: "process", ID: "twin-1", EnvID: in.EnvID, BuildID: in.Build.BuildID, Addr: "http://127.0.0.1:1"}
		},
		inspect: func(twinstate.Handle) activities.TwinHealth {
			return activities.TwinHealth{State: driver.StateReady, IdleFor: time.Hour}
		},
	}.register(w)
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
	awaitTwin(t, c, id, "the twin did not idle out", func(s workflows.TwinStatus) bool { return s.State == twinstate.Stopped })
	stopAndWrite(t, c, id, out)
}

// TestRecordTwinSuspectHistory records a twin workflow whose ready twin dies: a wake without Wait names it as the
// suspect, the inspection finds it gone, it is restarted, and the stop signal ends the workflow; into
// RECORD_OUT_SUSPECT. Skipped unless it is set.
func TestRecordTwinSuspectHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_OUT_SUSPECT", "record-suspect-")
	ctx := context.Background()
	var starts atomic.Int32
	twinStandIns{
		start: func(in activities.StartTwinInput) twinstate.Handle {
			n := starts.Add(1)
			return twinstate.Handle{Driver: "process", ID: fmt.Sprintf("twin-%d", n), EnvID: in.EnvID, BuildID: in.Build.BuildID,
				Addr: fmt.Sprintf("http://127.0.0.1:%d", n)}
		},
		inspect: func(h twinstate.Handle) activities.TwinHealth {
			if h.ID == "twin-1" {
				return activities.TwinHealth{State: twinstate.Gone, Detail: "no such container"}
			}
			return activities.TwinHealth{State: driver.StateReady}
		},
	}.register(w)
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
	stopAndWrite(t, c, workflows.TwinWorkflowID(in.EnvID), out)
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

// twinStandIns registers stand-ins of the twin activities: StartTwin answers start's handle (by default one named by
// the build), InspectTwin inspect's health (by default ready), ReapTwins reap's removed twins (by default none);
// StopTwin and RecordTwinEvent succeed.
type twinStandIns struct {
	start   func(activities.StartTwinInput) twinstate.Handle
	inspect func(twinstate.Handle) activities.TwinHealth
	reap    func(activities.ReapTwinsInput) []twinstate.Handle
}

func (s twinStandIns) register(w worker.Worker) {
	if s.start == nil {
		s.start = func(in activities.StartTwinInput) twinstate.Handle {
			return twinstate.Handle{Driver: "process", ID: "twin-" + in.Build.BuildID, EnvID: in.EnvID, BuildID: in.Build.BuildID,
				Addr: "http://127.0.0.1:1/" + in.Build.BuildID}
		}
	}
	if s.inspect == nil {
		s.inspect = func(twinstate.Handle) activities.TwinHealth { return activities.TwinHealth{State: driver.StateReady} }
	}
	if s.reap == nil {
		s.reap = func(activities.ReapTwinsInput) []twinstate.Handle { return nil }
	}
	w.RegisterActivityWithOptions(func(_ context.Context, in activities.StartTwinInput) (twinstate.Handle, error) {
		return s.start(in), nil
	}, activity.RegisterOptions{Name: "StartTwin"})
	w.RegisterActivityWithOptions(func(_ context.Context, h twinstate.Handle) (activities.TwinHealth, error) {
		return s.inspect(h), nil
	}, activity.RegisterOptions{Name: "InspectTwin"})
	w.RegisterActivityWithOptions(func(context.Context, twinstate.Handle) error { return nil }, activity.RegisterOptions{Name: "StopTwin"})
	w.RegisterActivityWithOptions(func(_ context.Context, in activities.ReapTwinsInput) ([]twinstate.Handle, error) {
		return s.reap(in), nil
	}, activity.RegisterOptions{Name: "ReapTwins"})
	w.RegisterActivityWithOptions(func(context.Context, activities.TwinEventInput) error { return nil }, activity.RegisterOptions{Name: "RecordTwinEvent"})
}

// awaitTwin polls the twin workflow's status until ok holds, failing with what after a minute.
func awaitTwin(t *testing.T, c client.Client, id, what string, ok func(workflows.TwinStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := c.QueryWorkflow(context.Background(), id, "", workflows.TwinStatusQuery)
		var s workflows.TwinStatus
		if err == nil && v.Get(&s) == nil && ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopAndWrite signals the twin workflow to stop, waits for it to end and writes its history to out.
func stopAndWrite(t *testing.T, c client.Client, id, out string) {
	t.Helper()
	ctx := context.Background()
	if err := c.SignalWorkflow(ctx, id, "", workflows.StopTwinSignal, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.GetWorkflow(ctx, id, "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, id, out)
}

func writeHistory(t *testing.T, c client.Client, id, out string) {
	t.Helper()
	replaytest.Record(t, c, id, "", out)
}
