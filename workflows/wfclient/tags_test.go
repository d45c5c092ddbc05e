package wfclient_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/driver"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twinstate"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// registerSearchAttributes registers doppel's search attributes on the test server's namespace when it lacks them
// (as `doppel dev` does at start, or an operator on a cluster), and waits until a start naming them is accepted.
func registerSearchAttributes(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	missing, err := wfclient.MissingSearchAttributes(ctx, c, "default", wfclient.SearchAttributes())
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) == 0 {
		return
	}
	add := wfclient.SearchAttributes()
	for name := range add {
		if !slices.Contains(missing, name) {
			delete(add, name)
		}
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{Namespace: "default",
		SearchAttributes: add}); err != nil {
		t.Fatal(err)
	}
	// The frontend accepts them once its namespace cache refreshes.
	deadline := time.Now().Add(time.Minute)
	for {
		id := "probe-search-attributes-" + schema.NewID("")
		_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "probe-" + id,
			TypedSearchAttributes: workflows.Tags("ws_probe", "env_probe", "bld_probe")}, "probe")
		if err == nil {
			_ = c.TerminateWorkflow(ctx, id, "", "probe")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the search attributes are not accepted a minute after registering them: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// tagsOf reads a workflow's doppel search attributes, as the Temporal UI shows them.
func tagsOf(t *testing.T, c client.Client, id string) map[string]string {
	t.Helper()
	d, err := c.DescribeWorkflowExecution(context.Background(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, p := range d.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields() {
		if _, ok := wfclient.SearchAttributes()[name]; !ok {
			continue
		}
		var v string
		if err := converter.GetDefaultDataConverter().FromPayload(p, &v); err != nil {
			t.Fatalf("%s of %s: %v", name, id, err)
		}
		out[name] = v
	}
	return out
}

func wantTags(t *testing.T, c client.Client, id string, want map[string]string) {
	t.Helper()
	if got := tagsOf(t, c, id); len(got) != len(want) || !equal(got, want) {
		t.Errorf("%s carries %v, want %v", id, got, want)
	}
}

func equal(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSearchAttributesOnWorkflows: on a real Temporal server whose namespace has doppel's search attributes, the
// workflows a tagged connection starts carry the workspace, environment and build they are about: a rebuild and
// the build it starts as a child, a twin workflow (which takes a new active build's id), a session open and a
// webhook delivery. An untagged connection starts them without.
func TestSearchAttributesOnWorkflows(t *testing.T) {
	addr := testenv.Temporal(t)
	ctx := context.Background()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	registerSearchAttributes(t, c)
	if missing, err := wfclient.MissingSearchAttributes(ctx, c, "default", wfclient.SearchAttributes()); err != nil || len(missing) != 0 {
		t.Fatalf("missing %v, %v", missing, err)
	}

	queue := "test-tags-" + schema.NewID("")
	conn := wfclient.Conn{Client: c, TaskQueue: queue, Tagged: true}
	w := sdkworker.New(c, queue, sdkworker.Options{})
	workflows.Register(w)
	reg := func(name string, fn any) { w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
	buildID := schema.NewID(schema.PrefixBuild)
	reg("QueueBuild", func(context.Context, string) (string, error) { return buildID, nil })
	reg("PlanBuild", func(context.Context, string, string) (activities.BuildPlan, error) {
		return activities.BuildPlan{}, temporal.NewNonRetryableApplicationError("no traces", activities.ErrTypeBadInput, nil)
	})
	reg("FailBuild", func(context.Context, string, string, string) error { return nil })
	reg("StartTwin", func(_ context.Context, in activities.StartTwinInput) (twinstate.Handle, error) {
		return twinstate.Handle{Driver: "process", ID: "twin-" + in.Build.BuildID, EnvID: in.EnvID, Addr: "http://127.0.0.1:1"}, nil
	})
	reg("InspectTwin", func(context.Context, twinstate.Handle) (activities.TwinHealth, error) {
		return activities.TwinHealth{State: driver.StateReady}, nil
	})
	reg("StopTwin", func(context.Context, twinstate.Handle) error { return nil })
	reg("ReapTwins", func(context.Context, activities.ReapTwinsInput) ([]twinstate.Handle, error) { return nil, nil })
	reg("RecordTwinEvent", func(context.Context, activities.TwinEventInput) error { return nil })
	reg("FindTwin", func(_ context.Context, in activities.FindTwinInput) (activities.TwinEndpoint, error) {
		return activities.TwinEndpoint{Addr: "http://127.0.0.1:1", BuildID: buildID}, nil
	})
	reg("OpenOnTwin", func(context.Context, activities.OpenOnTwinInput) (activities.OpenOnTwinResult, error) {
		return activities.OpenOnTwinResult{Receipts: rpc.Receipts{WorldHash: "sha256:w"}}, nil
	})
	reg("Deliver", func(context.Context, activities.DeliverInput) error { return nil })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ws, env := schema.NewID("ws"), schema.NewID(schema.PrefixEnv)

	// A rebuild, and its build as a child.
	builds := &wfclient.Builds{Conn: conn, Debounce: 50 * time.Millisecond}
	if err := builds.ScheduleBuild(ctx, ws, env); err != nil {
		t.Fatal(err)
	}
	if err := c.GetWorkflow(ctx, wfclient.RebuildWorkflowID(env), "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	wantTags(t, c, wfclient.RebuildWorkflowID(env), map[string]string{"DoppelWorkspace": ws, "DoppelEnv": env})
	wantTags(t, c, workflows.BuildWorkflowID(buildID), map[string]string{"DoppelWorkspace": ws, "DoppelEnv": env, "DoppelBuild": buildID})

	// A twin workflow, moved to a new build.
	dir := &wfclient.TwinDirectory{Conn: conn, Input: workflows.TwinInput{Idle: time.Hour, HealthEvery: time.Hour}}
	first := twinstate.Build{BuildID: buildID, BundleKey: "bundles/1"}
	if _, err := dir.WakeTwin(ctx, twinstate.Wake{EnvID: env, WorkspaceID: ws, Active: first, Wait: true}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.SignalWorkflow(ctx, workflows.TwinWorkflowID(env), "", workflows.StopTwinSignal, nil) }()
	wantTags(t, c, workflows.TwinWorkflowID(env), map[string]string{"DoppelWorkspace": ws, "DoppelEnv": env, "DoppelBuild": buildID})
	next := schema.NewID(schema.PrefixBuild)
	if err := conn.ActivateTwinBuild(ctx, env, twinstate.Build{BuildID: next, BundleKey: "bundles/2"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for tagsOf(t, c, workflows.TwinWorkflowID(env))["DoppelBuild"] != next {
		if time.Now().After(deadline) {
			t.Fatalf("the twin workflow still carries %v after the new build", tagsOf(t, c, workflows.TwinWorkflowID(env)))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A session open.
	sessions := &wfclient.Sessions{Conn: conn, TwinWait: time.Minute}
	sid := schema.NewID(schema.PrefixSession)
	if _, err := sessions.Open(ctx, toolplane.OpenWorld{SessionID: sid, EnvID: env, WorkspaceID: ws, BuildID: buildID}); err != nil {
		t.Fatal(err)
	}
	// The environment's opener that opened it: a workspace's and an environment's, of no one build.
	wantTags(t, c, sessions.OpenerID(env, sid), map[string]string{"DoppelWorkspace": ws, "DoppelEnv": env})

	// A webhook delivery, its workspace looked up; and one by an untagged connection.
	did := schema.NewID("whd")
	hooks := &wfclient.Webhooks{Conn: conn, Dispatched: func(context.Context, []string) error { return nil },
		Workspaces: func(_ context.Context, ids []string) (map[string]string, error) {
			return map[string]string{did: ws}, nil
		}}
	if err := hooks.StartDelivery(ctx, did, "test"); err != nil {
		t.Fatal(err)
	}
	wantTags(t, c, wfclient.WebhookDeliveryWorkflowID(did), map[string]string{"DoppelWorkspace": ws})
	plain := schema.NewID("whd")
	hooks.Tagged = false
	if err := hooks.StartDelivery(ctx, plain, "test"); err != nil {
		t.Fatal(err)
	}
	wantTags(t, c, wfclient.WebhookDeliveryWorkflowID(plain), map[string]string{})
}

// TestMissingSearchAttributes names the attributes a namespace lacks, and the commands that register them.
func TestMissingSearchAttributes(t *testing.T) {
	addr := testenv.Temporal(t)
	c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := wfclient.SearchAttributes()
	want["DoppelNeverRegistered"] = want["DoppelEnv"]
	registerSearchAttributes(t, c)
	missing, err := wfclient.MissingSearchAttributes(context.Background(), c, "default", want)
	if err != nil || !slices.Equal(missing, []string{"DoppelNeverRegistered"}) {
		t.Fatalf("missing %v, %v", missing, err)
	}
	cmds := wfclient.CreateCommands("prod", missing)
	if len(cmds) != 1 || cmds[0] != "temporal operator search-attribute create --namespace prod --name DoppelNeverRegistered --type Keyword" {
		t.Fatalf("commands %q", cmds)
	}
}
