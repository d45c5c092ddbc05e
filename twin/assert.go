package twin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Expectation is one end-state expectation of the grading language. It names what it looks at — the world's hash
// (StateHash), an entity table (Entity), one row (Key) or one field of a row (Field, a dotted path; a number
// segment indexes an array: "items.0.price") — and exactly one predicate:
//
//   - equals: the row (no field) or field holds this JSON value
//   - exists: the row or field is there (true) or not (false)
//   - unchanged / changed: the row, field or — with no key — every row of the entity (but the keys in except) is
//     the same as (differs from) the baseline: the opening world, or another session of the same build
//   - state_hash: the whole world hashes to this
type Expectation struct {
	Entity    string          `json:"entity,omitempty"`
	Key       *string         `json:"key,omitempty"`
	Field     string          `json:"field,omitempty"`
	Equals    json.RawMessage `json:"equals,omitempty"`
	Exists    *bool           `json:"exists,omitempty"`
	Unchanged bool            `json:"unchanged,omitempty"`
	Changed   bool            `json:"changed,omitempty"`
	Except    []string        `json:"except,omitempty"`
	StateHash string          `json:"state_hash,omitempty"`
}

// Outcome is one expectation's verdict with what was observed: the value now (null when absent; for an entity, the
// keys that changed), and for unchanged/changed the baseline's value.
type Outcome struct {
	Pass     bool            `json:"pass"`
	Observed json.RawMessage `json:"observed"`
	Baseline json.RawMessage `json:"baseline,omitempty"`
	Detail   string          `json:"detail"`
}

// ExpectError locates an expectation that is not well formed: Field is its field (entity, key, equals, …).
type ExpectError struct {
	Index  int
	Field  string
	Detail string
}

func (e *ExpectError) Error() string {
	return fmt.Sprintf("expect[%d].%s: %s", e.Index, e.Field, e.Detail)
}

// Check reports the first expectation that is not well formed against this runtime's entities.
func (rt *Runtime) Check(exps []Expectation) error {
	return CheckExpectations(rt.tableNames, exps)
}

// CheckExpectations reports the first expectation that is not well formed against a build's entities (its tables'
// names), as a runtime of the build checks them: a task's expectations are checked before its episode opens.
func CheckExpectations(tableNames []string, exps []Expectation) error {
	hasTable := func(name string) bool {
		for _, t := range tableNames {
			if t == name {
				return true
			}
		}
		return false
	}
	for i, e := range exps {
		bad := func(field, format string, args ...any) error {
			return &ExpectError{Index: i, Field: field, Detail: fmt.Sprintf(format, args...)}
		}
		n := 0
		for _, set := range []bool{e.Equals != nil, e.Exists != nil, e.Unchanged, e.Changed, e.StateHash != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			return bad("equals", "give exactly one of equals, exists, unchanged, changed, state_hash (got %d)", n)
		}
		if e.StateHash != "" {
			if e.Entity != "" || e.Key != nil || e.Field != "" || len(e.Except) > 0 {
				return bad("state_hash", "a state_hash expectation names no entity, key, field or except")
			}
			continue
		}
		if e.Entity == "" {
			return bad("entity", "required: one of %s", strings.Join(tableNames, ", "))
		}
		if !hasTable(e.Entity) {
			return bad("entity", "no entity %q in this build (entities: %s)", e.Entity, strings.Join(tableNames, ", "))
		}
		if e.Key == nil {
			if !e.Unchanged && !e.Changed {
				return bad("key", "required unless the predicate is unchanged or changed over the whole entity")
			}
			if e.Field != "" {
				return bad("field", "a field needs a key")
			}
			continue
		}
		if len(e.Except) > 0 {
			return bad("except", "except goes with an entity-wide unchanged or changed, not with a key")
		}
		if e.Equals != nil && !json.Valid(e.Equals) {
			return bad("equals", "not valid JSON")
		}
	}
	return nil
}

// Assert checks expectations against this session's world now. The baseline of unchanged/changed is against's
// world, or this session's opening world when against is nil. Call Check first: Assert answers an ExpectError too.
func (s *Session) Assert(exps []Expectation, against *Session) ([]Outcome, error) {
	if err := s.rt.Check(exps); err != nil {
		return nil, err
	}
	now, opening, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	hash := s.StateHash()
	base := opening
	if against != nil {
		if against.rt != s.rt {
			return nil, ErrOtherWorld
		}
		if base, _, err = against.snapshot(); err != nil {
			return nil, err
		}
	}
	out := make([]Outcome, len(exps))
	for i, e := range exps {
		out[i] = s.rt.assert(e, now, base, hash)
	}
	return out, nil
}

func (rt *Runtime) assert(e Expectation, now, base overlay, hash string) Outcome {
	if e.StateHash != "" {
		o := Outcome{Pass: hash == e.StateHash, Observed: mustJSON(hash)}
		o.Detail = verdict(o.Pass, "the world hashes to "+hash)
		return o
	}
	if e.Key == nil {
		except := map[string]bool{}
		for _, k := range e.Except {
			except[k] = true
		}
		changed := []string{}
		for _, k := range changedKeys(base, now, e.Entity) {
			a, aok := rt.rowIn(base, e.Entity, k)
			b, bok := rt.rowIn(now, e.Entity, k)
			if except[k] || (aok == bok && (!aok || jsonvalue.Equal(a, b))) {
				continue
			}
			changed = append(changed, k)
		}
		o := Outcome{Observed: mustJSON(changed), Pass: (len(changed) == 0) == e.Unchanged}
		what := fmt.Sprintf("%d %s rows changed", len(changed), e.Entity)
		if len(e.Except) > 0 {
			what += fmt.Sprintf(" besides the %d excepted", len(e.Except))
		}
		o.Detail = verdict(o.Pass, what)
		return o
	}
	cur, curOK := rt.valueIn(now, e.Entity, *e.Key, e.Field)
	o := Outcome{Observed: jsonOrNull(cur, curOK)}
	where := e.Entity + " " + strconv.Quote(*e.Key)
	if e.Field != "" {
		where += " " + e.Field
	}
	switch {
	case e.Equals != nil:
		want, err := jsonvalue.Parse(e.Equals)
		o.Pass = err == nil && curOK && jsonvalue.Equal(cur, want)
		switch {
		case !curOK:
			o.Detail = verdict(false, where+" is absent")
		default:
			o.Detail = verdict(o.Pass, where+" is "+string(o.Observed))
		}
	case e.Exists != nil:
		o.Pass = curOK == *e.Exists
		o.Detail = verdict(o.Pass, where+map[bool]string{true: " exists", false: " is absent"}[curOK])
	default:
		was, wasOK := rt.valueIn(base, e.Entity, *e.Key, e.Field)
		o.Baseline = jsonOrNull(was, wasOK)
		same := curOK == wasOK && (!curOK || jsonvalue.Equal(cur, was))
		o.Pass = same == e.Unchanged
		o.Detail = verdict(o.Pass, where+map[bool]string{true: " is as in the baseline", false: " differs from the baseline"}[same])
	}
	return o
}

// valueIn reads a row, or a field of it, in the world an overlay makes.
func (rt *Runtime) valueIn(o overlay, table, key, path string) (any, bool) {
	row, ok := rt.rowIn(o, table, key)
	if !ok {
		return nil, false
	}
	if path == "" {
		return row, true
	}
	if bt := rt.tables[table]; bt != nil && !bt.def.KeyInRow && path == bt.def.Key {
		return key, true
	}
	var v any = row
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case *jsonvalue.Object:
			if v, ok = x.Get(seg); !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func verdict(pass bool, what string) string {
	if pass {
		return "pass: " + what
	}
	return "fail: " + what
}

func jsonOrNull(v any, ok bool) json.RawMessage {
	if !ok {
		return json.RawMessage("null")
	}
	return jsonvalue.Canonical(v)
}

func mustJSON(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSpace(b.Bytes())
}

// ExpectationsFrom turns a diff into expectations that hold exactly for its end state: per entity, no row changed
// but those the diff names; each created row equals its new value; each deleted row is absent; each changed field
// holds its new value (or is absent). A reference run's diff so becomes a grader for other runs.
func (rt *Runtime) ExpectationsFrom(changes []Change) []Expectation {
	byTable := map[string][]Change{}
	for _, c := range changes {
		byTable[c.Entity] = append(byTable[c.Entity], c)
	}
	out := []Expectation{}
	no := false
	for _, table := range rt.tableNames {
		cs := byTable[table]
		e := Expectation{Entity: table, Unchanged: true}
		for _, c := range cs {
			e.Except = append(e.Except, c.Key)
		}
		out = append(out, e)
		for _, c := range cs {
			key := c.Key
			switch c.Op {
			case OpCreated:
				out = append(out, Expectation{Entity: table, Key: &key, Equals: c.After})
			case OpDeleted:
				out = append(out, Expectation{Entity: table, Key: &key, Exists: &no})
			default:
				for _, f := range c.Fields {
					if f.New == nil {
						out = append(out, Expectation{Entity: table, Key: &key, Field: f.Path, Exists: &no})
					} else {
						out = append(out, Expectation{Entity: table, Key: &key, Field: f.Path, Equals: f.New})
					}
				}
			}
		}
	}
	return out
}
