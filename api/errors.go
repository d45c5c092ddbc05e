package api

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/usage"
)

// Error codes carried in the envelope's code field.
const (
	CodeUnauthorized     = "unauthorized"     // 401
	CodePaymentRequired  = "paymentRequired"  // 402
	CodeForbidden        = "forbidden"        // 403
	CodeNotFound         = "notFound"         // 404
	CodeMethodNotAllowed = "methodNotAllowed" // 405
	CodeConflict         = "conflict"         // 409
	CodeNotReady         = "notReady"         // 409: a twin booting, a build running
	CodeTooLarge         = "tooLarge"         // 413
	CodeInvalid          = "invalid"          // 422 (and any other 4xx)
	CodeTimeout          = "timeout"          // 408: the body arrived too slowly
	CodeRateLimited      = "rateLimited"      // 429
	CodeInternal         = "internal"         // 500
	CodeUnavailable      = "unavailable"      // 502, 503, 504
)

// Access values of a 403 envelope.
const (
	AccessPending = "pending"
	AccessDenied  = "denied"
)

// CodeInfo documents one error code.
type CodeInfo struct {
	Status  int
	Code    string
	Meaning string
}

// Codes lists every error code with its HTTP status, as documented in the OpenAPI description.
func Codes() []CodeInfo {
	return []CodeInfo{
		{401, CodeUnauthorized, "No credential, or one that is invalid, revoked, or of the wrong kind for the route."},
		{402, CodePaymentRequired, "A meter is over its limit; `meter` names it with its used amount and limit, `cardWouldLift` says whether a card on file would lift it."},
		{403, CodeForbidden, "Access not granted; `access` is `pending` or `denied`."},
		{404, CodeNotFound, "No such route, environment, build, key or session — including another workspace's, an expired session, an unroutable tool."},
		{405, CodeMethodNotAllowed, "The path exists but not with this method; `Allow` lists the methods."},
		{408, CodeTimeout, "The request body arrived too slowly: under `api.body_min_rate_bytes` a second on average once `api.body_read_grace` passed. The connection is closed."},
		{409, CodeConflict, "The request conflicts with the current state."},
		{409, CodeNotReady, "Not ready yet: the twin is booting or a build is running. Retry after a moment."},
		{413, CodeTooLarge, "The body, a collect batch or an upload is over its size cap."},
		{422, CodeInvalid, "The input did not validate. `detail` names the first bad field as a path (e.g. `body.seed: expected integer`); `errors` lists every one."},
		{429, CodeRateLimited, "Rate limited. Retry after a moment."},
		{500, CodeInternal, "An unexpected error. Quote the requestId when reporting it."},
		{502, CodeUnavailable, "An upstream the request needed (a query's model endpoint) failed or refused; `detail` says which and why."},
		{503, CodeUnavailable, "A dependency (database, blob store, Temporal, twin) is not answering."},
	}
}

// codeFor is the default code of an HTTP status.
func codeFor(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusPaymentRequired:
		return CodePaymentRequired
	case http.StatusForbidden:
		return CodeForbidden
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusMethodNotAllowed:
		return CodeMethodNotAllowed
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusTooManyRequests:
		return CodeRateLimited
	case http.StatusRequestTimeout:
		return CodeTimeout
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	if status >= 500 {
		return CodeInternal
	}
	return CodeInvalid
}

// FieldError locates one invalid input.
type FieldError struct {
	Location string `json:"location" doc:"Where the bad input is, as a path: body.seed, body.traces[2].id, query.format, path.slug, or body for the whole body." example:"body.seed"`
	Message  string `json:"message" doc:"What is wrong with it." example:"expected integer"`
}

// Meter describes the meter a 402 is about.
type Meter struct {
	Name  string  `json:"name" example:"task_minutes"`
	Used  float64 `json:"used"`
	Limit float64 `json:"limit"`
}

// Envelope is the one error body every route answers with (spec §7).
type Envelope struct {
	status int
	// retryAfter, when positive, is sent as the Retry-After header (seconds) with the envelope.
	retryAfter int

	Detail        string       `json:"detail" doc:"Human-readable message. For 422 it names the field." example:"body.seed: expected integer"`
	Code          string       `json:"code" doc:"Machine-readable code." enum:"unauthorized,paymentRequired,forbidden,notFound,methodNotAllowed,conflict,notReady,timeout,tooLarge,invalid,rateLimited,internal,unavailable"`
	RequestID     string       `json:"requestId" doc:"The request's id, also in the X-Request-Id header." example:"req_0123456789abcdef"`
	Errors        []FieldError `json:"errors,omitempty" doc:"On 422: every invalid field."`
	Access        string       `json:"access,omitempty" enum:"pending,denied" doc:"On 403: whether access is pending or denied."`
	Meter         *Meter       `json:"meter,omitempty" doc:"On 402: the meter over its limit."`
	CardWouldLift *bool        `json:"cardWouldLift,omitempty" doc:"On 402: whether a card on file would lift the limit."`
}

// Error implements error.
func (e *Envelope) Error() string { return e.Detail }

// GetStatus implements huma.StatusError.
func (e *Envelope) GetStatus() int { return e.status }

// ContentType keeps errors plain JSON.
func (e *Envelope) ContentType(string) string { return "application/json" }

// NewError returns an envelope with the status's default code.
func NewError(status int, detail string) *Envelope {
	return &Envelope{status: status, Code: codeFor(status), Detail: detail}
}

// Errorf is NewError with a formatted detail.
func Errorf(status int, format string, args ...any) *Envelope {
	return NewError(status, fmt.Sprintf(format, args...))
}

// Unauthorized is a 401.
func Unauthorized(detail string) *Envelope { return NewError(http.StatusUnauthorized, detail) }

// Forbidden is a 403 with access pending or denied.
func Forbidden(access, detail string) *Envelope {
	e := NewError(http.StatusForbidden, detail)
	e.Access = access
	return e
}

// NotFound is a 404.
func NotFound(format string, args ...any) *Envelope {
	return Errorf(http.StatusNotFound, format, args...)
}

// Conflict is a 409 with code conflict.
func Conflict(format string, args ...any) *Envelope {
	return Errorf(http.StatusConflict, format, args...)
}

// NotReady is a 409 with code notReady.
func NotReady(format string, args ...any) *Envelope {
	e := Errorf(http.StatusConflict, format, args...)
	e.Code = CodeNotReady
	return e
}

// TooLarge is a 413.
func TooLarge(format string, args ...any) *Envelope {
	return Errorf(http.StatusRequestEntityTooLarge, format, args...)
}

// Invalid is a 422 naming one field: Invalid("body.seed", "expected integer").
func Invalid(location, message string) *Envelope {
	e := NewError(http.StatusUnprocessableEntity, location+": "+message)
	e.Errors = []FieldError{{Location: location, Message: message}}
	return e
}

// RateLimited is a 429.
func RateLimited(detail string) *Envelope { return NewError(http.StatusTooManyRequests, detail) }

// PaymentRequired is a 402 naming the meter over its limit.
func PaymentRequired(m Meter, cardWouldLift bool, detail string) *Envelope {
	e := NewError(http.StatusPaymentRequired, detail)
	e.Meter = &m
	e.CardWouldLift = &cardWouldLift
	return e
}

// Unavailable is a 503.
func Unavailable(format string, args ...any) *Envelope {
	return Errorf(http.StatusServiceUnavailable, format, args...)
}

// StoreError turns a store error into the right envelope: ErrNotFound → 404 "<what> not found",
// ErrConflict → 409, ErrInvalid → 422; anything else is returned unchanged (a 500, logged).
func StoreError(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return NotFound("%s not found", what)
	case errors.Is(err, store.ErrConflict):
		return Conflict("%s: %s", what, strings.TrimPrefix(err.Error(), "store: "))
	case errors.Is(err, store.ErrInvalid):
		e := NewError(http.StatusUnprocessableEntity, strings.TrimPrefix(err.Error(), "store: "))
		return e
	}
	return err
}

// EnvelopeOf returns the envelope an error answers with (a 500 for errors that are not envelopes),
// with its HTTP status. For transports that nest it, e.g. tRPC's error.data.envelope.
func EnvelopeOf(ctx context.Context, err error) (*Envelope, int) {
	var e *Envelope
	var pe *toolplane.Error
	var le *usage.LimitError
	if errors.As(err, &pe) {
		e = planeEnvelope(pe)
	} else if errors.As(err, &le) {
		e = limitEnvelope(le)
	} else if !errors.As(err, &e) {
		var se huma.StatusError
		if errors.As(err, &se) {
			e = fromHuma(ctx, se.GetStatus(), se.Error(), nil)
		} else {
			e = internal(ctx, err)
		}
	}
	if e.RequestID == "" {
		e.RequestID = RequestID(ctx)
	}
	return e, e.status
}

// planeEnvelope maps a tool-plane refusal to its envelope.
func planeEnvelope(pe *toolplane.Error) *Envelope {
	switch pe.Kind {
	case toolplane.NotFound:
		return NotFound("%s", pe.Detail)
	case toolplane.Invalid:
		if pe.Field == "" { // a whole input refused (a store rule), no one field to name
			return NewError(http.StatusUnprocessableEntity, pe.Detail)
		}
		return Invalid(pe.Field, pe.Detail)
	case toolplane.NotReady:
		return NotReady("%s", pe.Detail)
	case toolplane.Conflict:
		return Conflict("%s", pe.Detail)
	case toolplane.BadGateway:
		return NewError(http.StatusBadGateway, pe.Detail)
	case toolplane.TooLarge:
		return TooLarge("%s", pe.Detail)
	}
	return Unavailable("%s", pe.Detail)
}

// limitEnvelope is the 402 of a meter over its limit.
func limitEnvelope(le *usage.LimitError) *Envelope {
	return PaymentRequired(Meter{Name: le.Meter, Used: le.Used, Limit: le.Limit}, le.CardWouldLift, le.Error())
}

// WriteError writes err as an envelope on a plain net/http route.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	e, status := EnvelopeOf(r.Context(), err)
	writeEnvelope(w, status, e)
}

func writeEnvelope(w http.ResponseWriter, status int, e *Envelope) {
	w.Header().Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	w.Header().Del("Content-Length")
	if status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

// internal logs an unexpected error with the request id and returns a 500 that does not leak it.
func internal(ctx context.Context, err error) *Envelope {
	rid := RequestID(ctx)
	if unreachable(err) {
		loggerFrom(ctx).WarnContext(ctx, "dependency unavailable", slog.String("request_id", rid), slog.Any("error", err))
		e := NewError(http.StatusServiceUnavailable, "a backing service (database or blob store) is unavailable; retry in a moment (request "+rid+")")
		e.RequestID = rid
		return e
	}
	loggerFrom(ctx).ErrorContext(ctx, "internal error", slog.String("request_id", rid), slog.Any("error", err))
	e := NewError(http.StatusInternalServerError, "internal error; quote request id "+rid+" when reporting it")
	e.RequestID = rid
	return e
}

// unreachable reports whether err says a backing service could not be reached (refused or dropped connections,
// a closed pool, a timeout dialing): a 503 the client may retry, not a 500.
func unreachable(err error) bool {
	var opErr *net.OpError
	switch {
	case errors.Is(err, sql.ErrConnDone), errors.Is(err, driver.ErrBadConn), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &opErr):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "sql: database is closed") || strings.Contains(msg, "connection refused")
}

// fromHuma builds the envelope for an error huma raises itself (validation, body size, …).
// Malformed bodies (huma's 400) become 422s; 422's detail names the first field.
func fromHuma(ctx context.Context, status int, msg string, errs []error) *Envelope {
	malformed := false
	if status == http.StatusBadRequest {
		// Huma answers 400 only when the body does not parse (or is missing).
		status, malformed = http.StatusUnprocessableEntity, true
	}
	if status >= 500 && status != http.StatusServiceUnavailable {
		var cause error = errors.New(msg)
		if len(errs) > 0 {
			cause = errors.Join(errs...)
		}
		return internal(ctx, cause)
	}
	e := NewError(status, msg)
	e.RequestID = RequestID(ctx)
	for _, err := range errs {
		if err == nil {
			continue
		}
		var d huma.ErrorDetailer
		if errors.As(err, &d) {
			det := d.ErrorDetail()
			fe := fieldError(det.Location, det.Message)
			if malformed && fe.Location == "body" {
				fe.Message = "malformed JSON: " + fe.Message
			}
			e.Errors = append(e.Errors, fe)
		} else {
			e.Errors = append(e.Errors, FieldError{Message: err.Error()})
		}
	}
	if status == http.StatusUnprocessableEntity {
		if len(e.Errors) == 0 {
			e.Errors = []FieldError{{Location: "body", Message: msg}}
		}
		first := e.Errors[0]
		e.Detail = first.Message
		if first.Location != "" {
			e.Detail = first.Location + ": " + first.Message
		}
		if n := len(e.Errors) - 1; n > 0 {
			e.Detail += fmt.Sprintf(" (and %d more)", n)
		}
	}
	if status == http.StatusRequestEntityTooLarge {
		e.Detail = tooLargeDetail(msg)
	}
	return e
}

// tooLargeDetail says a body's real cap. Huma's "request body is too large limit=N bytes" names the byte count
// that trips it: it refuses a body once it has read N bytes, so N-1 bytes is the most a body may hold.
func tooLargeDetail(msg string) string {
	var limit int64
	if _, err := fmt.Sscanf(msg, "request body is too large limit=%d bytes", &limit); err == nil && limit > 0 {
		return fmt.Sprintf("the request body is over its cap of %d bytes", limit-1)
	}
	if msg == "" {
		return "the request body is over its size cap"
	}
	return msg
}

// unsupportedDetail is the 415 for a body in a content type the operation does not take, naming both.
func unsupportedDetail(ctx huma.Context, e *Envelope) {
	got := ctx.Header("Content-Type")
	var takes []string
	if op := ctx.Operation(); op != nil && op.RequestBody != nil {
		for ct := range op.RequestBody.Content {
			takes = append(takes, ct)
		}
	}
	sort.Strings(takes)
	e.Detail = fmt.Sprintf("Content-Type %q is not accepted here; send %s", got, strings.Join(takes, " or "))
	if len(takes) == 0 {
		e.Detail = fmt.Sprintf("Content-Type %q is not accepted here", got)
	}
	e.Errors = []FieldError{{Location: "header.Content-Type", Message: e.Detail}}
}

// fieldError locates a missing required property at the property itself (huma reports it at the parent).
func fieldError(location, message string) FieldError {
	if name, ok := strings.CutPrefix(message, "expected required property "); ok {
		if name, ok = strings.CutSuffix(name, " to be present"); ok {
			if location == "" {
				location = name
			} else {
				location += "." + name
			}
			return FieldError{Location: location, Message: "required property is missing"}
		}
	}
	return FieldError{Location: location, Message: message}
}

// Huma's error constructors are package variables: point them at the envelope once, so
// validation errors, body-size errors and errors returned by handlers all share one shape.
func init() {
	huma.NewError = func(status int, msg string, errs ...error) huma.StatusError {
		return fromHuma(context.Background(), status, msg, errs)
	}
	huma.NewErrorWithContext = func(ctx huma.Context, status int, msg string, errs ...error) huma.StatusError {
		var c context.Context = context.Background()
		if ctx != nil {
			c = ctx.Context()
		}
		e := fromHuma(c, status, msg, errs)
		if e.status == http.StatusUnsupportedMediaType && ctx != nil {
			unsupportedDetail(ctx, e)
		}
		return e
	}
}

// fillRequestID is a huma transformer that stamps the request id on envelopes created without one
// (e.g. returned by a handler) and converts any other error body huma may write into an envelope.
func fillRequestID(ctx huma.Context, _ string, v any) (any, error) {
	switch b := v.(type) {
	case *Envelope:
		if b.RequestID == "" {
			b.RequestID = RequestID(ctx.Context())
		}
		return b, nil
	case *huma.ErrorModel:
		errs := make([]error, 0, len(b.Errors))
		for _, d := range b.Errors {
			errs = append(errs, d)
		}
		return fromHuma(ctx.Context(), b.Status, b.Detail, errs), nil
	}
	return v, nil
}
