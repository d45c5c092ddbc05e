package ingest

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// sp makes a span starting at start (ms) and lasting a millisecond; attrs alternate key and value, a value that
// is a string becoming a string attribute and a json.RawMessage a structured one.
func sp(id string, start int64, attrs ...any) Span {
	s := Span{TraceID: "0af7651916cd43dd8448eb211c80319c", SpanID: id, Start: start * 1e6, End: (start + 1) * 1e6, Attrs: map[string]json.RawMessage{}}
	for i := 0; i < len(attrs); i += 2 {
		switch v := attrs[i+1].(type) {
		case string:
			b, _ := json.Marshal(v)
			s.Attrs[attrs[i].(string)] = b
		case json.RawMessage:
			s.Attrs[attrs[i].(string)] = v
		}
	}
	return s
}

// msgs renders an assembled trace's messages compactly: role, then text or calls or the answered call.
func msgs(a *Assembled) string {
	var parts []string
	for _, m := range a.Trace.Messages {
		s := m.Role
		if m.Content != nil {
			s += ":" + *m.Content
		}
		for _, tc := range m.ToolCalls {
			s += "[" + tc.ID + " " + tc.Function.Name + " " + tc.Function.Arguments + "]"
		}
		if m.ToolCallID != "" {
			s += "<" + m.ToolCallID
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " | ")
}

const (
	sysInstr = `[{"type":"text","content":"be brief"}]`
	in1      = `[{"role":"user","parts":[{"type":"text","content":"where is 7?"}]}]`
	out1     = `[{"role":"assistant","parts":[{"type":"tool_call","id":"c1","name":"get_order","arguments":{"id":7}}],"finish_reason":"tool_call"}]`
	in2      = `[{"role":"user","parts":[{"type":"text","content":"where is 7?"}]},{"role":"assistant","parts":[{"type":"tool_call","id":"c1","name":"get_order","arguments":{"id":7}}]},{"role":"tool","parts":[{"type":"tool_call_response","id":"c1","response":"shipped"}]}]`
	out2     = `[{"role":"assistant","parts":[{"type":"text","content":"It shipped."}],"finish_reason":"stop"}]`
	wantConv = `system:be brief | user:where is 7? | assistant[c1 get_order {"id":7}] | tool:shipped<c1 | assistant:It shipped.`
)

func TestAssemble(t *testing.T) {
	chat := func(id string, at int64, in, out string) Span {
		return sp(id, at, attrOperation, "chat", attrSystem, sysInstr, attrInputMessages, in, attrOutputMessages, out, attrRequestModel, "gpt-x")
	}
	tool := func(id string, at int64, call, name, args, result string) Span {
		return sp(id, at, attrOperation, "execute_tool", attrToolName, name, attrToolCallID, call, attrToolArgs, args, attrToolResult, result)
	}
	cases := []struct {
		name  string
		spans []Span
		want  string
	}{
		{"genai full history", []Span{chat("a1", 1, in1, out1), tool("b1", 3, "c1", "get_order", `{"id":7}`, "shipped"), chat("a2", 5, in2, out2)}, wantConv},
		{"genai structured attributes", []Span{
			sp("a1", 1, attrOperation, "chat", attrSystem, json.RawMessage(sysInstr), attrInputMessages, json.RawMessage(in1), attrOutputMessages, json.RawMessage(out1)),
			sp("a2", 5, attrOperation, "chat", attrSystem, json.RawMessage(sysInstr), attrInputMessages, json.RawMessage(in2), attrOutputMessages, json.RawMessage(out2)),
		}, wantConv},
		{"stateful inputs hold only what is new", []Span{
			chat("a1", 1, in1, out1),
			chat("a2", 5, `[{"role":"tool","parts":[{"type":"tool_call_response","id":"c1","result":"shipped"}]}]`, out2),
		}, wantConv},
		{"the tool span answers what no input repeated", []Span{chat("a1", 1, in1, out1), tool("b1", 3, "c1", "get_order", `{"id":7}`, "shipped")},
			`system:be brief | user:where is 7? | assistant[c1 get_order {"id":7}] | tool:shipped<c1`},
		{"content not captured: tool spans only", []Span{
			sp("a1", 1, attrOperation, "chat"), tool("b2", 7, "c2", "refund", `{"id":7}`, "done"), tool("b1", 3, "c1", "get_order", `{"id":7}`, "shipped"),
		}, `assistant[c1 get_order {"id":7}] | tool:shipped<c1 | assistant[c2 refund {"id":7}] | tool:done<c2`},
		{"a repeated span counts once", []Span{chat("a1", 1, in1, out1), tool("b1", 3, "c1", "get_order", `{"id":7}`, "shipped"),
			tool("b1", 3, "c1", "get_order", `{"id":7}`, "shipped"), chat("a2", 5, in2, out2), chat("a2", 5, in2, out2)}, wantConv},
		{"an answer to a call cut from the history is dropped", []Span{
			chat("a2", 5, `[{"role":"tool","parts":[{"type":"tool_call_response","id":"gone","response":"x"}]},{"role":"user","parts":[{"type":"text","content":"and 8?"}]}]`, out2),
		}, `system:be brief | user:and 8? | assistant:It shipped.`},
		{"a failed tool span answers with its error", []Span{chat("a1", 1, in1, out1),
			func() Span {
				s := sp("b1", 3, attrOperation, "execute_tool", attrToolName, "get_order", attrToolCallID, "c1")
				s.Error = "order not found"
				return s
			}()},
			`system:be brief | user:where is 7? | assistant[c1 get_order {"id":7}] | tool:order not found<c1`},
		{"openinference without call ids", []Span{
			sp("a1", 1, attrOIKind, "LLM", "llm.input_messages.0.message.role", "system", "llm.input_messages.0.message.content", "be brief",
				"llm.input_messages.1.message.role", "user", "llm.input_messages.1.message.contents.0.message_content.type", "text",
				"llm.input_messages.1.message.contents.0.message_content.text", "where is 7?",
				"llm.output_messages.0.message.role", "assistant", "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "get_order",
				"llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments", `{"id": 7}`),
			sp("b1", 3, attrOIKind, "TOOL", attrOIToolName, "get_order", attrOIInputValue, `{"id":7}`, attrOIOutputValue, "shipped"),
		}, `system:be brief | user:where is 7? | assistant[call_1 get_order {"id": 7}] | tool:shipped<call_1`},
		{"openllmetry flattened prompt and completion", []Span{
			sp("a1", 1, "gen_ai.system", "openai", "gen_ai.prompt.0.role", "system", "gen_ai.prompt.0.content", "be brief",
				"gen_ai.prompt.1.role", "user", "gen_ai.prompt.1.content", "where is 7?",
				"gen_ai.completion.0.role", "assistant", "gen_ai.completion.0.tool_calls.0.id", "c1",
				"gen_ai.completion.0.tool_calls.0.name", "get_order", "gen_ai.completion.0.tool_calls.0.arguments", `{"id":7}`),
			sp("a2", 5, "gen_ai.prompt.0.role", "system", "gen_ai.prompt.0.content", "be brief", "gen_ai.prompt.1.role", "user",
				"gen_ai.prompt.1.content", "where is 7?", "gen_ai.prompt.2.role", "assistant", "gen_ai.prompt.2.tool_calls.0.id", "c1",
				"gen_ai.prompt.2.tool_calls.0.name", "get_order", "gen_ai.prompt.2.tool_calls.0.arguments", `{"id":7}`,
				"gen_ai.prompt.3.role", "tool", "gen_ai.prompt.3.tool_call_id", "c1", "gen_ai.prompt.3.content", "shipped",
				"gen_ai.completion.0.role", "assistant", "gen_ai.completion.0.content", "It shipped."),
		}, wantConv},
		{"gen_ai.content.prompt events", []Span{
			func() Span {
				s := sp("a1", 1, attrOperation, "chat")
				s.Events = []SpanEvent{
					{Name: eventPrompt, Attrs: map[string]json.RawMessage{attrPromptEvent: json.RawMessage(`"[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"where is 7?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_order\",\"arguments\":\"{\\\"id\\\":7}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"shipped\"}]"`)}},
					{Name: eventCompletion, Attrs: map[string]json.RawMessage{attrComplEvent: json.RawMessage(`"[{\"message\":{\"role\":\"assistant\",\"content\":\"It shipped.\"}}]"`)}},
				}
				return s
			}(),
		}, wantConv},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Any arrival order gives the same trace.
			r := rand.New(rand.NewPCG(1, 2))
			for round := range 5 {
				spans := append([]Span(nil), c.spans...)
				if round > 0 {
					r.Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
				}
				a, err := Assemble("conv-1", spans)
				if err != nil {
					t.Fatal(err)
				}
				if got := msgs(a); got != c.want {
					t.Fatalf("round %d:\n got %s\nwant %s", round, got, c.want)
				}
			}
		})
	}
}

func TestAssembleToolDefs(t *testing.T) {
	defs := `[{"type":"function","name":"get_order","description":"Get an order.","parameters":{"type":"object","properties":{"id":{"type":"integer"}}}}]`
	spans := []Span{
		sp("a1", 1, attrOperation, "chat", attrInputMessages, in1, attrOutputMessages, out1, attrToolDefs, defs),
		sp("a2", 5, attrOIKind, "LLM", "llm.input_messages.0.message.role", "user", "llm.input_messages.0.message.content", "hi",
			"llm.tools.0.tool.json_schema", `{"type":"function","function":{"name":"refund","description":"Refund.","parameters":{"type":"object"}}}`,
			"llm.tools.1.tool.json_schema", `{"type":"function","function":{"name":"get_order","description":"other","parameters":{"type":"object"}}}`),
		sp("a3", 9, attrOperation, "chat", attrInputMessages, in1, "llm.request.functions.0.name", "notify",
			"llm.request.functions.0.parameters", `{"type":"object","properties":{}}`),
	}
	a, err := Assemble("c", spans)
	if err != nil {
		t.Fatal(err)
	}
	var names, descs []string
	for _, d := range a.Tools {
		names, descs = append(names, d.Name), append(descs, d.Description)
	}
	if !reflect.DeepEqual(names, []string{"get_order", "refund", "notify"}) || descs[0] != "Get an order." || descs[1] != "Refund." {
		t.Errorf("tools %v %v", names, descs)
	}
}

func TestAssembleErrors(t *testing.T) {
	for name, spans := range map[string][]Span{
		"nothing recorded":     {sp("a1", 1, attrOperation, "invoke_agent", attrConversation, "c")},
		"messages not JSON":    {sp("a1", 1, attrOperation, "chat", attrInputMessages, `[{"role":`)},
		"a tool name of words": {sp("b1", 1, attrOperation, "execute_tool", attrToolName, "get order", attrToolCallID, "c1")},
	} {
		if _, err := Assemble("c", spans); err == nil {
			t.Errorf("%s: assembled", name)
		}
	}
}

func TestConversations(t *testing.T) {
	const t1, t2 = "11111111111111111111111111111111", "22222222222222222222222222222222"
	spans := []SpanMeta{
		{TraceID: t1, SpanID: "a", Conversation: "conv-A"},         // names its conversation
		{TraceID: t1, SpanID: "b", Parent: "a"},                    // its trace names one: joins it
		{TraceID: t2, SpanID: "c", Conversation: "conv-A"},         // a later turn of the same conversation, another trace
		{TraceID: t2, SpanID: "d", Parent: "c"},                    // joins conv-A
		{TraceID: "33333333333333333333333333333333", SpanID: "e"}, // no conversation anywhere: its trace
		{TraceID: "44444444444444444444444444444444", SpanID: "f", Conversation: "x"},
		{TraceID: "44444444444444444444444444444444", SpanID: "g", Conversation: "y"},
		{TraceID: "44444444444444444444444444444444", SpanID: "h", Parent: "g"}, // two named: its ancestor's
		{TraceID: "44444444444444444444444444444444", SpanID: "i"},              // two named, no ancestor: its trace
	}
	got := Conversations(spans)
	want := []string{"c:conv-A", "c:conv-A", "c:conv-A", "c:conv-A", "t:33333333333333333333333333333333", "c:x", "c:y", "c:y",
		"t:44444444444444444444444444444444"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Conversations:\n got %v\nwant %v", got, want)
	}
}

func TestTraceID(t *testing.T) {
	task := func(v string) []Span { return []Span{sp("a", 1, "doppel.task", v)} }
	cases := []struct {
		key   string
		spans []Span
		attr  string
		want  string
	}{
		{"c:conv-1", task("12"), "doppel.task", "task-12/conv-1"},
		{"c:conv-1", task("task-12"), "doppel.task", "task-12/conv-1"},
		{"t:0af7", task("7"), "doppel.task", "task-7/0af7"},
		{"c:tau/task-3/trial-0", task("12"), "doppel.task", "tau/task-3/trial-0"}, // the id names its task already
		{"c:conv-1", task("12"), "", "conv-1"},
		{"c:conv-1", nil, "doppel.task", "conv-1"},
	}
	for _, c := range cases {
		if got := TraceID(c.key, c.spans, c.attr); got != c.want {
			t.Errorf("TraceID(%s) = %q, want %q", c.key, got, c.want)
		}
	}
}
