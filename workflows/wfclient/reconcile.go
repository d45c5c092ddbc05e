package wfclient

import (
	"context"
	"fmt"
	"time"

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
func (c Conn) ReconcileTwins(ctx context.Context, rec TwinReconciler, grace time.Duration) ([]twinstate.Handle, error) {
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
		st, ok, err := c.Status(ctx, h.EnvID)
		if err != nil {
			return nil, fmt.Errorf("reconcile twins: %w", err)
		}
		if !ok {
			continue // no workflow holds this environment's twins
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
