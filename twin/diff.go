package twin

import (
	"encoding/json"
	"errors"
	"sort"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// ErrOtherWorld: two sessions compared are not worlds of the same bundle.
var ErrOtherWorld = errors.New("sessions are not worlds of the same build")

// Change ops.
const (
	OpCreated = "created"
	OpDeleted = "deleted"
	OpUpdated = "updated"
)

// Change is one row's difference between two worlds: created (After set), deleted (Before set) or updated (Fields
// set). Rows are canonical JSON.
type Change struct {
	Entity string          `json:"entity"`
	Key    string          `json:"key"`
	Op     string          `json:"op"`
	Fields []FieldChange   `json:"fields,omitempty"`
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// FieldChange is one changed field of an updated row: Path is dotted through nested objects (arrays and scalars are
// compared whole); Old is absent when the field was added, New when it was removed.
type FieldChange struct {
	Path string          `json:"path"`
	Old  json.RawMessage `json:"old,omitempty"`
	New  json.RawMessage `json:"new,omitempty"`
}

// Diff answers the entity-level change from against's world to this session's world now, in a stable order
// (entities, then keys, then field paths, each sorted). A nil against compares with this session's opening world
// (after its seed rows, before its first call). Both sessions must run on the same runtime.
func (s *Session) Diff(against *Session) ([]Change, error) {
	to, opening, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	from := opening
	if against != nil {
		if against.rt != s.rt {
			return nil, ErrOtherWorld
		}
		if from, _, err = against.snapshot(); err != nil {
			return nil, err
		}
	}
	return s.rt.diff(from, to), nil
}

// rowIn answers a row of the world an overlay makes over the base.
func (rt *Runtime) rowIn(o overlay, table, key string) (*jsonvalue.Object, bool) {
	if r, ok := o[table][key]; ok {
		return r, r != nil
	}
	if bt := rt.tables[table]; bt != nil {
		r, ok := bt.rows[key]
		return r, ok
	}
	return nil, false
}

// changedKeys lists, sorted, the keys of table that either overlay holds: the only rows two worlds over the same
// base can differ in.
func changedKeys(from, to overlay, table string) []string {
	seen := map[string]bool{}
	for k := range from[table] {
		seen[k] = true
	}
	for k := range to[table] {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (rt *Runtime) diff(from, to overlay) []Change {
	out := []Change{}
	for _, table := range rt.tableNames {
		for _, k := range changedKeys(from, to, table) {
			a, aok := rt.rowIn(from, table, k)
			b, bok := rt.rowIn(to, table, k)
			switch {
			case !aok && !bok, a == b:
			case !aok:
				out = append(out, Change{Entity: table, Key: k, Op: OpCreated, After: jsonvalue.Canonical(b)})
			case !bok:
				out = append(out, Change{Entity: table, Key: k, Op: OpDeleted, Before: jsonvalue.Canonical(a)})
			default:
				if fs := fieldDiff(nil, "", a, b); len(fs) > 0 {
					out = append(out, Change{Entity: table, Key: k, Op: OpUpdated, Fields: fs})
				}
			}
		}
	}
	return out
}

// fieldDiff appends the changed fields of two objects, recursing into nested objects.
func fieldDiff(out []FieldChange, prefix string, a, b *jsonvalue.Object) []FieldChange {
	seen := make(map[string]bool, a.Len()+b.Len())
	keys := make([]string, 0, a.Len()+b.Len())
	for _, k := range append(append([]string(nil), a.Keys...), b.Keys...) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		va, oka := a.Get(k)
		vb, okb := b.Get(k)
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		oa, isObjA := va.(*jsonvalue.Object)
		ob, isObjB := vb.(*jsonvalue.Object)
		switch {
		case oka && okb && isObjA && isObjB:
			out = fieldDiff(out, path, oa, ob)
		case oka && okb && jsonvalue.Equal(va, vb):
		default:
			fc := FieldChange{Path: path}
			if oka {
				fc.Old = jsonvalue.Canonical(va)
			}
			if okb {
				fc.New = jsonvalue.Canonical(vb)
			}
			out = append(out, fc)
		}
	}
	return out
}

// ExpectationsFrom turns a diff into the expectations that hold exactly for its end state (Runtime.ExpectationsFrom).
func (s *Session) ExpectationsFrom(changes []Change) []Expectation {
	return s.rt.ExpectationsFrom(changes)
}
