package api

import (
	"net/http"
	"reflect"

	"github.com/danielgtaylor/huma/v2"
)

// MetaErrorBody is the OpenAPI extension naming an operation's error body when it is not the envelope: POST
// /v1/traces answers errors with google.rpc.Status, as OTLP/HTTP requires of it.
const MetaErrorBody = "x-doppel-error-body"

// The OTLP/HTTP bodies as documented (in their JSON encoding); requests are decoded by the otlp package with the
// official OTLP types.
type (
	// OTLPExportTraceServiceRequest is OTLP's ExportTraceServiceRequest.
	OTLPExportTraceServiceRequest struct {
		ResourceSpans []map[string]any `json:"resourceSpans" doc:"OTLP's ExportTraceServiceRequest in its JSON encoding: resources, their scopes, their spans (trace and span ids in hex)."`
	}
	// OTLPExportTraceServiceResponse is OTLP's ExportTraceServiceResponse.
	OTLPExportTraceServiceResponse struct {
		PartialSuccess *OTLPPartialSuccess `json:"partialSuccess,omitempty" doc:"Set only when spans were rejected (or to carry a warning); absent on full success."`
	}
	// OTLPPartialSuccess is OTLP's ExportTracePartialSuccess.
	OTLPPartialSuccess struct {
		RejectedSpans string `json:"rejectedSpans,omitempty" doc:"Spans refused (an int64, written as a decimal string as protobuf's JSON mapping writes int64)." example:"2"`
		ErrorMessage  string `json:"errorMessage,omitempty" doc:"Why, naming the first rejected spans by path (resourceSpans[0].scopeSpans[0].spans[3].spanId: …)."`
	}
	// OTLPStatus is google.rpc.Status, OTLP/HTTP's error body.
	OTLPStatus struct {
		Code    int              `json:"code" doc:"A gRPC code (OTLP does not use it; retry by the HTTP status)." example:"3"`
		Message string           `json:"message" doc:"The envelope's detail, its code and request id." example:"body: the body is not an ExportTraceServiceRequest in protobuf: … (invalid; request req_0123456789abcdef)"`
		Details []map[string]any `json:"details,omitempty" doc:"google.protobuf.Any values: google.rpc.ErrorInfo (reason = the envelope's code, domain doppel.dev, metadata requestId, status, detail and any access/meter fields), google.rpc.BadRequest (the envelope's field errors), google.rpc.RetryInfo (with Retry-After)."`
	}
)

// documentTraces adds POST /v1/traces to the OpenAPI document: it is served by a plain handler (OTLP/HTTP bodies
// are protobuf or JSON, answered in kind), not a huma operation, and is not a verb.
func documentTraces(a huma.API) {
	oapi := a.OpenAPI()
	reg := oapi.Components.Schemas
	status := reg.Schema(reflect.TypeOf(OTLPStatus{}), true, "OTLPStatus")
	binary := &huma.Schema{Type: "string", Format: "binary"}
	errResp := func(desc string, retry bool) *huma.Response {
		r := &huma.Response{Description: desc, Content: map[string]*huma.MediaType{
			"application/json":       {Schema: status},
			"application/x-protobuf": {Schema: binary},
		}}
		if retry {
			r.Headers = map[string]*huma.Param{"Retry-After": {Description: "Seconds to wait before retrying.", Schema: &huma.Schema{Type: "integer"}}}
		}
		return r
	}
	op := &huma.Operation{
		OperationID: "traces.export",
		Method:      http.MethodPost,
		Path:        tracesPath,
		Summary:     "Export traces (OTLP/HTTP)",
		Description: "OpenTelemetry's OTLP/HTTP trace export, as any OTLP exporter sends it: point " +
			"`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` at `{base_url}/v1/traces` with `OTEL_EXPORTER_OTLP_TRACES_HEADERS=Authorization=Bearer mk_live_…`. " +
			"The body is an ExportTraceServiceRequest, protobuf (`application/x-protobuf`) or JSON (`application/json`, ids in hex), " +
			"optionally gzip-compressed (`Content-Encoding: gzip`); the answer comes in the request's encoding.\n\n" +
			"Spans that record model calls and tool executions — OpenTelemetry GenAI (`gen_ai.*`: chat and `execute_tool` spans, " +
			"`gen_ai.input.messages`/`gen_ai.output.messages`, the older `gen_ai.prompt`/`gen_ai.completion` forms) and OpenInference " +
			"(`LLM` and `TOOL` spans) — are staged durably; other spans are dropped. Each resource's `service.name` names the project " +
			"(its environment is made on its first spans) unless the `X-Doppel-Project` header or the `project` query names one for the whole request. " +
			"A conversation (`gen_ai.conversation.id`, else `session.id`, else the OpenTelemetry trace) becomes one trace once none of its spans " +
			"arrived for the settle time (config `otlp.settle`); a span arriving later makes a new version of it. Span ids make every resend idempotent. " +
			"Tool definitions the spans carry (`gen_ai.tool.definitions`, `llm.tools`) join the environment's build inputs.\n\n" +
			"**This is the one route whose errors are not the envelope**: OTLP/HTTP exporters parse a `google.rpc.Status`, so errors answer " +
			"with one, carrying the envelope's fields (its message is the detail, code and request id; its details a `google.rpc.ErrorInfo` " +
			"whose reason is the envelope's code and whose metadata holds the rest, a `google.rpc.BadRequest` of the field errors, and a " +
			"`google.rpc.RetryInfo` when Retry-After is sent). Bad data answers 400 (not 422); 429 and 503 carry Retry-After and are the " +
			"statuses exporters retry. Spans refused one by one (a bad id, no project) do not fail the export: 200 with `partialSuccess`.\n\n" +
			"Limits are collect's: the body (also after gzip) and conversations per request (413), the environment's collected bytes (413), " +
			"requests per second per address (429).",
		Tags:     []string{"collect"},
		Security: WorkspaceKeyAuth(),
		Parameters: []*huma.Param{
			{Name: projectHeader, In: "header", Description: "The project of every span of the request, over the resources' service.name.", Schema: &huma.Schema{Type: "string", MaxLength: intPtr(128)}},
			{Name: projectQuery, In: "query", Description: "The same as the X-Doppel-Project header (give one, or both equal).", Schema: &huma.Schema{Type: "string", MaxLength: intPtr(128)}},
			{Name: "Content-Encoding", In: "header", Description: "gzip, or none.", Schema: &huma.Schema{Type: "string", Enum: []any{"gzip", "identity"}}},
		},
		RequestBody: &huma.RequestBody{Required: true, Description: "An OTLP ExportTraceServiceRequest.", Content: map[string]*huma.MediaType{
			"application/x-protobuf": {Schema: binary},
			"application/json":       {Schema: reg.Schema(reflect.TypeOf(OTLPExportTraceServiceRequest{}), true, "OTLPExportTraceServiceRequest")},
		}},
		Responses: map[string]*huma.Response{
			"200": {Description: "Accepted (in part when partialSuccess is set): the spans are durable.", Content: map[string]*huma.MediaType{
				"application/json":       {Schema: reg.Schema(reflect.TypeOf(OTLPExportTraceServiceResponse{}), true, "OTLPExportTraceServiceResponse")},
				"application/x-protobuf": {Schema: binary},
			}},
			"400":     errResp("The body is not an ExportTraceServiceRequest in its encoding (or its gzip is broken). Not retried.", false),
			"401":     errResp("No or invalid workspace key.", false),
			"403":     errResp("Workspace access pending or denied.", false),
			"413":     errResp("The body (before or after gzip), its conversations, or the environment's collected bytes is over its cap. Not retried.", false),
			"415":     errResp("A Content-Type other than application/x-protobuf or application/json, or a Content-Encoding other than gzip.", false),
			"429":     errResp("Over the per-address rate. Retried after Retry-After.", true),
			"503":     errResp("The database is not answering; nothing was stored. Retried after Retry-After.", true),
			"default": errResp("Any other failure, as a google.rpc.Status.", false),
		},
		Metadata:   map[string]any{MetaVerb: false},
		Extensions: map[string]any{MetaErrorBody: "google.rpc.Status"},
	}
	oapi.AddOperation(op)
}

func intPtr(n int) *int { return &n }
