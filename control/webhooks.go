package control

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/webhook"
)

// URLChecker refuses an endpoint URL that would reach what the server must not (server-side request forgery).
type URLChecker interface {
	CheckURL(ctx context.Context, rawURL string) error
}

// DeliveryStarter starts a recorded delivery's workflow now; reason (test, redeliver) is logged on its attempts.
type DeliveryStarter interface {
	StartDelivery(ctx context.Context, deliveryID, reason string) error
}

// Webhooks is the service of a workspace's webhook endpoints, their deliveries and its recorded events.
type Webhooks struct {
	DB bun.IDB
	// Guard checks endpoint URLs when they are created or changed (nil: webhooks are not configured).
	Guard URLChecker
	// Deliveries starts test sends and redeliveries (nil: those are unavailable).
	Deliveries DeliveryStarter
	// Log answers the logger of a call's context, which records a delivery that could not start now (the sweeper
	// starts it later); nil: not logged.
	Log func(context.Context) *slog.Logger
}

// EndpointChange is an update of an endpoint: the fields given (non-nil) replace the endpoint's.
type EndpointChange struct {
	URL         *string
	Events      *[]string
	Description *string
	Disabled    *bool
}

// Delivery is a delivery with its event's type and every attempt, in order.
type Delivery struct {
	schema.WebhookDelivery
	EventType string
	Log       []schema.WebhookAttempt
}

// Create registers an endpoint of the workspace with a new signing secret (in the answer only).
func (w *Webhooks) Create(ctx context.Context, workspaceID, url, description string, events []string) (*schema.WebhookEndpoint, error) {
	if err := w.checkURL(ctx, url); err != nil {
		return nil, err
	}
	ep := &schema.WebhookEndpoint{WorkspaceID: workspaceID, URL: url, Description: description,
		EventTypes: strings.Join(events, ","), Secret: webhook.NewSecret()}
	if err := store.CreateEndpoint(ctx, w.DB, ep); err != nil {
		return nil, storeError(err, "webhook endpoint")
	}
	return ep, nil
}

// List answers the workspace's endpoints, oldest first.
func (w *Webhooks) List(ctx context.Context, workspaceID string) ([]schema.WebhookEndpoint, error) {
	return store.ListEndpoints(ctx, w.DB, workspaceID)
}

// Update replaces the fields ch gives; the URL is checked as at create, the secret stays.
func (w *Webhooks) Update(ctx context.Context, workspaceID, id string, ch EndpointChange) (*schema.WebhookEndpoint, error) {
	ep, err := store.GetEndpoint(ctx, w.DB, workspaceID, id)
	if err != nil {
		return nil, storeError(err, "webhook endpoint "+id)
	}
	var cols []string
	if u := ch.URL; u != nil {
		if err := w.checkURL(ctx, *u); err != nil {
			return nil, err
		}
		ep.URL, cols = *u, append(cols, "url")
	}
	if e := ch.Events; e != nil {
		ep.EventTypes, cols = strings.Join(*e, ","), append(cols, "event_types")
	}
	if s := ch.Description; s != nil {
		ep.Description, cols = *s, append(cols, "description")
	}
	if b := ch.Disabled; b != nil {
		ep.Disabled, cols = *b, append(cols, "disabled")
	}
	if len(cols) > 0 {
		if err := store.UpdateEndpoint(ctx, w.DB, ep, cols...); err != nil {
			return nil, storeError(err, "webhook endpoint "+id)
		}
	}
	return ep, nil
}

// Delete deletes an endpoint and its delivery log; pending deliveries stop.
func (w *Webhooks) Delete(ctx context.Context, workspaceID, id string) error {
	existed, err := store.DeleteEndpoint(ctx, w.DB, workspaceID, id)
	if err != nil {
		return err
	}
	if !existed {
		return notFound("webhook endpoint " + id + " not found")
	}
	return nil
}

// Test records a webhook.test event for the endpoint alone and starts its delivery.
func (w *Webhooks) Test(ctx context.Context, workspaceID, id string) (*schema.WebhookDelivery, error) {
	if w.Deliveries == nil {
		return nil, unavailable("webhook delivery is not configured")
	}
	ep, err := store.GetEndpoint(ctx, w.DB, workspaceID, id)
	if err != nil {
		return nil, storeError(err, "webhook endpoint "+id)
	}
	if ep.Disabled {
		return nil, conflict("webhook endpoint " + ep.ID + " is disabled: enable it (webhooks.update) to send it events")
	}
	dl, err := store.RecordTestEvent(ctx, w.DB, ep)
	if err != nil {
		return nil, err
	}
	w.start(ctx, dl, "test")
	return dl, nil
}

// Redeliver sends a finished delivery of the endpoint again through a fresh retry window; a pending one is a
// conflict (its retries continue).
func (w *Webhooks) Redeliver(ctx context.Context, workspaceID, endpointID, deliveryID string) (*schema.WebhookDelivery, error) {
	if w.Deliveries == nil {
		return nil, unavailable("webhook delivery is not configured")
	}
	dl, err := store.GetDelivery(ctx, w.DB, workspaceID, deliveryID)
	if err != nil || dl.EndpointID != endpointID {
		return nil, notFound("delivery " + deliveryID + " not found on webhook endpoint " + endpointID)
	}
	reset, err := store.ResetDelivery(ctx, w.DB, workspaceID, dl.ID)
	if err != nil {
		return nil, err
	}
	if !reset {
		return nil, conflict("delivery " + dl.ID + " is pending: its retries continue")
	}
	w.start(ctx, dl, "redeliver")
	return dl, nil
}

// ListDeliveries answers an endpoint's deliveries, newest first, before the delivery id before (paging).
func (w *Webhooks) ListDeliveries(ctx context.Context, workspaceID, id, before string, limit int) ([]Delivery, error) {
	ep, err := store.GetEndpoint(ctx, w.DB, workspaceID, id)
	if err != nil {
		return nil, storeError(err, "webhook endpoint "+id)
	}
	ds, err := store.ListDeliveries(ctx, w.DB, ep.ID, before, limit)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(ds))
	for _, x := range ds {
		ids = append(ids, x.ID)
	}
	attempts, err := store.ListAttempts(ctx, w.DB, ids)
	if err != nil {
		return nil, err
	}
	out := make([]Delivery, 0, len(ds))
	types := map[string]string{}
	for _, x := range ds {
		if _, ok := types[x.EventID]; !ok {
			ev, err := store.GetEvent(ctx, w.DB, x.EventID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			if ev != nil {
				types[x.EventID] = ev.Type
			}
		}
		out = append(out, Delivery{WebhookDelivery: x, EventType: types[x.EventID], Log: attempts[x.ID]})
	}
	return out, nil
}

// ListEvents answers the workspace's recorded events, newest first, of one type or all, before the event id before.
func (w *Webhooks) ListEvents(ctx context.Context, workspaceID, typ, before string, limit int) ([]schema.Event, error) {
	return store.ListEvents(ctx, w.DB, workspaceID, typ, before, limit)
}

func (w *Webhooks) checkURL(ctx context.Context, u string) error {
	if w.Guard == nil {
		return unavailable("webhooks are not configured")
	}
	if err := w.Guard.CheckURL(ctx, u); err != nil {
		return &toolplane.Error{Kind: toolplane.Invalid, Field: "body.url", Detail: err.Error()}
	}
	return nil
}

// start starts a recorded delivery; one that cannot start now is logged, and the sweeper starts it later.
func (w *Webhooks) start(ctx context.Context, dl *schema.WebhookDelivery, reason string) {
	if err := w.Deliveries.StartDelivery(ctx, dl.ID, reason); err != nil && w.Log != nil {
		w.Log(ctx).WarnContext(ctx, "webhooks: start delivery", "delivery", dl.ID, "error", err)
	}
}
