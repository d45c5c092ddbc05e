package jsonvalue

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
	v, _ := Decode([]byte(`{"n": "x"}`))
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

func TestValidate(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","required":["id","items"],"additionalProperties":false,"properties":{
		"id":{"type":"string"},"n":{"type":"integer","minimum":0},"tag":{"type":["string","null"]},
		"items":{"type":"array","minItems":1,"items":{"type":"object","properties":{"kind":{"enum":["a","b"]}}}},
		"any":{"anyOf":[{"type":"string"},{"type":"boolean"}]}}}`)
	tests := []struct {
		doc  string
		want string // "" valid, else a substring of the error
	}{
		{`{"id":"x","items":[{"kind":"a"}],"n":3,"tag":null,"any":true}`, ""},
		{`{"id":"x","items":[{"kind":"a"}],"n":3.0}`, ""},
		{`{"items":[{}]}`, `missing required field "id"`},
		{`{"id":1,"items":[{}]}`, "$.id: want string, got integer"},
		{`{"id":"x","items":[]}`, "$.items: 0 items"},
		{`{"id":"x","items":[{"kind":"c"}]}`, `$.items[0].kind: "c" is not one of`},
		{`{"id":"x","items":[{}],"n":1.5}`, "$.n: want integer, got number"},
		{`{"id":"x","items":[{}],"n":-1}`, "below the minimum"},
		{`{"id":"x","items":[{}],"extra":1}`, "$.extra: unknown field"},
		{`{"id":"x","items":[{}],"any":3}`, "$.any: matches no alternative"},
		{`[]`, "$: want object, got array"},
	}
	for _, tt := range tests {
		v, err := Decode([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		err = Validate(schema, v)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Validate(%s) = %v, want valid", tt.doc, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Validate(%s) = %v, want error containing %q", tt.doc, err, tt.want)
		}
	}
}

func TestCheckTypes(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","required":["order_id"],"additionalProperties":false,"properties":{
		"order_id":{"type":"string","enum":["#W1"]},"item_ids":{"type":"array","minItems":2,"items":{"type":"string"}},
		"qty":{"type":"integer","minimum":1}}}`)
	tests := []struct {
		doc  string
		want string
	}{
		{`{"order_id":"#W9"}`, ""}, // enum not enforced
		{`{}`, ""},                 // required not enforced
		{`{"other":1,"qty":0,"item_ids":[]}`, ""}, // unknown fields, bounds not enforced
		{`{"order_id":9}`, "$.order_id: want string, got integer"},
		{`{"item_ids":["a",2]}`, "$.item_ids[1]: want string, got integer"},
		{`{"qty":"2"}`, "$.qty: want integer, got string"},
		{`["x"]`, "$: want object, got array"},
	}
	for _, tt := range tests {
		v, err := Decode([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		err = CheckTypes(schema, v)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckTypes(%s) = %v, want %q", tt.doc, err, tt.want)
		}
	}
}

// TestValidateExactNumbers: enum and const compare numbers by value, exactly, however the schema and the
// value spell them.
func TestValidateExactNumbers(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"id":{"enum":[12345678901234567890, 1.5]},"n":{"const":2}}}`)
	tests := []struct {
		doc string
		ok  bool
	}{
		{`{"id":12345678901234567890}`, true},
		{`{"id":12345678901234567891}`, false},
		{`{"id":1.50}`, true},
		{`{"n":2.0}`, true},
		{`{"n":20e-1}`, true},
		{`{"n":3}`, false},
	}
	for _, tt := range tests {
		v, err := Decode([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		if err := Validate(schema, v); (err == nil) != tt.ok {
			t.Errorf("Validate(%s) = %v, want ok %v", tt.doc, err, tt.ok)
		}
	}
}
