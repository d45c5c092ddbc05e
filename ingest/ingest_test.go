package ingest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/trace"
)

// body wraps traces (JSON text) into a collect body of project "shop".
func body(traces ...string) string {
	return `{"project":"shop","traces":[` + strings.Join(traces, ",") + `]}`
}

// tr makes a trace with the given messages (JSON text).
func tr(id string, msgs ...string) string {
	return fmt.Sprintf(`{"id":%q,"messages":[%s]}`, id, strings.Join(msgs, ","))
}

const (
	sys    = `{"role":"system","content":"be helpful"}`
	user   = `{"role":"user","content":"where is order 7?"}`
	call   = `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_order","arguments":"{\"id\":7}"}}]}`
	answer = `{"role":"tool","tool_call_id":"c1","content":"{\"status\":\"shipped\"}"}`
	final  = `{"role":"assistant","content":"It shipped."}`
)

func TestDecodeAccepts(t *testing.T) {
	cases := []struct {
		name, body string
		check      func(t *testing.T, p *Parsed)
	}{
		{"full conversation", body(tr("t1", sys, user, call, answer, final)), func(t *testing.T, p *Parsed) {
			tr := p.Batch.Traces[0]
			if len(tr.Messages) != 5 || tr.Messages[2].Content != nil || tr.Messages[2].ToolCalls[0].Function.Arguments != `{"id":7}` ||
				tr.Messages[3].ToolCallID != "c1" || *tr.Messages[4].Content != "It shipped." {
				t.Errorf("decoded %+v", tr)
			}
			if !reflect.DeepEqual(p.Tools, []string{"get_order"}) || p.Calls != 1 || p.Messages != 5 || p.Slug != "shop" {
				t.Errorf("tools %v calls %d messages %d slug %q", p.Tools, p.Calls, p.Messages, p.Slug)
			}
		}},
		{"unknown fields ignored at every level", `{"x":{"deep":[1,2,{"a":null}]},"project":"shop","traces":[{"meta":true,"id":"t","messages":[{"refusal":null,"role":"user","content":"hi","annotations":[]}]}]}`, func(t *testing.T, p *Parsed) {
			if p.Batch.Traces[0].Messages[0].Role != "user" {
				t.Errorf("decoded %+v", p.Batch)
			}
		}},
		{"camelCase aliases", body(tr("t", `{"role":"assistant","toolCalls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}`, `{"role":"tool","toolCallId":"a","content":"ok"}`)), func(t *testing.T, p *Parsed) {
			m := p.Batch.Traces[0].Messages
			if len(m[0].ToolCalls) != 1 || m[1].ToolCallID != "a" {
				t.Errorf("decoded %+v", m)
			}
		}},
		{"both spellings agreeing", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"1"}}],"toolCalls":[{"id":"a","function":{"name":"f","arguments":"1"}}]}`, `{"role":"tool","tool_call_id":"a","toolCallId":"a","content":"ok"}`)), nil},
		{"null optional fields", body(`{"id":"t","model":null,"messages":[{"role":"user","content":"x","name":null,"tool_calls":null,"tool_call_id":null}]}`), nil},
		{"assistant content absent with tool calls", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"[]"}}]}`)), nil},
		{"call id reused across turns", body(tr("t", call, answer, call, answer)), nil},
		{"escapes and unicode", body(tr("t\u00e9", `{"role":"user","content":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\ud800x é 😀"}`)), func(t *testing.T, p *Parsed) {
			want := "a\"b\\c/d\b\f\n\r\té😀\uFFFDx é 😀"
			if got := *p.Batch.Traces[0].Messages[0].Content; got != want {
				t.Errorf("content %q, want %q", got, want)
			}
		}},
		{"white space everywhere", " \n{ \"project\" : \"shop\" ,\t\"traces\" : [ { \"id\" : \"t\" , \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"\" } ] } ] } \r\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Decode([]byte(c.body), Options{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var want trace.Batch
			if err := json.Unmarshal([]byte(c.body), &want); err != nil {
				t.Fatal(err)
			}
			if c.name != "camelCase aliases" && !reflect.DeepEqual(p.Batch, want) {
				t.Errorf("Decode = %+v, encoding/json = %+v", p.Batch, want)
			}
			if c.check != nil {
				c.check(t, p)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	long := strings.Repeat("x", 600)
	cases := []struct {
		name, body string
		want       []FieldError // Message holds a substring of the message
	}{
		{"empty body", ``, []FieldError{{"body", "unexpected end of body"}}},
		{"not an object", `[1,2]`, []FieldError{{"body", "must be an object, got array"}}},
		{"trailing data", body(tr("t", user)) + `{}`, []FieldError{{"body", "unexpected data after the body's object"}}},
		{"missing everything", `{}`, []FieldError{{"project", "is required"}, {"traces", "is required"}}},
		{"empty traces", `{"project":"shop","traces":[]}`, []FieldError{{"traces", "at least one trace"}}},
		{"project wrong type", `{"project":7,"traces":[` + tr("t", user) + `]}`, []FieldError{{"project", "must be a string, got number"}}},
		{"project without letters", `{"project":"---","traces":[` + tr("t", user) + `]}`, []FieldError{{"project", "at least one ASCII letter or digit"}}},
		{"project too long", `{"project":"` + strings.Repeat("p", 129) + `","traces":[` + tr("t", user) + `]}`, []FieldError{{"project", "limit of 128"}}},
		{"project control char", `{"project":"a\nb","traces":[` + tr("t", user) + `]}`, []FieldError{{"project", "control characters"}}},
		{"project twice", `{"project":"a","project":"b","traces":[` + tr("t", user) + `]}`, []FieldError{{"project", "given twice"}}},
		{"traces not array", `{"project":"shop","traces":{}}`, []FieldError{{"traces", "must be an array, got object"}}},
		{"traces null", `{"project":"shop","traces":null}`, []FieldError{{"traces", "must be an array, got null"}}},
		{"trace not object", body(`"t"`), []FieldError{{"traces[0]", "must be an object, got string"}}},
		{"trace id missing", body(`{"messages":[` + user + `]}`), []FieldError{{"traces[0].id", "is required"}}},
		{"trace id number", body(`{"id":1,"messages":[` + user + `]}`), []FieldError{{"traces[0].id", "must be a string, got number"}}},
		{"trace id too long", body(tr(long, user)), []FieldError{{"traces[0].id", "limit of 512"}}},
		{"trace id duplicate", body(tr("a", user), tr("b", user), tr("a", user)), []FieldError{{"traces[2].id", "duplicates traces[0].id"}}},
		{"model wrong type", body(`{"id":"t","model":[],"messages":[` + user + `]}`), []FieldError{{"traces[0].model", "must be a string, got array"}}},
		{"messages missing", body(`{"id":"t"}`), []FieldError{{"traces[0].messages", "is required"}}},
		{"messages empty", body(`{"id":"t","messages":[]}`), []FieldError{{"traces[0].messages", "at least one message"}}},
		{"role missing", body(tr("t", `{"content":"x"}`)), []FieldError{{"traces[0].messages[0].role", "is required"}}},
		{"role unknown", body(tr("t", user, user, `{"role":"bot","content":"x"}`)), []FieldError{{"traces[0].messages[2].role", `got "bot"`}}},
		{"role wrong type", body(tr("t", `{"role":true,"content":"x"}`)), []FieldError{{"traces[0].messages[0].role", "must be a string, got boolean"}}},
		{"content parts array", body(tr("t", `{"role":"user","content":[{"type":"text","text":"x"}]}`)), []FieldError{{"traces[0].messages[0].content", "must be a string, got array"}}},
		{"user content null", body(tr("t", `{"role":"user","content":null}`)), []FieldError{{"traces[0].messages[0].content", "null is allowed only on an assistant message with tool_calls"}}},
		{"user content missing", body(tr("t", `{"role":"user"}`)), []FieldError{{"traces[0].messages[0].content", "is required"}}},
		{"assistant null content without calls", body(tr("t", `{"role":"assistant","content":null}`)), []FieldError{{"traces[0].messages[0].content", "null is allowed only"}}},
		{"tool calls on user", body(tr("t", `{"role":"user","content":"x","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls", "only assistant messages carry tool_calls"}}},
		{"tool calls wrong type", body(tr("t", `{"role":"assistant","content":"x","tool_calls":"f()"}`)), []FieldError{{"traces[0].messages[0].tool_calls", "must be an array, got string"}}},
		{"tool call id missing", body(tr("t", `{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].id", "is required"}}},
		{"tool call id duplicate in message", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},{"id":"a","function":{"name":"g","arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[1].id", "duplicates tool_calls[0].id"}}},
		{"tool call type", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","type":"code","function":{"name":"f","arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].type", `must be "function"`}}},
		{"function missing", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a"}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function", "is required"}}},
		{"function name missing", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function.name", "is required"}}},
		{"function name with space", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"get order","arguments":"{}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function.name", "white space"}}},
		{"arguments object", body(tr("t", user, user, user, user, `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":{"x":1}}}]}`)), []FieldError{{"traces[0].messages[4].tool_calls[0].function.arguments", "must be a string holding JSON, got object"}}},
		{"arguments not JSON", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{x:1}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function.arguments", "must be a string holding JSON; invalid JSON at byte 1"}}},
		{"arguments trailing", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{} {}"}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function.arguments", "unexpected data after the value"}}},
		{"arguments empty", body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":""}}]}`)), []FieldError{{"traces[0].messages[0].tool_calls[0].function.arguments", "is required"}}},
		{"tool message without id", body(tr("t", call, `{"role":"tool","content":"x"}`)), []FieldError{{"traces[0].messages[1].tool_call_id", "is required on a tool message"}}},
		{"tool message answering nothing", body(tr("t", call, `{"role":"tool","tool_call_id":"zz","content":"x"}`)), []FieldError{{"traces[0].messages[1].tool_call_id", `names no earlier tool call in this trace ("zz")`}}},
		{"tool answer before its call", body(tr("t", answer, call)), []FieldError{{"traces[0].messages[0].tool_call_id", "names no earlier tool call"}}},
		{"tool_call_id on user", body(tr("t", `{"role":"user","content":"x","tool_call_id":"c"}`)), []FieldError{{"traces[0].messages[0].tool_call_id", "only tool messages carry tool_call_id"}}},
		{"tool message content null", body(tr("t", call, `{"role":"tool","tool_call_id":"c1","content":null}`)), []FieldError{{"traces[0].messages[1].content", "must be a string"}}},
		{"spellings disagree", body(tr("t", call, `{"role":"tool","tool_call_id":"c1","toolCallId":"c2","content":"x"}`)), []FieldError{{"traces[0].messages[1].toolCallId", "differs from the other spelling"}}},
		{"ids reset per trace", body(tr("a", call), tr("b", answer)), []FieldError{{"traces[1].messages[0].tool_call_id", "names no earlier tool call"}}},
		{"several errors in order", body(tr("a", `{"role":"x","content":"y"}`), `{"id":"","messages":[{"role":"tool","content":"x"}]}`),
			[]FieldError{{"traces[0].messages[0].role", "got \"x\""}, {"traces[1].messages[0].tool_call_id", "is required"}, {"traces[1].id", "is required"}}},
		{"syntax: missing comma", `{"project":"shop" "traces":[]}`, []FieldError{{"body", "invalid JSON at byte 18: invalid character '\"' after an object field"}}},
		{"syntax: inside a trace", body(tr("t", `{"role":"user","content":"x",}`)), []FieldError{{"traces[0].messages[0]", "looking for a field name"}}},
		{"syntax: bad escape", body(tr("t", `{"role":"user","content":"\x"}`)), []FieldError{{"traces[0].messages[0].content", `invalid escape 'x'`}}},
		{"syntax: raw newline in string", body(tr("t", "{\"role\":\"user\",\"content\":\"a\nb\"}")), []FieldError{{"traces[0].messages[0].content", "control character"}}},
		{"syntax: invalid utf-8", body(tr("t", "{\"role\":\"user\",\"content\":\"a\xffb\"}")), []FieldError{{"traces[0].messages[0].content", "invalid UTF-8"}}},
		{"syntax: unterminated", `{"project":"sh`, []FieldError{{"project", "unexpected end of body in a string"}}},
		{"syntax: in an unknown field", `{"project":"shop","extra":[1,2,}`, []FieldError{{"extra", "invalid character '}' looking for a value"}}},
		{"syntax: bad number", `{"project":"shop","n":01}`, []FieldError{{"body", "after an object field"}}},
		{"syntax: bad literal", `{"project":"shop","n":nul}`, []FieldError{{"n", "expecting null"}}},
		{"too deep", `{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, []FieldError{{"x", "nested deeper than 10000 levels"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode([]byte(c.body), Options{})
			var e *Error
			if err == nil || !asError(err, &e) {
				t.Fatalf("Decode = %v, want *Error", err)
			}
			if len(e.Fields) != len(c.want) {
				t.Fatalf("got %d errors %v, want %d %v", len(e.Fields), e.Fields, len(c.want), c.want)
			}
			for i, w := range c.want {
				if g := e.Fields[i]; g.Path != w.Path || !strings.Contains(g.Message, w.Message) {
					t.Errorf("error %d = %q, want path %q and message containing %q", i, g, w.Path, w.Message)
				}
			}
		})
	}
}

func asError(err error, e **Error) bool {
	x, ok := err.(*Error)
	*e = x
	return ok
}

func TestDecodeLimits(t *testing.T) {
	var traces []string
	for i := range 30 {
		traces = append(traces, tr(fmt.Sprint(i), `{"role":"bot","content":"x"}`))
	}
	_, err := Decode([]byte(body(traces...)), Options{MaxErrors: 5})
	e, _ := err.(*Error)
	if e == nil || len(e.Fields) != 5 || !e.Truncated || e.Fields[4].Path != "traces[4].messages[0].role" {
		t.Fatalf("MaxErrors 5: %v", err)
	}
	_, err = Decode([]byte(body(traces[:3]...)), Options{MaxErrors: 3})
	if e, _ := err.(*Error); e == nil || len(e.Fields) != 3 || e.Truncated {
		t.Fatalf("exactly MaxErrors errors must not be marked truncated: %v", err)
	}
	ok := make([]string, 4)
	for i := range ok {
		ok[i] = tr(fmt.Sprint(i), user)
	}
	if _, err := Decode([]byte(body(ok...)), Options{MaxTraces: 4}); err != nil {
		t.Fatalf("4 traces with MaxTraces 4: %v", err)
	}
	_, err = Decode([]byte(body(append(ok, tr("x", user))...)), Options{MaxTraces: 4})
	if e, _ := err.(*Error); e == nil || !e.OverLimit || e.Fields[0].Path != "traces" || !strings.Contains(e.Fields[0].Message, "limit of 4 traces") {
		t.Fatalf("5 traces with MaxTraces 4: %v", err)
	}
}

func TestValidateTrace(t *testing.T) {
	s := func(v string) *string { return &v }
	good := trace.Trace{ID: "t", Messages: []trace.Message{
		{Role: "user", Content: s("hi")},
		{Role: "assistant", ToolCalls: []trace.ToolCall{{ID: "c", Function: trace.Function{Name: "f", Arguments: "{}"}}}},
		{Role: "tool", ToolCallID: "c", Content: s("ok")},
	}}
	if err := ValidateTrace(&good); err != nil {
		t.Fatalf("good trace: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(t *trace.Trace)
		path   string
	}{
		{"no id", func(t *trace.Trace) { t.ID = "" }, "id"},
		{"bad role", func(t *trace.Trace) { t.Messages[0].Role = "robot" }, "messages[0].role"},
		{"nil user content", func(t *trace.Trace) { t.Messages[0].Content = nil }, "messages[0].content"},
		{"invalid utf-8", func(t *trace.Trace) { t.Messages[0].Content = s("\xff") }, "messages[0].content"},
		{"bad arguments", func(t *trace.Trace) { t.Messages[1].ToolCalls[0].Function.Arguments = "{" }, "messages[1].tool_calls[0].function.arguments"},
		{"no function name", func(t *trace.Trace) { t.Messages[1].ToolCalls[0].Function.Name = "" }, "messages[1].tool_calls[0].function.name"},
		{"dangling answer", func(t *trace.Trace) { t.Messages[2].ToolCallID = "nope" }, "messages[2].tool_call_id"},
		{"no messages", func(t *trace.Trace) { t.Messages = nil }, "messages"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := good
			x.Messages = append([]trace.Message(nil), good.Messages...)
			x.Messages[1].ToolCalls = append([]trace.ToolCall(nil), good.Messages[1].ToolCalls...)
			c.mutate(&x)
			err := ValidateTrace(&x)
			e, _ := err.(*Error)
			if e == nil || e.Fields[0].Path != c.path {
				t.Fatalf("ValidateTrace = %v, want an error at %s", err, c.path)
			}
		})
	}
}

func TestSlug(t *testing.T) {
	long := strings.Repeat("ab ", 40)
	sum := sha256.Sum256([]byte(long))
	cases := map[string]string{
		"tau2-retail":              "tau2-retail",
		"Tau Retail":               "tau-retail",
		"  My_Agent!! v2 ":         "my-agent-v2",
		"Café Bot":                 "caf-bot",
		"---":                      "",
		"日本語":                      "",
		"a":                        "a",
		long:                       strings.Repeat("ab-", 17) + "a-" + hex.EncodeToString(sum[:])[:10],
		strings.Repeat("x", 63):    strings.Repeat("x", 63),
		"UPPER.lower.123":          "upper-lower-123",
		"trailing punctuation...!": "trailing-punctuation",
	}
	for in, want := range cases {
		got := Slug(in)
		if got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
		if len(got) > MaxSlugLen || strings.HasPrefix(got, "-") || strings.HasSuffix(got, "-") || strings.Contains(got, "--") {
			t.Errorf("Slug(%q) = %q is not a clean slug", in, got)
		}
	}
	if Slug(strings.Repeat("x", 64)) == Slug(strings.Repeat("x", 65)) {
		t.Error("long names that differ share a slug")
	}
}

func TestDetect(t *testing.T) {
	s := func(v string) *string { return &v }
	crew := trace.Batch{Traces: []trace.Trace{{Messages: []trace.Message{{Role: "system", Content: s("You are Clerk. Helpful.\nYour personal goal is: sell")}}}}}
	plain := trace.Batch{Traces: []trace.Trace{{Messages: []trace.Message{{Role: "system", Content: s("You are a shop agent.")}}}}}
	cases := []struct {
		name string
		b    *trace.Batch
		h    Hints
		want Agent
	}{
		{"nothing known", &plain, Hints{UserAgent: "curl/8.0"}, Agent{}},
		{"python requests", &plain, Hints{UserAgent: "python-requests/2.31.0"}, Agent{Language: "python"}},
		{"go collector", &plain, Hints{UserAgent: "doppel-collector-go/1"}, Agent{Language: "go"}},
		{"langchain in user agent", &plain, Hints{UserAgent: "langchain/0.3 python-httpx/0.27"}, Agent{Framework: "langchain", Language: "python"}},
		{"crewai prompt", &crew, Hints{UserAgent: "python-httpx/0.27"}, Agent{Framework: "crewai", Language: "python"}},
		{"stated wins", &crew, Hints{UserAgent: "python-httpx/0.27", Framework: "mine", Language: "kotlin"}, Agent{Framework: "mine", Language: "kotlin"}},
	}
	for _, c := range cases {
		if got := Detect(c.b, c.h); got != c.want {
			t.Errorf("%s: Detect = %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestEncodeCanonical(t *testing.T) {
	a := `{"project":"shop","traces":[{"id":"t","messages":[{"role":"user","content":"\u00e9 \"q\" \u0001 </>"}]}]}`
	b := "{ \"traces\" : [ { \"messages\": [ {\"content\":\"é \\\"q\\\" \\u0001 \\u003c/\\u003e\", \"role\":\"user\"} ], \"id\":\"t\", \"model\":null } ], \"project\":\"shop\", \"extra\": 1 }"
	pa, err := Decode([]byte(a), Options{})
	if err != nil {
		t.Fatal(err)
	}
	pb, err := Decode([]byte(b), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ja, jb := AppendJSON(nil, &pa.Batch), AppendJSON(nil, &pb.Batch)
	want := `{"project":"shop","traces":[{"id":"t","messages":[{"role":"user","content":"é \"q\" \u0001 </>"}]}]}`
	if string(ja) != want || string(jb) != want {
		t.Fatalf("canonical JSON:\n%s\n%s\nwant\n%s", ja, jb, want)
	}
	ba, _ := EncodeBlob(&pa.Batch)
	bb, _ := EncodeBlob(&pb.Batch)
	if string(ba) != string(bb) {
		t.Fatal("equal batches gave different blobs")
	}
	one := AppendBody(nil, pa.Batch.Project, [][]byte{AppendTrace(nil, &pa.Batch.Traces[0])})
	if string(one) != want {
		t.Fatalf("AppendBody(AppendTrace) = %s, want %s", one, want)
	}
	if _, err := DecodeBlob(ja); err == nil {
		t.Fatal("DecodeBlob accepted plain JSON")
	}
}

func TestDecodeTrace(t *testing.T) {
	got, err := DecodeTrace([]byte(" " + tr("t1", user, call, answer) + "\n"))
	if err != nil || got.ID != "t1" || len(got.Messages) != 3 {
		t.Fatalf("DecodeTrace = %+v, %v", got, err)
	}
	for in, want := range map[string]string{
		`[]`:                                  "trace: must be an object, got array",
		tr("t", `{"role":"x","content":"y"}`): `messages[0].role: must be one of system, user, assistant, tool; got "x"`,
		tr("t", user) + " {}":                 "trace: invalid JSON at byte",
		`{"messages":[` + user + `]}`:         "id: is required",
	} {
		_, err := DecodeTrace([]byte(in))
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("DecodeTrace(%s) = %v, want %q", in, err, want)
		}
	}
}

// Check reads the tau traces as Decode does, keeping of their texts only the system prompts: roles come first in
// their messages, so no other text is kept.
func TestCheckKeepsSystemPrompts(t *testing.T) {
	for _, name := range []string{"tau-retail-dev.json", "tau-airline-dev.json"} {
		body := readData(t, name)
		p, err := Decode(body, Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := Check(body, Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkChecked(t, p, c)
		kept, system := 0, 0
		for _, tr := range c.Batch.Traces {
			for _, m := range tr.Messages {
				if m.Role == trace.RoleSystem {
					system++
				}
				if m.Content != nil {
					if m.Role != trace.RoleSystem {
						t.Fatalf("%s: Check kept a %s text", name, m.Role)
					}
					kept++
				}
			}
		}
		if kept == 0 || kept != system {
			t.Fatalf("%s: Check kept %d texts of %d system messages", name, kept, system)
		}
	}
}
