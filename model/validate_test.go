package model

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestSchemaCache(t *testing.T) {
	var c SchemaCache
	raw := json.RawMessage(`{"type": "object", "properties": {"n": {"type": "integer"}}}`)
	a, err := c.Get(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Get(json.RawMessage(string(raw)))
	if err != nil || a != b {
		t.Fatalf("second Get of the same schema: %p, %v; want the cached %p", b, err, a)
	}
	v, _ := DecodeJSON([]byte(`{"n": "x"}`))
	if err := a.CheckTypes(v); err == nil || !strings.Contains(err.Error(), "$.n") {
		t.Fatalf("CheckTypes of a string for an integer: %v, want an error naming $.n", err)
	}
	if _, err := c.Get(json.RawMessage(`{"type": `)); err == nil {
		t.Fatal("a schema that is not JSON decoded")
	}
	empty, err := c.Get(nil)
	if err != nil || empty.CheckTypes(v) != nil || empty.Validate(v) != nil {
		t.Fatalf("the empty schema: %v; want every value to pass", err)
	}
}
