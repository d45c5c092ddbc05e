package jsonvalue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Validate checks a decoded JSON value (from Decode: map[string]any, []any, json.Number, string, bool,
// nil) against a JSON Schema. It understands the subset doppel's inferred and provided schemas use: type
// (one or a list), properties, required, additionalProperties (bool or schema), items, enum, const, anyOf,
// oneOf, allOf, minItems, maxItems, minimum, maximum, nullable. Unknown keywords are ignored. The error
// names the JSON path of the first violation, e.g. $.orders[0].status.
func Validate(schema json.RawMessage, v any) error {
	return run(schema, v, false)
}

// CheckTypes checks only that a decoded JSON value has the JSON types the schema gives it (type, through
// properties, items and the anyOf/oneOf/allOf alternatives); required fields, enums, bounds and unknown
// fields are not checked. It suits tool arguments, whose inferred schemas are too narrow to enforce: a
// value never seen in a recording is the production tool's business, a wrong type is bad input.
func CheckTypes(schema json.RawMessage, v any) error {
	return run(schema, v, true)
}

func run(schema json.RawMessage, v any, typesOnly bool) error {
	s, err := ParseSchema(schema)
	if err != nil {
		return err
	}
	if typesOnly {
		return s.CheckTypes(v)
	}
	return s.Validate(v)
}

// Schema is a JSON Schema decoded once, to check many values against; it is safe for concurrent use.
type Schema struct {
	s     any
	empty bool // no schema: everything passes
}

// ParseSchema decodes a JSON Schema (with Decode, so a const or enum number compares with a value's
// number exactly); empty input is the schema every value passes.
func ParseSchema(schema json.RawMessage) (*Schema, error) {
	if len(bytes.TrimSpace(schema)) == 0 {
		return &Schema{empty: true}, nil
	}
	s, err := Decode(schema)
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	return &Schema{s: s}, nil
}

// Validate is the package's Validate against s.
func (s *Schema) Validate(v any) error {
	if s.empty {
		return nil
	}
	return validator{}.validate(s.s, v, "$")
}

// CheckTypes is the package's CheckTypes against s.
func (s *Schema) CheckTypes(v any) error {
	if s.empty {
		return nil
	}
	return validator{typesOnly: true}.validate(s.s, v, "$")
}

// SchemaCache keeps decoded schemas by their text, up to a bound (then it starts over), so a schema checked on
// every call is decoded once. The zero value is ready; it is safe for concurrent use.
type SchemaCache struct {
	mu sync.Mutex
	m  map[string]*Schema
}

// maxCachedSchemas bounds a SchemaCache.
const maxCachedSchemas = 4096

// Get returns schema decoded, from the cache when it was decoded before.
func (c *SchemaCache) Get(schema json.RawMessage) (*Schema, error) {
	c.mu.Lock()
	s, ok := c.m[string(schema)]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := ParseSchema(schema)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedSchemas {
		c.m = map[string]*Schema{}
	}
	c.m[string(schema)] = s
	c.mu.Unlock()
	return s, nil
}

type validator struct{ typesOnly bool }

func (vd validator) validate(s any, v any, path string) error {
	switch sv := s.(type) {
	case bool:
		if !sv {
			return fmt.Errorf("%s: not allowed", path)
		}
		return nil
	case map[string]any:
		return vd.validateObject(sv, v, path)
	default:
		return nil
	}
}

func (vd validator) validateObject(s map[string]any, v any, path string) error {
	if t, ok := s["type"]; ok {
		types := typeList(t)
		if nb, _ := s["nullable"].(bool); nb {
			types = append(types, "null")
		}
		if len(types) > 0 && !matchesAny(types, v) {
			return fmt.Errorf("%s: want %s, got %s", path, strings.Join(types, " or "), kindOf(v))
		}
	}
	if c, ok := s["const"]; ok && !vd.typesOnly && !jsonEqual(c, v) {
		return fmt.Errorf("%s: must equal %s", path, compact(c))
	}
	if e, ok := s["enum"].([]any); ok && !vd.typesOnly {
		found := false
		for _, x := range e {
			if jsonEqual(x, v) {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("%s: %s is not one of %s", path, compact(v), compact(e))
		}
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			if err := vd.validate(sub, v, path); err != nil {
				return err
			}
		}
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		alts, ok := s[kw].([]any)
		if !ok || len(alts) == 0 {
			continue
		}
		var first error
		matched := false
		for _, sub := range alts {
			if err := vd.validate(sub, v, path); err == nil {
				matched = true
				break
			} else if first == nil {
				first = err
			}
		}
		if !matched {
			return fmt.Errorf("%s: matches no alternative of %s (first: %v)", path, kw, first)
		}
	}
	switch x := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		if req, ok := s["required"].([]any); ok && !vd.typesOnly {
			for _, r := range req {
				name, _ := r.(string)
				if _, present := x[name]; !present {
					return fmt.Errorf("%s: missing required field %q", path, name)
				}
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sub := fieldPath(path, k)
			if ps, ok := props[k]; ok {
				if err := vd.validate(ps, x[k], sub); err != nil {
					return err
				}
				continue
			}
			if ap, ok := s["additionalProperties"]; ok && !vd.typesOnly {
				if err := vd.validate(ap, x[k], sub); err != nil {
					if b, isBool := ap.(bool); isBool && !b {
						return fmt.Errorf("%s: unknown field", sub)
					}
					return err
				}
			}
		}
	case []any:
		if n, ok := number(s["minItems"]); ok && !vd.typesOnly && float64(len(x)) < n {
			return fmt.Errorf("%s: %d items, want at least %v", path, len(x), n)
		}
		if n, ok := number(s["maxItems"]); ok && !vd.typesOnly && float64(len(x)) > n {
			return fmt.Errorf("%s: %d items, want at most %v", path, len(x), n)
		}
		if items, ok := s["items"]; ok {
			for i, it := range x {
				if err := vd.validate(items, it, path+"["+strconv.Itoa(i)+"]"); err != nil {
					return err
				}
			}
		}
	case json.Number:
		f, err := x.Float64()
		if err == nil && !vd.typesOnly {
			if n, ok := number(s["minimum"]); ok && f < n {
				return fmt.Errorf("%s: %s is below the minimum %v", path, x, n)
			}
			if n, ok := number(s["maximum"]); ok && f > n {
				return fmt.Errorf("%s: %s is above the maximum %v", path, x, n)
			}
		}
	}
	return nil
}

func fieldPath(path, k string) string {
	for _, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return path + "[" + strconv.Quote(k) + "]"
		}
	}
	if k == "" {
		return path + `[""]`
	}
	return path + "." + k
}

func typeList(t any) []string {
	switch x := t.(type) {
	case string:
		return []string{x}
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func matchesAny(types []string, v any) bool {
	for _, t := range types {
		if matchesType(t, v) {
			return true
		}
	}
	return false
}

func matchesType(t string, v any) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		if _, err := n.Int64(); err == nil {
			return true
		}
		f, err := n.Float64()
		return err == nil && f == math.Trunc(f) && !math.IsInf(f, 0)
	}
	return true // unknown type names do not reject
}

func kindOf(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return "integer"
		}
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}

// jsonEqual is JSON equality of two decoded values: equal canonical bytes.
func jsonEqual(a, b any) bool {
	return bytes.Equal(Canonical(a), Canonical(b))
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Decode decodes one JSON document the way encoding/json does, for Validate and CheckTypes: objects are
// map[string]any, numbers stay exact (json.Number), trailing data is an error. (Parse keeps key order and
// number spelling instead; Canonical writes both forms the same.)
func Decode(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	var extra any
	if err := d.Decode(&extra); err == nil {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}
