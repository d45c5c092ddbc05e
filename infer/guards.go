package infer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
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
		if jsonvalue.Identical(v, x) {
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
		if jsonvalue.Identical(a[i], b[i]) {
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
	return !jsonvalue.Identical(a, v), true
}

func (p argNotField) code() string {
	return p.arg.expr() + " != " + rowE{path: p.path}.code()
}

// loopSub: some element of an argument list names no nested object, or one whose
// field has a value no successful call saw (a new item that is not available).
type loopSub struct {
	list        argPath
	table, name string
	field       string
	vals        []any
}

// failAt answers the first index the condition holds at, or -1.
func (p loopSub) failAt(c *ectx) (int, bool) {
	v, ok := p.list.get(c.args)
	if !ok {
		return -1, false
	}
	l, ok := v.([]any)
	if !ok {
		return -1, false
	}
	idx := c.subs[p.table+"\x00"+p.name]
	for i, e := range l {
		o := idx[jsonvalue.CanonicalText(e)]
		if o == nil {
			return i, true
		}
		f, ok := o.Get(p.field)
		if !ok {
			return i, true
		}
		in := false
		for _, x := range p.vals {
			if jsonvalue.Identical(f, x) {
				in = true
			}
		}
		if !in {
			return i, true
		}
	}
	return -1, true
}

func (p loopSub) eval(c *ectx) (bool, bool) {
	i, ok := p.failAt(c)
	return i >= 0, ok
}

func (p loopSub) code() string {
	sub := fmt.Sprintf("world.sub(%q, %q, %s[i])", p.table, p.name, p.list.expr())
	cond := sub + " == None or " + sub + "[" + strconv.Quote(p.field) + "]"
	if len(p.vals) == 1 {
		cond += " != " + lit(p.vals[0])
	} else {
		cond += " not in " + lit(p.vals)
	}
	return cond
}

// maxGuardCandidates bounds the conditions tried per kind of error answer.
const maxGuardCandidates = 2000

type guard struct {
	pred pexpr
	text []part
}

var numberWords = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}

// textWords are the lower-case words of a text.
func textWords(s string) map[string]bool {
	out := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	}) {
		out[w] = true
	}
	return out
}

func pathWords(p []any, into map[string]bool) {
	for _, e := range p {
		if s, ok := e.(string); ok {
			for w := range textWords(s) {
				into[w] = true
			}
		}
	}
}

// predWords are the words a condition would be described with.
func predWords(p pexpr) map[string]bool {
	out := map[string]bool{}
	switch x := p.(type) {
	case fieldNotIn:
		pathWords(x.path, out)
		for _, v := range x.vals {
			if s, ok := scalarText(v); ok {
				for w := range textWords(s) {
					out[w] = true
				}
			}
		}
	case listLenNot:
		pathWords(x.path, out)
		out[strconv.Itoa(x.n)] = true
		if x.n < len(numberWords) {
			out[numberWords[x.n]] = true
		}
	case lenDiffer:
		pathWords(argPathAny(x.a), out)
		pathWords(argPathAny(x.b), out)
		out["number"], out["match"], out["length"] = true, true, true
	case pairEqual:
		pathWords(argPathAny(x.a), out)
		pathWords(argPathAny(x.b), out)
		out["same"], out["different"] = true, true
	case argNotField:
		pathWords(argPathAny(x.arg), out)
		pathWords(x.path, out)
	case loopSub:
		pathWords(argPathAny(x.list), out)
		out[x.field] = true
		out["found"] = true
		for w := range textWords(x.field) {
			out[w] = true
		}
	}
	return out
}

func argPathAny(p argPath) []any { return []any(p) }

func overlap(a, b map[string]bool) int {
	n := 0
	for w := range b {
		if a[w] {
			n++
		}
	}
	return n
}

// renderParts writes a template's text for these arguments; at is the loop index a
// loop template's element references stand for.
func renderParts(ps []part, args *jsonvalue.Object, at int) (string, bool) {
	var b strings.Builder
	for _, p := range ps {
		if p.path == nil {
			b.WriteString(p.lit)
			continue
		}
		v, ok := p.path.getAt(args, at)
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
		// Of the conditions that separate refusals from successes, the one the error
		// text talks about (its words name the field, the value or the count).
		var best pexpr
		words := textWords(g[0].c.text)
		cands := m.guardCandidates(gctx[0], sctx)
		if len(cands) > maxGuardCandidates {
			cands = cands[:maxGuardCandidates]
		}
		// The first candidate by (score descending, candidate order) that separates is the one a scan of
		// every candidate keeping the strictly better score would pick; lower scores need not be scanned
		// against every success once one separates.
		scores := make([]int, len(cands))
		byScore := make([]int, len(cands))
		for i, p := range cands {
			scores[i], byScore[i] = overlap(words, predWords(p)), i
		}
		sort.SliceStable(byScore, func(a, b int) bool { return scores[byScore[a]] > scores[byScore[b]] })
		for _, i := range byScore {
			if p := cands[i]; holds(p, gctx, true) && holds(p, sctx, false) {
				best = p
				break
			}
		}
		if best == nil {
			unexplained += len(g)
			continue
		}
		guards = append(guards, guard{pred: best, text: tmpl})
	}
	sort.SliceStable(guards, func(i, j int) bool { return guardKind(guards[i].pred) < guardKind(guards[j].pred) })
	// A loop condition's text names the element it failed at.
	for gi, g := range guards {
		if ls, ok := g.pred.(loopSub); ok {
			guards[gi].text = loopParts(g.text, ls.list)
		}
	}
	// Every refusal must get its own text from the first guard that fires.
	for _, f := range fails {
		c := ctxFn(f)
		for _, g := range guards {
			if v, ok := g.pred.eval(c); ok && v {
				at := -1
				if ls, ok := g.pred.(loopSub); ok {
					at, _ = ls.failAt(c)
				}
				if txt, ok := renderParts(g.text, f.c.args, at); !ok || txt != f.c.text {
					unexplained++
				}
				break
			}
		}
	}
	return guards, unexplained
}

// loopParts makes a template's references to elements of the loop's list refer to the loop's element.
func loopParts(ps []part, list argPath) []part {
	out := make([]part, len(ps))
	for i, p := range ps {
		out[i] = p
		if len(p.path) == len(list)+1 && p.path[:len(list)].key() == list.key() {
			if _, ok := p.path[len(list)].(int); ok {
				np := append(append(argPath{}, list...), loopIndex)
				out[i] = part{path: np}
			}
		}
	}
	return out
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

// maxNotIn and maxLoopVals are the most distinct values a condition on a field may list (more
// would only memorize ids).
const (
	maxNotIn    = 4
	maxLoopVals = 2
)

// containsIdentical reports whether xs holds a value identical to v (xs stays short: at most one
// past the limits above).
func containsIdentical(xs []any, v any) bool {
	for _, x := range xs {
		if jsonvalue.Identical(x, v) {
			return true
		}
	}
	return false
}

// guardCandidates lists preconditions worth trying, built from one refused call and the successes.
func (m *model) guardCandidates(c *ectx, succ []*ectx) []pexpr {
	var out []pexpr
	scalar := func(v any) bool {
		switch v.(type) {
		case string, jsonvalue.Number, bool, nil:
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
				if !containsIdentical(vals, sv) {
					vals = append(vals, sv)
				}
				if len(vals) > maxNotIn {
					// Too many distinct values for a condition: stop looking (the test below fails the same way).
					good = false
					break
				}
			}
			// A condition on values that vary call by call (ids) would only memorize.
			if good && len(vals) > 0 && len(vals) <= maxNotIn && (len(vals) == 1 || 2*len(vals) <= len(succ)) {
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
	// Elements of argument lists that must name available nested objects.
	for _, l := range lists {
		for _, id := range m.subNames() {
			tn, name := splitSub(id)
			idx := c.subs[id]
			fieldVals := map[string][]any{}
			var fieldOrder []string
			resolvable := len(succ) > 0
			for _, s := range succ {
				v, ok := l.get(s.args)
				els, ok2 := v.([]any)
				if !ok || !ok2 {
					resolvable = false
					break
				}
				for _, e := range els {
					o := idx[jsonvalue.CanonicalText(e)]
					if o == nil {
						resolvable = false
						break
					}
					for fi, f := range o.Keys {
						if !scalar(o.Vals[fi]) {
							continue
						}
						if _, seen := fieldVals[f]; !seen {
							fieldOrder = append(fieldOrder, f)
						}
						// More than maxLoopVals distinct values rule the field out: one past it is enough to know.
						if fv := fieldVals[f]; len(fv) <= maxLoopVals && !containsIdentical(fv, o.Vals[fi]) {
							fieldVals[f] = append(fv, o.Vals[fi])
						}
					}
				}
			}
			if !resolvable {
				continue
			}
			for _, f := range fieldOrder {
				if vals := fieldVals[f]; len(vals) <= maxLoopVals && len(vals)*2 <= len(succ)+1 {
					out = append(out, loopSub{list: l, table: tn, name: name, field: f, vals: vals})
				}
			}
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
