package twin

import (
	"errors"
	"fmt"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
)

// A starTemplate is a model value converted to Starlark once, from which world.get builds each handler's private,
// mutable copy without converting again: its leaves (None, booleans, numbers, strings) are immutable Starlark
// values shared by every copy, and only its dicts and lists are made afresh. build(makeTemplate(v)) equals
// toStar(v): the same dicts with the same keys in the same order, the same lists, the same leaves.
type starTemplate struct {
	leaf  starlark.Value   // an immutable value; nil for a dict or a list
	keys  []starlark.Value // a dict's keys (starlark.String), in order
	elems []starTemplate   // a dict's values (beside keys) or a list's elements
	dict  bool
	size  int64 // what a copy takes, as structSize counts it (a provided handler's world.get is charged it)
}

// makeTemplate converts a model value, as toStar does, into a template.
func makeTemplate(v any) starTemplate {
	switch x := v.(type) {
	case []any:
		t := starTemplate{elems: make([]starTemplate, len(x)), size: headBytes}
		for i, e := range x {
			t.elems[i] = makeTemplate(e)
			t.size += slotBytes + t.elems[i].size
		}
		return t
	case *jsonvalue.Object:
		t := starTemplate{dict: true, keys: make([]starlark.Value, len(x.Keys)), elems: make([]starTemplate, len(x.Keys)), size: headBytes}
		for i, k := range x.Keys {
			t.keys[i] = starlark.String(k)
			t.elems[i] = makeTemplate(x.Vals[i])
			t.size += entryBytes + headBytes + t.elems[i].size
		}
		return t
	}
	leaf := toStar(v)
	return starTemplate{leaf: leaf, size: structSize(leaf, 1<<62)}
}

// build makes a fresh, mutable Starlark value from the template.
func (t *starTemplate) build() starlark.Value {
	if t.leaf != nil {
		return t.leaf
	}
	if t.dict {
		d := starlark.NewDict(len(t.keys))
		for i, k := range t.keys {
			_ = d.SetKey(k, t.elems[i].build())
		}
		return d
	}
	elems := make([]starlark.Value, len(t.elems))
	for i := range t.elems {
		elems[i] = t.elems[i].build()
	}
	return starlark.NewList(elems)
}

// rowStar is a fresh Starlark copy of row (table, key) as world.get answers it. A base row — immutable and shared
// by every session — is converted once per runtime and copied from its template after; any other row (a
// session's own, one made up) is converted each time: measured over long-lived sessions, keeping templates of
// a session's own rows cost more (a template made for a row read once, more heap for the GC to mark) than it saved.
func (s *Session) rowStar(table, key string, row *jsonvalue.Object) starlark.Value {
	v, _ := s.rowStarSized(table, key, row, -1)
	return v
}

// rowStarSized is rowStar with what the copy takes as structSize counts it, walking no further than limit (-1: the
// size is not wanted).
func (s *Session) rowStarSized(table, key string, row *jsonvalue.Object, limit int64) (starlark.Value, int64) {
	bt := s.rt.tables[table]
	if bt == nil || bt.rows[key] != row {
		v := toStar(row)
		if limit < 0 {
			return v, 0
		}
		return v, structSize(v, limit)
	}
	if t, ok := bt.stars.Load(key); ok {
		t := t.(*starTemplate)
		return t.build(), t.size
	}
	t := makeTemplate(row)
	bt.stars.Store(key, &t)
	return t.build(), t.size
}

// deepCopyStar is deepcopy(x): the value toStar(fromStar(x)) converts to — dicts and lists made afresh (tuples and
// sets become lists, a dict's non-string keys their text), immutable leaves shared — with fromStar's errors, without
// the model value in between.
func deepCopyStar(v starlark.Value, depth int) (starlark.Value, error) {
	if depth > jsonvalue.MaxDepth {
		return nil, errors.New("value nested too deeply")
	}
	switch x := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.String, starlark.Int, starlark.Float:
		return x, nil
	case *starlark.List:
		elems := make([]starlark.Value, x.Len())
		for i := range elems {
			e, err := deepCopyStar(x.Index(i), depth+1)
			if err != nil {
				return nil, err
			}
			elems[i] = e
		}
		return starlark.NewList(elems), nil
	case starlark.Tuple:
		elems := make([]starlark.Value, len(x))
		for i := range x {
			e, err := deepCopyStar(x[i], depth+1)
			if err != nil {
				return nil, err
			}
			elems[i] = e
		}
		return starlark.NewList(elems), nil
	case *starlark.Dict:
		c := dictCopy{d: starlark.NewDict(x.Len()), depth: depth}
		x.Entries()(c.entry) // in order, without Items' copy of the entries
		if c.err != nil {
			return nil, c.err
		}
		return c.d, nil
	case *starlark.Set:
		var elems []starlark.Value
		iter := x.Iterate()
		defer iter.Done()
		var e starlark.Value
		for iter.Next(&e) {
			c, err := deepCopyStar(e, depth+1)
			if err != nil {
				return nil, err
			}
			elems = append(elems, c)
		}
		return starlark.NewList(elems), nil
	}
	return nil, fmt.Errorf("a %s cannot be part of an answer or a row", v.Type())
}

// dictCopy copies a dict's entries, as deepCopyStar copies a dict, stopping at the first error.
type dictCopy struct {
	d     *starlark.Dict
	depth int
	err   error
}

func (c *dictCopy) entry(k, v starlark.Value) bool {
	if _, ok := k.(starlark.String); !ok {
		k = starlark.String(k.String())
	}
	var e starlark.Value
	if e, c.err = deepCopyStar(v, c.depth+1); c.err != nil {
		return false
	}
	_ = c.d.SetKey(k, e)
	return true
}
