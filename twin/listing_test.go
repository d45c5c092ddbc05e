package twin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// timetableBundle: a direct search and a connecting search over bus routes. The direct search's answers list
// buses (no day in them: the day is an argument); the connecting search's legs carry their day.
func timetableBundle() *Bundle {
	return &Bundle{
		Format:       FormatVersion,
		Name:         "timetable",
		SchemaSource: "traces",
		Style:        StylePython,
		Tools: []Tool{
			{Name: "find_buses", Binding: BindingSimulated, Rung: RungReplay, Kind: KindQuery},
			{Name: "find_connections", Binding: BindingSimulated, Rung: RungReplay, Kind: KindQuery},
		},
		Recordings: []Recording{
			{Tool: "find_buses", Args: `{"day":"mon","from":"AAA","to":"BBB"}`, Answer: 0, Trace: "t1"},
			{Tool: "find_buses", Args: `{"day":"tue","from":"BBB","to":"CCC"}`, Answer: 1, Trace: "t1", Call: 1},
			{Tool: "find_connections", Args: `{"day":"wed","from":"AAA","to":"CCC"}`, Answer: 2, Trace: "t2"},
			// A later answer about bus B20 on Monday: it wins over the first.
			{Tool: "find_buses", Args: `{"day":"mon","from":"AAA","to":"BBB"}`, Answer: 3, Trace: "t3"},
		},
		Answers: []string{
			`[{"bus": "B10", "from": "AAA", "to": "BBB", "seats": 3}, {"bus": "B20", "from": "AAA", "to": "BBB", "seats": 9}]`,
			`[{"bus": "B30", "from": "BBB", "to": "CCC", "seats": 4}]`,
			`[[{"bus": "B20", "from": "AAA", "to": "BBB", "seats": 1, "day": "wed"}, {"bus": "B30", "from": "BBB", "to": "CCC", "seats": 0, "day": "wed"}]]`,
			`[{"bus": "B10", "from": "AAA", "to": "BBB", "seats": 3}, {"bus": "B20", "from": "AAA", "to": "BBB", "seats": 8}]`,
		},
	}
}

func TestListingAnswersSearchesFromRows(t *testing.T) {
	rt := rowsRuntime(t, timetableBundle())
	if l := rt.tools["find_buses"].listing; l == nil || l.key != "bus" || l.match["from"] != "from" || l.match["to"] != "to" || len(l.dims) != 1 || l.dims[0] != "day" {
		t.Fatalf("find_buses listing = %+v, want key bus, from/to matched, day a dimension", l)
	}
	if rt.tools["find_connections"].listing != nil {
		t.Error("find_connections (lists of legs) learned a listing; want none")
	}
	if row := rt.tools["find_buses"].listing.rows[rt.tools["find_buses"].listing.rowID("B20", []string{"mon"})]; row == nil || Render(row, StylePython) != `{"bus": "B20", "from": "AAA", "to": "BBB", "seats": 8}` {
		t.Errorf("B20 on monday = %v, want the later recording's row (8 seats)", row)
	}
	s := open(t, rt, SessionSpec{})
	for _, tt := range []struct {
		name, args string
		rung, want string // want "" when the rows do not answer (the nearest recording does)
	}{
		{"recorded arguments replay", `{"day":"mon","from":"AAA","to":"BBB"}`, RungReplay,
			`[{"bus": "B10", "from": "AAA", "to": "BBB", "seats": 3}, {"bus": "B20", "from": "AAA", "to": "BBB", "seats": 9}]`},
		{"a day only a connection showed", `{"day":"wed","from":"AAA","to":"BBB"}`, RungInfer,
			`[{"bus": "B20", "from": "AAA", "to": "BBB", "seats": 1}]`},
		{"the other leg of that connection", `{"day":"wed","from":"BBB","to":"CCC"}`, RungInfer,
			`[{"bus": "B30", "from": "BBB", "to": "CCC", "seats": 0}]`},
		{"no row for that day", `{"day":"fri","from":"AAA","to":"BBB"}`, RungInfer, ""},
		{"an argument the recordings never gave", `{"day":"wed","from":"AAA","to":"BBB","class":"x"}`, RungInfer, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.Call(context.Background(), "find_buses", json.RawMessage(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if res.Rung != tt.rung {
				t.Errorf("rung %s, want %s", res.Rung, tt.rung)
			}
			if tt.want != "" && res.Content != tt.want {
				t.Errorf("answer %s\nwant %s", res.Content, tt.want)
			}
			if tt.want == "" && res.Content == `[{"bus": "B20", "from": "AAA", "to": "BBB", "seats": 1}]` {
				t.Errorf("answered from wednesday's rows: %s", res.Content)
			}
		})
	}
}

func TestLearnListingNeedsConsistentAnswers(t *testing.T) {
	for _, tt := range []struct {
		name    string
		answers []string
		ok      bool
	}{
		{"two answers listing buses", []string{`[{"bus": "B10", "from": "AAA"}]`, `[{"bus": "B20", "from": "BBB"}]`}, true},
		{"one answer is not enough", []string{`[{"bus": "B10", "from": "AAA"}]`}, false},
		{"no id field", []string{`[{"name": "x", "from": "AAA"}]`, `[{"name": "y", "from": "BBB"}]`}, false},
		{"different fields", []string{`[{"bus": "B10", "from": "AAA"}]`, `[{"bus": "B20", "from": "BBB", "seats": 1}]`}, false},
		{"not a list", []string{`{"bus": "B10", "from": "AAA"}`, `{"bus": "B20", "from": "BBB"}`}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tool := &rtTool{def: &Tool{Name: "q", Kind: KindQuery}}
			for i, a := range tt.answers {
				args := []string{`{"from":"AAA"}`, `{"from":"BBB"}`}[i]
				v := mustArgs(t, args)
				tool.all = append(tool.all, &rec{args: v, flat: flatten(v), answer: a})
			}
			if got := learnListing(tool, parseText, StylePython) != nil; got != tt.ok {
				t.Errorf("learned = %v, want %v", got, tt.ok)
			}
		})
	}
}

func mustArgs(t *testing.T, s string) any {
	t.Helper()
	v, err := jsonvalue.ParseString(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rowsRuntime is a runtime whose listings and preconditions are learned (as the first inferred call does).
func rowsRuntime(t *testing.T, b *Bundle) *Runtime {
	t.Helper()
	rt, err := NewRuntime(b, RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rt.rowsOnce.Do(rt.learnRows)
	return rt
}

func parseText(s string) (any, bool) {
	v, err := jsonvalue.ParseString(s)
	return v, err == nil
}
