// Package otlp reads OpenTelemetry trace exports (OTLP: protobuf or JSON, as OTLP/HTTP and OTLP/gRPC carry them)
// into the spans doppel stages, and writes OTLP's answers (ExportTraceServiceResponse, google.rpc.Status).
package otlp

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/klauspost/compress/gzip"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Content types of OTLP/HTTP bodies (OTLP specification, "OTLP/HTTP").
const (
	ContentTypeProtobuf = "application/x-protobuf"
	ContentTypeJSON     = "application/json"
)

// ErrContentType is a body of a content type OTLP does not define.
var ErrContentType = errors.New("otlp: unsupported content type")

// Encoding tells a request's encoding from its Content-Type: ContentTypeProtobuf or ContentTypeJSON (parameters
// such as charset aside), else ErrContentType.
func Encoding(contentType string) (string, error) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(contentType))
	}
	switch mt {
	case ContentTypeProtobuf, "application/protobuf":
		return ContentTypeProtobuf, nil
	case ContentTypeJSON:
		return ContentTypeJSON, nil
	}
	return "", fmt.Errorf("%w %q: send %s or %s", ErrContentType, contentType, ContentTypeProtobuf, ContentTypeJSON)
}

// DecodeError is a body that is not an ExportTraceServiceRequest in its encoding.
type DecodeError struct {
	Encoding string
	Err      error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("the body is not an ExportTraceServiceRequest in %s: %v", e.Encoding, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Decode reads an ExportTraceServiceRequest in encoding (Encoding's answer). JSON follows OTLP's mapping: trace
// and span ids are hex (base64, the plain protobuf JSON mapping, is accepted too, told apart by length), enums
// are numbers (names are accepted too), and unknown fields are ignored.
func Decode(body []byte, encoding string) (*coltracepb.ExportTraceServiceRequest, error) {
	req := &coltracepb.ExportTraceServiceRequest{}
	switch encoding {
	case ContentTypeProtobuf:
		if err := proto.Unmarshal(body, req); err != nil {
			return nil, &DecodeError{Encoding: "protobuf", Err: err}
		}
	case ContentTypeJSON:
		std, err := hexIDsToBase64(body)
		if err != nil {
			return nil, &DecodeError{Encoding: "JSON", Err: err}
		}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(std, req); err != nil {
			return nil, &DecodeError{Encoding: "JSON", Err: err}
		}
	default:
		return nil, fmt.Errorf("%w %q", ErrContentType, encoding)
	}
	return req, nil
}

// idFields are the JSON names of OTLP's trace and span id fields (lowerCamelCase as OTLP writes them, and the
// proto names protojson also reads), with the byte length of the id each holds.
var idFields = map[string]int{
	"traceId": 16, "spanId": 8, "parentSpanId": 8,
	"trace_id": 16, "span_id": 8, "parent_span_id": 8,
}

// hexIDsToBase64 rewrites OTLP JSON's hex trace and span ids as base64, the protobuf JSON mapping's spelling of
// bytes, token by token. An id whose length is its hex length (32 or 16 digits) and holds only hex digits is hex;
// any other value is left for protojson to read as base64.
func hexIDsToBase64(body []byte) ([]byte, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(false))
	var out bytes.Buffer
	out.Grow(len(body))
	enc := jsontext.NewEncoder(&out, jsontext.AllowDuplicateNames(true))
	var idBytes []byte
	for {
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		// A string is an object's member name when the object holds an odd count of tokens with it.
		if kind, length := dec.StackIndex(dec.StackDepth()); tok.Kind() == '"' && kind == '{' && length%2 == 1 {
			if n, isID := idFields[tok.String()]; isID {
				if err := enc.WriteToken(tok); err != nil {
					return nil, err
				}
				val, err := dec.ReadToken()
				if err != nil {
					return nil, err
				}
				if s := val.String(); val.Kind() == '"' && len(s) == 2*n {
					if idBytes, err = hex.AppendDecode(idBytes[:0], []byte(s)); err == nil {
						val = jsontext.String(base64.StdEncoding.EncodeToString(idBytes))
					}
				}
				tok = val
			}
		}
		if err := enc.WriteToken(tok); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

// Errors of Decompress.
var (
	ErrContentEncoding = errors.New("otlp: unsupported content encoding")
	ErrTooLarge        = errors.New("otlp: body over the size limit")
)

// Decompress answers a request body as it was before its Content-Encoding (gzip, or none: "" or identity), at
// most limit bytes after decompression (ErrTooLarge beyond, as OTLP asks of servers).
func Decompress(body []byte, contentEncoding string, limit int64) ([]byte, error) {
	switch strings.ToLower(strings.TrimSpace(contentEncoding)) {
	case "", "identity":
		if int64(len(body)) > limit {
			return nil, ErrTooLarge
		}
		return body, nil
	case "gzip", "x-gzip":
	default:
		return nil, fmt.Errorf("%w %q: send gzip or none", ErrContentEncoding, contentEncoding)
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, &DecodeError{Encoding: "gzip", Err: err}
	}
	defer zr.Close()
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, &DecodeError{Encoding: "gzip", Err: err}
	}
	if int64(len(out)) > limit {
		return nil, ErrTooLarge
	}
	return out, nil
}
