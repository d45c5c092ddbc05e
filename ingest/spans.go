package ingest

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
)

// Span is an OpenTelemetry span as doppel stages it: its ids and times, and the attributes and events that can
// carry a conversation (OpenTelemetry GenAI, OpenInference), each attribute's value as JSON: a string attribute
// is a JSON string, a structured one (an array or a key-value list) the JSON array or object it holds.
type Span struct {
	TraceID string `json:"trace_id"` // 32 lower-case hex digits
	SpanID  string `json:"span_id"`  // 16 lower-case hex digits
	Parent  string `json:"parent_id,omitempty"`
	Name    string `json:"name,omitempty"`
	// Start and End are Unix nanoseconds.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Error is the status message of a span whose status is ERROR ("error" when it gives none).
	Error  string                     `json:"error,omitempty"`
	Attrs  map[string]json.RawMessage `json:"attrs,omitempty"`
	Events []SpanEvent                `json:"events,omitempty"`
}

// SpanEvent is an event of a span (the older GenAI conventions put prompts and completions in events).
type SpanEvent struct {
	Name  string                     `json:"name"`
	Time  int64                      `json:"time"`
	Attrs map[string]json.RawMessage `json:"attrs,omitempty"`
}

// Attribute names doppel reads.
const (
	attrOperation      = "gen_ai.operation.name"
	attrConversation   = "gen_ai.conversation.id"
	attrInputMessages  = "gen_ai.input.messages"
	attrOutputMessages = "gen_ai.output.messages"
	attrSystem         = "gen_ai.system_instructions"
	attrToolDefs       = "gen_ai.tool.definitions"
	attrToolName       = "gen_ai.tool.name"
	attrToolCallID     = "gen_ai.tool.call.id"
	attrToolArgs       = "gen_ai.tool.call.arguments"
	attrToolResult     = "gen_ai.tool.call.result"
	attrRequestModel   = "gen_ai.request.model"
	attrResponseModel  = "gen_ai.response.model"
	attrPromptPrefix   = "gen_ai.prompt."
	attrComplPrefix    = "gen_ai.completion."
	attrFunctionsFlat  = "llm.request.functions."
	attrPromptEvent    = "gen_ai.prompt"
	attrComplEvent     = "gen_ai.completion"
	eventPrompt        = "gen_ai.content.prompt"
	eventCompletion    = "gen_ai.content.completion"

	attrOIKind            = "openinference.span.kind"
	attrOISession         = "session.id"
	attrOIInput           = "llm.input_messages."
	attrOIOutput          = "llm.output_messages."
	attrOITools           = "llm.tools."
	attrOIModel           = "llm.model_name"
	attrOIToolName        = "tool.name"
	attrOIToolID          = "tool.id"
	attrOIToolCallID      = "tool_call.id"
	attrOIInputValue      = "input.value"
	attrOIOutputValue     = "output.value"
	attrOIToolSchema      = "tool.parameters"
	attrOIToolDesc        = "tool.description"
	oiKindLLM, oiKindTool = "LLM", "TOOL"
)

// keptPrefixes are the attribute namespaces a staged span keeps; everything else a span carries is dropped.
var keptPrefixes = []string{"gen_ai.", "llm.", "openinference.", "tool.", "tool_call.", "input.", "output.", "session."}

// KeepAttr reports whether a staged span keeps attribute key: the GenAI and OpenInference namespaces, and
// taskAttr (the attribute naming a trace's task, see TraceID).
func KeepAttr(key, taskAttr string) bool {
	if key == taskAttr && key != "" {
		return true
	}
	for _, p := range keptPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// KeepEvent reports whether a staged span keeps an event: the older GenAI conventions' prompt and completion.
func KeepEvent(name string) bool { return name == eventPrompt || name == eventCompletion }

// Span kinds, for assembly.
const (
	kindOther = iota
	kindChat  // a model call: messages in and out
	kindTool  // a tool's execution: a call and its result
)

// kind tells what a span records.
func (s *Span) kind() int {
	switch s.Str(attrOIKind) {
	case oiKindLLM:
		return kindChat
	case oiKindTool:
		return kindTool
	}
	switch s.Str(attrOperation) {
	case "chat", "text_completion", "generate_content":
		return kindChat
	case "execute_tool":
		return kindTool
	case "":
	default:
		return kindOther
	}
	if s.Attrs[attrInputMessages] != nil || s.Attrs[attrOutputMessages] != nil || s.hasPrefix(attrPromptPrefix) ||
		s.hasPrefix(attrComplPrefix) || s.hasPrefix(attrOIInput) || s.hasPrefix(attrOIOutput) {
		return kindChat
	}
	for _, e := range s.Events {
		if KeepEvent(e.Name) {
			return kindChat
		}
	}
	if s.Attrs[attrToolName] != nil {
		return kindTool
	}
	return kindOther
}

// Relevant reports whether a span is worth staging: it records a model call or a tool's execution, or it names
// a conversation or a task (taskAttr) its siblings may not.
func (s *Span) Relevant(taskAttr string) bool {
	return s.kind() != kindOther || s.Conversation() != "" || (taskAttr != "" && s.Str(taskAttr) != "")
}

// Conversation is the conversation a span names: gen_ai.conversation.id, else OpenInference's session.id.
func (s *Span) Conversation() string {
	if c := s.Str(attrConversation); c != "" {
		return c
	}
	return s.Str(attrOISession)
}

// Str answers attribute key as text: a string attribute's value, a number or boolean as JSON spells it, ""
// when absent or structured.
func (s *Span) Str(key string) string { return attrStr(s.Attrs[key]) }

func attrStr(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var v string
		if json.Unmarshal(raw, &v) == nil {
			return v
		}
		return ""
	case '{', '[', 'n':
		return ""
	}
	return string(raw)
}

func (s *Span) hasPrefix(p string) bool {
	for k := range s.Attrs {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// jsonAttr answers a value that may be JSON given as a JSON string (how the conventions record structured
// values where structured attributes are not supported): the JSON the string holds when it holds an array or an
// object, else raw itself.
func jsonAttr(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return raw
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return raw
	}
	t := strings.TrimSpace(s)
	if t == "null" || t != "" && (t[0] == '[' || t[0] == '{') && json.Valid([]byte(t)) {
		return json.RawMessage(t)
	}
	return raw
}

// flat gathers the attributes under prefix followed by an index ("llm.input_messages.3.message.role") into one
// map per index, keyed by the rest of the name ("message.role"), in index order.
func flat(attrs map[string]json.RawMessage, prefix string) []map[string]json.RawMessage {
	byIdx := map[int]map[string]json.RawMessage{}
	for k, v := range attrs {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		num, tail, ok := strings.Cut(rest, ".")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || n < 0 {
			continue
		}
		m := byIdx[n]
		if m == nil {
			m = map[string]json.RawMessage{}
			byIdx[n] = m
		}
		m[tail] = v
	}
	idx := make([]int, 0, len(byIdx))
	for n := range byIdx {
		idx = append(idx, n)
	}
	sort.Ints(idx)
	out := make([]map[string]json.RawMessage, len(idx))
	for i, n := range idx {
		out[i] = byIdx[n]
	}
	return out
}

// SpanMeta is what grouping needs of a staged span.
type SpanMeta struct {
	TraceID, SpanID, Parent, Conversation string
}

// Conversations assigns each span the conversation it belongs to, as a key: "c:" + the conversation id for a
// span that names one (gen_ai.conversation.id, session.id); a span that names none joins the conversation the
// spans of its OpenTelemetry trace name when they name exactly one, else that of its nearest ancestor naming one,
// else its trace's own ("t:" + the trace id). A doppel trace is one conversation.
func Conversations(spans []SpanMeta) []string {
	convs := map[string]map[string]bool{} // trace id → conversations named in it
	byID := map[string]int{}
	for i, s := range spans {
		byID[s.TraceID+"/"+s.SpanID] = i
		if s.Conversation != "" {
			if convs[s.TraceID] == nil {
				convs[s.TraceID] = map[string]bool{}
			}
			convs[s.TraceID][s.Conversation] = true
		}
	}
	keys := make([]string, len(spans))
	for i, s := range spans {
		switch named := convs[s.TraceID]; {
		case s.Conversation != "":
			keys[i] = "c:" + s.Conversation
		case len(named) == 1:
			for c := range named {
				keys[i] = "c:" + c
			}
		default:
			keys[i] = "t:" + s.TraceID
			seen := 0
			for p := s.Parent; p != "" && seen < len(spans); seen++ {
				j, ok := byID[s.TraceID+"/"+p]
				if !ok {
					break
				}
				if spans[j].Conversation != "" {
					keys[i] = "c:" + spans[j].Conversation
					break
				}
				p = spans[j].Parent
			}
		}
	}
	return keys
}

// TraceID is the id of the doppel trace a conversation key (Conversations) makes: the conversation id, or the
// OpenTelemetry trace id in hex. When a span of it names a task in taskAttr and the id names none, the task leads
// it as a path segment, so the self-check holds the trials of a task out together: "task-12/<id>" (a value of
// digits is prefixed with "task-"; a value "task-12" is used as it is).
func TraceID(key string, spans []Span, taskAttr string) string {
	id := key[2:]
	if taskAttr == "" || hasTaskSegment(id) {
		return id
	}
	for i := range spans {
		v := strings.TrimSpace(spans[i].Str(taskAttr))
		if v == "" {
			continue
		}
		if !strings.HasPrefix(v, "task-") {
			v = "task-" + v
		}
		return v + "/" + id
	}
	return id
}

// hasTaskSegment reports whether an id holds a path segment task-N (N digits), as the self-check reads it.
func hasTaskSegment(id string) bool {
	for _, seg := range strings.Split(id, "/") {
		n, ok := strings.CutPrefix(seg, "task-")
		if ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}
