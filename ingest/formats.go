package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// Message formats a collect body's trace may be in: its "format" field names one; a trace that names none is
// detected (DetectFormat). Every format maps to the one trace model (OpenAI chat messages, spec §2.7).
const (
	// FormatChat is spec §2.7's trace: OpenAI Chat Completions messages.
	FormatChat = "openai-chat"
	// FormatResponses is the OpenAI Responses API's items: input and output with message, function_call and
	// function_call_output items, and the request's instructions and tools.
	FormatResponses = "openai-responses"
	// FormatMessages is Anthropic's Messages API: system, messages with text, tool_use and tool_result content
	// blocks, and the request's tools.
	FormatMessages = "anthropic-messages"
)

// Formats lists the format names a trace may give, in the order the documentation names them.
var Formats = []string{FormatChat, FormatResponses, FormatMessages}

// ToolDef is a tool definition a trace or a span carried, in doppel's native shape (what infer.ParseToolDefs
// reads): name, description, and the input's JSON Schema as it was given.
type ToolDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// AddToolDefs appends to dst the definitions of defs whose name dst does not hold yet: the first definition of a
// name wins, in the order met.
func AddToolDefs(dst, defs []ToolDef) []ToolDef {
	for _, d := range defs {
		if !hasTool(dst, d.Name) {
			dst = append(dst, d)
		}
	}
	return dst
}

func hasTool(defs []ToolDef, name string) bool {
	for i := range defs {
		if defs[i].Name == name {
			return true
		}
	}
	return false
}

// ParseTools reads a "tools" value in any of the shapes agents pass to their model: OpenAI Chat Completions
// ({type: function, function: {name, description, parameters}}), the Responses API ({type: function, name,
// description, parameters}), Anthropic ({name, description, input_schema}) or doppel's native shape ({name,
// description, inputSchema}). Entries that define no function with a schema (an OpenAI built-in tool such as
// web_search, an Anthropic server tool) are skipped: they are not the agent's own tools. path names the value in
// errors.
func ParseTools(raw json.RawMessage, path string) ([]ToolDef, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fieldErr(path, "must be an array of tool definitions")
	}
	var out []ToolDef
	for i, item := range items {
		var d struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
			InputSnake  json.RawMessage `json:"input_schema"`
			Parameters  json.RawMessage `json:"parameters"`
			Function    *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(item, &d); err != nil {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "must be a tool definition object")
		}
		def := ToolDef{Name: d.Name, Description: d.Description}
		switch {
		case d.Function != nil:
			def = ToolDef{Name: d.Function.Name, Description: d.Function.Description, InputSchema: d.Function.Parameters}
		case len(d.InputSchema) > 0:
			def.InputSchema = d.InputSchema
		case len(d.InputSnake) > 0:
			def.InputSchema = d.InputSnake
		default:
			def.InputSchema = d.Parameters
		}
		if d.Type != "" && d.Type != "function" && d.Type != "custom" && d.Function == nil {
			continue // a provider's built-in tool
		}
		def.InputSchema = compactJSON(def.InputSchema)
		if def.Name == "" || len(def.InputSchema) == 0 || def.InputSchema[0] != '{' {
			continue // nothing a build can use: no name, or no object schema
		}
		out = AddToolDefs(out, []ToolDef{def})
	}
	return out, nil
}

// compactJSON answers raw without insignificant white space, nil when it is empty, null or not JSON.
func compactJSON(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return nil
	}
	return b.Bytes()
}

// DetectFormat tells the format of a trace given as a JSON object: its "format" field when it gives one, else
// openai-responses when it has Responses fields (input, output or instructions) and no messages, else
// anthropic-messages when it has a top-level system or a message whose content is an array of blocks and no
// OpenAI tool fields (tool_calls, tool_call_id, a tool role), else openai-chat.
func DetectFormat(raw []byte) (string, error) {
	var t struct {
		Format       *string           `json:"format"`
		Messages     []json.RawMessage `json:"messages"`
		Input        json.RawMessage   `json:"input"`
		Output       json.RawMessage   `json:"output"`
		Instructions json.RawMessage   `json:"instructions"`
		System       json.RawMessage   `json:"system"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return FormatChat, nil // the chat decoder names what is wrong
	}
	if t.Format != nil {
		switch *t.Format {
		case FormatChat, FormatResponses, FormatMessages:
			return *t.Format, nil
		}
		return "", fieldErr("format", fmt.Sprintf("must be one of %s; got %s", strings.Join(Formats, ", "), quote(*t.Format)))
	}
	if t.Messages == nil && (t.Input != nil || t.Output != nil || t.Instructions != nil) {
		return FormatResponses, nil
	}
	anthropic := t.System != nil
	for _, m := range t.Messages {
		var msg struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCalls  json.RawMessage `json:"tool_calls"`
			ToolCalls2 json.RawMessage `json:"toolCalls"`
			ToolCallID json.RawMessage `json:"tool_call_id"`
			ToolCallI2 json.RawMessage `json:"toolCallId"`
		}
		if json.Unmarshal(m, &msg) != nil {
			return FormatChat, nil
		}
		if msg.Role == trace.RoleTool || msg.ToolCalls != nil || msg.ToolCalls2 != nil || msg.ToolCallID != nil || msg.ToolCallI2 != nil {
			return FormatChat, nil
		}
		if c := bytes.TrimSpace(msg.Content); len(c) > 0 && c[0] == '[' {
			anthropic = true
		}
	}
	if anthropic {
		return FormatMessages, nil
	}
	return FormatChat, nil
}

// DecodeAnyTrace reads one trace in any format (the format field, else DetectFormat), maps it to the trace
// model and validates it as DecodeTrace does. It answers the tool definitions the trace carried ("tools") and
// the format read. Errors are *Error with paths relative to the trace as given (input[3].call_id).
func DecodeAnyTrace(raw []byte) (*trace.Trace, []ToolDef, string, error) {
	format, err := DetectFormat(raw)
	if err != nil {
		return nil, nil, "", err
	}
	var (
		t     *trace.Trace
		tools []ToolDef
	)
	switch format {
	case FormatResponses:
		t, tools, err = decodeResponses(raw)
	case FormatMessages:
		t, tools, err = decodeMessages(raw)
	default:
		if t, err = DecodeTrace(raw); err != nil {
			return nil, nil, format, err
		}
		var extra struct {
			Tools json.RawMessage `json:"tools"`
		}
		if json.Unmarshal(raw, &extra) == nil {
			tools, err = ParseTools(extra.Tools, "tools")
		}
		return t, tools, format, err
	}
	if err != nil {
		return nil, nil, format, err
	}
	if err := ValidateTrace(t); err != nil {
		return nil, nil, format, converted(err, format)
	}
	return t, tools, format, nil
}

// converted explains an error found in a trace mapped from format: its paths name the mapped messages.
func converted(err error, format string) error {
	e, ok := err.(*Error)
	if !ok {
		return err
	}
	out := &Error{Truncated: e.Truncated}
	for _, f := range e.Fields {
		out.Fields = append(out.Fields, FieldError{Path: "trace", Message: fmt.Sprintf("mapped from %s to chat messages, %s: %s", format, f.Path, f.Message)})
	}
	return out
}

// fieldErr is an *Error of one field.
func fieldErr(path, msg string) *Error {
	return &Error{Fields: []FieldError{{Path: path, Message: msg}}}
}

// prefixed answers err with every path prefixed by prefix (traces[3]); "trace" names the trace itself.
func prefixed(err error, prefix string) error {
	e, ok := err.(*Error)
	if !ok {
		return fieldErr(prefix, err.Error())
	}
	out := &Error{Truncated: e.Truncated, OverLimit: e.OverLimit}
	for _, f := range e.Fields {
		p := prefix
		switch {
		case f.Path == "trace" || f.Path == "":
		case strings.HasPrefix(f.Path, "["):
			p += f.Path
		default:
			p += "." + f.Path
		}
		out.Fields = append(out.Fields, FieldError{Path: p, Message: f.Message})
	}
	return out
}

// textOf reads a content value that is a string, or an array of parts whose text it joins: parts typed text,
// input_text or output_text carry a "text" field (OpenAI and Anthropic), and a bare string part counts as text.
// Other parts (images, files, reasoning) carry no text. ok is false when raw is neither.
func textOf(raw json.RawMessage) (s string, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	if raw[0] == '"' {
		return s, json.Unmarshal(raw, &s) == nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		p = bytes.TrimSpace(p)
		if len(p) > 0 && p[0] == '"' {
			var t string
			if json.Unmarshal(p, &t) == nil {
				b.WriteString(t)
			}
			continue
		}
		var part struct {
			Type    string  `json:"type"`
			Text    *string `json:"text"`
			Content *string `json:"content"`
		}
		if json.Unmarshal(p, &part) != nil {
			return "", false
		}
		switch part.Type {
		case "text", "input_text", "output_text", "":
			if part.Text != nil {
				b.WriteString(*part.Text)
			} else if part.Content != nil {
				b.WriteString(*part.Content) // OpenTelemetry GenAI's text part
			}
		}
	}
	return b.String(), true
}

// argsString turns a tool call's arguments as a format gives them into the chat format's arguments string: a JSON
// string is taken as it is (it holds the JSON), an object or other JSON value is written compactly, and nothing
// is "{}".
func argsString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if strings.TrimSpace(s) == "" {
				return "{}"
			}
			return s
		}
	}
	if c := compactJSON(raw); c != nil {
		return string(c)
	}
	return string(raw)
}

// resultString turns a tool result as a format gives it into a tool message's content: a string as it is, text
// parts joined, any other JSON value written compactly.
func resultString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if s, ok := textOf(raw); ok && (raw[0] == '"' || isTextParts(raw)) {
		return s
	}
	if c := compactJSON(raw); c != nil {
		return string(c)
	}
	return string(raw)
}

// isTextParts reports whether raw is an array of content parts that are all text.
func isTextParts(raw json.RawMessage) bool {
	var parts []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &parts) != nil || len(parts) == 0 {
		return false
	}
	for _, p := range parts {
		switch p.Type {
		case "text", "input_text", "output_text":
		default:
			return false
		}
	}
	return true
}

// str answers a pointer to s, for message contents.
func str(s string) *string { return &s }
