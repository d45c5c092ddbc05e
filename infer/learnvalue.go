package infer

import (
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// fits reports whether e gives every target in its context.
func fits(e vexpr, targets []any, ctxs []*ectx) bool {
	for i := range targets {
		v, ok := e.eval(ctxs[i])
		if !ok || !jsonvalue.Identical(v, targets[i]) {
			return false
		}
	}
	return true
}

// learnValue finds an expression giving each target from its context, preferring
// what is most likely the rule: an argument, a field of the old row or element,
// a nested object found by id, an object built field by field, arithmetic over
// those, a choice by sign, and last a constant.
func (m *model) learnValue(name string, targets []any, ctxs []*ectx) (vexpr, bool) {
	if len(targets) == 0 {
		return nil, false
	}
	c0, t0 := ctxs[0], targets[0]
	for _, e := range m.directCandidates(c0, t0, name) {
		if fits(e, targets, ctxs) {
			return e, true
		}
	}
	// An object built field by field.
	if o0, ok := t0.(*jsonvalue.Object); ok {
		order := strings.Join(o0.Keys, "\x00")
		same := true
		for _, t := range targets {
			o, ok := t.(*jsonvalue.Object)
			if !ok || strings.Join(o.Keys, "\x00") != order {
				same = false
				break
			}
		}
		if same && o0.Len() > 0 {
			obj := objE{keys: o0.Keys}
			ok := true
			var numeric []vexpr
			var pending []int
			for ki, k := range o0.Keys {
				ts := make([]any, len(targets))
				for i, t := range targets {
					ts[i], _ = t.(*jsonvalue.Object).Get(k)
				}
				e, found := m.learnValue(k, ts, ctxs)
				if !found {
					pending = append(pending, ki)
					obj.vals = append(obj.vals, nil)
					continue
				}
				if _, isConst := e.(constE); isConst && !allSame(ts) {
					pending = append(pending, ki)
					obj.vals = append(obj.vals, nil)
					continue
				}
				obj.vals = append(obj.vals, e)
				if n, isNum := e.(numE); isNum && (n.op == "abs") {
					numeric = append(numeric, n.a)
				}
			}
			// Fields still unexplained may be chosen by the sign of a sibling's amount.
			for _, ki := range pending {
				k := o0.Keys[ki]
				ts := make([]any, len(targets))
				for i, t := range targets {
					ts[i], _ = t.(*jsonvalue.Object).Get(k)
				}
				e, found := m.signChoice(ts, ctxs, numeric)
				if !found {
					ok = false
					break
				}
				obj.vals[ki] = e
			}
			if ok {
				return obj, true
			}
		}
	}
	if _, ok := t0.(jsonvalue.Number); ok {
		if e, ok := m.numeric(targets, ctxs); ok {
			return e, true
		}
	}
	if allSame(targets) {
		return constE{v: t0}, true
	}
	return nil, false
}

func allSame(ts []any) bool {
	for _, t := range ts[1:] {
		if !jsonvalue.Identical(t, ts[0]) {
			return false
		}
	}
	return true
}

// directCandidates are expressions whose value in the first context equals the first target,
// those named like the field being learned first.
func (m *model) directCandidates(c *ectx, t any, name string) []vexpr {
	out := m.directCandidatesAll(c, t)
	if name == "" {
		return out
	}
	key := func(e vexpr) int {
		r := 0
		switch x := e.(type) {
		case rowE:
			r = 2
			if x.elem {
				r = 1
			}
		case subE:
			r = 3
		}
		r *= 2
		if lastName(e) != name {
			r++
		}
		return r
	}
	sort.SliceStable(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out
}

// lastName is the last key an expression reads.
func lastName(e vexpr) string {
	switch x := e.(type) {
	case argE:
		if n := len(x.path); n > 0 {
			if s, ok := x.path[n-1].(string); ok {
				return s
			}
		}
	case rowE:
		if n := len(x.path); n > 0 {
			if s, ok := x.path[n-1].(string); ok {
				return s
			}
		}
	case subE:
		return x.field
	}
	return ""
}

func (m *model) directCandidatesAll(c *ectx, t any) []vexpr {
	var out []vexpr
	add := func(e vexpr) {
		if v, ok := e.eval(c); ok && jsonvalue.Identical(v, t) {
			out = append(out, e)
		}
	}
	// Pair-loop elements first: inside a loop over argument lists they are the rule.
	if c.i >= 0 {
		for _, l := range argLists(c.args) {
			add(pairArgE{list: l, at: -1})
		}
	}
	for _, p := range argPaths(c.args) {
		add(argE{path: p})
	}
	for _, l := range argLists(c.args) {
		add(argE{path: l, sorted: true})
	}
	if c.elem != nil {
		for _, p := range valuePaths(c.elem, 3) {
			add(rowE{elem: true, path: p})
		}
	}
	for _, p := range valuePaths(c.pre, 3) {
		add(rowE{path: p})
	}
	for _, k := range m.subKeyExprs(c) {
		for _, name := range m.subNames() {
			tn, ix := splitSub(name)
			add(subE{table: tn, index: ix, key: k})
			if o := c.subs[name]; o != nil {
				kv, ok := k.eval(c)
				if !ok {
					continue
				}
				if so := o[jsonvalue.CanonicalText(kv)]; so != nil {
					for _, f := range so.Keys {
						add(subE{table: tn, index: ix, key: k, field: f})
					}
				}
			}
		}
	}
	return out
}

// argPaths are the paths of every argument value (scalars, lists and objects), top level first.
func argPaths(args *jsonvalue.Object) []argPath {
	var out []argPath
	var walk func(p argPath, v any, depth int)
	walk = func(p argPath, v any, depth int) {
		if len(p) > 0 {
			out = append(out, p)
		}
		if depth > 3 {
			return
		}
		switch x := v.(type) {
		case *jsonvalue.Object:
			for i, k := range x.Keys {
				walk(append(append(argPath{}, p...), k), x.Vals[i], depth+1)
			}
		case []any:
			for i, e := range x {
				if i > 3 {
					break
				}
				walk(append(append(argPath{}, p...), i), e, depth+1)
			}
		}
	}
	walk(nil, args, 0)
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) < len(out[j]) })
	return out
}

// valuePaths are the paths into a row or element: object keys, and a list's first and last element.
func valuePaths(v any, depth int) [][]any {
	var out [][]any
	var walk func(p []any, v any, d int)
	walk = func(p []any, v any, d int) {
		if len(p) > 0 {
			out = append(out, p)
		}
		if d >= depth {
			return
		}
		switch x := v.(type) {
		case *jsonvalue.Object:
			for i, k := range x.Keys {
				walk(append(append([]any{}, p...), k), x.Vals[i], d+1)
			}
		case []any:
			if len(x) > 0 {
				walk(append(append([]any{}, p...), 0), x[0], d+1)
				if len(x) > 1 {
					walk(append(append([]any{}, p...), -1), x[len(x)-1], d+1)
				}
			}
		}
	}
	walk(nil, v, 0)
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) < len(out[j]) })
	return out
}

// subKeyExprs are the id-like values a nested object may be found by: scalar
// arguments, and in a pair loop the loop's, first and last list elements.
func (m *model) subKeyExprs(c *ectx) []vexpr {
	var out []vexpr
	for _, l := range argLists(c.args) {
		if c.i >= 0 {
			out = append(out, pairArgE{list: l, at: -1})
		}
		out = append(out, pairArgE{list: l, at: -2}, pairArgE{list: l, at: 0})
	}
	for i, k := range c.args.Keys {
		if _, ok := c.args.Vals[i].(string); ok {
			out = append(out, argE{path: argPath{k}})
		}
	}
	return out
}

// numeric searches arithmetic over numbers the context holds: sums over argument
// lists of values found by id, differences, negation, absolute value, rounding.
func (m *model) numeric(targets []any, ctxs []*ectx) (vexpr, bool) {
	return m.numericWhere(targets, ctxs, nil)
}

// numericWhere is numeric keeping only expressions accept allows (nil: all).
func (m *model) numericWhere(targets []any, ctxs []*ectx, accept func(vexpr) bool) (vexpr, bool) {
	fits := func(e vexpr, targets []any, ctxs []*ectx) bool {
		return fits(e, targets, ctxs) && (accept == nil || accept(e))
	}
	c0 := ctxs[0]
	atoms := m.numericAtoms(c0)
	if len(atoms) > maxAtoms {
		atoms = atoms[:maxAtoms]
	}
	tryForms := func(x vexpr) (vexpr, bool) {
		for _, e := range []vexpr{x, numE{op: "neg", a: x}, numE{op: "abs", a: x}, numE{op: "round2", a: x},
			numE{op: "abs", a: numE{op: "round2", a: x}}} {
			if fits(e, targets, ctxs) {
				return e, true
			}
		}
		return nil, false
	}
	for _, a := range atoms {
		if e, ok := tryForms(a); ok {
			return e, true
		}
	}
	for _, a := range atoms {
		for _, b := range atoms {
			for _, op := range []string{"+", "-"} {
				if op == "+" && a.code() > b.code() {
					continue
				}
				if e, ok := tryForms(numE{op: op, a: a, b: b}); ok {
					return e, true
				}
			}
		}
	}
	// A whole-number rate times a number or a difference (a fee per unit added).
	t0, _ := targets[0].(jsonvalue.Number)
	scaled := func(x vexpr) (vexpr, bool) {
		v, ok := x.eval(c0)
		n, isNum := v.(jsonvalue.Number)
		if !ok || !isNum || n.IsFloat() || t0.IsFloat() || n == "0" {
			return nil, false
		}
		rate, ok := numDivExact(t0, n)
		if !ok {
			return nil, false
		}
		e := numE{op: "*", a: constE{v: rate}, b: x}
		return e, fits(e, targets, ctxs)
	}
	for _, a := range atoms {
		if e, ok := scaled(a); ok {
			return e, true
		}
	}
	for _, a := range atoms {
		for _, b := range atoms {
			if a.code() == b.code() {
				continue
			}
			if e, ok := scaled(numE{op: "-", a: a, b: b}); ok {
				return e, true
			}
		}
	}
	return nil, false
}

// maxAtoms bounds the numbers arithmetic is searched over (pairs are tried, so the
// search grows with its square).
const maxAtoms = 64

// numericAtoms lists number-valued expressions in a context.
func (m *model) numericAtoms(c *ectx) []vexpr {
	var out []vexpr
	isNum := func(e vexpr) bool {
		v, ok := e.eval(c)
		if !ok {
			return false
		}
		_, ok = v.(jsonvalue.Number)
		return ok
	}
	for _, p := range argPaths(c.args) {
		if e := (argE{path: p}); isNum(e) {
			out = append(out, e)
		}
	}
	if c.elem != nil {
		for _, p := range valuePaths(c.elem, 3) {
			if e := (rowE{elem: true, path: p}); isNum(e) {
				out = append(out, e)
			}
		}
	}
	for _, p := range valuePaths(c.pre, 3) {
		if e := (rowE{path: p}); isNum(e) {
			out = append(out, e)
		}
	}
	// Sums over argument lists of numbers found through them: by id in nested objects of
	// the world, or among the row's own list elements.
	lists := argLists(c.args)
	var resolvers []func(key vexpr) []vexpr
	at0 := *c
	at0.i = 0
	resolvers = append(resolvers, func(key vexpr) []vexpr {
		var r []vexpr
		kv, ok := key.eval(&at0)
		if !ok {
			return nil
		}
		for _, lp := range rowObjectLists(c.pre) {
			l, _ := c.pre.Get(lp)
			for _, el := range l.([]any) {
				o, ok := el.(*jsonvalue.Object)
				if !ok {
					continue
				}
				for fi, f := range o.Keys {
					if jsonvalue.Identical(o.Vals[fi], kv) {
						for gi, g := range o.Keys {
							if _, ok := o.Vals[gi].(jsonvalue.Number); ok {
								r = append(r, findE{list: lp, field: f, key: key, get: g})
							}
						}
					}
				}
			}
		}
		return r
	})
	resolvers = append(resolvers, func(key vexpr) []vexpr {
		var r []vexpr
		kv, ok := key.eval(&at0)
		if !ok {
			return nil
		}
		for _, name := range m.subNames() {
			tn, ix := splitSub(name)
			if so := c.subs[name][jsonvalue.CanonicalText(kv)]; so != nil {
				for fi, f := range so.Keys {
					if _, ok := so.Vals[fi].(jsonvalue.Number); ok {
						r = append(r, subE{table: tn, index: ix, key: key, field: f})
					}
				}
			}
		}
		return r
	})
	var terms [][]vexpr // per list: resolvable numeric terms of its i-th element
	for _, l := range lists {
		v, _ := l.get(c.args)
		if n, _ := v.([]any); len(n) == 0 {
			terms = append(terms, nil)
			continue
		}
		var ts []vexpr
		for _, res := range resolvers {
			ts = append(ts, res(pairArgE{list: l, at: -1})...)
		}
		terms = append(terms, ts)
	}
	for li, l := range lists {
		for _, a := range terms[li] {
			out = append(out, pairSumE{lists: []argPath{l}, a: a})
		}
		for lj, l2 := range lists {
			if len(lists) > 1 && lj == li {
				continue
			}
			for _, a := range terms[li] {
				for _, b := range terms[lj] {
					if a.code() == b.code() {
						continue
					}
					out = append(out, pairSumE{lists: []argPath{l, l2}, a: a, b: b})
				}
			}
		}
	}
	return out
}

// rowObjectLists are the row's top-level fields holding lists of objects.
func rowObjectLists(row *jsonvalue.Object) []string {
	var out []string
	for i, k := range row.Keys {
		if l, ok := row.Vals[i].([]any); ok && len(l) > 0 {
			if _, ok := l[0].(*jsonvalue.Object); ok {
				out = append(out, k)
			}
		}
	}
	return out
}

// findE reads a field of the first element of the row's list whose id field equals key.
type findE struct {
	list  string
	field string
	key   vexpr
	get   string
}

func (e findE) eval(c *ectx) (any, bool) {
	kv, ok := e.key.eval(c)
	if !ok {
		return nil, false
	}
	l, ok := c.pre.Get(e.list)
	if !ok {
		return nil, false
	}
	ls, ok := l.([]any)
	if !ok {
		return nil, false
	}
	for _, el := range ls {
		o, ok := el.(*jsonvalue.Object)
		if !ok {
			continue
		}
		if f, ok := o.Get(e.field); ok && jsonvalue.Identical(f, kv) {
			v, ok := o.Get(e.get)
			if !ok {
				return nil, false
			}
			return jsonvalue.Clone(v), true
		}
	}
	return nil, false
}

func (e findE) code() string {
	return "[x for x in pre[" + strconv.Quote(e.list) + "] if x[" + strconv.Quote(e.field) + "] == " + e.key.code() + "][0][" + strconv.Quote(e.get) + "]"
}

// signChoice explains a field taking one of two values by the sign of an amount.
func (m *model) signChoice(targets []any, ctxs []*ectx, numeric []vexpr) (vexpr, bool) {
	var vals []any
	for _, t := range targets {
		dup := false
		for _, v := range vals {
			if jsonvalue.Identical(v, t) {
				dup = true
			}
		}
		if !dup {
			vals = append(vals, t)
		}
	}
	if len(vals) != 2 {
		return nil, false
	}
	for _, x := range numeric {
		for _, pair := range [][2]any{{vals[0], vals[1]}, {vals[1], vals[0]}} {
			e := condE{x: x, a: constE{v: pair[0]}, b: constE{v: pair[1]}}
			if fits(e, targets, ctxs) {
				return e, true
			}
		}
	}
	return nil, false
}

// numDivExact answers a/b when both are integers and b divides a.
func numDivExact(a, b jsonvalue.Number) (jsonvalue.Number, bool) {
	x, ok1 := new(big.Int).SetString(string(a), 10)
	y, ok2 := new(big.Int).SetString(string(b), 10)
	if !ok1 || !ok2 || y.Sign() == 0 {
		return "", false
	}
	q, r := new(big.Int).QuoRem(x, y, new(big.Int))
	if r.Sign() != 0 {
		return "", false
	}
	return jsonvalue.Number(q.String()), true
}
