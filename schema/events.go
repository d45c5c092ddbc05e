package schema

import (
	"encoding/json"
	"time"

	"github.com/uptrace/bun"
)

// Webhook delivery status values.
const (
	DeliveryPending   = "pending"
	DeliverySucceeded = "succeeded"
	DeliveryFailed    = "failed"
)

// Event is something that happened in a workspace, recorded with the change it reports (the webhook outbox).
type Event struct {
	bun.BaseModel `bun:"table:events"`

	ID          string          `bun:"id,pk"`
	WorkspaceID string          `bun:"workspace_id,notnull"`
	Type        string          `bun:"type,notnull"`
	Subject     string          `bun:"subject,notnull"`
	Data        json.RawMessage `bun:"data,notnull"`
	// DedupKey makes an event recorded twice (a retried activity) one event; the id when nothing repeats.
	DedupKey  string    `bun:"dedup_key,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// WebhookEndpoint is a workspace's receiver of events.
type WebhookEndpoint struct {
	bun.BaseModel `bun:"table:webhook_endpoints"`

	ID          string `bun:"id,pk"`
	WorkspaceID string `bun:"workspace_id,notnull"`
	URL         string `bun:"url,notnull"`
	Description string `bun:"description,notnull"`
	// EventTypes is the comma-separated filter; empty: every type.
	EventTypes string `bun:"event_types,notnull"`
	// Secret is the signing secret, whsec_ + base64 (Standard Webhooks). Signing needs it, so it is kept as is.
	Secret    string    `bun:"secret,notnull"`
	Disabled  bool      `bun:"disabled,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
	UpdatedAt time.Time `bun:"updated_at,notnull"`
}

// WebhookDelivery is one event on its way to one endpoint.
type WebhookDelivery struct {
	bun.BaseModel `bun:"table:webhook_deliveries"`

	ID             string     `bun:"id,pk"`
	WorkspaceID    string     `bun:"workspace_id,notnull"`
	EndpointID     string     `bun:"endpoint_id,notnull"`
	EventID        string     `bun:"event_id,notnull"`
	Status         string     `bun:"status,notnull"`
	Attempts       int64      `bun:"attempts,notnull"`
	Dispatched     bool       `bun:"dispatched,notnull"`
	LastStatusCode int64      `bun:"last_status_code,notnull"`
	LastError      string     `bun:"last_error,notnull"`
	CreatedAt      time.Time  `bun:"created_at,notnull"`
	UpdatedAt      time.Time  `bun:"updated_at,notnull"`
	FinishedAt     *time.Time `bun:"finished_at"`
}

// WebhookAttempt is one POST of a delivery: its answer (or error) and latency.
type WebhookAttempt struct {
	bun.BaseModel `bun:"table:webhook_attempts"`

	ID         string `bun:"id,pk"`
	DeliveryID string `bun:"delivery_id,notnull"`
	N          int64  `bun:"n,notnull"`
	// Reason is auto (the delivery workflow), redeliver or test.
	Reason     string    `bun:"reason,notnull"`
	StatusCode int64     `bun:"status_code,notnull"`
	LatencyMs  int64     `bun:"latency_ms,notnull"`
	Error      string    `bun:"error,notnull"`
	CreatedAt  time.Time `bun:"created_at,notnull"`
}

// Upload is a file stored content-addressed in the blob store, referenced by its upl_ id from builds and collect.
type Upload struct {
	bun.BaseModel `bun:"table:uploads"`

	ID          string    `bun:"id,pk"`
	WorkspaceID string    `bun:"workspace_id,notnull"`
	BlobKey     string    `bun:"blob_key,notnull"`
	SHA256      string    `bun:"sha256,notnull"`
	Filename    string    `bun:"filename,notnull"`
	ContentType string    `bun:"content_type,notnull"`
	Bytes       int64     `bun:"bytes,notnull"`
	CreatedAt   time.Time `bun:"created_at,notnull"`
}
