package schema

import (
	"time"

	"github.com/uptrace/bun"
)

// StagedSpan is an OpenTelemetry span staged until its conversation settles (POST /v1/traces). Its ids are the
// key: a span sent again is not staged twice.
type StagedSpan struct {
	bun.BaseModel `bun:"table:staged_spans"`

	EnvID   string `bun:"env_id,pk"`
	TraceID string `bun:"trace_id,pk"` // OpenTelemetry trace id, hex
	SpanID  string `bun:"span_id,pk"`  // hex
	// ParentID and ConversationID are what grouping spans into conversations reads (ingest.Conversations).
	ParentID       string    `bun:"parent_id,notnull"`
	ConversationID string    `bun:"conversation_id,notnull"`
	ReceivedAt     time.Time `bun:"received_at,notnull"`
	// Pending is true until a version of the conversation's trace is made from the span.
	Pending bool  `bun:"pending,notnull"`
	Bytes   int64 `bun:"bytes,notnull"`
	// Span is the staged span: OTLP protobuf with the attributes assembly reads, S2-compressed (otlp.Staged.Data).
	Span []byte `bun:"span,notnull"`
}
