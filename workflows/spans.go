package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
)

// Names of span settling; never change them.
const (
	// SettleSpansWorkflowName is the registered name of an environment's span settling.
	SettleSpansWorkflowName = "doppel.SettleSpans"
	// SpansStagedSignal tells a SettleSpans workflow that spans were staged.
	SpansStagedSignal = "spans-staged"
)

// settleRoundsPerRun bounds one run's history (a round is a timer and an activity or two) before it continues as
// new; signals (one per export) count towards the history too, so the server's suggestion is followed as well.
const settleRoundsPerRun = 100

// minSettleWait keeps a run from spinning when a conversation is due now.
const minSettleWait = time.Second

// SettleSpansInput configures an environment's span settling.
type SettleSpansInput struct {
	EnvID string
	// Settle is how long a conversation receives no span before it becomes a trace (config otlp.settle).
	Settle time.Duration
}

// SettleSpans makes traces of an environment's staged spans as their conversations settle: it sleeps until the
// first conversation can have settled, runs AssembleSettled (which decides, from when each span arrived, which have),
// schedules a rebuild when traces were stored, and sleeps until the next pending conversation is due. Signals wake
// it from nothing pending but never push its timer back, so steady traffic cannot starve conversations that ended.
// It ends when no span is pending and no signal came meanwhile, and continues as new to keep its history short.
func SettleSpans(ctx workflow.Context, in SettleSpansInput) error {
	if in.Settle <= 0 {
		return temporal.NewNonRetryableApplicationError("settle spans: settle must be positive", activities.ErrTypeBadInput, nil)
	}
	signals := workflow.GetSignalChannel(ctx, SpansStagedSignal)
	var a *activities.Spans
	assemble := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	short := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	wait := in.Settle
	for round := 0; round < settleRoundsPerRun; round++ {
		if wait > 0 {
			if err := workflow.Sleep(ctx, wait); err != nil {
				return err
			}
		}
		for signals.ReceiveAsync(nil) {
		}
		var res activities.SettleResult
		if err := workflow.ExecuteActivity(assemble, a.AssembleSettled, in.EnvID, in.Settle).Get(ctx, &res); err != nil {
			return err
		}
		if res.Assembled > 0 {
			if err := workflow.ExecuteActivity(short, a.ScheduleRebuild, in.EnvID).Get(ctx, nil); err != nil {
				return err
			}
		}
		switch {
		case res.More:
			wait = 0
		case res.Pending > 0:
			wait = max(res.NextIn, minSettleWait)
		case signals.ReceiveAsync(nil):
			// Spans staged while the activity ran: they settle a full settle time after they came.
			wait = in.Settle
		default:
			return nil
		}
		if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			break
		}
	}
	return workflow.NewContinueAsNewError(ctx, SettleSpansWorkflowName, in)
}
