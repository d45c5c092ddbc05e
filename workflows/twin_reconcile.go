package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/doppel-dev/doppel/twinstate"
)

// TwinReconciler lists the twins a driver runs and removes those not kept (a driver.Driver that is a
// driver.Reconciler is one).
type TwinReconciler interface {
	List(ctx context.Context) ([]twinstate.Handle, error)
	Reconcile(ctx context.Context, keep func(twinstate.Handle) bool, grace time.Duration) ([]twinstate.Handle, error)
}

// ReconcileTwins removes the driver's twins that no environment's TwinWorkflow holds: twins left behind by a
// crashed worker whose environment's workflow ended or was lost. A TwinWorkflow reaps strays only of its own
// environment while it runs; this covers the rest, at worker start. Twins younger than grace are kept (a start
// may still be returning their handle).
func ReconcileTwins(ctx context.Context, c client.Client, rec TwinReconciler, grace time.Duration) ([]twinstate.Handle, error) {
	handles, err := rec.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile twins: %w", err)
	}
	held := map[string]bool{}
	asked := map[string]bool{}
	for _, h := range handles {
		if asked[h.EnvID] {
			continue
		}
		asked[h.EnvID] = true
		v, err := c.QueryWorkflow(ctx, TwinWorkflowID(h.EnvID), "", TwinStatusQuery)
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) {
			continue // no workflow holds this environment's twins
		}
		if err != nil {
			return nil, fmt.Errorf("reconcile twins: status of %s: %w", h.EnvID, err)
		}
		var st TwinStatus
		if err := v.Get(&st); err != nil {
			return nil, fmt.Errorf("reconcile twins: status of %s: %w", h.EnvID, err)
		}
		for _, slot := range st.Twins {
			if slot.Handle != nil {
				held[slot.Handle.ID] = true
			}
		}
	}
	removed, err := rec.Reconcile(ctx, func(h twinstate.Handle) bool { return held[h.ID] }, grace)
	if err != nil {
		return removed, fmt.Errorf("reconcile twins: %w", err)
	}
	return removed, nil
}
