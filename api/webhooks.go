package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
)

// eventTypeEnum is the enum of subscribable event types (webhook.test is sent only by webhooks.test).
const eventTypeEnum = "build.succeeded,build.failed,env.ready,twin.ready,twin.stopped,session.opened,session.closed,session.expired"

// DeliveryStarter starts a recorded delivery's workflow (wfclient.Webhooks is one); reason is logged on its
// attempts (test, redeliver).
type DeliveryStarter interface {
	StartDelivery(ctx context.Context, deliveryID, reason string) error
}

// WebhookRoutes serve the webhook verbs and the event list.
type WebhookRoutes struct {
	// Guard checks endpoint URLs against server-side request forgery when they are created or changed.
	Guard *webhook.Guard
	// Deliveries starts test sends and redeliveries (nil: those answer 503).
	Deliveries DeliveryStarter
}

// WebhookEndpoint is an endpoint as listed: never its secret.
type WebhookEndpoint struct {
	ID          string    `json:"id" doc:"Prefixed whe_." example:"whe_0123456789abcdef"`
	URL         string    `json:"url"`
	Description string    `json:"description"`
	Events      []string  `json:"events" doc:"Event types sent to it; empty: all."`
	Disabled    bool      `json:"disabled"`
	CreatedAt   time.Time `json:"created_at" format:"date-time"`
	UpdatedAt   time.Time `json:"updated_at" format:"date-time"`
}

func endpointOf(ep *schema.WebhookEndpoint) WebhookEndpoint {
	out := WebhookEndpoint{ID: ep.ID, URL: ep.URL, Description: ep.Description, Events: []string{}, Disabled: ep.Disabled,
		CreatedAt: ep.CreatedAt.UTC(), UpdatedAt: ep.UpdatedAt.UTC()}
	if ep.EventTypes != "" {
		out.Events = strings.Split(ep.EventTypes, ",")
	}
	return out
}

// CreateWebhookInput is POST /v1/webhooks.
type CreateWebhookInput struct {
	Body struct {
		URL         string   `json:"url" minLength:"1" maxLength:"2048" doc:"http(s) URL events are POSTed to. Loopback, private, link-local and metadata addresses are refused unless webhooks.allow_cidrs allows them." example:"https://hooks.example.com/doppel"`
		Events      []string `json:"events,omitempty" maxItems:"16" uniqueItems:"true" doc:"Event types to send; omitted or empty: all." enum:"build.succeeded,build.failed,env.ready,twin.ready,twin.stopped,session.opened,session.closed,session.expired"`
		Description string   `json:"description,omitempty" maxLength:"200"`
	}
}

// CreatedWebhook is a new endpoint with its signing secret, shown only in this response.
type CreatedWebhook struct {
	WebhookEndpoint
	Secret string `json:"secret" doc:"Signing secret, whsec_ + base64 (Standard Webhooks). Shown once." example:"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"`
}

// CreateWebhookOutput wraps CreatedWebhook.
type CreateWebhookOutput struct {
	Body CreatedWebhook
}

// ListWebhooksOutput is GET /v1/webhooks.
type ListWebhooksOutput struct {
	Body []WebhookEndpoint
}

// WebhookIDInput names an endpoint.
type WebhookIDInput struct {
	ID string `path:"id" minLength:"1" maxLength:"64" doc:"Endpoint id (whe_…)."`
}

// UpdateWebhookInput is PATCH /v1/webhooks/{id}: the fields given replace the endpoint's.
type UpdateWebhookInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"64" doc:"Endpoint id (whe_…)."`
	Body struct {
		URL         *string   `json:"url,omitempty" minLength:"1" maxLength:"2048"`
		Events      *[]string `json:"events,omitempty" maxItems:"16" uniqueItems:"true" doc:"Replaces the filter; empty: all." enum:"build.succeeded,build.failed,env.ready,twin.ready,twin.stopped,session.opened,session.closed,session.expired"`
		Description *string   `json:"description,omitempty" maxLength:"200"`
		Disabled    *bool     `json:"disabled,omitempty" doc:"A disabled endpoint gets no new deliveries; pending ones end."`
	}
}

// WebhookOutput wraps one endpoint.
type WebhookOutput struct {
	Body WebhookEndpoint
}

// DeleteWebhookOutput is DELETE /v1/webhooks/{id}.
type DeleteWebhookOutput struct {
	Body struct {
		Existed bool `json:"existed"`
	}
}

// DeliveryQueued is the 202 answer of a test send or a redelivery.
type DeliveryQueued struct {
	DeliveryID string `json:"delivery_id" doc:"Prefixed whd_; poll webhooks.deliveries for its attempts."`
	EventID    string `json:"event_id" doc:"The event's id: the webhook-id header of every attempt."`
	Status     string `json:"status" enum:"pending"`
}

// DeliveryQueuedOutput wraps DeliveryQueued.
type DeliveryQueuedOutput struct {
	Status int
	Body   DeliveryQueued
}

// ListDeliveriesInput pages an endpoint's deliveries.
type ListDeliveriesInput struct {
	ID     string `path:"id" minLength:"1" maxLength:"64" doc:"Endpoint id (whe_…)."`
	Before string `query:"before" maxLength:"64" doc:"Only deliveries older than this delivery id (paging)."`
	Limit  int    `query:"limit" minimum:"1" maximum:"500" default:"50"`
}

// WebhookAttempt is one POST of a delivery.
type WebhookAttempt struct {
	N          int64     `json:"n"`
	Reason     string    `json:"reason" enum:"auto,redeliver,test"`
	StatusCode int64     `json:"status_code" doc:"The receiver's HTTP status; 0 when none came (connection refused, timeout, refused address)."`
	LatencyMs  int64     `json:"latency_ms"`
	Error      string    `json:"error,omitempty"`
	At         time.Time `json:"at" format:"date-time"`
}

// WebhookDelivery is one event on its way to one endpoint, with its attempts.
type WebhookDelivery struct {
	ID             string           `json:"id" doc:"Prefixed whd_."`
	EventID        string           `json:"event_id"`
	EventType      string           `json:"event_type"`
	Status         string           `json:"status" enum:"pending,succeeded,failed"`
	Attempts       int64            `json:"attempts"`
	LastStatusCode int64            `json:"last_status_code"`
	LastError      string           `json:"last_error,omitempty"`
	CreatedAt      time.Time        `json:"created_at" format:"date-time"`
	FinishedAt     *time.Time       `json:"finished_at" nullable:"true" format:"date-time"`
	Log            []WebhookAttempt `json:"log" doc:"Every attempt, in order."`
}

// ListDeliveriesOutput is GET /v1/webhooks/{id}/deliveries.
type ListDeliveriesOutput struct {
	Body []WebhookDelivery
}

// RedeliverInput names a delivery of an endpoint.
type RedeliverInput struct {
	ID         string `path:"id" minLength:"1" maxLength:"64" doc:"Endpoint id (whe_…)."`
	DeliveryID string `path:"delivery_id" minLength:"1" maxLength:"64" doc:"Delivery id (whd_…)."`
}

// ListEventsInput pages the workspace's events.
type ListEventsInput struct {
	Type   string `query:"type" maxLength:"64" doc:"Only events of this type."`
	Before string `query:"before" maxLength:"64" doc:"Only events older than this event id (paging)."`
	Limit  int    `query:"limit" minimum:"1" maximum:"500" default:"50"`
}

// Event is a recorded event, as webhooks receive it.
type Event struct {
	ID        string          `json:"id" doc:"Prefixed evt_; the webhook-id of its deliveries."`
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp" format:"date-time"`
	Data      json.RawMessage `json:"data"`
}

// ListEventsOutput is GET /v1/events.
type ListEventsOutput struct {
	Body []Event
}

// Register adds the webhook verbs and events.list.
func (wr *WebhookRoutes) Register(a huma.API, d *Deps) {
	tags := []string{"webhooks"}
	Declare(a, Verb[CreateWebhookInput, CreateWebhookOutput]{
		Name: "webhooks.create", Method: http.MethodPost, Path: "/v1/webhooks", Tags: tags, Security: WorkspaceKeyAuth(),
		Status:  http.StatusCreated,
		Summary: "Create a webhook endpoint",
		Description: "Registers a URL that receives the workspace's events (all, or those listed), each POSTed as JSON " +
			"`{id, type, timestamp, workspace_id, data}` and signed as Standard Webhooks specifies (`webhook-id`, " +
			"`webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>`), so its libraries verify it. " +
			"The signing secret is in this answer only. Deliveries are at least once: retried with exponential backoff for " +
			"webhooks.retry_window (24 h), the same `webhook-id` on every attempt.",
		Handler: func(ctx context.Context, in *CreateWebhookInput) (*CreateWebhookOutput, error) {
			p := PrincipalFrom(ctx)
			if err := wr.checkURL(ctx, in.Body.URL); err != nil {
				return nil, err
			}
			ep := &schema.WebhookEndpoint{WorkspaceID: p.Workspace.ID, URL: in.Body.URL, Description: in.Body.Description,
				EventTypes: strings.Join(in.Body.Events, ","), Secret: webhook.NewSecret()}
			if err := store.CreateEndpoint(ctx, d.DB, ep); err != nil {
				return nil, StoreError(err, "webhook endpoint")
			}
			return &CreateWebhookOutput{Body: CreatedWebhook{WebhookEndpoint: endpointOf(ep), Secret: ep.Secret}}, nil
		},
	})

	Declare(a, Verb[struct{}, ListWebhooksOutput]{
		Name: "webhooks.list", Method: http.MethodGet, Path: "/v1/webhooks", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary: "List webhook endpoints", Description: "The workspace's endpoints, oldest first; never their secrets.",
		Handler: func(ctx context.Context, _ *struct{}) (*ListWebhooksOutput, error) {
			eps, err := store.ListEndpoints(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID)
			if err != nil {
				return nil, err
			}
			out := &ListWebhooksOutput{Body: make([]WebhookEndpoint, 0, len(eps))}
			for i := range eps {
				out.Body = append(out.Body, endpointOf(&eps[i]))
			}
			return out, nil
		},
	})

	Declare(a, Verb[UpdateWebhookInput, WebhookOutput]{
		Name: "webhooks.update", Method: http.MethodPatch, Path: "/v1/webhooks/{id}", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary:     "Update a webhook endpoint",
		Description: "Replaces the fields given: url (checked as at create), events, description, disabled. The secret stays.",
		Handler: func(ctx context.Context, in *UpdateWebhookInput) (*WebhookOutput, error) {
			ep, err := store.GetEndpoint(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID, in.ID)
			if err != nil {
				return nil, StoreError(err, "webhook endpoint "+in.ID)
			}
			var cols []string
			if u := in.Body.URL; u != nil {
				if err := wr.checkURL(ctx, *u); err != nil {
					return nil, err
				}
				ep.URL, cols = *u, append(cols, "url")
			}
			if e := in.Body.Events; e != nil {
				ep.EventTypes, cols = strings.Join(*e, ","), append(cols, "event_types")
			}
			if s := in.Body.Description; s != nil {
				ep.Description, cols = *s, append(cols, "description")
			}
			if b := in.Body.Disabled; b != nil {
				ep.Disabled, cols = *b, append(cols, "disabled")
			}
			if len(cols) > 0 {
				if err := store.UpdateEndpoint(ctx, d.DB, ep, cols...); err != nil {
					return nil, StoreError(err, "webhook endpoint "+in.ID)
				}
			}
			return &WebhookOutput{Body: endpointOf(ep)}, nil
		},
	})

	Declare(a, Verb[WebhookIDInput, DeleteWebhookOutput]{
		Name: "webhooks.delete", Method: http.MethodDelete, Path: "/v1/webhooks/{id}", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary:     "Delete a webhook endpoint",
		Description: "Deletes the endpoint and its delivery log; pending deliveries stop. Another workspace's endpoint answers 404.",
		Handler: func(ctx context.Context, in *WebhookIDInput) (*DeleteWebhookOutput, error) {
			existed, err := store.DeleteEndpoint(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID, in.ID)
			if err != nil {
				return nil, err
			}
			if !existed {
				return nil, NotFound("webhook endpoint %s not found", in.ID)
			}
			out := &DeleteWebhookOutput{}
			out.Body.Existed = true
			return out, nil
		},
	})

	Declare(a, Verb[WebhookIDInput, DeliveryQueuedOutput]{
		Name: "webhooks.test", Method: http.MethodPost, Path: "/v1/webhooks/{id}/test", Tags: tags, Security: WorkspaceKeyAuth(),
		Status: http.StatusAccepted, Errors: []int{http.StatusConflict, http.StatusServiceUnavailable},
		Summary:     "Send a test event",
		Description: "Records a `webhook.test` event for this endpoint only and delivers it like any other (signed, retried, logged).",
		Handler: func(ctx context.Context, in *WebhookIDInput) (*DeliveryQueuedOutput, error) {
			if wr.Deliveries == nil {
				return nil, Unavailable("webhook delivery is not configured")
			}
			ep, err := store.GetEndpoint(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID, in.ID)
			if err != nil {
				return nil, StoreError(err, "webhook endpoint "+in.ID)
			}
			if ep.Disabled {
				return nil, Conflict("webhook endpoint %s is disabled: enable it (webhooks.update) to send it events", ep.ID)
			}
			dl, err := store.RecordTestEvent(ctx, d.DB, ep)
			if err != nil {
				return nil, err
			}
			return wr.start(ctx, dl, "test")
		},
	})

	Declare(a, Verb[ListDeliveriesInput, ListDeliveriesOutput]{
		Name: "webhooks.deliveries", Method: http.MethodGet, Path: "/v1/webhooks/{id}/deliveries", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary:     "List an endpoint's deliveries",
		Description: "Deliveries newest first, each with its status and every attempt's HTTP status, latency and error.",
		Handler: func(ctx context.Context, in *ListDeliveriesInput) (*ListDeliveriesOutput, error) {
			ep, err := store.GetEndpoint(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID, in.ID)
			if err != nil {
				return nil, StoreError(err, "webhook endpoint "+in.ID)
			}
			ds, err := store.ListDeliveries(ctx, d.DB, ep.ID, in.Before, in.Limit)
			if err != nil {
				return nil, err
			}
			return deliveriesOf(ctx, d, ds)
		},
	})

	Declare(a, Verb[RedeliverInput, DeliveryQueuedOutput]{
		Name: "webhooks.redeliver", Method: http.MethodPost, Path: "/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver",
		Tags: tags, Security: WorkspaceKeyAuth(), Status: http.StatusAccepted, Errors: []int{http.StatusConflict, http.StatusServiceUnavailable},
		Summary: "Redeliver an event",
		Description: "Sends a finished delivery (succeeded or failed) again, with the same `webhook-id`, through a fresh retry " +
			"window. A delivery still pending answers 409: its retries continue.",
		Handler: func(ctx context.Context, in *RedeliverInput) (*DeliveryQueuedOutput, error) {
			if wr.Deliveries == nil {
				return nil, Unavailable("webhook delivery is not configured")
			}
			ws := PrincipalFrom(ctx).Workspace.ID
			dl, err := store.GetDelivery(ctx, d.DB, ws, in.DeliveryID)
			if err != nil || dl.EndpointID != in.ID {
				return nil, NotFound("delivery %s not found on webhook endpoint %s", in.DeliveryID, in.ID)
			}
			reset, err := store.ResetDelivery(ctx, d.DB, ws, dl.ID)
			if err != nil {
				return nil, err
			}
			if !reset {
				return nil, Conflict("delivery %s is pending: its retries continue", dl.ID)
			}
			return wr.start(ctx, dl, "redeliver")
		},
	})

	Declare(a, Verb[ListEventsInput, ListEventsOutput]{
		Name: "events.list", Method: http.MethodGet, Path: "/v1/events", Tags: []string{"events"}, Security: WorkspaceKeyAuth(),
		Summary: "List events",
		Description: "The workspace's recorded events, newest first: " + strings.ReplaceAll(eventTypeEnum, ",", ", ") +
			". The same events webhooks receive, for callers that poll.",
		Handler: func(ctx context.Context, in *ListEventsInput) (*ListEventsOutput, error) {
			if in.Type != "" && !events.Known(in.Type) {
				return nil, Invalid("query.type", "unknown event type; one of "+eventTypeEnum+", webhook.test")
			}
			evs, err := store.ListEvents(ctx, d.DB, PrincipalFrom(ctx).Workspace.ID, in.Type, in.Before, in.Limit)
			if err != nil {
				return nil, err
			}
			out := &ListEventsOutput{Body: make([]Event, 0, len(evs))}
			for _, ev := range evs {
				out.Body = append(out.Body, Event{ID: ev.ID, Type: ev.Type, Timestamp: ev.CreatedAt.UTC(), Data: ev.Data})
			}
			return out, nil
		},
	})
}

func (wr *WebhookRoutes) checkURL(ctx context.Context, u string) error {
	if wr.Guard == nil {
		return Unavailable("webhooks are not configured")
	}
	if err := wr.Guard.CheckURL(ctx, u); err != nil {
		return Invalid("body.url", err.Error())
	}
	return nil
}

func (wr *WebhookRoutes) start(ctx context.Context, dl *schema.WebhookDelivery, reason string) (*DeliveryQueuedOutput, error) {
	if err := wr.Deliveries.StartDelivery(ctx, dl.ID, reason); err != nil {
		// Recorded: the sweeper starts it later.
		loggerFrom(ctx).WarnContext(ctx, "webhooks: start delivery", "delivery", dl.ID, "error", err)
	}
	return &DeliveryQueuedOutput{Status: http.StatusAccepted, Body: DeliveryQueued{DeliveryID: dl.ID, EventID: dl.EventID,
		Status: schema.DeliveryPending}}, nil
}

func deliveriesOf(ctx context.Context, d *Deps, ds []schema.WebhookDelivery) (*ListDeliveriesOutput, error) {
	ids := make([]string, 0, len(ds))
	for _, x := range ds {
		ids = append(ids, x.ID)
	}
	attempts, err := store.ListAttempts(ctx, d.DB, ids)
	if err != nil {
		return nil, err
	}
	out := &ListDeliveriesOutput{Body: make([]WebhookDelivery, 0, len(ds))}
	types := map[string]string{}
	for _, x := range ds {
		if _, ok := types[x.EventID]; !ok {
			ev, err := store.GetEvent(ctx, d.DB, x.EventID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			if ev != nil {
				types[x.EventID] = ev.Type
			}
		}
		w := WebhookDelivery{ID: x.ID, EventID: x.EventID, EventType: types[x.EventID], Status: x.Status, Attempts: x.Attempts,
			LastStatusCode: x.LastStatusCode, LastError: x.LastError, CreatedAt: x.CreatedAt.UTC(), Log: []WebhookAttempt{}}
		if x.FinishedAt != nil {
			t := x.FinishedAt.UTC()
			w.FinishedAt = &t
		}
		for _, at := range attempts[x.ID] {
			w.Log = append(w.Log, WebhookAttempt{N: at.N, Reason: at.Reason, StatusCode: at.StatusCode, LatencyMs: at.LatencyMs,
				Error: at.Error, At: at.CreatedAt.UTC()})
		}
		out.Body = append(out.Body, w)
	}
	return out, nil
}
