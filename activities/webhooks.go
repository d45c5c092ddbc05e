package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/uptrace/bun"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

// ErrTypeDeliveryFailed: one webhook attempt failed (retried by the delivery workflow's backoff).
const ErrTypeDeliveryFailed = "WebhookAttemptFailed"

// Dispatcher starts the delivery of recorded webhook deliveries (wfclient.Webhooks is one). Kick must not
// block: what it cannot start now, the sweeper starts later.
type Dispatcher interface {
	Kick(ids []string)
}

// EventLog records events in the database and has their deliveries started.
type EventLog struct {
	DB       *bun.DB
	Dispatch Dispatcher
}

// Record records ev with its deliveries in db (a transaction of the caller's, or the log's database when nil)
// and returns the deliveries' ids, for Kick once the transaction commits.
func (l *EventLog) Record(ctx context.Context, db bun.IDB, ev *schema.Event) ([]string, error) {
	if db == nil {
		db = l.DB
	}
	return store.RecordEvent(ctx, db, ev)
}

// Kick starts the deliveries' workflows (after the transaction that recorded them committed).
func (l *EventLog) Kick(ids []string) {
	if l != nil && l.Dispatch != nil && len(ids) > 0 {
		l.Dispatch.Kick(ids)
	}
}

// EmitEnv records an event about an environment in a transaction of its own and kicks its deliveries.
func (l *EventLog) EmitEnv(ctx context.Context, envID, typ, dedup string, data func(env *schema.Environment) any) error {
	if l == nil {
		return nil
	}
	env, err := store.GetEnvByID(ctx, l.DB, envID)
	if errors.Is(err, store.ErrNotFound) {
		return nil // deleted meanwhile: nobody to tell
	}
	if err != nil {
		return fmt.Errorf("event %s: %w", typ, err)
	}
	ev, err := store.NewEvent(env.WorkspaceID, typ, envID, dedup, data(env))
	if err != nil {
		return err
	}
	ids, err := l.Record(ctx, nil, ev)
	if err != nil {
		return fmt.Errorf("event %s: %w", typ, err)
	}
	l.Kick(ids)
	return nil
}

// Webhooks holds what the webhook activities need; the worker registers a filled one.
type Webhooks struct {
	DB     *bun.DB
	Sender *webhook.Sender
	// Dispatch starts deliveries' workflows, for the sweeper.
	Dispatch interface {
		Dispatch(ctx context.Context, ids []string) error
	}
	Log *slog.Logger
}

// DeliverInput names the delivery to attempt and why (auto, redeliver).
type DeliverInput struct {
	DeliveryID string
	Reason     string
}

// Deliver makes one attempt of a delivery and logs it (status, latency). A delivery already succeeded is done; a
// failed attempt is an error, retried with the workflow's backoff; a deleted endpoint or event ends it.
func (w *Webhooks) Deliver(ctx context.Context, in DeliverInput) error {
	d, err := store.GetDelivery(ctx, w.DB, "", in.DeliveryID)
	if errors.Is(err, store.ErrNotFound) {
		return nil // its endpoint was deleted
	}
	if err != nil {
		return err
	}
	if d.Status != schema.DeliveryPending {
		return nil
	}
	ep, err := store.GetEndpoint(ctx, w.DB, d.WorkspaceID, d.EndpointID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if ep.Disabled {
		return temporal.NewNonRetryableApplicationError("endpoint "+ep.ID+" is disabled", ErrTypeBadInput, nil)
	}
	ev, err := store.GetEvent(ctx, w.DB, d.EventID)
	if err != nil {
		return err
	}
	body, err := json.Marshal(events.Message{ID: ev.ID, Type: ev.Type, Timestamp: ev.CreatedAt.UTC(),
		WorkspaceID: ev.WorkspaceID, Data: ev.Data})
	if err != nil {
		return temporal.NewNonRetryableApplicationError("encode event "+ev.ID+": "+err.Error(), ErrTypeBadInput, err)
	}
	res := w.Sender.Send(ctx, webhook.Request{URL: ep.URL, Secret: ep.Secret, ID: ev.ID, Timestamp: time.Now(), Body: body})
	reason := in.Reason
	if reason == "" {
		reason = "auto"
	}
	a := &schema.WebhookAttempt{Reason: reason, StatusCode: int64(res.StatusCode), LatencyMs: res.Latency.Milliseconds(), Error: res.Detail}
	if err := store.RecordAttempt(ctx, w.DB, d, a, res.OK()); err != nil {
		return err
	}
	if !res.OK() {
		return temporal.NewApplicationError(fmt.Sprintf("attempt %d of %s: %s", a.N, d.ID, res.Detail), ErrTypeDeliveryFailed)
	}
	return nil
}

// FailDelivery marks a delivery failed once its retry window has passed.
func (w *Webhooks) FailDelivery(ctx context.Context, deliveryID, reason string) error {
	return store.FinishDelivery(ctx, w.DB, deliveryID, reason)
}

// SweepInput asks to start deliveries recorded before Before whose workflows were never started, and, when
// PruneBefore is set, to delete events recorded before it (with their finished deliveries).
type SweepInput struct {
	Before      time.Time
	Limit       int
	PruneBefore time.Time
}

// SweepDeliveries prunes events past their retention and starts the workflows of deliveries that were recorded but not started (their process died
// between the commit and the start, or Temporal did not answer), and answers how many.
func (w *Webhooks) SweepDeliveries(ctx context.Context, in SweepInput) (int, error) {
	if in.Limit <= 0 {
		in.Limit = 500
	}
	if !in.PruneBefore.IsZero() {
		if n, err := store.PruneEvents(ctx, w.DB, in.PruneBefore, in.Limit); err != nil {
			return 0, err
		} else if n > 0 && w.Log != nil {
			w.Log.Info("pruned events past their retention", "events", n)
		}
	}
	ids, err := store.Undispatched(ctx, w.DB, in.Before, in.Limit)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if err := w.Dispatch.Dispatch(ctx, ids); err != nil {
		return 0, err
	}
	return len(ids), nil
}
