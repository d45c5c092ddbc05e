package workflows

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
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

// SettleSpansWorkflowID is the workflow id of an environment's span settling.
func SettleSpansWorkflowID(envID string) string { return "settle-spans/" + envID }

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

// ScheduleSettle signals the environment's SettleSpans workflow, starting it if none runs (api.SpanSettler).
func (s *Starter) ScheduleSettle(ctx context.Context, envID string) error {
	_, err := s.Client.SignalWithStartWorkflow(ctx, SettleSpansWorkflowID(envID), SpansStagedSignal, nil,
		client.StartWorkflowOptions{
			TaskQueue:             s.TaskQueue,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			StaticSummary:         "assemble the spans of " + envID + " into traces as their conversations settle",
		},
		SettleSpansWorkflowName, SettleSpansInput{EnvID: envID, Settle: s.Settle})
	if err != nil {
		return fmt.Errorf("schedule span settling of %s: %w", envID, err)
	}
	return nil
}
