package api

import (
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/doppel-dev/doppel/otlp"
)

// errorDomain is the google.rpc.ErrorInfo domain of doppel's errors.
const errorDomain = "doppel.dev"

// httpStatusOf is the HTTP status an OTLP export answers an envelope with: OTLP calls invalid data 400 Bad
// Request (the envelope's 422); every other status is the envelope's own.
func httpStatusOf(e *Envelope) int {
	if e.status == http.StatusUnprocessableEntity {
		return http.StatusBadRequest
	}
	return e.status
}

// grpcCodeOf is the gRPC code an envelope answers with over OTLP/gRPC, chosen so that an exporter retries exactly
// what OTLP/HTTP's statuses tell it to retry: 429 and 503 retry (RESOURCE_EXHAUSTED with RetryInfo, UNAVAILABLE),
// a 413 does not (RESOURCE_EXHAUSTED without RetryInfo).
func grpcCodeOf(e *Envelope) codes.Code {
	switch e.status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusUnsupportedMediaType:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusPaymentRequired, http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict:
		return codes.FailedPrecondition
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Internal
}

// traceStatus is the google.rpc.Status an export's error answers with, OTLP's failure body. Its message is the
// envelope's detail with its code and request id; its details carry every field of the envelope:
//   - google.rpc.ErrorInfo: reason = the envelope's code, domain doppel.dev, metadata requestId, status, detail,
//     and access, meter, meterUsed, meterLimit, cardWouldLift when the envelope has them;
//   - google.rpc.BadRequest: one field violation per entry of the envelope's errors (field = its location);
//   - google.rpc.RetryInfo: the delay of the Retry-After header, when one is sent.
func traceStatus(e *Envelope, retryAfter int) (*status.Status, error) {
	meta := map[string]string{"requestId": e.RequestID, "status": strconv.Itoa(e.status), "detail": e.Detail}
	if e.Access != "" {
		meta["access"] = e.Access
	}
	if e.Meter != nil {
		meta["meter"] = e.Meter.Name
		meta["meterUsed"] = strconv.FormatFloat(e.Meter.Used, 'g', -1, 64)
		meta["meterLimit"] = strconv.FormatFloat(e.Meter.Limit, 'g', -1, 64)
	}
	if e.CardWouldLift != nil {
		meta["cardWouldLift"] = strconv.FormatBool(*e.CardWouldLift)
	}
	details := []proto.Message{&errdetails.ErrorInfo{Reason: e.Code, Domain: errorDomain, Metadata: meta}}
	if len(e.Errors) > 0 {
		br := &errdetails.BadRequest{}
		for _, f := range e.Errors {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: f.Location, Description: f.Message})
		}
		details = append(details, br)
	}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(retryAfter) * time.Second)})
	}
	msg := e.Detail + " (" + e.Code + "; request " + e.RequestID + ")"
	return otlp.NewStatus(grpcCodeOf(e), msg, details...)
}
