package otlp

import (
	"fmt"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Response is an export's success answer: partial_success is set when spans were rejected (or, with none
// rejected, to carry a warning), and left unset otherwise, as OTLP requires.
func Response(rejected int64, message string) *coltracepb.ExportTraceServiceResponse {
	resp := &coltracepb.ExportTraceServiceResponse{}
	if rejected > 0 || message != "" {
		resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{RejectedSpans: rejected, ErrorMessage: message}
	}
	return resp
}

// NewStatus is a google.rpc.Status of code and message with details (each packed in an Any).
func NewStatus(code codes.Code, message string, details ...proto.Message) (*status.Status, error) {
	st := &status.Status{Code: int32(code), Message: message}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			return nil, fmt.Errorf("otlp: pack status detail: %w", err)
		}
		st.Details = append(st.Details, a)
	}
	return st, nil
}

// Encode writes m in encoding (ContentTypeProtobuf or ContentTypeJSON). JSON follows OTLP's mapping where it
// matters to an answer: enums as numbers; int64 fields are strings, as protobuf's JSON mapping writes them.
func Encode(m proto.Message, encoding string) ([]byte, error) {
	if encoding == ContentTypeJSON {
		return protojson.MarshalOptions{UseEnumNumbers: true}.Marshal(m)
	}
	return proto.Marshal(m)
}
