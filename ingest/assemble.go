package ingest

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/doppel-dev/doppel/trace"
)

// Assembled is one conversation's spans made into a doppel trace.
type Assembled struct {
	Trace trace.Trace
	// Tools are the tool definitions the spans carried, first definition of a name winning, in span order.
	Tools []ToolDef
}

// timed is a message with the time (Unix ns) the span that first recorded it started (its input) or ended (its
// output): where a tool execution no model-call span mentions goes.
type timed struct {
	m trace.Message
	t int64
}

// toolExec is a tool execution span: the call and its result.
type toolExec struct {
	id, name, args, result string
	start                  int64
	span                   string
}

// Assemble makes the doppel trace id of one conversation's spans (as Conversations groups them), in whatever
// order they came:
//
//   - Model-call spans, in start order, give the messages. Each one's input (system instructions first) is merged
//     into the conversation so far: an input that repeats the conversation (an agent sending the whole history)
//     extends it where they overlap, an input that only holds what is new (a stateful API) is appended; its
//     output (the first choice) follows.
//   - Tool execution spans answer the calls the messages made, by tool call id (or, with no id, the first call
//     of the same tool no execution answered yet); the answer goes after the calling message and the answers
//     already there. An execution no message mentions (content not captured) becomes an assistant call and its
//     answer, placed after the messages recorded before it started.
//   - Calls without an id get one (call_N); a tool message with no id answers the first unanswered call before
//     it; one that answers no call before it is dropped (the history it answered was cut).
//
// The trace is then checked as a collect trace is (ValidateTrace). The spans' tool definitions come with it.
func Assemble(id string, spans []Span) (*Assembled, error) {
	ordered := make([]*Span, 0, len(spans))
	seen := make(map[string]bool, len(spans))
	for i := range spans {
		if k := spans[i].TraceID + "/" + spans[i].SpanID; !seen[k] { // a span sent twice counts once
			seen[k] = true
			ordered = append(ordered, &spans[i])
		}
	}
	slices.SortStableFunc(ordered, func(a, b *Span) int {
		return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.End, b.End), cmp.Compare(a.TraceID, b.TraceID), cmp.Compare(a.SpanID, b.SpanID))
	})
	a := &Assembled{Trace: trace.Trace{ID: id}}
	var conv []timed
	var execs []toolExec
	for _, s := range ordered {
		switch s.kind() {
		case kindChat:
			in, out, err := chatSpanMessages(s)
			if err != nil {
				return nil, spanErr(s, err)
			}
			conv = merge(conv, in, s.Start)
			for _, m := range out {
				conv = append(conv, timed{m, s.End})
			}
			if m := cmp.Or(s.Str(attrResponseModel), s.Str(attrRequestModel), s.Str(attrOIModel)); m != "" {
				a.Trace.Model = m
			}
			a.Tools = AddToolDefs(a.Tools, spanToolDefs(s))
		case kindTool:
			execs = append(execs, execOf(s))
		}
	}
	conv = fillIDs(conv)
	conv = applyExecs(conv, execs)
	conv = dropOrphanAnswers(conv)
	if len(conv) == 0 {
		return nil, fieldErr("trace", "its spans record no messages and no tool executions")
	}
	a.Trace.Messages = make([]trace.Message, len(conv))
	for i := range conv {
		a.Trace.Messages[i] = conv[i].m
	}
	if err := ValidateTrace(&a.Trace); err != nil {
		return nil, err
	}
	return a, nil
}

func spanErr(s *Span, err error) error {
	e, ok := err.(*Error)
	if !ok {
		return fmt.Errorf("span %s: %w", s.SpanID, err)
	}
	out := &Error{}
	for _, f := range e.Fields {
		out.Fields = append(out.Fields, FieldError{Path: "span " + s.SpanID + ": " + f.Path, Message: f.Message})
	}
	return out
}

// execOf reads a tool execution span (GenAI execute_tool, OpenInference TOOL).
func execOf(s *Span) toolExec {
	e := toolExec{start: s.Start, span: s.SpanID}
	if s.Str(attrOIKind) == oiKindTool {
		e.name = s.Str(attrOIToolName)
		e.id = cmp.Or(s.Str(attrOIToolCallID), s.Str(attrOIToolID))
		e.args = argsString(s.Attrs[attrOIInputValue])
		e.result = resultString(s.Attrs[attrOIOutputValue])
	} else {
		e.name = s.Str(attrToolName)
		e.id = s.Str(attrToolCallID)
		e.args = argsString(s.Attrs[attrToolArgs])
		e.result = resultString(s.Attrs[attrToolResult])
	}
	if _, has := s.Attrs[attrToolResult]; !has && s.Attrs[attrOIOutputValue] == nil && s.Error != "" {
		e.result = s.Error // a failed execution: what it said is what the agent saw
	}
	return e
}

// merge adds a model call's input messages (recorded at time t) to the conversation: from where the end of the
// conversation and the start of the input overlap most; a repeated leading system message is skipped.
func merge(conv []timed, in []trace.Message, t int64) []timed {
	if len(in) == 0 {
		return conv
	}
	k := overlap(conv, in)
	if k == 0 && len(conv) > 0 && in[0].Role == trace.RoleSystem && sameMessage(&conv[0].m, &in[0]) {
		in = in[1:]
		k = overlap(conv, in)
	}
	for _, m := range in[k:] {
		conv = append(conv, timed{m, t})
	}
	return conv
}

// overlap is the largest k such that the last k messages of conv are the first k of in.
func overlap(conv []timed, in []trace.Message) int {
	for k := min(len(conv), len(in)); k > 0; k-- {
		tail := conv[len(conv)-k:]
		same := true
		for i := range k {
			if !sameMessage(&tail[i].m, &in[i]) {
				same = false
				break
			}
		}
		if same {
			return k
		}
	}
	return 0
}

// sameMessage compares what a message says: role, text, tool calls (arguments as JSON, spelling aside) and the
// call it answers.
func sameMessage(a, b *trace.Message) bool {
	if a.Role != b.Role || a.ToolCallID != b.ToolCallID || len(a.ToolCalls) != len(b.ToolCalls) {
		return false
	}
	if text(a) != text(b) {
		return false // no text and empty text say the same
	}
	for i := range a.ToolCalls {
		x, y := &a.ToolCalls[i], &b.ToolCalls[i]
		if x.ID != y.ID || x.Function.Name != y.Function.Name || !sameJSON(x.Function.Arguments, y.Function.Arguments) {
			return false
		}
	}
	return true
}

func text(m *trace.Message) string {
	if m.Content == nil {
		return ""
	}
	return *m.Content
}

func sameJSON(a, b string) bool {
	if a == b {
		return true
	}
	ca, cb := compactJSON([]byte(a)), compactJSON([]byte(b))
	return ca != nil && string(ca) == string(cb)
}

// fillIDs gives calls without an id one (call_N, N counting the trace's calls), and a tool message without an id
// the id of the first call before it that no message answered yet.
func fillIDs(conv []timed) []timed {
	n := 0
	var open []string // unanswered call ids, in order
	used := map[string]bool{}
	for i := range conv {
		for _, tc := range conv[i].m.ToolCalls {
			used[tc.ID] = true
		}
	}
	for i := range conv {
		m := &conv[i].m
		for k := range m.ToolCalls {
			n++
			if m.ToolCalls[k].ID == "" {
				id := "call_" + strconv.Itoa(n)
				for used[id] {
					id += "_"
				}
				used[id] = true
				m.ToolCalls[k].ID = id
			}
			open = append(open, m.ToolCalls[k].ID)
		}
		if m.Role != trace.RoleTool {
			continue
		}
		if m.ToolCallID == "" && len(open) > 0 {
			m.ToolCallID = open[0]
		}
		if j := slices.Index(open, m.ToolCallID); j >= 0 {
			open = slices.Delete(open, j, j+1)
		}
	}
	return conv
}

// applyExecs answers the conversation's calls with the tool executions, and adds the executions it does not
// mention (see Assemble).
func applyExecs(conv []timed, execs []toolExec) []timed {
	claimed := map[string]bool{}
	for _, e := range execs {
		at, id := -1, e.id
		for i := range conv {
			for _, tc := range conv[i].m.ToolCalls {
				switch {
				case id != "" && tc.ID == id:
				case id == "" && !claimed[tc.ID] && tc.Function.Name == e.name && (e.args == "{}" || sameJSON(e.args, tc.Function.Arguments)):
				default:
					continue
				}
				if at < 0 {
					at, id = i, tc.ID
				}
			}
		}
		if at >= 0 {
			if claimed[id] {
				continue // a repeated execution span of one call
			}
			claimed[id] = true
			if answered(conv, id) {
				continue
			}
			j := at + 1
			for j < len(conv) && conv[j].m.Role == trace.RoleTool {
				j++
			}
			conv = slices.Insert(conv, j, timed{trace.Message{Role: trace.RoleTool, ToolCallID: id, Content: str(e.result)}, conv[at].t})
			continue
		}
		if id == "" {
			id = "call_" + e.span
		}
		claimed[id] = true
		j := 0
		for j < len(conv) && conv[j].t <= e.start {
			j++
		}
		call := trace.Message{Role: trace.RoleAssistant, ToolCalls: []trace.ToolCall{{ID: id, Type: "function",
			Function: trace.Function{Name: e.name, Arguments: e.args}}}}
		conv = slices.Insert(conv, j, timed{call, e.start},
			timed{trace.Message{Role: trace.RoleTool, ToolCallID: id, Content: str(e.result)}, e.start})
	}
	return conv
}

func answered(conv []timed, id string) bool {
	for i := range conv {
		if conv[i].m.Role == trace.RoleTool && conv[i].m.ToolCallID == id {
			return true
		}
	}
	return false
}

// dropOrphanAnswers drops tool messages that answer no call made before them.
func dropOrphanAnswers(conv []timed) []timed {
	calls := map[string]bool{}
	out := conv[:0]
	for _, c := range conv {
		for _, tc := range c.m.ToolCalls {
			calls[tc.ID] = true
		}
		if c.m.Role == trace.RoleTool && !calls[c.m.ToolCallID] {
			continue
		}
		out = append(out, c)
	}
	return out
}
