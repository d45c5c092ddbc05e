package ingest

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/doppel-dev/doppel/trace"
)

// A long text every trace of a batch repeats (a system prompt) decodes to one string, not one per trace.
func TestDecodeBlobSharesLongStrings(t *testing.T) {
	prompt := strings.Repeat("You are a helpful agent; follow the policy. ", 40)
	content := func(s string) *string { return &s }
	var b trace.Batch
	for _, id := range []string{"t1", "t2", "t3"} {
		b.Traces = append(b.Traces, trace.Trace{ID: id, Messages: []trace.Message{
			{Role: trace.RoleSystem, Content: content(prompt)},
			{Role: trace.RoleUser, Content: content("hello " + id)},
		}})
	}
	blob, err := EncodeBlob(&b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBlob(blob)
	if err != nil {
		t.Fatal(err)
	}
	first := *got.Traces[0].Messages[0].Content
	if first != prompt {
		t.Fatalf("decoded prompt differs: %q", first)
	}
	for _, tr := range got.Traces[1:] {
		s := *tr.Messages[0].Content
		if s != prompt || unsafe.StringData(s) != unsafe.StringData(first) {
			t.Errorf("trace %s: its prompt is a copy of its own, want the first trace's string", tr.ID)
		}
	}
}
