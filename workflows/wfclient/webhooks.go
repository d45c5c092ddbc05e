package wfclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/workflows"
)

// Bounds of the background dispatch of Webhooks.Kick.
const (
	webhookKickQueue       = 10_000
	webhookDispatchers     = 8
	webhookDispatchTimeout = 10 * time.Second
)

// WebhookSweeperWorkflowID is the sweeper's workflow id: one per task queue (deployments sharing a namespace on
// different queues have their own databases).
func WebhookSweeperWorkflowID(taskQueue string) string { return "webhook-sweeper/" + taskQueue }

// WebhookDeliveryWorkflowID is the workflow id of one delivery.
func WebhookDeliveryWorkflowID(deliveryID string) string { return "webhook-delivery/" + deliveryID }

// Webhooks starts delivery workflows for recorded deliveries: it is the activities.Dispatcher of every process
// that records events (the API's tool plane, the worker's activities).
type Webhooks struct {
	Conn
	// Dispatched records deliveries as started, so the sweeper leaves them be (the wiring passes the store's
	// MarkDispatched: workflows does no database I/O of its own).
	Dispatched func(ctx context.Context, ids []string) error
	// Workspaces answers deliveries' workspaces by id, for their search attribute (the wiring passes the store's
	// DeliveryWorkspaces; nil, or a failure, starts them without).
	Workspaces func(ctx context.Context, ids []string) (map[string]string, error)
	Policy     workflows.DeliveryPolicy
	Log        *slog.Logger

	once  sync.Once
	queue chan string
}

var _ activities.Dispatcher = (*Webhooks)(nil)

// Dispatch starts each delivery's workflow (one already running is left to run) and records it started.
func (w *Webhooks) Dispatch(ctx context.Context, ids []string) error {
	var started []string
	var errs []error
	ws := w.workspaces(ctx, ids)
	for _, id := range ids {
		if err := w.start(ctx, ws[id], id, "auto"); err != nil {
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
	if err := w.start(ctx, w.workspaces(ctx, []string{id})[id], id, reason); err != nil {
		return err
	}
	return w.Dispatched(ctx, []string{id})
}

// workspaces answers the deliveries' workspaces when the workflows are tagged (none when it cannot).
func (w *Webhooks) workspaces(ctx context.Context, ids []string) map[string]string {
	if !w.Tagged || w.Workspaces == nil {
		return nil
	}
	ws, err := w.Workspaces(ctx, ids)
	if err != nil && w.Log != nil {
		w.Log.Warn("deliveries' workspaces: starting them without the search attribute", "error", err)
	}
	return ws
}

// start starts one delivery's workflow; reason is recorded on its attempts.
func (w *Webhooks) start(ctx context.Context, workspaceID, id, reason string) error {
	_, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       WebhookDeliveryWorkflowID(id),
		TaskQueue:                w.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		EnableEagerStart:         true, // a worker in this process (doppel dev, doppel worker) takes it at once
		StaticSummary:            "deliver " + id,
		TypedSearchAttributes:    w.tags(workspaceID, "", ""),
	}, workflows.WebhookDeliveryWorkflowName, workflows.WebhookDeliveryInput{DeliveryID: id, Reason: reason, Policy: w.Policy})
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
func (w *Webhooks) StartSweeper(ctx context.Context, in workflows.WebhookSweeperInput) error {
	_, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       WebhookSweeperWorkflowID(w.TaskQueue),
		TaskQueue:                w.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            "start webhook deliveries that were recorded but not started",
	}, workflows.WebhookSweeperWorkflowName, in)
	if err != nil {
		return fmt.Errorf("start webhook sweeper: %w", err)
	}
	return nil
}
