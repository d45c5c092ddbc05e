package ingest

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/trace"
)

// FuzzDecode checks, for any body: Decode never panics; a rejected body gets field-named errors;
// a body encoding/json finds invalid is rejected; an accepted body is valid JSON, and its canonical
// encoding, its blob and the body's own blob read back to the same batch; every accepted trace has an id and at least one message.
func FuzzDecode(f *testing.F) {
	seeds := []string{
		body(tr("t1", sys, user, call, answer, final)),
		body(tr("t", `{"role":"assistant","toolCalls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}`, `{"role":"tool","toolCallId":"a","content":"ok"}`)),
		body(tr("t\u00e9", `{"role":"user","content":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\ud800x é 😀"}`)),
		`{"x":{"deep":[1,-2.5e+3,{"a":null,"b":true,"c":false}]},"project":"shop","traces":[{"meta":true,"id":"t","messages":[{"role":"user","content":"hi"}]}]}`,
		`{"project":"shop","traces":[]}`,
		`{"project":"shop" "traces":[]}`,
		`[1,2]`, ``, `null`, `{"project":"sh`,
		body(tr("a", call), tr("b", answer)),
		body(tr("t", `{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":{"x":1}}}]}`)),
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b, Options{})
		checked, cerr := Check(b, Options{})
		if !reflect.DeepEqual(err, cerr) {
			t.Fatalf("Decode: %v; Check: %v", err, cerr)
		}
		if err != nil {
			e, ok := err.(*Error)
			if !ok || len(e.Fields) == 0 {
				t.Fatalf("rejected without field errors: %v", err)
			}
			for _, fe := range e.Fields {
				if fe.Path == "" || fe.Message == "" {
					t.Fatalf("field error without path or message: %+v", fe)
				}
			}
			return
		}
		for i := range p.Batch.Traces {
			if tr := &p.Batch.Traces[i]; tr.ID == "" || len(tr.Messages) == 0 {
				t.Fatalf("accepted traces[%d] with id %q and %d messages", i, tr.ID, len(tr.Messages))
			}
		}
		checkChecked(t, p, checked)
		if !json.Valid(b) {
			t.Fatalf("accepted a body encoding/json finds invalid: %q", b)
		}
		canon := AppendJSON(nil, &p.Batch)
		var std trace.Batch
		if err := json.Unmarshal(canon, &std); err != nil {
			t.Fatalf("canonical JSON does not decode with encoding/json: %v\n%s", err, canon)
		}
		if !reflect.DeepEqual(std, p.Batch) {
			t.Fatalf("canonical JSON reads back differently with encoding/json:\n%+v\n%+v", std, p.Batch)
		}
		again, err := Decode(canon, Options{})
		if err != nil {
			t.Fatalf("canonical JSON rejected: %v\n%s", err, canon)
		}
		if !reflect.DeepEqual(again.Batch, p.Batch) {
			t.Fatalf("canonical JSON decodes differently")
		}
		blob, err := EncodeBlob(&p.Batch)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeBlob(blob)
		if err != nil || !reflect.DeepEqual(*back, p.Batch) {
			t.Fatalf("blob round trip: %v", err)
		}
		lean, err := DecodeBlobCalls(blob)
		if err != nil {
			t.Fatalf("DecodeBlobCalls: %v", err)
		}
		checkLean(t, &p.Batch, lean)
		// Collect stores the body as it came: its blob reads back as Decode read the body.
		if blob, err = EncodeBodyBlob(b); err != nil {
			t.Fatal(err)
		}
		if back, err = DecodeBlob(blob); err != nil || !reflect.DeepEqual(*back, p.Batch) {
			t.Fatalf("body blob round trip: %v", err)
		}
		if lean, err = DecodeBlobCalls(blob); err != nil {
			t.Fatalf("DecodeBlobCalls of the body blob: %v", err)
		}
		checkLean(t, &p.Batch, lean)
	})
}

// checkChecked checks that what Check answered is what Decode did (p) with some texts absent, never a system
// message's.
func checkChecked(t *testing.T, p, checked *Parsed) {
	t.Helper()
	full, got := p.Batch, checked.Batch
	full.Traces = slices.Clone(full.Traces)
	for i := range full.Traces {
		if i >= len(got.Traces) || len(got.Traces[i].Messages) != len(full.Traces[i].Messages) {
			break // DeepEqual below says so
		}
		full.Traces[i].Messages = slices.Clone(full.Traces[i].Messages)
		for j := range full.Traces[i].Messages {
			m, c := &full.Traces[i].Messages[j], got.Traces[i].Messages[j].Content
			switch {
			case c != nil && (m.Content == nil || *c != *m.Content):
				t.Fatalf("traces[%d].messages[%d]: Check read the text %q", i, j, *c)
			case c == nil && m.Content != nil && m.Role == trace.RoleSystem:
				t.Fatalf("traces[%d].messages[%d]: Check left out a system prompt", i, j)
			case c == nil:
				m.Content = nil
			}
		}
	}
	want := *p
	want.Batch = full
	if !reflect.DeepEqual(*checked, want) {
		t.Fatalf("Check answered\n%+v\nwant\n%+v", *checked, want)
	}
}

// checkLean checks that lean is full with just the texts DecodeBlobCalls leaves out absent: every tool and system
// text, the first non-empty user text and the last non-blank text the assistant said without tool calls stay.
func checkLean(t *testing.T, full, lean *trace.Batch) {
	t.Helper()
	if full.Project != lean.Project || len(full.Traces) != len(lean.Traces) {
		t.Fatalf("lean batch %q with %d traces, whole %q with %d", lean.Project, len(lean.Traces), full.Project, len(full.Traces))
	}
	for i := range full.Traces {
		ft, lt := &full.Traces[i], &lean.Traces[i]
		if ft.ID != lt.ID || ft.Model != lt.Model || len(ft.Messages) != len(lt.Messages) {
			t.Fatalf("traces[%d] differ beyond their texts", i)
		}
		keep := make([]bool, len(ft.Messages))
		user, answer := false, -1
		for j, m := range ft.Messages {
			switch {
			case m.Content == nil:
			case m.Role == trace.RoleTool || m.Role == trace.RoleSystem:
				keep[j] = true
			case m.Role == trace.RoleUser && !user && *m.Content != "":
				keep[j], user = true, true
			case m.Role == trace.RoleAssistant && len(m.ToolCalls) == 0 && strings.TrimSpace(*m.Content) != "":
				answer = j
			}
		}
		if answer >= 0 {
			keep[answer] = true
		}
		for j := range ft.Messages {
			fm, lm := ft.Messages[j], lt.Messages[j]
			if keep[j] {
				if lm.Content == nil || *lm.Content != *fm.Content {
					t.Fatalf("traces[%d].messages[%d] (%s): lean text %v, want %q", i, j, fm.Role, lm.Content, *fm.Content)
				}
			} else if lm.Content != nil {
				t.Fatalf("traces[%d].messages[%d] (%s): lean kept %q", i, j, fm.Role, *lm.Content)
			}
			fm.Content, lm.Content = nil, nil
			if !reflect.DeepEqual(fm, lm) {
				t.Fatalf("traces[%d].messages[%d] differ beyond their text:\n%+v\n%+v", i, j, fm, lm)
			}
		}
	}
}

// DecodeBlobCalls keeps the texts a build reads, on the tau traces and on conversations that test its rules.
func TestDecodeBlobCalls(t *testing.T) {
	p, err := Decode(readData(t, "tau-retail-dev.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	odd, err := Decode([]byte(body(
		tr("blank-first", `{"role":"system","content":"  "}`, `{"role":"system","content":"second prompt"}`,
			`{"role":"user","content":""}`, `{"role":"user","content":"  real \"request\"\n"}`, `{"role":"user","content":"later"}`,
			`{"role":"assistant","content":"thinking","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}`,
			`{"role":"tool","tool_call_id":"a","content":""}`, `{"role":"assistant","content":"done \u00e9"}`,
			`{"role":"assistant","content":" \t "}`),
		tr("no-answer", `{"role":"user","content":""}`, `{"role":"assistant","content":null,"tool_calls":[{"id":"b","function":{"name":"f","arguments":"{}"}}]}`),
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*trace.Batch{&p.Batch, &odd.Batch} {
		blob, err := EncodeBlob(b)
		if err != nil {
			t.Fatal(err)
		}
		lean, err := DecodeBlobCalls(blob)
		if err != nil {
			t.Fatal(err)
		}
		checkLean(t, b, lean)
	}
	// The rules, spelled out on the odd trace: the blank prompt stays (every system text does), the empty user
	// text and the later one go, and the answer is the last non-blank text said without tool calls.
	blob, _ := EncodeBlob(&odd.Batch)
	lean, _ := DecodeBlobCalls(blob)
	var got []string
	for _, m := range lean.Traces[0].Messages {
		if m.Content != nil {
			got = append(got, m.Role+":"+*m.Content)
		}
	}
	want := []string{"system:  ", "system:second prompt", "user:  real \"request\"\n", "tool:", "assistant:done \u00e9"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("kept %q, want %q", got, want)
	}
}
