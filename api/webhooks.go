package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/webhook"
)

// eventTypeEnum is the enum of subscribable event types (webhook.test is sent only by webhooks.test).
const eventTypeEnum = "build.succeeded,build.failed,env.ready,twin.ready,twin.stopped,session.opened,session.closed,session.expired"

// WebhookRoutes serve the webhook verbs and the event list.
type WebhookRoutes struct {
	// Guard checks endpoint URLs against server-side request forgery when they are created or changed.
	Guard *webhook.Guard
	// Deliveries starts test sends and redeliveries (wfclient.Webhooks is one; nil: those answer 503).
	Deliveries control.DeliveryStarter
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
	svc := &control.Webhooks{DB: d.DB, Log: loggerFrom}
	if wr.Guard != nil { // a nil *webhook.Guard in the interface would not read as "not configured"
		svc.Guard = wr.Guard
	}
	svc.Deliveries = wr.Deliveries
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
			ep, err := svc.Create(ctx, PrincipalFrom(ctx).Workspace.ID, in.Body.URL, in.Body.Description, in.Body.Events)
			if err != nil {
				return nil, err
			}
			return &CreateWebhookOutput{Body: CreatedWebhook{WebhookEndpoint: endpointOf(ep), Secret: ep.Secret}}, nil
		},
	})

	Declare(a, Verb[struct{}, ListWebhooksOutput]{
		Name: "webhooks.list", Method: http.MethodGet, Path: "/v1/webhooks", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary: "List webhook endpoints", Description: "The workspace's endpoints, oldest first; never their secrets.",
		Handler: func(ctx context.Context, _ *struct{}) (*ListWebhooksOutput, error) {
			eps, err := svc.List(ctx, PrincipalFrom(ctx).Workspace.ID)
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
			ep, err := svc.Update(ctx, PrincipalFrom(ctx).Workspace.ID, in.ID, control.EndpointChange{URL: in.Body.URL,
				Events: in.Body.Events, Description: in.Body.Description, Disabled: in.Body.Disabled})
			if err != nil {
				return nil, err
			}
			return &WebhookOutput{Body: endpointOf(ep)}, nil
		},
	})

	Declare(a, Verb[WebhookIDInput, DeleteWebhookOutput]{
		Name: "webhooks.delete", Method: http.MethodDelete, Path: "/v1/webhooks/{id}", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary:     "Delete a webhook endpoint",
		Description: "Deletes the endpoint and its delivery log; pending deliveries stop. Another workspace's endpoint answers 404.",
		Handler: func(ctx context.Context, in *WebhookIDInput) (*DeleteWebhookOutput, error) {
			if err := svc.Delete(ctx, PrincipalFrom(ctx).Workspace.ID, in.ID); err != nil {
				return nil, err
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
			dl, err := svc.Test(ctx, PrincipalFrom(ctx).Workspace.ID, in.ID)
			if err != nil {
				return nil, err
			}
			return queued(dl), nil
		},
	})

	Declare(a, Verb[ListDeliveriesInput, ListDeliveriesOutput]{
		Name: "webhooks.deliveries", Method: http.MethodGet, Path: "/v1/webhooks/{id}/deliveries", Tags: tags, Security: WorkspaceKeyAuth(),
		Summary:     "List an endpoint's deliveries",
		Description: "Deliveries newest first, each with its status and every attempt's HTTP status, latency and error.",
		Handler: func(ctx context.Context, in *ListDeliveriesInput) (*ListDeliveriesOutput, error) {
			ds, err := svc.ListDeliveries(ctx, PrincipalFrom(ctx).Workspace.ID, in.ID, in.Before, in.Limit)
			if err != nil {
				return nil, err
			}
			return deliveriesOf(ds), nil
		},
	})

	Declare(a, Verb[RedeliverInput, DeliveryQueuedOutput]{
		Name: "webhooks.redeliver", Method: http.MethodPost, Path: "/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver",
		Tags: tags, Security: WorkspaceKeyAuth(), Status: http.StatusAccepted, Errors: []int{http.StatusConflict, http.StatusServiceUnavailable},
		Summary: "Redeliver an event",
		Description: "Sends a finished delivery (succeeded or failed) again, with the same `webhook-id`, through a fresh retry " +
			"window. A delivery still pending answers 409: its retries continue.",
		Handler: func(ctx context.Context, in *RedeliverInput) (*DeliveryQueuedOutput, error) {
			dl, err := svc.Redeliver(ctx, PrincipalFrom(ctx).Workspace.ID, in.ID, in.DeliveryID)
			if err != nil {
				return nil, err
			}
			return queued(dl), nil
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
			evs, err := svc.ListEvents(ctx, PrincipalFrom(ctx).Workspace.ID, in.Type, in.Before, in.Limit)
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

// queued is the answer of a delivery recorded and started.
func queued(dl *schema.WebhookDelivery) *DeliveryQueuedOutput {
	return &DeliveryQueuedOutput{Status: http.StatusAccepted, Body: DeliveryQueued{DeliveryID: dl.ID, EventID: dl.EventID,
		Status: schema.DeliveryPending}}
}

func deliveriesOf(ds []control.Delivery) *ListDeliveriesOutput {
	out := &ListDeliveriesOutput{Body: make([]WebhookDelivery, 0, len(ds))}
	for _, x := range ds {
		w := WebhookDelivery{ID: x.ID, EventID: x.EventID, EventType: x.EventType, Status: x.Status, Attempts: x.Attempts,
			LastStatusCode: x.LastStatusCode, LastError: x.LastError, CreatedAt: x.CreatedAt.UTC(), Log: []WebhookAttempt{}}
		if x.FinishedAt != nil {
			t := x.FinishedAt.UTC()
			w.FinishedAt = &t
		}
		for _, at := range x.Log {
			w.Log = append(w.Log, WebhookAttempt{N: at.N, Reason: at.Reason, StatusCode: at.StatusCode, LatencyMs: at.LatencyMs,
				Error: at.Error, At: at.CreatedAt.UTC()})
		}
		out.Body = append(out.Body, w)
	}
	return out
}
