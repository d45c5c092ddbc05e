// Package worker registers doppel's workflows and activities on a Temporal worker.
package worker

import (
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/query/flow"
	"github.com/doppel-dev/doppel/workflows"
)

// Deps are the filled activity structs the worker serves; a nil one is not registered.
type Deps struct {
	Builds   *activities.Builds
	Twins    *activities.Twins
	Sessions *activities.Sessions
	Queries  *flow.Activities
	Webhooks *activities.Webhooks
	Spans    *activities.Spans
}

// Named is an activity and the name it is registered under.
type Named struct {
	Name string
	Fn   any
}

// Activities lists the activities of d's filled structs under their names. Each name is its method's name: the
// name a workflow calling the method value asks for, and the name running histories record, so never change one.
func (d Deps) Activities() []Named {
	var out []Named
	if b := d.Builds; b != nil {
		out = append(out, Named{"QueueBuild", b.QueueBuild}, Named{"PlanBuild", b.PlanBuild}, Named{"InferBundle", b.InferBundle},
			Named{"SelfCheck", b.SelfCheck}, Named{"ActivateBuild", b.ActivateBuild}, Named{"FailBuild", b.FailBuild})
	}
	if t := d.Twins; t != nil {
		out = append(out, Named{"StartTwin", t.StartTwin}, Named{"InspectTwin", t.InspectTwin}, Named{"StopTwin", t.StopTwin},
			Named{"RecordTwinEvent", t.RecordTwinEvent}, Named{"ReapTwins", t.ReapTwins})
	}
	if s := d.Sessions; s != nil {
		out = append(out, Named{"FindTwin", s.FindTwin}, Named{"OpenOnTwin", s.OpenOnTwin}, Named{"CloseOnTwin", s.CloseOnTwin},
			Named{"ReapIdleSessions", s.ReapIdleSessions})
	}
	if q := d.Queries; q != nil {
		out = append(out, Named{"PrepareQuery", q.PrepareQuery}, Named{"OpenQuerySession", q.OpenQuerySession},
			Named{"CallQueryTool", q.CallQueryTool}, Named{"CloseQuerySession", q.CloseQuerySession}, Named{"ModelTurn", q.ModelTurn},
			Named{"FinishQuery", q.FinishQuery},
			// query-v1's steps
			Named{"BeginQuerySession", q.BeginQuerySession}, Named{"RecordQuerySession", q.RecordQuerySession},
			Named{"AgentTurn", q.AgentTurn}, Named{"RunQueryTool", q.RunQueryTool})
	}
	if w := d.Webhooks; w != nil {
		out = append(out, Named{"Deliver", w.Deliver}, Named{"FailDelivery", w.FailDelivery}, Named{"SweepDeliveries", w.SweepDeliveries})
	}
	if s := d.Spans; s != nil {
		out = append(out, Named{"AssembleSettled", s.AssembleSettled}, Named{"ScheduleRebuild", s.ScheduleRebuild})
	}
	return out
}

// Registry is the part of a worker (or a test environment) that takes registrations.
type Registry interface {
	workflows.Registrar
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// Register registers every workflow and every activity of d under its explicit name.
func Register(r Registry, d Deps) {
	workflows.Register(r)
	flow.Register(r)
	for _, a := range d.Activities() {
		r.RegisterActivityWithOptions(a.Fn, activity.RegisterOptions{Name: a.Name})
	}
}

// New creates a worker polling taskQueue with everything registered; the caller starts and stops it.
func New(c client.Client, taskQueue string, d Deps) sdkworker.Worker {
	w := sdkworker.New(c, taskQueue, sdkworker.Options{
		// Build activities heartbeat their progress every 2s; without this the SDK would hold each heartbeat for
		// 0.8 of the heartbeat timeout, so a retry could resume from progress up to 8s old (issue 13, defect 9).
		MaxHeartbeatThrottleInterval: 2 * time.Second,
	})
	Register(w, d)
	return w
}
