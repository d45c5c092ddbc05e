package infer

import (
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// call is one recorded tool call, parsed once.
type call struct {
	trace   int // index of its trace in the prepared set
	idx     int
	tool    string
	raw     string
	args    *jsonvalue.Object // nil when the arguments are not a JSON object
	canon   string            // canonical JSON of args ("" when args is nil)
	answer  bool              // an answer was recorded
	text    string
	val     any // the answer parsed as JSON (valid only when isJSON)
	isJSON  bool
	isErr   bool
	success bool // answered, not an error
}

// ptrace is a prepared trace.
type ptrace struct {
	id    string
	calls []*call
}

// warnings counts messy input, never fatal.
type warnings struct {
	counts   map[string]int
	examples map[string]string
}

func (w *warnings) add(code, example string) {
	if w.counts == nil {
		w.counts = map[string]int{}
		w.examples = map[string]string{}
	}
	w.counts[code]++
	if _, ok := w.examples[code]; !ok {
		if len(example) > 160 {
			example = example[:160] + "…"
		}
		w.examples[code] = example
	}
}

func (w *warnings) list() []Warning {
	out := make([]Warning, 0, len(w.counts))
	for c, n := range w.counts {
		out = append(out, Warning{Code: c, Count: n, Example: w.examples[c]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// prepare parses traces once: calls paired with answers, arguments and answers decoded.
// Traces are taken in id order (duplicates by id keep the first), so the input order does not matter.
func prepare(traces []trace.Trace, w *warnings) []*ptrace {
	idx := make([]int, len(traces))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return traces[idx[a]].ID < traces[idx[b]].ID })
	var out []*ptrace
	seen := map[string]bool{}
	for _, i := range idx {
		t := traces[i]
		if seen[t.ID] {
			w.add("duplicate_trace_id", t.ID)
			continue
		}
		seen[t.ID] = true
		callIDs := map[string]bool{}
		for j, m := range t.Messages {
			for _, tc := range m.ToolCalls {
				callIDs[tc.ID] = true
			}
			if m.Role == trace.RoleTool && m.ToolCallID != "" && !callIDs[m.ToolCallID] {
				w.add("answer_to_unknown_call", fmt.Sprintf("%s messages[%d].tool_call_id=%q", t.ID, j, m.ToolCallID))
			}
			switch m.Role {
			case trace.RoleSystem, trace.RoleUser, trace.RoleAssistant, trace.RoleTool:
			default:
				w.add("unknown_role", fmt.Sprintf("%s messages[%d].role=%q", t.ID, j, m.Role))
			}
			if m.Role == trace.RoleTool && m.ToolCallID == "" {
				w.add("tool_message_without_call_id", fmt.Sprintf("%s messages[%d]", t.ID, j))
			}
		}
		pt := &ptrace{id: t.ID}
		for _, c := range trace.Calls(t) {
			pc := &call{trace: len(out), idx: c.Index, tool: c.Tool, raw: c.RawArgs, answer: c.Answered, text: c.Result}
			if c.Tool == "" {
				w.add("call_without_tool_name", fmt.Sprintf("%s call %d", t.ID, c.Index))
				continue
			}
			if v, err := jsonvalue.ParseString(c.RawArgs); err == nil {
				if o, ok := v.(*jsonvalue.Object); ok {
					pc.args = o
				}
			} else if strings.TrimSpace(c.RawArgs) == "" {
				pc.args = jsonvalue.NewObject(0)
			}
			if pc.args == nil {
				w.add("arguments_not_json_object", fmt.Sprintf("%s %s(%s)", t.ID, c.Tool, c.RawArgs))
			} else {
				pc.canon = string(jsonvalue.Canonical(pc.args))
			}
			if !c.Answered {
				w.add("call_without_result", fmt.Sprintf("%s %s call %d", t.ID, c.Tool, c.Index))
			} else {
				pc.isErr = twin.IsErrorText(c.Result)
				if jsonvalue.LooksJSON(c.Result) {
					if v, err := jsonvalue.ParseString(c.Result); err == nil {
						pc.val, pc.isJSON = v, true
						if o, ok := v.(*jsonvalue.Object); ok && o.Len() == 1 && (o.Keys[0] == "error" || o.Keys[0] == "Error") {
							pc.isErr = true
						}
					} else if c.Result[0] == '{' || c.Result[0] == '[' {
						w.add("answer_not_json", fmt.Sprintf("%s %s: %s", t.ID, c.Tool, c.Result))
					}
				}
				pc.success = !pc.isErr
			}
			pt.calls = append(pt.calls, pc)
		}
		out = append(out, pt)
	}
	return out
}
