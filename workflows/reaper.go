package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
)

// SessionReaperWorkflowName is the registered name of the idle-session reaper; never change it.
const SessionReaperWorkflowName = "doppel.SessionReaper"

// SessionReaperInput configures the reaper.
type SessionReaperInput struct {
	// Idle is how long an unused session stays open (config session.idle).
	Idle time.Duration
	// Every is the time between sweeps (default Idle/60, at least a second, at most a minute).
	Every time.Duration
	// Sweeps counts sweeps done by earlier runs (continue-as-new keeps histories short).
	Sweeps int
}

// sweepsPerRun bounds one run's history before it continues as new.
const sweepsPerRun = 200

// SessionReaper expires idle sessions: every In.Every it runs ReapIdleSessions as of workflow time, and it
// continues as new every sweepsPerRun sweeps.
func SessionReaper(ctx workflow.Context, in SessionReaperInput) error {
	if in.Idle <= 0 {
		return temporal.NewNonRetryableApplicationError("session reaper: idle must be positive", activities.ErrTypeBadInput, nil)
	}
	every := in.Every
	if every <= 0 {
		every = min(max(in.Idle/60, time.Second), time.Minute)
	}
	var a *activities.Sessions
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	for i := 0; i < sweepsPerRun; i++ {
		if err := workflow.Sleep(ctx, every); err != nil {
			return err
		}
		var res activities.ReapResult
		err := workflow.ExecuteActivity(actx, a.ReapIdleSessions, activities.ReapInput{Now: workflow.Now(ctx), Idle: in.Idle}).Get(ctx, &res)
		if err != nil {
			// A failed sweep is retried by the next one; the reaper itself must keep running.
			workflow.GetLogger(ctx).Warn("session sweep failed", "error", err)
			continue
		}
		in.Sweeps++
		if len(res.Expired) > 0 {
			workflow.SetCurrentDetails(ctx, fmt.Sprintf("sweep %d expired %d sessions", in.Sweeps, len(res.Expired)))
		}
	}
	return workflow.NewContinueAsNewError(ctx, SessionReaper, in)
}
