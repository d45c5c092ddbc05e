// Package worker registers doppel's workflows and activities on a Temporal worker.
package worker

import (
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/workflows"
)

// Deps are the filled activity structs the worker serves; a nil one is not registered.
type Deps struct {
	Builds   *activities.Builds
	Twins    *activities.Twins
	Sessions *activities.Sessions
	Queries  *activities.Queries
	Webhooks *activities.Webhooks
	Spans    *activities.Spans
}

// Register registers every workflow under its explicit name and every activity struct's methods.
func Register(r sdkworker.Registry, d Deps) {
	workflows.Register(r)
	if d.Builds != nil {
		r.RegisterActivityWithOptions(d.Builds, activity.RegisterOptions{})
	}
	if d.Twins != nil {
		r.RegisterActivityWithOptions(d.Twins, activity.RegisterOptions{})
	}
	if d.Sessions != nil {
		r.RegisterActivityWithOptions(d.Sessions, activity.RegisterOptions{})
	}
	if d.Queries != nil {
		r.RegisterActivityWithOptions(d.Queries, activity.RegisterOptions{})
	}
	if d.Webhooks != nil {
		r.RegisterActivityWithOptions(d.Webhooks, activity.RegisterOptions{})
	}
	if d.Spans != nil {
		r.RegisterActivityWithOptions(d.Spans, activity.RegisterOptions{})
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
