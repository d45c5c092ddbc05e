package ingest

import (
	"strings"
	"testing"
)

func TestDecodeTraceBytes(t *testing.T) {
	a := `{"id":"a","messages":[{"role":"user","content":"hi"}]}`
	b := `{"id": "b", "messages": [{"role": "user", "content": "a longer message"}]}`
	body := `{"project": "p", "traces": [ ` + a + ` ,
		` + b + `]}`
	p, err := Decode([]byte(body), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.TraceBytes) != 2 || p.TraceBytes[0] != int64(len(a)) || p.TraceBytes[1] != int64(len(b)) {
		t.Fatalf("TraceBytes = %v, want [%d %d]", p.TraceBytes, len(a), len(b))
	}
	if !strings.Contains(body, a) {
		t.Fatal("test body lost a trace")
	}
}
