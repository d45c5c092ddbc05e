package twin

import (
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// The schema check built from the parsed arguments answers what decoding them again did, for every argument text.
func TestArgsProblemFromParsedMatchesDecode(t *testing.T) {
	sc, err := jsonvalue.ParseSchema([]byte(`{"type": "object", "properties": {
		"order_id": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"},
		"items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}},
		"flag": {"type": ["boolean", "null"]}, "é": {"type": "string"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tool := &rtTool{schema: sc}
	raws := []string{
		`{}`, `{"order_id": "#W1"}`, `{"order_id": 1}`, `{"qty": 2}`, `{"qty": 2.0}`, `{"qty": 2.5}`, `{"qty": 1e3}`,
		`{"qty": 12345678901234567890}`, `{"price": "1"}`, `{"price": -0.5e-3}`, `{"items": [{"id": "a", "n": 1}, {"id": 2}]}`,
		`{"items": {}}`, `{"flag": null}`, `{"flag": "yes"}`, `{"qty": 1, "qty": "x"}`, `{"qty": "x", "qty": 1}`,
		`{"é": 1}`, `{"\u00e9": 1}`, `{"order_id": "a\"b", "qty": "x"}`, `{"qty": NaN}`, `{"qty": Infinity}`,
		"{\"order_id\": \"\xff\", \"qty\": \"x\"}", "{\"\xff\": 1, \"qty\": true}", `{"unknown": [1, {"x": []}]}`,
		" \t\n{\"qty\": \"x\"} \r\n",
	}
	for _, raw := range raws {
		v, err := jsonvalue.Parse([]byte(raw))
		if err != nil {
			continue // a call refuses these before the schema is checked
		}
		o, ok := v.(*jsonvalue.Object)
		if !ok {
			t.Fatalf("%s: not an object", raw)
		}
		if got, want := tool.argsProblem([]byte(raw), o), tool.argsProblem([]byte(raw), nil); got != want {
			t.Errorf("%s: from the parsed value %q, decoded again %q", raw, got, want)
		}
	}
}
