package ingest

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/trace"
)

// withType gives every tool call type "function", as the formats' mappings do.
func withType(t trace.Trace) trace.Trace {
	out := t
	out.Messages = make([]trace.Message, len(t.Messages))
	for i, m := range t.Messages {
		out.Messages[i] = m
		if len(m.ToolCalls) > 0 {
			out.Messages[i].ToolCalls = append([]trace.ToolCall(nil), m.ToolCalls...)
			for k := range out.Messages[i].ToolCalls {
				out.Messages[i].ToolCalls[k].Type = "function"
			}
		}
	}
	return out
}

// TestFormatsTauRoundTrip writes every tau retail trace as an OpenAI Responses trace and as an Anthropic Messages
// trace (from the formats' documentation, in internal/tauformats) and reads each back, named and detected: the
// trace model is the one collected in the chat format (Messages carries arguments as objects, so only their
// spelling may differ), and the tools come back with names, descriptions and schemas.
func TestFormatsTauRoundTrip(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		format string
		write  func(trace.Trace, []tauformats.Tool) map[string]any
		want   func(trace.Trace) trace.Trace
	}{
		{FormatResponses, tauformats.Responses, withType},
		{FormatMessages, tauformats.Messages, tauformats.CompactArgs},
	} {
		for _, named := range []bool{true, false} {
			calls := 0
			for _, tr := range traces {
				obj := tc.write(tr, tools)
				if named {
					obj["format"] = tc.format
				}
				raw, err := json.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				got, defs, format, err := DecodeAnyTrace(raw)
				if err != nil {
					t.Fatalf("%s (named %v) %s: %v", tc.format, named, tr.ID, err)
				}
				if format != tc.format {
					t.Fatalf("%s: read as %s", tr.ID, format)
				}
				want := tc.want(tr)
				if !reflect.DeepEqual(*got, want) {
					gj, _ := json.Marshal(got)
					wj, _ := json.Marshal(want)
					t.Fatalf("%s %s: read back\n%s\nwant\n%s", tc.format, tr.ID, gj, wj)
				}
				if len(defs) != len(tools) {
					t.Fatalf("%s: %d tools read, want %d", tr.ID, len(defs), len(tools))
				}
				for i, d := range defs {
					if d.Name != tools[i].Name || d.Description != tools[i].Description || string(d.InputSchema) != string(compactJSON(tools[i].Parameters)) {
						t.Fatalf("%s: tool %d = %+v, want %+v", tr.ID, i, d, tools[i])
					}
				}
				calls += len(trace.Calls(*got))
			}
			t.Logf("%s (format named: %v): %d traces, %d calls read back equal", tc.format, named, len(traces), calls)
		}
	}
}

// TestNormalizeBody maps a mixed body's traces to the chat format, keeps chat traces byte for byte, gathers the
// tools, and leaves a chat-only body untouched without decoding it.
func TestNormalizeBody(t *testing.T) {
	resp := `{"id":"r1","format":"openai-responses","instructions":"be brief","input":[{"role":"user","content":"where is 7?"},` +
		`{"type":"function_call","call_id":"c1","name":"get_order","arguments":"{\"id\": 7}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"shipped"}],"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It shipped."}]}],` +
		`"tools":[{"type":"function","name":"get_order","description":"Get an order.","parameters":{"type":"object","properties":{"id":{"type":"integer"}}}},{"type":"web_search"}]}`
	anth := `{"id":"a1","system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"where is 7?"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"…"},{"type":"tool_use","id":"tu1","name":"get_order","input":{"id":7}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":[{"type":"text","text":"shipped"}]}]}],` +
		`"response":{"role":"assistant","content":[{"type":"text","text":"It shipped."}]},"tools":[{"name":"cancel","input_schema":{"type":"object"}}]}`
	chat := tr("c1", sys, user, call, answer, final)
	in := body(resp, anth, chat)
	n, err := NormalizeBody([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if n.Converted != 2 {
		t.Fatalf("converted %d traces, want 2", n.Converted)
	}
	if !strings.Contains(string(n.Body), chat) {
		t.Errorf("the chat trace was not kept as it came:\n%s", n.Body)
	}
	p, err := Decode(n.Body, Options{})
	if err != nil {
		t.Fatalf("normalized body does not decode: %v\n%s", err, n.Body)
	}
	want := []string{
		`[{"role":"system","content":"be brief"},{"role":"user","content":"where is 7?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_order","arguments":"{\"id\": 7}"}}]},{"role":"tool","content":"shipped","tool_call_id":"c1"},{"role":"assistant","content":"It shipped."}]`,
		`[{"role":"system","content":"be brief"},{"role":"user","content":"where is 7?"},{"role":"assistant","content":null,"tool_calls":[{"id":"tu1","type":"function","function":{"name":"get_order","arguments":"{\"id\":7}"}}]},{"role":"tool","content":"shipped","tool_call_id":"tu1"},{"role":"assistant","content":"It shipped."}]`,
	}
	for i, w := range want {
		got, _ := json.Marshal(p.Batch.Traces[i].Messages)
		if string(got) != w {
			t.Errorf("trace %d:\n got %s\nwant %s", i, got, w)
		}
	}
	if len(n.Tools) != 2 || n.Tools[0].Name != "get_order" || n.Tools[0].Description != "Get an order." || n.Tools[1].Name != "cancel" {
		t.Errorf("tools %+v", n.Tools)
	}

	plain := []byte(body(chat))
	n, err = NormalizeBody(plain)
	if err != nil || &n.Body[0] != &plain[0] || n.Converted != 0 || n.Tools != nil {
		t.Errorf("chat-only body: %v, converted %d, tools %v, same bytes %v", err, n.Converted, n.Tools, err == nil && &n.Body[0] == &plain[0])
	}
}

// TestNormalizeBodyErrors names the field as the body gave it.
func TestNormalizeBodyErrors(t *testing.T) {
	cases := []struct{ name, trace, path, msg string }{
		{"unknown format", `{"id":"x","format":"gemini","messages":[]}`, "traces[0].format", "must be one of openai-chat, openai-responses, anthropic-messages"},
		{"call without id", `{"id":"x","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "traces[0].input[0].call_id", "is required"},
		{"output without call id", `{"id":"x","input":[{"role":"user","content":"hi"},{"type":"function_call_output","output":"ok"}]}`, "traces[0].input[1].call_id", "is required"},
		{"bad role", `{"id":"x","input":[{"type":"message","role":"robot","content":"hi"}]}`, "traces[0].input[0].role", "must be one of"},
		{"tool_use without name", `{"id":"x","system":"s","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","input":{}}]}]}`, "traces[0].messages[0].content[0].name", "is required"},
		{"result answering nothing", `{"id":"x","system":"s","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"nope","content":"x"}]}]}`, "traces[0]", "tool_call_id: names no earlier tool call"},
		{"bad tools", `{"id":"x","input":"hi","tools":{"name":"f"}}`, "traces[0].tools", "must be an array"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NormalizeBody([]byte(body(`{"id":"ok","messages":[{"role":"user","content":"hi"}]}`, c.trace)))
			if err == nil {
				t.Fatal("accepted")
			}
			e, ok := err.(*Error)
			if !ok || len(e.Fields) == 0 {
				t.Fatalf("error %T %v", err, err)
			}
			f := e.Fields[0]
			want := strings.Replace(c.path, "traces[0]", "traces[1]", 1)
			if f.Path != want || !strings.Contains(f.Message, c.msg) {
				t.Errorf("got %s: %s; want %s: …%s…", f.Path, f.Message, want, c.msg)
			}
		})
	}
}

func TestDetectFormat(t *testing.T) {
	cases := []struct{ trace, want string }{
		{`{"id":"a","messages":[{"role":"user","content":"hi"}]}`, FormatChat},
		{`{"id":"a","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"tool","tool_call_id":"x","content":"y"}]}`, FormatChat},
		{`{"id":"a","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, FormatMessages},
		{`{"id":"a","system":"s","messages":[{"role":"user","content":"hi"}]}`, FormatMessages},
		{`{"id":"a","input":"hi"}`, FormatResponses},
		{`{"id":"a","output":[]}`, FormatResponses},
		{`{"id":"a","format":"anthropic-messages","input":"ignored"}`, FormatMessages},
		{`not json`, FormatChat},
	}
	for _, c := range cases {
		got, err := DetectFormat([]byte(c.trace))
		if err != nil || got != c.want {
			t.Errorf("DetectFormat(%s) = %q, %v; want %q", c.trace, got, err, c.want)
		}
	}
}
