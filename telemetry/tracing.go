package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
)

// TracingOptions configure tracing. It is off unless Endpoint, Exporter, or OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) in Environ names where spans go.
type TracingOptions struct {
	// Endpoint is the OTLP/HTTP base URL (e.g. http://127.0.0.1:4318); spans are posted to <Endpoint>/v1/traces.
	Endpoint string
	// Environ is the process environment (os.Environ's form): the OTEL_EXPORTER_OTLP_* variables apply when
	// Endpoint is empty.
	Environ []string
	// ServiceName names this process in its spans (default "doppel").
	ServiceName string
	// SampleRatio is the share of new traces recorded (0 or above 1: all); a request carrying a sampled parent
	// is always recorded.
	SampleRatio float64
	// Exporter, when set, receives the spans instead of OTLP (tests).
	Exporter sdktrace.SpanExporter
}

// Tracing is a process's tracer provider and propagator; its zero value (and nil) traces nothing.
type Tracing struct {
	tp   *sdktrace.TracerProvider
	prop propagation.TextMapPropagator
}

// NewTracing starts tracing as o says, or answers a Tracing that traces nothing when it names no destination.
func NewTracing(_ context.Context, o TracingOptions) (*Tracing, error) {
	exp := o.Exporter
	if exp == nil {
		var opts []otlptracehttp.Option
		switch {
		case o.Endpoint != "":
			u, err := url.Parse(o.Endpoint)
			if err != nil || u.Scheme == "" || u.Host == "" {
				return nil, fmt.Errorf("otel endpoint %q: want an absolute URL such as http://127.0.0.1:4318", o.Endpoint)
			}
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		case lookup(o.Environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && lookup(o.Environ, "OTEL_EXPORTER_OTLP_ENDPOINT") == "":
			return &Tracing{}, nil // off
		}
		// Without an explicit endpoint the exporter reads the OTEL_EXPORTER_OTLP_* variables itself.
		var err error
		if exp, err = otlptracehttp.New(context.Background(), opts...); err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
	}
	name := o.ServiceName
	if name == "" {
		name = "doppel"
	}
	sampler := sdktrace.AlwaysSample()
	if o.SampleRatio > 0 && o.SampleRatio < 1 {
		sampler = sdktrace.TraceIDRatioBased(o.SampleRatio)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sampler)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	)
	return &Tracing{tp: tp, prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}, nil
}

// Enabled reports whether spans are recorded and exported.
func (t *Tracing) Enabled() bool { return t != nil && t.tp != nil }

// Provider is the tracer provider: a no-op one when tracing is off.
func (t *Tracing) Provider() trace.TracerProvider {
	if !t.Enabled() {
		return noop.NewTracerProvider()
	}
	return t.tp
}

// Propagator carries trace context in W3C traceparent/tracestate and baggage headers (nil when off).
func (t *Tracing) Propagator() propagation.TextMapPropagator {
	if !t.Enabled() {
		return nil
	}
	return t.prop
}

// TemporalInterceptor makes spans of workflow starts, workflows and activities, linked through Temporal's headers
// (nil when tracing is off). Set on the client, the worker made from that client uses it too.
func (t *Tracing) TemporalInterceptor() (interceptor.Interceptor, error) {
	if !t.Enabled() {
		return nil, nil
	}
	return temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
		Tracer: t.tp.Tracer("doppel/temporal"), TextMapPropagator: t.prop,
	})
}

// Shutdown exports the spans still buffered and stops tracing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing shutdown: %w", err)
	}
	return nil
}

func lookup(environ []string, name string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// LogHandler adds trace_id and span_id to every record logged with a context that carries a span, so a log line
// leads to its trace.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}
func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
