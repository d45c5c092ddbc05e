package infer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/twin"
)

// pexpr is a precondition: true means the call is refused.
type pexpr interface {
	eval(c *ectx) (bool, bool)
	code() string
}

// fieldNotIn: a field of the row is none of the values successful calls saw.
type fieldNotIn struct {
	path []any
	vals []any
}

func (p fieldNotIn) eval(c *ectx) (bool, bool) {
	v, ok := rowE{path: p.path}.eval(c)
	if !ok {
		return false, false
	}
	for _, x := range p.vals {
		if twin.Identical(v, x) {
			return false, true
		}
	}
	return true, true
}

func (p fieldNotIn) code() string {
	f := rowE{path: p.path}.code()
	if len(p.vals) == 1 {
		return f + " != " + lit(p.vals[0])
	}
	return f + " not in " + lit(p.vals)
}

// listLenNot: a list of the row does not have the length successful calls saw.
type listLenNot struct {
	path []any
	n    int
}

func (p listLenNot) eval(c *ectx) (bool, bool) {
	v, ok := rowE{path: p.path}.eval(c)
	if !ok {
		return false, false
	}
	l, ok := v.([]any)
	if !ok {
		return false, false
	}
	return len(l) != p.n, true
}

func (p listLenNot) code() string {
	return "len(" + rowE{path: p.path}.code() + ") != " + strconv.Itoa(p.n)
}

// lenDiffer: two argument lists differ in length.
type lenDiffer struct{ a, b argPath }

func (p lenDiffer) lists(c *ectx) ([]any, []any, bool) {
	av, ok1 := p.a.get(c.args)
	bv, ok2 := p.b.get(c.args)
	a, ok3 := av.([]any)
	b, ok4 := bv.([]any)
	return a, b, ok1 && ok2 && ok3 && ok4
}

func (p lenDiffer) eval(c *ectx) (bool, bool) {
	a, b, ok := p.lists(c)
	if !ok {
		return false, false
	}
	return len(a) != len(b), true
}

func (p lenDiffer) code() string {
	return "len(" + p.a.expr() + ") != len(" + p.b.expr() + ")"
}

// pairEqual: two argument lists hold the same value at some position.
type pairEqual struct{ a, b argPath }

func (p pairEqual) eval(c *ectx) (bool, bool) {
	a, b, ok := lenDiffer(p).lists(c)
	if !ok {
		return false, false
	}
	for i := 0; i < len(a) && i < len(b); i++ {
		if twin.Identical(a[i], b[i]) {
			return true, true
		}
	}
	return false, true
}

func (p pairEqual) code() string {
	return fmt.Sprintf("len([i for i in range(min(len(%s), len(%s))) if %s[i] == %s[i]]) > 0",
		p.a.expr(), p.b.expr(), p.a.expr(), p.b.expr())
}

// argNotField: an argument differs from a field of the row.
type argNotField struct {
	arg  argPath
	path []any
}

func (p argNotField) eval(c *ectx) (bool, bool) {
	a, ok1 := p.arg.get(c.args)
	v, ok2 := rowE{path: p.path}.eval(c)
	if !ok1 || !ok2 {
		return false, false
	}
	return !twin.Identical(a, v), true
}

func (p argNotField) code() string {
	return p.arg.expr() + " != " + rowE{path: p.path}.code()
}

type guard struct {
	pred pexpr
	text []part
	rank int
}

func renderParts(ps []part, args *twin.Object) (string, bool) {
	var b strings.Builder
	for _, p := range ps {
		if p.path == nil {
			b.WriteString(p.lit)
			continue
		}
		v, ok := p.path.get(args)
		if !ok {
			return "", false
		}
		s, ok := scalarText(v)
		if !ok {
			return "", false
		}
		b.WriteString(s)
	}
	return b.String(), true
}

// learnGuards turns recorded refusals into preconditions: for each kind of error
// text, a condition on the row or the arguments that holds for every refused call
// and for no successful one.
func (m *model) learnGuards(ti *toolInfo, succ, fails []wex, ctxFn func(wex) *ectx) ([]guard, int) {
	if len(fails) == 0 {
		return nil, 0
	}
	groups := map[string][]wex{}
	var order []string
	for _, f := range fails {
		k := partsKey(templateOf(f.c.text, f.c.args))
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], f)
	}
	sctx := make([]*ectx, len(succ))
	for i, x := range succ {
		sctx[i] = ctxFn(x)
	}
	holds := func(p pexpr, cs []*ectx, want bool) bool {
		for _, c := range cs {
			v, ok := p.eval(c)
			if !ok {
				if want {
					return false
				}
				continue
			}
			if v != want {
				return false
			}
		}
		return true
	}
	var guards []guard
	unexplained := 0
	for _, k := range order {
		g := groups[k]
		tmpl, ok := commonTemplate(calls(g))
		if !ok || len(succ) == 0 {
			unexplained += len(g)
			continue
		}
		gctx := make([]*ectx, len(g))
		for i, x := range g {
			gctx[i] = ctxFn(x)
		}
		found := false
		for rank, p := range m.guardCandidates(gctx[0], sctx) {
			if holds(p, gctx, true) && holds(p, sctx, false) {
				guards = append(guards, guard{pred: p, text: tmpl, rank: rank})
				found = true
				break
			}
		}
		if !found {
			unexplained += len(g)
		}
	}
	sort.SliceStable(guards, func(i, j int) bool { return guardKind(guards[i].pred) < guardKind(guards[j].pred) })
	// Every refusal must get its own text from the first guard that fires.
	for _, f := range fails {
		c := ctxFn(f)
		for _, g := range guards {
			if v, ok := g.pred.eval(c); ok && v {
				if txt, ok := renderParts(g.text, f.c.args); !ok || txt != f.c.text {
					unexplained++
				}
				break
			}
		}
	}
	return guards, unexplained
}

func calls(xs []wex) []*call {
	out := make([]*call, len(xs))
	for i, x := range xs {
		out[i] = x.c
	}
	return out
}

func guardKind(p pexpr) int {
	switch p.(type) {
	case fieldNotIn:
		return 0
	case listLenNot:
		return 1
	case lenDiffer:
		return 2
	case pairEqual:
		return 3
	}
	return 4
}

// guardCandidates lists preconditions worth trying, built from one refused call and the successes.
func (m *model) guardCandidates(c *ectx, succ []*ectx) []pexpr {
	var out []pexpr
	scalar := func(v any) bool {
		switch v.(type) {
		case string, twin.Number, bool, nil:
			return true
		}
		return false
	}
	for _, p := range valuePaths(c.pre, 3) {
		v, ok := rowE{path: p}.eval(c)
		if !ok {
			continue
		}
		if scalar(v) {
			var vals []any
			good := true
			for _, s := range succ {
				sv, ok := rowE{path: p}.eval(s)
				if !ok || !scalar(sv) {
					good = false
					break
				}
				dup := false
				for _, x := range vals {
					if twin.Identical(x, sv) {
						dup = true
					}
				}
				if !dup {
					vals = append(vals, sv)
				}
			}
			// A condition on values that vary call by call (ids) would only memorize.
			if good && len(vals) > 0 && len(vals) <= 4 && (len(vals) == 1 || 2*len(vals) <= len(succ)) {
				out = append(out, fieldNotIn{path: p, vals: vals})
			}
		}
		if _, ok := v.([]any); ok && len(succ) > 0 {
			sv, ok := rowE{path: p}.eval(succ[0])
			if l, isList := sv.([]any); ok && isList {
				out = append(out, listLenNot{path: p, n: len(l)})
			}
		}
	}
	lists := argLists(c.args)
	for i, a := range lists {
		for _, b := range lists[i+1:] {
			out = append(out, lenDiffer{a, b}, pairEqual{a, b})
		}
	}
	for _, ap := range argPaths(c.args) {
		if v, ok := ap.get(c.args); !ok || !scalar(v) {
			continue
		}
		for _, p := range valuePaths(c.pre, 3) {
			out = append(out, argNotField{arg: ap, path: p})
		}
	}
	return out
}
