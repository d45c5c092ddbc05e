package api

import (
	"context"
	"log/slog"
	"reflect"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/envinputs"
	"github.com/doppel-dev/doppel/ingest"
)

// normalizeCollect maps a collect body's traces given in another format (the OpenAI Responses API's items,
// Anthropic Messages) to the chat format, and answers the tool definitions its traces carried. A body of chat
// traces without tools comes back as it is.
func normalizeCollect(body []byte) ([]byte, []ingest.ToolDef, error) {
	n, err := ingest.NormalizeBody(body)
	if err != nil {
		return nil, nil, decodeError(err)
	}
	return n.Body, n.Tools, nil
}

// addTools joins tool definitions traces carried to an environment's build inputs (envinputs.AddTools); it is
// best effort, after the traces are stored: a failure is logged.
func addTools(ctx context.Context, logger *slog.Logger, db bun.IDB, blobs envinputs.Blobs, envID string, defs []ingest.ToolDef) {
	if len(defs) == 0 || blobs == nil {
		return
	}
	if _, err := envinputs.AddTools(ctx, db, blobs, envID, defs); err != nil {
		logger.WarnContext(ctx, "collect: add tool definitions to build inputs", slog.String("env", envID), slog.Any("error", err))
	}
}

// The other trace formats as documented (a trace of the collect body is one of chat, Responses, Messages).
type (
	collectTool struct {
		Type        string         `json:"type,omitempty" doc:"function (OpenAI); absent for Anthropic and doppel's native shape. Other types (built-in tools) are skipped."`
		Name        string         `json:"name,omitempty"`
		Description string         `json:"description,omitempty"`
		Parameters  map[string]any `json:"parameters,omitempty" doc:"JSON Schema (OpenAI Responses)."`
		InputSchema map[string]any `json:"input_schema,omitempty" doc:"JSON Schema (Anthropic)."`
		Function    map[string]any `json:"function,omitempty" doc:"{name, description, parameters} (OpenAI Chat Completions)."`
	}
	collectResponsesTrace struct {
		ID           string           `json:"id" minLength:"1" maxLength:"512"`
		Format       string           `json:"format,omitempty" enum:"openai-responses" doc:"Names the format; detected from input/output when absent."`
		Model        string           `json:"model,omitempty" maxLength:"256"`
		Instructions string           `json:"instructions,omitempty" doc:"The system prompt."`
		Input        []map[string]any `json:"input,omitempty" doc:"Responses API input items: message items ({role, content}), function_call ({call_id, name, arguments}), function_call_output ({call_id, output}); others are skipped. A string is one user message."`
		Output       []map[string]any `json:"output,omitempty" doc:"Responses API output items, the same kinds."`
		Tools        []collectTool    `json:"tools,omitempty" doc:"The request's tools: they join the environment's build inputs."`
	}
	collectMessagesTrace struct {
		ID       string           `json:"id" minLength:"1" maxLength:"512"`
		Format   string           `json:"format,omitempty" enum:"anthropic-messages" doc:"Names the format; detected from system or content blocks when absent."`
		Model    string           `json:"model,omitempty" maxLength:"256"`
		System   string           `json:"system,omitempty" doc:"The system prompt: a string or text blocks."`
		Messages []map[string]any `json:"messages" doc:"Messages API messages: content a string or blocks — text, tool_use ({id, name, input}) on assistant turns, tool_result ({tool_use_id, content}) on user turns."`
		Response map[string]any   `json:"response,omitempty" doc:"The Messages API's answer to the last request ({role: assistant, content}), appended."`
		Tools    []collectTool    `json:"tools,omitempty" doc:"The request's tools: they join the environment's build inputs."`
	}
)

// documentFormats makes the collect body's traces one of the three formats in the OpenAPI document.
func documentFormats(oapi *huma.OpenAPI, body *huma.Schema) {
	reg := oapi.Components.Schemas
	if body.Ref != "" {
		body = reg.SchemaFromRef(body.Ref)
	}
	if body == nil || body.Properties["traces"] == nil {
		return
	}
	traces := body.Properties["traces"]
	chat := traces.Items
	traces.Items = &huma.Schema{OneOf: []*huma.Schema{chat,
		reg.Schema(reflect.TypeOf(collectResponsesTrace{}), true, "collectResponsesTrace"),
		reg.Schema(reflect.TypeOf(collectMessagesTrace{}), true, "collectMessagesTrace"),
	}}
	traces.Description = "The batch. Trace ids are unique within it. Each trace is in one of three formats: OpenAI Chat Completions " +
		"messages (openai-chat, spec §2.7), the OpenAI Responses API's items (openai-responses) or Anthropic Messages " +
		"(anthropic-messages). A trace may name its format in `format`; otherwise it is detected. Every format is stored as chat " +
		"messages; `tools` a trace carries join the environment's build inputs (a tool already defined there keeps its definition)."
}
