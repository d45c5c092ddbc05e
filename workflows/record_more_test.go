package workflows_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/internal/replaytest"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// More recorders of testdata/ histories, for the workflows and paths the first ones left out: a session open that
// retries on a twin that did not answer, the idle-session reaper and the webhook sweeper (a few sweeps, then
// terminated), a twin that reaps and moves to a new build, a failed build, a rebuild continued as new, and a
// webhook delivery that gives up (the query's are in query/flow). Each is skipped unless its RECORD_* variable names
// the file to write.

// TestRecordSessionOpenHistory: FindTwin, OpenOnTwin fails with TwinUnavailable, FindTwin names the twin suspect,
// OpenOnTwin succeeds.
func TestRecordSessionOpenHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_SESSION_OPEN", "record-open-")
	ctx := context.Background()
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.FindTwinInput) (activities.TwinEndpoint, error) {
		if in.Suspect != "" {
			return activities.TwinEndpoint{Addr: "http://127.0.0.1:2", BuildID: "bld_record", HandleID: "twin-2"}, nil
		}
		return activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_record", HandleID: "twin-1"}, nil
	}, activity.RegisterOptions{Name: "FindTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
		if in.Addr == "http://127.0.0.1:1" {
			return activities.OpenOnTwinResult{}, temporal.NewApplicationError("connection refused", activities.ErrTypeTwinUnavailable)
		}
		return activities.OpenOnTwinResult{Receipts: rpc.Receipts{Seed: in.Spec.Seed, WorldHash: "sha256:w", Seeded: true},
			StateHash: "sha256:s"}, nil
	}, activity.RegisterOptions{Name: "OpenOnTwin"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	id := workflows.SessionOpenWorkflowID("ses_record" + time.Now().Format("150405"))
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, workflows.SessionOpenWorkflowName,
		workflows.SessionOpenInput{SessionID: "ses_record", EnvID: "env_record", Spec: rpc.SessionSpec{Seed: 7, SeedInstructions: "2 orders"},
			TwinWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var res workflows.SessionOpenResult
	if err := run.Get(ctx, &res); err != nil || res.TwinAddr != "http://127.0.0.1:2" {
		t.Fatalf("open: %+v %v", res, err)
	}
	writeHistory(t, c, id, out)
}

// TestRecordSessionReaperHistory: sweeps every second; the first fails, the next expire a session; terminated
// after four.
func TestRecordSessionReaperHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_SESSION_REAPER", "record-reaper-")
	var n atomic.Int32
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.ReapInput) (activities.ReapResult, error) {
		if n.Add(1) == 1 {
			return activities.ReapResult{}, temporal.NewNonRetryableApplicationError("database is locked", "Test", nil)
		}
		return activities.ReapResult{Expired: []string{"ses_1"}, Extended: 1}, nil
	}, activity.RegisterOptions{Name: "ReapIdleSessions"})
	id := wfclient.SessionReaperID(queue)
	runSweeps(t, c, w, id, queue, workflows.SessionReaperWorkflowName, workflows.SessionReaperInput{Idle: time.Hour, Every: time.Second}, &n, 4)
	writeHistory(t, c, id, out)
}

// TestRecordWebhookSweeperHistory: sweeps every second, starting two deliveries, then none; terminated after three.
func TestRecordWebhookSweeperHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_WEBHOOK_SWEEPER", "record-sweeper-")
	var n atomic.Int32
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.SweepInput) (int, error) {
		if n.Add(1) == 1 {
			return 2, nil
		}
		return 0, nil
	}, activity.RegisterOptions{Name: "SweepDeliveries"})
	id := wfclient.WebhookSweeperWorkflowID(queue)
	runSweeps(t, c, w, id, queue, workflows.WebhookSweeperWorkflowName, workflows.WebhookSweeperInput{Every: time.Second, Retention: time.Hour}, &n, 3)
	writeHistory(t, c, id, out)
}

// runSweeps starts a sweeping workflow, waits until its activity ran sweeps times, and terminates it.
func runSweeps(t *testing.T, c client.Client, w interface {
	Start() error
	Stop()
}, id, queue, name string, in any, n *atomic.Int32, sweeps int32) {
	t.Helper()
	ctx := context.Background()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, name, in); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for n.Load() < sweeps {
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps in a minute", n.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the last sweep's result is recorded
	if err := c.TerminateWorkflow(ctx, id, "", "recorded"); err != nil {
		t.Fatal(err)
	}
}

// TestRecordTwinReapHistory: a twin woken on one build reaps the environment's strays every second, then a new
// build arrives and its twin boots beside the first; the stop signal ends the workflow.
func TestRecordTwinReapHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_TWIN_REAP", "record-reap-")
	ctx := context.Background()
	var reaps atomic.Int32
	twinStandIns{reap: func(in activities.ReapTwinsInput) []twinstate.Handle {
		if reaps.Add(1) == 1 {
			return []twinstate.Handle{{Driver: "process", ID: "stray", EnvID: in.EnvID}}
		}
		return nil
	}}.register(w)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	in := workflows.TwinInput{EnvID: "env_record_reap", Active: twinstate.Build{BuildID: "bld_1", BundleKey: "bundles/1", BundleHash: "sha256:1"},
		Idle: time.Hour, HealthEvery: time.Hour, ReapEvery: time.Second}
	if st, err := (wfclient.Conn{Client: c, TaskQueue: queue}).Wake(ctx, "", in, workflows.WakeRequest{Wait: true}); err != nil || st.State != twinstate.Ready {
		t.Fatalf("wake: %+v %v", st, err)
	}
	deadline := time.Now().Add(time.Minute)
	for reaps.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no reap in a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	id := workflows.TwinWorkflowID(in.EnvID)
	if err := (wfclient.Conn{Client: c, TaskQueue: queue}).ActivateTwinBuild(ctx, in.EnvID, twinstate.Build{BuildID: "bld_2", BundleKey: "bundles/2", BundleHash: "sha256:2"}); err != nil {
		t.Fatal(err)
	}
	awaitTwin(t, c, id, "the new build's twin did not boot", newBuildReady)
	stopAndWrite(t, c, id, out)
}

// newBuildReady says the twin of the new build (bld_2) is active and ready.
func newBuildReady(s workflows.TwinStatus) bool {
	return s.Active.BuildID == "bld_2" && s.State == twinstate.Ready
}

// TestRecordBuildFailedHistory: the build's inference fails with bad input; the failure is recorded.
func TestRecordBuildFailedHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_BUILD_FAILED", "record-build-")
	ctx := context.Background()
	w.RegisterActivityWithOptions(func(ctx context.Context, envID, buildID string) (activities.BuildPlan, error) {
		return activities.BuildPlan{EnvID: envID, BuildID: buildID, BatchKeys: []string{"traces/1"}, BatchIDs: []string{"tb_1"}, NTraces: 3}, nil
	}, activity.RegisterOptions{Name: "PlanBuild"})
	w.RegisterActivityWithOptions(func(ctx context.Context, plan activities.BuildPlan) (activities.Inferred, error) {
		return activities.Inferred{}, temporal.NewNonRetryableApplicationError("no tool calls in 3 traces", activities.ErrTypeBadInput, nil)
	}, activity.RegisterOptions{Name: "InferBundle"})
	w.RegisterActivityWithOptions(func(ctx context.Context, envID, buildID, reason string) error { return nil }, activity.RegisterOptions{Name: "FailBuild"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	bid := "bld_record" + time.Now().Format("150405")
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.BuildWorkflowID(bid), TaskQueue: queue}, workflows.BuildWorkflowName,
		workflows.BuildInput{EnvID: "env_record", BuildID: bid})
	if err != nil {
		t.Fatal(err)
	}
	var res workflows.BuildResult
	if err := run.Get(ctx, &res); err != nil || res.Succeeded || res.Error == "" {
		t.Fatalf("build: %+v %v", res, err)
	}
	writeHistory(t, c, workflows.BuildWorkflowID(bid), out)
}

// TestRecordRebuildContinuedHistory: traces arrive while the rebuild's build runs, so the rebuild continues as new
// after it; the first run's history is written.
func TestRecordRebuildContinuedHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_REBUILD_CONTINUED", "record-rebuild-")
	ctx := context.Background()
	var queued atomic.Int32
	inferring := make(chan struct{}, 4)
	w.RegisterActivityWithOptions(func(ctx context.Context, envID string) (string, error) {
		return "bld_record_" + string(rune('a'+queued.Add(1)-1)) + time.Now().Format("150405"), nil
	}, activity.RegisterOptions{Name: "QueueBuild"})
	w.RegisterActivityWithOptions(func(ctx context.Context, envID, buildID string) (activities.BuildPlan, error) {
		return activities.BuildPlan{EnvID: envID, BuildID: buildID, NTraces: 1}, nil
	}, activity.RegisterOptions{Name: "PlanBuild"})
	w.RegisterActivityWithOptions(func(ctx context.Context, plan activities.BuildPlan) (activities.Inferred, error) {
		inferring <- struct{}{}
		time.Sleep(time.Second)
		return activities.Inferred{BundleKey: "bundles/" + plan.BuildID, BundleHash: "sha256:" + plan.BuildID, NTools: 2}, nil
	}, activity.RegisterOptions{Name: "InferBundle"})
	w.RegisterActivityWithOptions(func(ctx context.Context, plan activities.BuildPlan, inf activities.Inferred) (activities.SelfChecked, error) {
		return activities.SelfChecked{Agreement: 90, Calls: 10}, nil
	}, activity.RegisterOptions{Name: "SelfCheck"})
	w.RegisterActivityWithOptions(func(ctx context.Context, plan activities.BuildPlan, inf activities.Inferred, chk activities.SelfChecked) error {
		return nil
	}, activity.RegisterOptions{Name: "ActivateBuild"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	env := "env_record_" + time.Now().Format("150405")
	in := workflows.RebuildInput{EnvID: env, Debounce: 300 * time.Millisecond}
	run, err := c.SignalWithStartWorkflow(ctx, wfclient.RebuildWorkflowID(env), workflows.CollectedSignal, nil,
		client.StartWorkflowOptions{TaskQueue: queue}, workflows.RebuildWorkflowName, in)
	if err != nil {
		t.Fatal(err)
	}
	first := run.GetRunID() // Get below moves the run to the last one
	<-inferring
	if err := c.SignalWorkflow(ctx, wfclient.RebuildWorkflowID(env), "", workflows.CollectedSignal, nil); err != nil {
		t.Fatal(err)
	}
	// Get follows the continued runs to the last one.
	if err := run.Get(ctx, nil); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if queued.Load() != 2 {
		t.Fatalf("%d builds queued, want 2 (the rebuild did not continue as new)", queued.Load())
	}
	replaytest.Record(t, c, wfclient.RebuildWorkflowID(env), first, out)
}

// TestRecordWebhookGaveUpHistory: every attempt fails; after the window the delivery is marked failed.
func TestRecordWebhookGaveUpHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_WEBHOOK_GAVE_UP", "record-hook-")
	ctx := context.Background()
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.DeliverInput) error {
		return temporal.NewApplicationError("HTTP 503: down", activities.ErrTypeDeliveryFailed)
	}, activity.RegisterOptions{Name: "Deliver"})
	w.RegisterActivityWithOptions(func(ctx context.Context, id, reason string) error { return nil }, activity.RegisterOptions{Name: "FailDelivery"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	id := wfclient.WebhookDeliveryWorkflowID("whd_record_gaveup" + time.Now().Format("150405"))
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, workflows.WebhookDeliveryWorkflowName,
		workflows.WebhookDeliveryInput{DeliveryID: "whd_record_gaveup", Reason: "auto",
			Policy: workflows.DeliveryPolicy{Window: 3 * time.Second, Initial: 200 * time.Millisecond, Max: time.Second, Attempt: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, c, id, out)
}

// TestRecordTwinTaggedHistory: a twin workflow started with doppel's search attributes (the namespace has them)
// takes a new build's id as its DoppelBuild (version twin-build-attribute), then stops; into RECORD_TWIN_TAGGED.
func TestRecordTwinTaggedHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_TWIN_TAGGED", "record-tagged-")
	ctx := context.Background()
	twinStandIns{}.register(w)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	conn := wfclient.Conn{Client: c, TaskQueue: queue, Tagged: true}
	in := workflows.TwinInput{EnvID: "env_record_tagged" + time.Now().Format("150405"), Active: twinstate.Build{BuildID: "bld_1",
		BundleKey: "bundles/1", BundleHash: "sha256:1"}, Idle: time.Hour, HealthEvery: time.Hour}
	if st, err := conn.Wake(ctx, "ws_record", in, workflows.WakeRequest{Wait: true}); err != nil || st.State != twinstate.Ready {
		t.Fatalf("wake: %+v %v", st, err)
	}
	id := workflows.TwinWorkflowID(in.EnvID)
	if err := conn.ActivateTwinBuild(ctx, in.EnvID, twinstate.Build{BuildID: "bld_2", BundleKey: "bundles/2", BundleHash: "sha256:2"}); err != nil {
		t.Fatal(err)
	}
	awaitTwin(t, c, id, "the new build's twin did not boot", newBuildReady)
	stopAndWrite(t, c, id, out)
}

// TestRecordSessionOpenerHistory: an environment's SessionOpener started by an update-with-start, then four more
// opens sent at once (one refused by the twin as a bad spec), then idle until it ends.
func TestRecordSessionOpenerHistory(t *testing.T) {
	out, c, queue, w := recorder(t, "RECORD_SESSION_OPENER", "record-opener-")
	ctx := context.Background()
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.FindTwinInput) (activities.TwinEndpoint, error) {
		return activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: "bld_record", HandleID: "twin-1"}, nil
	}, activity.RegisterOptions{Name: "FindTwin"})
	w.RegisterActivityWithOptions(func(ctx context.Context, in activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
		if in.SessionID == "ses_bad" {
			return activities.OpenOnTwinResult{}, temporal.NewNonRetryableApplicationError("scenario: no scenario \"x\"", activities.ErrTypeSessionSpec, nil)
		}
		return activities.OpenOnTwinResult{Receipts: rpc.Receipts{Seed: in.Spec.Seed, WorldHash: "sha256:w", Seeded: true},
			StateHash: "sha256:s"}, nil
	}, activity.RegisterOptions{Name: "OpenOnTwin"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	id := workflows.SessionOpenerWorkflowID("env_record"+time.Now().Format("150405"), 0)
	open := func(session string, seed int64) error {
		start := c.NewWithStartWorkflowOperation(client.StartWorkflowOptions{ID: id, TaskQueue: queue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING},
			workflows.SessionOpenerWorkflowName, workflows.SessionOpenerInput{EnvID: "env_record", Idle: 2 * time.Second})
		h, err := c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{StartWorkflowOperation: start,
			UpdateOptions: client.UpdateWorkflowOptions{UpdateID: session, UpdateName: workflows.OpenSessionUpdate,
				WaitForStage: client.WorkflowUpdateStageCompleted, Args: []any{workflows.SessionOpenInput{SessionID: session,
					EnvID: "env_record", Spec: rpc.SessionSpec{Seed: seed, SeedInstructions: "2 orders"}, TwinWait: time.Minute}}}})
		if err != nil {
			return err
		}
		var res workflows.SessionOpenResult
		return h.Get(ctx, &res)
	}
	if err := open("ses_first", 1); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for i, s := range []string{"ses_a", "ses_b", "ses_bad", "ses_c"} {
		go func() { errs <- open(s, int64(i+2)) }()
	}
	failed := 0
	for range 4 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d opens failed, want the bad spec's alone", failed)
	}
	if err := c.GetWorkflow(ctx, id, "").Get(ctx, nil); err != nil {
		t.Fatalf("the opener did not end idle: %v", err)
	}
	writeHistory(t, c, id, out)
}
