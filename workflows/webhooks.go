package workflows

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
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
	DefaultWebhookWindow   = 24 * time.Hour
	DefaultWebhookInitial  = 5 * time.Second
	DefaultWebhookMax      = time.Hour
	DefaultWebhookAttempt  = 30 * time.Second
	webhookSweepsPerRun    = 200
	webhookKickQueue       = 10_000
	webhookDispatchers     = 8
	webhookDispatchTimeout = 10 * time.Second
)

// WebhookSweeperWorkflowID is the sweeper's workflow id: one per task queue (deployments sharing a namespace on
// different queues have their own databases).
func WebhookSweeperWorkflowID(taskQueue string) string { return "webhook-sweeper/" + taskQueue }

// WebhookDeliveryWorkflowID is the workflow id of one delivery.
func WebhookDeliveryWorkflowID(deliveryID string) string { return "webhook-delivery/" + deliveryID }

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

// Webhooks starts delivery workflows for recorded deliveries: it is the activities.Dispatcher of every process
// that records events (the API's tool plane, the worker's activities).
type Webhooks struct {
	Client    client.Client
	TaskQueue string
	// Dispatched records deliveries as started, so the sweeper leaves them be (the wiring passes the store's
	// MarkDispatched: workflows does no database I/O of its own).
	Dispatched func(ctx context.Context, ids []string) error
	Policy     DeliveryPolicy
	Log        *slog.Logger

	once  sync.Once
	queue chan string
}

var _ activities.Dispatcher = (*Webhooks)(nil)

// Dispatch starts each delivery's workflow (one already running is left to run) and records it started.
func (w *Webhooks) Dispatch(ctx context.Context, ids []string) error {
	var started []string
	var errs []error
	for _, id := range ids {
		if err := w.Start(ctx, id, "auto"); err != nil {
			errs = append(errs, err)
			continue
		}
		started = append(started, id)
	}
	if err := w.Dispatched(ctx, started); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// StartDelivery starts one delivery's workflow now (a test send, a redelivery) and records it started.
func (w *Webhooks) StartDelivery(ctx context.Context, id, reason string) error {
	if err := w.Start(ctx, id, reason); err != nil {
		return err
	}
	return w.Dispatched(ctx, []string{id})
}

// Start starts one delivery's workflow; reason is recorded on its attempts.
func (w *Webhooks) Start(ctx context.Context, id, reason string) error {
	_, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       WebhookDeliveryWorkflowID(id),
		TaskQueue:                w.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		EnableEagerStart:         true, // a worker in this process (doppel dev, doppel worker) takes it at once
		StaticSummary:            "deliver " + id,
	}, WebhookDeliveryWorkflowName, WebhookDeliveryInput{DeliveryID: id, Reason: reason, Policy: w.Policy})
	if err != nil {
		return fmt.Errorf("start delivery %s: %w", id, err)
	}
	return nil
}

// Kick queues deliveries to be dispatched in the background, without holding its caller: a few dispatchers
// start their workflows in order. When the queue is full, or a start fails, the sweeper starts them later.
func (w *Webhooks) Kick(ids []string) {
	if w == nil || len(ids) == 0 {
		return
	}
	w.once.Do(func() {
		w.queue = make(chan string, webhookKickQueue)
		for range webhookDispatchers {
			go w.dispatchLoop()
		}
	})
	for _, id := range ids {
		select {
		case w.queue <- id:
		default:
			return
		}
	}
}

func (w *Webhooks) dispatchLoop() {
	for id := range w.queue {
		ctx, cancel := context.WithTimeout(context.Background(), webhookDispatchTimeout)
		err := w.Dispatch(ctx, []string{id})
		cancel()
		if err != nil && w.Log != nil {
			w.Log.Warn("webhook dispatch failed; the sweeper will retry", "delivery", id, "error", err)
		}
	}
}

// StartSweeper starts the webhook sweeper unless it already runs.
func (w *Webhooks) StartSweeper(ctx context.Context, in WebhookSweeperInput) error {
	_, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       WebhookSweeperWorkflowID(w.TaskQueue),
		TaskQueue:                w.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "start webhook deliveries that were recorded but not started",
	}, WebhookSweeperWorkflowName, in)
	if err != nil {
		return fmt.Errorf("start webhook sweeper: %w", err)
	}
	return nil
}
