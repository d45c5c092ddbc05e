package twin

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// wholeCanonical is the definition the streamed writer must match: the canonical JSON of the
// bundle's whole encoding/json form, tools and tables sorted by name.
func wholeCanonical(t *testing.T, b *Bundle) []byte {
	t.Helper()
	c := *b
	c.Format = FormatVersion
	c.Tools = append([]Tool(nil), b.Tools...)
	c.Tables = append([]Table(nil), b.Tables...)
	sortByName(c.Tools, func(x Tool) string { return x.Name })
	sortByName(c.Tables, func(x Table) string { return x.Name })
	raw, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonvalue.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return jsonvalue.Canonical(v)
}

func sortByName[T any](xs []T, name func(T) string) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && name(xs[j]) < name(xs[j-1]); j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}

func TestWriteCanonicalMatchesWholeEncoding(t *testing.T) {
	full := bankBundle()
	full.Tables = append(full.Tables, Table{Name: "aa_facts", Key: "id", Rows: []Row{},
		Facts: []Row{{Key: "k<1>", JSON: "{'a': \"\\u2028&\"}", From: []string{"t#1"}}}})
	full.Recordings = []Recording{
		{Tool: "get_order", Args: `{"order_id":"#W1"}`, Answer: 1, Trace: "t1", Call: 0},
		{Tool: "get_order", Args: `{"order_id":"#W2"}`, Answer: 0, Error: true, State: "-", Trace: "t\xff2", Call: 3},
		{Tool: "q\"uote\\", Args: "{\"a\":\"tab\there\\u0001 <b>\"}", Answer: 12, State: "s\x01\n", Trace: "t/3#x9", Call: -1},
		{Tool: "é\u2028", Args: "{}", Answer: 2, Error: true, Trace: "", Call: 1 << 40},
	}
	full.Tables[len(full.Tables)-1].Rows = []Row{{Key: "a\"b", JSON: "{}", From: []string{}}, {Key: "\x7f", JSON: "{\"x\":1}", From: []string{"a", "b\\c"}},
		{Key: "bad \xff", JSON: "{}"}}
	full.Answers = []string{"plain", "bad utf-8 \xff\xfe here", "<html> & \u2028 \"quoted\""}
	full.Scenarios = map[string]string{"b": "two", "a": "one"}
	full.Agent = &Agent{SystemPrompt: "be nice", Tools: []string{"get_order"}, Runs: []AgentRun{
		{TraceID: "t1", Request: "hi", Answer: "ok"},
		{TraceID: "t2", Request: "<b> \u2028 \"q\"", Answer: "", Calls: []AgentCall{{Tool: "get_order", Arguments: `{"order_id": "#W1"}`}, {Tool: "x", Arguments: ""}}},
		{TraceID: "t3", Request: "bad \xff", Answer: "a", Calls: []AgentCall{}},
	}}
	noRuns := bankBundle()
	noRuns.Agent = &Agent{SystemPrompt: "p", Runs: []AgentRun{}}
	cases := []struct {
		name string
		b    *Bundle
	}{
		{"bank bundle", bankBundle()},
		{"every long list filled, odd strings", full},
		{"nil lists", &Bundle{SchemaSource: "traces"}},
		{"an agent without runs", noRuns},
		{"empty lists", &Bundle{SchemaSource: "traces", Tools: []Tool{}, Tables: []Table{{Name: "t"}}, Recordings: []Recording{}, Answers: []string{}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := wholeCanonical(t, tc.b)
			got, err := tc.b.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("streamed bytes differ from the whole encoding:\n got %s\nwant %s", got, want)
			}
			if h := tc.b.Hash(); h != HashBytes(want) {
				t.Fatalf("Hash = %s, want %s", h, HashBytes(want))
			}
			if _, err := UnmarshalBundle(got); err != nil && tc.name == "bank bundle" {
				t.Fatalf("streamed bytes do not read back: %v", err)
			}
		})
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

// A writer's error ends the write and is answered (wrapped), not swallowed.
func TestWriteCanonicalWriterError(t *testing.T) {
	b := bankBundle()
	for i := range 5000 {
		b.Answers = append(b.Answers, string(rune('a'+i%26))+" a recorded answer long enough to pass the flush size soon")
	}
	err := b.WriteCanonical(&failWriter{after: 1})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Fatalf("err = %v, want the writer's error", err)
	}
}

// blockWriter joins writes of every size, across and beyond its block size, back into the bytes written.
func TestBlockWriter(t *testing.T) {
	var w blockWriter
	var want []byte
	for i, n := range []int{0, 1, 100, blockSize - 101, 1, blockSize + 7, 3, 2 * blockSize, 5} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		if got, err := w.Write(p); err != nil || got != n {
			t.Fatalf("Write(%d bytes) = %d, %v", n, got, err)
		}
		want = append(want, p...)
	}
	if got := w.bytes(); !bytes.Equal(got, want) {
		t.Fatalf("joined %d bytes differ from the %d written", len(got), len(want))
	}
}
