package infer

// The statements a learned write is made of: each applies itself to a row at build time (fit and self-check) and
// writes itself as Starlark for the synthesized handler.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// stmt is one step of a learned write, applied to the row being changed.
type stmt interface {
	apply(c *ectx, row *jsonvalue.Object) bool
	code(b *strings.Builder, indent string)
}

// objAt walks object keys from the row.
func objAt(row *jsonvalue.Object, path []string) (*jsonvalue.Object, bool) {
	cur := row
	for _, p := range path {
		v, ok := cur.Get(p)
		if !ok {
			return nil, false
		}
		if cur, ok = v.(*jsonvalue.Object); !ok {
			return nil, false
		}
	}
	return cur, true
}

// listAt returns the list at path in row and the object holding it.
func listAt(row *jsonvalue.Object, path []string) (*jsonvalue.Object, []any, bool) {
	parent, ok := objAt(row, path[:len(path)-1])
	if !ok {
		return nil, nil, false
	}
	cur, _ := parent.Get(path[len(path)-1])
	l, ok := cur.([]any)
	return parent, l, ok
}

func pathCode(root string, path []string) string {
	var b strings.Builder
	b.WriteString(root)
	for _, p := range path {
		b.WriteString("[" + strconv.Quote(p) + "]")
	}
	return b.String()
}

// setS stores a value at path/key.
type setS struct {
	path []string
	key  string
	val  vexpr
}

func (s setS) apply(c *ectx, row *jsonvalue.Object) bool {
	o, ok := objAt(row, s.path)
	if !ok {
		return false
	}
	v, ok := s.val.eval(c)
	if !ok {
		return false
	}
	o.Set(s.key, v)
	return true
}

func (s setS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%s%s = %s\n", ind, pathCode("row", append(append([]string{}, s.path...), s.key)), s.val.code())
}

// delS removes path/key.
type delS struct {
	path []string
	key  string
}

func (s delS) apply(c *ectx, row *jsonvalue.Object) bool {
	o, ok := objAt(row, s.path)
	if !ok {
		return false
	}
	o.Delete(s.key)
	return true
}

func (s delS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%s%s.pop(%q, None)\n", ind, pathCode("row", s.path), s.key)
}

// appendEachS appends one new element per element the list had before the write.
type appendEachS struct {
	path []string
	val  vexpr
}

func (s appendEachS) apply(c *ectx, row *jsonvalue.Object) bool {
	before, ok := rowE{path: toAny(s.path)}.eval(c)
	if !ok {
		return false
	}
	bl, ok := before.([]any)
	if !ok {
		return false
	}
	parent, l, ok := listAt(row, s.path)
	if !ok {
		return false
	}
	for _, e := range bl {
		cc := *c
		cc.elem = e
		v, ok := s.val.eval(&cc)
		if !ok {
			return false
		}
		l = append(l, v)
	}
	parent.Set(s.path[len(s.path)-1], l)
	return true
}

func (s appendEachS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%sfor old in %s:\n", ind, pathCode("pre", s.path))
	fmt.Fprintf(b, "%s    %s.append(%s)\n", ind, pathCode("row", s.path), s.val.code())
}

// appendS appends fixed new elements.
type appendS struct {
	path []string
	vals []vexpr
}

func (s appendS) apply(c *ectx, row *jsonvalue.Object) bool {
	parent, l, ok := listAt(row, s.path)
	if !ok {
		return false
	}
	for _, e := range s.vals {
		v, ok := e.eval(c)
		if !ok {
			return false
		}
		l = append(l, v)
	}
	parent.Set(s.path[len(s.path)-1], l)
	return true
}

func (s appendS) code(b *strings.Builder, ind string) {
	for _, e := range s.vals {
		fmt.Fprintf(b, "%s%s.append(%s)\n", ind, pathCode("row", s.path), e.code())
	}
}

// appendIfS appends an element when a number of it is not zero.
type appendIfS struct {
	path []string
	val  objE
	cond int // the index in val of the number that must not be zero
}

func (s appendIfS) apply(c *ectx, row *jsonvalue.Object) bool {
	v, ok := s.val.vals[s.cond].eval(c)
	if !ok {
		return false
	}
	if n, ok := v.(jsonvalue.Number); !ok || n.Float64() == 0 {
		return ok
	}
	return appendS{path: s.path, vals: []vexpr{s.val}}.apply(c, row)
}

func (s appendIfS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%sif %s != 0:\n", ind, paren(s.val.vals[s.cond].code()))
	fmt.Fprintf(b, "%s    %s.append(%s)\n", ind, pathCode("row", s.path), s.val.code())
}

// updateS changes, for each element of an argument list, the first list element whose id field equals it.
type updateS struct {
	path  []string // the list in the row
	field string   // the id field of its elements
	list  argPath  // the argument list naming elements
	keys  []string
	vals  []vexpr
}

func (s updateS) apply(c *ectx, row *jsonvalue.Object) bool {
	v, ok := s.list.get(c.args)
	if !ok {
		return false
	}
	ids, ok := v.([]any)
	if !ok {
		return false
	}
	_, l, ok := listAt(row, s.path)
	if !ok {
		return false
	}
	for i, id := range ids {
		for _, e := range l {
			o, ok := e.(*jsonvalue.Object)
			if !ok {
				continue
			}
			f, ok := o.Get(s.field)
			if !ok || !jsonvalue.Identical(f, id) {
				continue
			}
			cc := *c
			cc.i = i
			cc.elem = jsonvalue.Clone(o)
			for k, key := range s.keys {
				nv, ok := s.vals[k].eval(&cc)
				if !ok {
					return false
				}
				o.Set(key, nv)
			}
			break
		}
	}
	return true
}

func (s updateS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%sfor i in range(len(%s)):\n", ind, s.list.expr())
	fmt.Fprintf(b, "%s    for it in %s:\n", ind, pathCode("row", s.path))
	fmt.Fprintf(b, "%s        if it[%q] == %s[i]:\n", ind, s.field, s.list.expr())
	fmt.Fprintf(b, "%s            old = deepcopy(it)\n", ind)
	for k, key := range s.keys {
		fmt.Fprintf(b, "%s            it[%q] = %s\n", ind, key, s.vals[k].code())
	}
	fmt.Fprintf(b, "%s            break\n", ind)
}

// replaceS replaces the whole row (when the write reorders its fields).
type replaceS struct{ val objE }

func (s replaceS) apply(c *ectx, row *jsonvalue.Object) bool {
	v, ok := s.val.eval(c)
	if !ok {
		return false
	}
	o := v.(*jsonvalue.Object)
	row.Keys, row.Vals = o.Keys, o.Vals
	return true
}

func (s replaceS) code(b *strings.Builder, ind string) {
	fmt.Fprintf(b, "%srow = %s\n", ind, s.val.code())
}

func toAny(p []string) []any {
	out := make([]any, len(p))
	for i, s := range p {
		out[i] = s
	}
	return out
}
