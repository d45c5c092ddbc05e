package worker

import (
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/query/flow"
)

// names records what is registered.
type names struct{ workflows, activities []string }

func (n *names) RegisterWorkflowWithOptions(_ any, o workflow.RegisterOptions) {
	n.workflows = append(n.workflows, o.Name)
}
func (n *names) RegisterActivityWithOptions(_ any, o activity.RegisterOptions) {
	n.activities = append(n.activities, o.Name)
}

func allDeps() Deps {
	return Deps{Builds: &activities.Builds{}, Twins: &activities.Twins{}, Sessions: &activities.Sessions{},
		Queries: &flow.Activities{}, Webhooks: &activities.Webhooks{}, Spans: &activities.Spans{}}
}

// TestRegisteredNames pins the name of every workflow and activity: running histories name them, so a rename
// strands every workflow that runs. Add names here; never change one.
func TestRegisteredNames(t *testing.T) {
	var n names
	Register(&n, allDeps())
	wantWorkflows := []string{"doppel.Build", "doppel.Query", "doppel.Rebuild", "doppel.SessionOpen", "doppel.SessionOpener", "doppel.SessionReaper",
		"doppel.SettleSpans", "doppel.Twin", "doppel.WebhookDelivery", "doppel.WebhookSweeper"}
	wantActivities := []string{"ActivateBuild", "AgentTurn", "AssembleSettled", "BeginQuerySession", "CallQueryTool", "CloseOnTwin", "CloseQuerySession", "Deliver", "FailBuild",
		"FailDelivery", "FindTwin", "FinishQuery", "InferBundle", "InspectTwin", "ModelTurn", "OpenOnTwin", "OpenQuerySession",
		"PlanBuild", "PrepareQuery", "QueueBuild", "ReapIdleSessions", "ReapTwins", "RecordQuerySession", "RecordTwinEvent", "RunQueryTool",
		"ScheduleRebuild", "SelfCheck", "StartTwin", "StopTwin", "SweepDeliveries"}
	slices.Sort(n.workflows)
	slices.Sort(n.activities)
	if !slices.Equal(n.workflows, wantWorkflows) {
		t.Errorf("workflows registered:\n%q\nwant\n%q", n.workflows, wantWorkflows)
	}
	if !slices.Equal(n.activities, wantActivities) {
		t.Errorf("activities registered:\n%q\nwant\n%q", n.activities, wantActivities)
	}
}

// TestActivityNamesAreMethodNames: each activity's name is the name of the method it runs, the name a workflow that
// calls the method value asks for; and every exported method of an activity struct is registered.
func TestActivityNamesAreMethodNames(t *testing.T) {
	d := allDeps()
	registered := map[string]bool{}
	for _, a := range d.Activities() {
		fn := runtime.FuncForPC(reflect.ValueOf(a.Fn).Pointer()).Name() // e.g. …/activities.(*Builds).PlanBuild-fm
		method := strings.TrimSuffix(fn[strings.LastIndex(fn, ".")+1:], "-fm")
		if method != a.Name {
			t.Errorf("activity %q runs method %s", a.Name, fn)
		}
		registered[a.Name] = true
	}
	for _, s := range []any{d.Builds, d.Twins, d.Sessions, d.Queries, d.Webhooks, d.Spans} {
		typ := reflect.TypeOf(s)
		for i := range typ.NumMethod() {
			if m := typ.Method(i); !registered[m.Name] {
				t.Errorf("%s.%s is not registered as an activity", typ, m.Name)
			}
		}
	}
}
