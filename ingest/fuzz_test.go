package ingest

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/doppel-dev/doppel/trace"
)

// FuzzDecode checks, for any body: Decode never panics; a rejected body gets field-named errors;
// a body encoding/json finds invalid is rejected; an accepted body is valid JSON, and its canonical
// encoding and blob read back to the same batch; every accepted trace has an id and at least one message.
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
	})
}
