package infer

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// ectx is what a write's value expressions see: the arguments, the row before the
// write, and inside loops the current element and pair index.
type ectx struct {
	m    *model
	args *jsonvalue.Object
	pre  *jsonvalue.Object
	elem any // the element a loop is at (its state before this write touched it)
	i    int // the pair index in a loop over argument lists; -1 outside
	// subs resolves nested objects by id (world.sub) while learning.
	subs map[string]map[string]*jsonvalue.Object
}

// vexpr is a value a write stores: it evaluates in Go while learning and prints as Starlark.
type vexpr interface {
	eval(c *ectx) (any, bool)
	code() string
}

type constE struct{ v any }

func (e constE) eval(*ectx) (any, bool) { return jsonvalue.Clone(e.v), true }
func (e constE) code() string           { return lit(e.v) }

// argE reads args at a path; sorted sorts a list of strings.
type argE struct {
	path   argPath
	sorted bool
}

func (e argE) eval(c *ectx) (any, bool) {
	v, ok := e.path.get(c.args)
	if !ok {
		return nil, false
	}
	if e.sorted {
		l, ok := v.([]any)
		if !ok {
			return nil, false
		}
		return sortedList(l)
	}
	return jsonvalue.Clone(v), true
}

func (e argE) code() string {
	if e.sorted {
		return "sorted(" + e.path.expr() + ")"
	}
	return e.path.expr()
}

func sortedList(l []any) (any, bool) {
	out := make([]any, len(l))
	copy(out, l)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0; j-- {
			a, ok1 := out[j-1].(string)
			b, ok2 := out[j].(string)
			if !ok1 || !ok2 {
				return nil, false
			}
			if b < a {
				out[j-1], out[j] = out[j], out[j-1]
			} else {
				break
			}
		}
	}
	return out, true
}

// pairArgE reads element i (or a fixed index) of an argument list in a pair loop.
type pairArgE struct {
	list argPath
	at   int // -1: the loop's index; -2: the last element; >= 0 fixed
}

func (e pairArgE) index(c *ectx, n int) int {
	switch e.at {
	case -1:
		return c.i
	case -2:
		return n - 1
	}
	return e.at
}

func (e pairArgE) eval(c *ectx) (any, bool) {
	v, ok := e.list.get(c.args)
	if !ok {
		return nil, false
	}
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	i := e.index(c, len(l))
	if i < 0 || i >= len(l) {
		return nil, false
	}
	return jsonvalue.Clone(l[i]), true
}

func (e pairArgE) code() string {
	switch e.at {
	case -1:
		return e.list.expr() + "[i]"
	case -2:
		return e.list.expr() + "[-1]"
	}
	return e.list.expr() + "[" + strconv.Itoa(e.at) + "]"
}

// rowE reads the row before the write (pre), or the loop element (elem), at a path.
type rowE struct {
	elem bool
	path []any // string keys, int indexes (-1 last)
}

func (e rowE) eval(c *ectx) (any, bool) {
	var cur any = c.pre
	if e.elem {
		cur = c.elem
	}
	for _, p := range e.path {
		switch x := p.(type) {
		case string:
			o, ok := cur.(*jsonvalue.Object)
			if !ok {
				return nil, false
			}
			if cur, ok = o.Get(x); !ok {
				return nil, false
			}
		case int:
			l, ok := cur.([]any)
			if !ok || len(l) == 0 {
				return nil, false
			}
			i := x
			if i < 0 {
				i = len(l) + i
			}
			if i < 0 || i >= len(l) {
				return nil, false
			}
			cur = l[i]
		}
	}
	return jsonvalue.Clone(cur), true
}

func (e rowE) code() string {
	var b strings.Builder
	if e.elem {
		b.WriteString("old")
	} else {
		b.WriteString("pre")
	}
	for _, p := range e.path {
		switch x := p.(type) {
		case string:
			b.WriteString("[" + strconv.Quote(x) + "]")
		case int:
			b.WriteString("[" + strconv.Itoa(x) + "]")
		}
	}
	return b.String()
}

// subE resolves a nested object by an id (world.sub) and reads a field of it.
type subE struct {
	table, index string
	key          vexpr
	field        string
}

func (e subE) eval(c *ectx) (any, bool) {
	k, ok := e.key.eval(c)
	if !ok {
		return nil, false
	}
	o := c.subs[e.table+"\x00"+e.index][jsonvalue.CanonicalText(k)]
	if o == nil {
		return nil, false
	}
	if e.field == "" {
		return jsonvalue.Clone(o), true
	}
	v, ok := o.Get(e.field)
	if !ok {
		return nil, false
	}
	return jsonvalue.Clone(v), true
}

func (e subE) code() string {
	s := fmt.Sprintf("world.sub(%q, %q, %s)", e.table, e.index, e.key.code())
	if e.field != "" {
		s += "[" + strconv.Quote(e.field) + "]"
	}
	return s
}

// numE is arithmetic with Python's semantics: ints stay exact, floats are IEEE doubles.
type numE struct {
	op   string // "neg", "abs", "round2", "+", "-"
	a, b vexpr
}

func (e numE) eval(c *ectx) (any, bool) {
	a, ok := e.a.eval(c)
	if !ok {
		return nil, false
	}
	an, ok := a.(jsonvalue.Number)
	if !ok {
		return nil, false
	}
	switch e.op {
	case "neg":
		return numNeg(an, c.m.style), true
	case "abs":
		if strings.HasPrefix(string(an), "-") {
			return numNeg(an, c.m.style), true
		}
		return an, true
	case "round2":
		if !an.IsFloat() {
			return an, true
		}
		return jsonvalue.Number(c.m.style.FormatFloat(twin.PyRound(an.Float64(), 2))), true
	}
	b, ok := e.b.eval(c)
	if !ok {
		return nil, false
	}
	bn, ok := b.(jsonvalue.Number)
	if !ok {
		return nil, false
	}
	return numBin(e.op, an, bn, c.m.style)
}

func (e numE) code() string {
	switch e.op {
	case "*":
		return paren(e.a.code()) + " * " + paren(e.b.code())
	case "neg":
		return "-" + paren(e.a.code())
	case "abs":
		return "abs(" + e.a.code() + ")"
	case "round2":
		return "round(" + e.a.code() + ", 2)"
	}
	return paren(e.a.code()) + " " + e.op + " " + paren(e.b.code())
}

func paren(s string) string {
	if strings.ContainsAny(s, " ") && !(strings.HasPrefix(s, "(") && strings.HasSuffix(s, ")")) {
		return "(" + s + ")"
	}
	return s
}

func numNeg(n jsonvalue.Number, st twin.Style) jsonvalue.Number {
	if !n.IsFloat() {
		var z big.Int
		if _, ok := z.SetString(string(n), 10); ok {
			return jsonvalue.Number(z.Neg(&z).String())
		}
	}
	return jsonvalue.Number(st.FormatFloat(-n.Float64()))
}

func numBin(op string, a, b jsonvalue.Number, st twin.Style) (any, bool) {
	if !a.IsFloat() && !b.IsFloat() {
		var x, y big.Int
		if _, ok := x.SetString(string(a), 10); !ok {
			return nil, false
		}
		if _, ok := y.SetString(string(b), 10); !ok {
			return nil, false
		}
		switch op {
		case "+":
			return jsonvalue.Number(x.Add(&x, &y).String()), true
		case "-":
			return jsonvalue.Number(x.Sub(&x, &y).String()), true
		case "*":
			return jsonvalue.Number(x.Mul(&x, &y).String()), true
		}
		return nil, false
	}
	fa, fb := a.Float64(), b.Float64()
	var r float64
	switch op {
	case "+":
		r = fa + fb
	case "-":
		r = fa - fb
	case "*":
		r = fa * fb
	default:
		return nil, false
	}
	return jsonvalue.Number(st.FormatFloat(r)), true
}

// pairSumE is Python's "d = 0; for each pair i: d += a_i - b_i" (or + a_i alone).
type pairSumE struct {
	lists []argPath // the argument lists the loop runs over together (the first sets the length)
	a, b  vexpr     // b may be nil
}

func (e pairSumE) eval(c *ectx) (any, bool) {
	v, ok := e.lists[0].get(c.args)
	if !ok {
		return nil, false
	}
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	var acc jsonvalue.Number = "0"
	for i := range l {
		cc := *c
		cc.i = i
		av, ok := e.a.eval(&cc)
		if !ok {
			return nil, false
		}
		an, ok := av.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		term := an
		if e.b != nil {
			bv, ok := e.b.eval(&cc)
			if !ok {
				return nil, false
			}
			bn, ok := bv.(jsonvalue.Number)
			if !ok {
				return nil, false
			}
			t, ok := numBin("-", an, bn, c.m.style)
			if !ok {
				return nil, false
			}
			term = t.(jsonvalue.Number)
		}
		s, ok := numBin("+", acc, term, c.m.style)
		if !ok {
			return nil, false
		}
		acc = s.(jsonvalue.Number)
	}
	return acc, true
}

// code is Python's left-to-right sum from int 0, as a comprehension.
func (e pairSumE) code() string {
	term := e.a.code()
	if e.b != nil {
		term = paren(e.a.code()) + " - " + paren(e.b.code())
	}
	return "fsum([" + term + " for i in range(len(" + e.lists[0].expr() + "))])"
}

// condE picks a or b by the sign of x (x > 0).
type condE struct {
	x    vexpr
	a, b vexpr
}

func (e condE) eval(c *ectx) (any, bool) {
	x, ok := e.x.eval(c)
	if !ok {
		return nil, false
	}
	n, ok := x.(jsonvalue.Number)
	if !ok {
		return nil, false
	}
	if n.Float64() > 0 {
		return e.a.eval(c)
	}
	return e.b.eval(c)
}

func (e condE) code() string {
	return e.a.code() + " if " + paren(e.x.code()) + " > 0 else " + e.b.code()
}

// objE builds an object, each field from its own expression, in this key order.
type objE struct {
	keys []string
	vals []vexpr
}

func (e objE) eval(c *ectx) (any, bool) {
	o := jsonvalue.NewObject(len(e.keys))
	for i, k := range e.keys {
		v, ok := e.vals[i].eval(c)
		if !ok {
			return nil, false
		}
		o.Set(k, v)
	}
	return o, true
}

func (e objE) code() string {
	var parts []string
	for i, k := range e.keys {
		parts = append(parts, strconv.Quote(k)+": "+e.vals[i].code())
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
