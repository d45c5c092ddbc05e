package api

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// startSpan starts the server span of r, continuing the trace its headers carry. It is named by the route pattern
// (POST /v1/sessions/{session_id}/call), or by the path for tRPC procedures, never by ids.
func (s *server) startSpan(ctx context.Context, r *http.Request, pattern, requestID string) (context.Context, trace.Span) {
	ctx = s.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
	name := pattern
	switch {
	case name == "" && transportOf(r.URL.Path) == "trpc":
		name = r.Method + " " + r.URL.Path
	case name == "":
		name = r.Method + " (unrouted)"
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method),
		attribute.String("url.path", r.URL.Path),
		attribute.String("http.route", pattern),
		attribute.String("doppel.request_id", requestID),
	))
}

// endSpan ends a server span with the answer's status; 5xx answers mark it failed.
func endSpan(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}
