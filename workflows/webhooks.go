package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/doppel-dev/doppel/activities"
)

// Registered names of the webhook workflows; never change them.
const (
	WebhookDeliveryWorkflowName = "doppel.WebhookDelivery"
	WebhookSweeperWorkflowName  = "doppel.WebhookSweeper"
)

// Defaults of DeliveryPolicy.
const (
	DefaultWebhookWindow  = 24 * time.Hour
	DefaultWebhookInitial = 5 * time.Second
	DefaultWebhookMax     = time.Hour
	DefaultWebhookAttempt = 30 * time.Second
	webhookSweepsPerRun   = 200
)

// DeliveryPolicy is how long and how often a delivery is tried: attempts back off exponentially (doubling from
// Initial up to Max) for Window, then the delivery is marked failed.
type DeliveryPolicy struct {
	Window  time.Duration
	Initial time.Duration
	Max     time.Duration
	// Attempt bounds one attempt (a worker that dies mid-attempt is retried after it).
	Attempt time.Duration
}

func (p DeliveryPolicy) withDefaults() DeliveryPolicy {
	if p.Window <= 0 {
		p.Window = DefaultWebhookWindow
	}
	if p.Initial <= 0 {
		p.Initial = DefaultWebhookInitial
	}
	if p.Max <= 0 {
		p.Max = DefaultWebhookMax
	}
	if p.Attempt <= 0 {
		p.Attempt = DefaultWebhookAttempt
	}
	return p
}

// WebhookDeliveryInput names a delivery and its retry policy.
type WebhookDeliveryInput struct {
	DeliveryID string
	Reason     string
	Policy     DeliveryPolicy
}

// WebhookDelivery delivers one event to one endpoint at least once: the Deliver activity, each attempt logged.
// The first attempt is a local activity (one workflow task when the receiver answers at once); after a failure,
// attempts are retried by Temporal with exponential backoff until the window closes; then the delivery is marked
// failed.
func WebhookDelivery(ctx workflow.Context, in WebhookDeliveryInput) error {
	p := in.Policy.withDefaults()
	var a *activities.Webhooks
	start := workflow.Now(ctx)
	first := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: p.Attempt,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	in1 := activities.DeliverInput{DeliveryID: in.DeliveryID, Reason: in.Reason}
	err := workflow.ExecuteLocalActivity(first, a.Deliver, in1).Get(ctx, nil)
	if err == nil {
		return nil
	}
	if _, typ := errorText(err); typ != activities.ErrTypeBadInput {
		if err = workflow.Sleep(ctx, p.Initial); err != nil {
			return err
		}
		left := p.Window - workflow.Now(ctx).Sub(start)
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			ScheduleToCloseTimeout: max(left, p.Attempt),
			StartToCloseTimeout:    p.Attempt,
			RetryPolicy: &temporal.RetryPolicy{
				InitialInterval:        min(2*p.Initial, p.Max),
				BackoffCoefficient:     2,
				MaximumInterval:        p.Max,
				NonRetryableErrorTypes: []string{activities.ErrTypeBadInput},
			},
		})
		err = workflow.ExecuteActivity(actx, a.Deliver, in1).Get(ctx, nil)
		if err == nil {
			return nil
		}
	}
	// Past the window Temporal answers the last attempt's error (or a timeout when it was cut short).
	reason, typ := errorText(err)
	if typ != activities.ErrTypeBadInput {
		reason = fmt.Sprintf("gave up after %s of retries; last attempt: %s", p.Window, reason)
	}
	fctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	return workflow.ExecuteActivity(fctx, a.FailDelivery, in.DeliveryID, reason).Get(ctx, nil)
}

// WebhookSweeperInput configures the sweeper.
type WebhookSweeperInput struct {
	// Every is the time between sweeps; deliveries older than Every that were never started are started.
	Every time.Duration
	// Retention is how long events are kept (0: for ever); older ones are deleted with their finished deliveries.
	Retention time.Duration
	Sweeps    int
}

// WebhookSweeper deletes events older than Retention and starts, every Every, the deliveries that were recorded but whose workflows never started, so an
// event recorded just before its process died is still delivered.
func WebhookSweeper(ctx workflow.Context, in WebhookSweeperInput) error {
	if in.Every <= 0 {
		in.Every = 10 * time.Second
	}
	var a *activities.Webhooks
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	for i := 0; i < webhookSweepsPerRun; i++ {
		if err := workflow.Sleep(ctx, in.Every); err != nil {
			return err
		}
		var n int
		now := workflow.Now(ctx)
		sweep := activities.SweepInput{Before: now.Add(-in.Every)}
		if in.Retention > 0 {
			sweep.PruneBefore = now.Add(-in.Retention)
		}
		if err := workflow.ExecuteActivity(actx, a.SweepDeliveries, sweep).Get(ctx, &n); err != nil {
			workflow.GetLogger(ctx).Warn("webhook sweep failed", "error", err)
			continue
		}
		in.Sweeps++
		if n > 0 {
			workflow.SetCurrentDetails(ctx, fmt.Sprintf("sweep %d started %d deliveries", in.Sweeps, n))
		}
	}
	return workflow.NewContinueAsNewError(ctx, WebhookSweeperWorkflowName, in)
}

// RegisterWebhooks registers the webhook workflows under their explicit names.
func RegisterWebhooks(r Registrar) {
	r.RegisterWorkflowWithOptions(WebhookDelivery, workflow.RegisterOptions{Name: WebhookDeliveryWorkflowName})
	r.RegisterWorkflowWithOptions(WebhookSweeper, workflow.RegisterOptions{Name: WebhookSweeperWorkflowName})
}
