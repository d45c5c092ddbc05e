package infer

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// wex is one recorded write: the target row before it, the arguments and the answer.
type wex struct {
	c    *call
	pre  *jsonvalue.Object
	post *jsonvalue.Object // nil for an error answer
}

// learnAppendIf explains a list that gains one element in some calls and none in others.
func (m *model) learnAppendIf(path []string, before, after [][]any, ctxs []*ectx) (stmt, bool) {
	var ts []any
	var with, without []*ectx
	for i := range before {
		switch len(after[i]) - len(before[i]) {
		case 1:
			ts = append(ts, after[i][len(before[i])])
			with = append(with, ctxs[i])
		case 0:
			without = append(without, ctxs[i])
		default:
			return nil, false
		}
	}
	if len(with) == 0 || len(without) == 0 {
		return nil, false
	}
	e, ok := m.learnValue("", ts, with)
	if !ok {
		return nil, false
	}
	obj, ok := e.(objE)
	if !ok {
		return nil, false
	}
	zeroWithout := func(e vexpr) bool {
		for _, c := range without {
			x, ok := e.eval(c)
			if n, isNum := x.(jsonvalue.Number); !ok || !isNum || n.Float64() != 0 {
				return false
			}
		}
		return true
	}
	nonzeroWith := func(e vexpr) bool {
		for _, c := range with {
			x, ok := e.eval(c)
			if n, isNum := x.(jsonvalue.Number); !ok || !isNum || n.Float64() == 0 {
				return false
			}
		}
		return true
	}
	for k, v := range obj.vals {
		fts := make([]any, len(ts))
		for i, t := range ts {
			fts[i], _ = t.(*jsonvalue.Object).Get(obj.keys[k])
		}
		if _, isNum := fts[0].(jsonvalue.Number); !isNum {
			continue
		}
		if _, isConst := v.(constE); isConst || !zeroWithout(v) || !nonzeroWith(v) {
			// The amount must also be zero exactly when nothing was appended (a fee per unit added).
			nv, ok := m.numericWhere(fts, with, func(e vexpr) bool { return zeroWithout(e) && nonzeroWith(e) })
			if !ok {
				continue
			}
			vals := append([]vexpr(nil), obj.vals...)
			vals[k] = nv
			obj = objE{keys: obj.keys, vals: vals}
		}
		return appendIfS{path: path, val: obj, cond: k}, true
	}
	return nil, false
}

// writeExamples collects a write's recorded calls with the target row's state before each. One pass over
// the traces collects every write tool's (kept in m.wexs until synthesis is done): a pass per tool cost
// seconds per write in a large build.
func (m *model) writeExamples(ti *toolInfo) []wex {
	if m.wexs == nil {
		m.wexs = m.allWriteExamples()
	}
	return m.wexs[ti.name]
}

func (m *model) allWriteExamples() map[string][]wex {
	out := map[string][]wex{}
	for _, t := range m.traces {
		v := m.newView()
		for _, c := range t.calls {
			if m.tools[c.tool].write && c.answer && c.args != nil {
				if tn, k, ok := m.target(c); ok {
					if pre, ok := v.get(tn, k); ok {
						x := wex{c: c, pre: pre}
						if c.success {
							if o, ok := c.val.(*jsonvalue.Object); ok && c.isJSON {
								x.post = o
							}
						}
						if c.success && x.post == nil {
							// A success that is not the row: not this kind of write.
						} else {
							out[c.tool] = append(out[c.tool], x)
						}
					}
				}
			}
			v.observe(c)
		}
	}
	return out
}

// synthWrite learns a write's effect on its target row from the rows before and
// after each recorded call, and its refusals from the recorded error answers.
func (m *model) synthWrite(ti *toolInfo) {
	ti.kind = twin.KindWrite
	if m.synthTemplate(ti) || m.synthConstant(ti) || (ti.table == "" && m.synthPure(ti)) {
		return
	}
	ti.kind = twin.KindWrite
	if ti.table == "" || ti.keyArg == "" {
		ti.notes = append(ti.notes, "write answered from recordings: it does not answer with a row it changed")
		return
	}
	exs := m.writeExamples(ti)
	var succ, fails []wex
	for _, x := range exs {
		if x.post != nil {
			succ = append(succ, x)
		} else {
			fails = append(fails, x)
		}
	}
	subs := m.subIndex()
	ctx := func(x wex) *ectx {
		return &ectx{m: m, args: x.c.args, pre: x.pre, i: -1, subs: subs}
	}
	var stmts []stmt
	learned := false
	if len(succ) > 0 {
		pres := make([]*jsonvalue.Object, len(succ))
		posts := make([]*jsonvalue.Object, len(succ))
		ctxs := make([]*ectx, len(succ))
		for i, x := range succ {
			pres[i], posts[i], ctxs[i] = x.pre, x.post, ctx(x)
		}
		var why string
		stmts, why = m.learnObject(nil, pres, posts, ctxs)
		learned = why == ""
		if learned {
			// Check the whole program on every example.
			for i, x := range succ {
				row := jsonvalue.Clone(x.pre).(*jsonvalue.Object)
				for _, s := range stmts {
					if !s.apply(ctxs[i], row) {
						learned = false
						break
					}
				}
				if !learned || !jsonvalue.Identical(row, x.post) {
					learned = false
					why = "the learned changes do not reproduce every recorded answer"
					break
				}
			}
		}
		if !learned {
			ti.notes = append(ti.notes, "effect of a successful call not learned: "+why)
		}
	}
	guards, unexplained := m.learnGuards(ti, succ, fails, ctx)
	if unexplained > 0 {
		ti.notes = append(ti.notes, fmt.Sprintf("%d recorded error answer(s) not explained by a precondition", unexplained))
	}
	if learned {
		guards = append(guards, m.successGuards(ti.table, succ, guards)...)
	}
	if !learned && len(guards) == 0 {
		return
	}
	t := m.tables[ti.table]
	var b strings.Builder
	b.WriteString(header(
		fmt.Sprintf("%s changes one %s row, named by argument %q.", ti.name, t.name, ti.keyArg),
		fmt.Sprintf("Learned from %d successful calls and %d error answers (rows before and after each).", len(succ), len(fails))))
	fmt.Fprintf(&b, "def %s(args):\n", funcName(ti.name))
	fmt.Fprintf(&b, "    key = args.get(%q)\n", ti.keyArg)
	fmt.Fprintf(&b, "    row = world.get(%q, key)\n", t.name)
	b.WriteString("    if row == None:\n")
	b.WriteString("        " + m.notFound(ti) + "\n")
	b.WriteString("    pre = deepcopy(row)\n")
	for _, g := range guards {
		if ls, ok := g.pred.(loopSub); ok {
			fmt.Fprintf(&b, "    for i in range(len(%s)):\n", ls.list.expr())
			fmt.Fprintf(&b, "        if %s:\n", g.pred.code())
			fmt.Fprintf(&b, "            return error(%s)\n", templateExpr(g.text))
			continue
		}
		fmt.Fprintf(&b, "    if %s:\n", g.pred.code())
		fmt.Fprintf(&b, "        return error(%s)\n", templateExpr(g.text))
	}
	if !learned {
		b.WriteString("    return decline(\"the recordings do not show how a successful call changes the row\")\n")
		ti.source = b.String()
		return
	}
	for _, s := range stmts {
		s.code(&b, "    ")
	}
	fmt.Fprintf(&b, "    world.put(%q, key, row)\n", t.name)
	b.WriteString("    return row\n")
	ti.source = b.String()
}

// learnObject explains how each example's object at path changed. It answers the
// steps, or why it could not.
func (m *model) learnObject(path []string, pres, posts []*jsonvalue.Object, ctxs []*ectx) ([]stmt, string) {
	var keys []string
	seen := map[string]bool{}
	for _, o := range posts {
		for _, k := range o.Keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	for _, o := range pres {
		for _, k := range o.Keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	var stmts []stmt
	var added, sameNamed []string
	for _, k := range keys {
		inPre, inPost := 0, 0
		same := true
		for i := range pres {
			pv, pok := pres[i].Get(k)
			qv, qok := posts[i].Get(k)
			if pok {
				inPre++
			}
			if qok {
				inPost++
			}
			if !pok || !qok || !jsonvalue.Identical(pv, qv) {
				same = false
			}
		}
		n := len(pres)
		switch {
		case same && inPre == n && inPost == n:
			// Inside an object the write fills from arguments, a field equal to the argument of its
			// name in every example is that argument (it only happened not to change).
			if len(path) > 0 && namedArgFits(k, posts, ctxs) {
				sameNamed = append(sameNamed, k)
			}
			continue
		case inPost == 0 && inPre > 0:
			stmts = append(stmts, delS{path: path, key: k})
			continue
		case inPost != n:
			return nil, fmt.Sprintf("field %s is present in some answers only", strings.Join(append(append([]string{}, path...), k), "."))
		}
		if inPre < n {
			added = append(added, k)
		}
		targets := make([]any, n)
		for i := range posts {
			targets[i], _ = posts[i].Get(k)
		}
		sub := append(append([]string{}, path...), k)
		if inPre == n {
			// Objects changed inside: recurse.
			subPres, subPosts, objs := make([]*jsonvalue.Object, n), make([]*jsonvalue.Object, n), true
			for i := range pres {
				pv, _ := pres[i].Get(k)
				a, ok1 := pv.(*jsonvalue.Object)
				b, ok2 := targets[i].(*jsonvalue.Object)
				if !ok1 || !ok2 {
					objs = false
					break
				}
				subPres[i], subPosts[i] = a, b
			}
			if objs {
				if ss, why := m.learnObject(sub, subPres, subPosts, ctxs); why == "" {
					stmts = append(stmts, ss...)
					continue
				}
			}
			if ss, ok := m.learnList(sub, pres, targets, ctxs); ok {
				stmts = append(stmts, ss...)
				continue
			}
		}
		e, ok := m.learnValue(k, targets, ctxs)
		if !ok {
			return nil, fmt.Sprintf("no rule explains field %s", strings.Join(sub, "."))
		}
		stmts = append(stmts, setS{path: path, key: k, val: e})
	}
	if setsFromArgs(stmts) {
		for _, k := range sameNamed {
			stmts = append(stmts, setS{path: path, key: k, val: argE{path: argPath{k}}})
		}
	}
	sortLikeSiblings(stmts, path, posts, ctxs)
	// Key order: kept keys keep their place, new keys come last in the order set.
	for i := range pres {
		var order []string
		for _, k := range pres[i].Keys {
			if _, ok := posts[i].Get(k); ok {
				order = append(order, k)
			}
		}
		order = append(order, added...)
		if strings.Join(order, "\x00") != strings.Join(posts[i].Keys, "\x00") {
			return m.rebuildObject(path, pres, posts, ctxs)
		}
	}
	return stmts, ""
}

func namedArgFits(k string, posts []*jsonvalue.Object, ctxs []*ectx) bool {
	for i, p := range posts {
		v, _ := p.Get(k)
		a, ok := ctxs[i].args.Get(k)
		if !ok || !jsonvalue.Identical(a, v) {
			return false
		}
	}
	return true
}

func setsFromArgs(stmts []stmt) bool {
	for _, s := range stmts {
		if st, ok := s.(setS); ok {
			if _, ok := st.val.(argE); ok {
				return true
			}
		}
	}
	return false
}

// rebuildObject explains an object whose fields were reordered: it is built anew.
func (m *model) rebuildObject(path []string, pres, posts []*jsonvalue.Object, ctxs []*ectx) ([]stmt, string) {
	order := posts[0].Keys
	for _, p := range posts[1:] {
		if strings.Join(p.Keys, "\x00") != strings.Join(order, "\x00") {
			return nil, "fields come back in different orders"
		}
	}
	obj := objE{keys: order}
	for _, k := range order {
		targets := make([]any, len(posts))
		for i := range posts {
			targets[i], _ = posts[i].Get(k)
		}
		// A field that did not change reads the old one.
		unchanged := true
		for i := range pres {
			pv, ok := pres[i].Get(k)
			if !ok || !jsonvalue.Identical(pv, targets[i]) {
				unchanged = false
				break
			}
		}
		var e vexpr
		if unchanged {
			e = rowE{path: toAny(append(append([]string{}, path...), k))}
		} else {
			var ok bool
			if e, ok = m.learnValue(k, targets, ctxs); !ok {
				return nil, "no rule explains field " + strings.Join(append(append([]string{}, path...), k), ".")
			}
		}
		obj.vals = append(obj.vals, e)
	}
	if len(path) == 0 {
		return []stmt{replaceS{val: obj}}, ""
	}
	return []stmt{setS{path: path[:len(path)-1], key: path[len(path)-1], val: obj}}, ""
}

// learnList explains a list field's change: elements appended (one per old element,
// or a fixed number), or elements named by an argument list updated in place.
func (m *model) learnList(path []string, pres []*jsonvalue.Object, targets []any, ctxs []*ectx) ([]stmt, bool) {
	n := len(pres)
	before := make([][]any, n)
	after := make([][]any, n)
	for i := range pres {
		pv, _ := pres[i].Get(path[len(path)-1])
		a, ok1 := pv.([]any)
		b, ok2 := targets[i].([]any)
		if !ok1 || !ok2 {
			return nil, false
		}
		before[i], after[i] = a, b
	}
	// The list as a field of the row: pres here are the parent objects, so paths are relative to the row.
	appended := true
	for i := range before {
		if len(after[i]) < len(before[i]) {
			appended = false
			break
		}
		for j := range before[i] {
			if !jsonvalue.Identical(before[i][j], after[i][j]) {
				appended = false
				break
			}
		}
	}
	if appended {
		each := true
		fixed := len(after[0]) - len(before[0])
		some := false
		for i := range before {
			k := len(after[i]) - len(before[i])
			if k != len(before[i]) {
				each = false
			}
			if k != fixed {
				fixed = -1
			}
			if k > 0 {
				some = true
			}
		}
		if each && some {
			var ts []any
			var cs []*ectx
			for i := range before {
				for j, e := range before[i] {
					cc := *ctxs[i]
					cc.elem = e
					cs = append(cs, &cc)
					ts = append(ts, after[i][len(before[i])+j])
				}
			}
			// One new element per old one is the rule only if each new element is made from its old one.
			if e, ok := m.learnValue("", ts, cs); ok && strings.Contains(e.code(), "old[") {
				return []stmt{appendEachS{path: path, val: e}}, true
			}
		}
		// One element appended in some calls and none in others: appended when its amount is not zero.
		if fixed < 0 && !each {
			if st, ok := m.learnAppendIf(path, before, after, ctxs); ok {
				return []stmt{st}, true
			}
		}
		if fixed > 0 {
			var vals []vexpr
			ok := true
			for j := 0; j < fixed && ok; j++ {
				ts := make([]any, n)
				for i := range before {
					ts[i] = after[i][len(before[i])+j]
				}
				var e vexpr
				if e, ok = m.learnValue("", ts, ctxs); ok {
					vals = append(vals, e)
				}
			}
			if ok {
				return []stmt{appendS{path: path, vals: vals}}, true
			}
		}
		if each && some {
			var ts []any
			var cs []*ectx
			for i := range before {
				for j, e := range before[i] {
					cc := *ctxs[i]
					cc.elem = e
					cs = append(cs, &cc)
					ts = append(ts, after[i][len(before[i])+j])
				}
			}
			if e, ok := m.learnValue("", ts, cs); ok {
				return []stmt{appendEachS{path: path, val: e}}, true
			}
		}
		return nil, false
	}
	return m.learnUpdate(path, before, after, ctxs)
}

// learnUpdate explains same-length lists of objects whose elements named by an
// argument list changed in place.
func (m *model) learnUpdate(path []string, before, after [][]any, ctxs []*ectx) ([]stmt, bool) {
	for i := range before {
		if len(before[i]) != len(after[i]) || len(before[i]) == 0 {
			return nil, false
		}
	}
	first, ok := before[0][0].(*jsonvalue.Object)
	if !ok {
		return nil, false
	}
	for _, idField := range first.Keys {
		for _, list := range argLists(ctxs[0].args) {
			st, ok := m.tryUpdate(path, idField, list, before, after, ctxs)
			if ok {
				return []stmt{st}, true
			}
		}
	}
	return nil, false
}

// argLists are the argument paths holding lists of scalars.
func argLists(args *jsonvalue.Object) []argPath {
	var out []argPath
	for i, k := range args.Keys {
		if l, ok := args.Vals[i].([]any); ok {
			scalars := true
			for _, e := range l {
				if _, ok := scalarText(e); !ok {
					scalars = false
				}
			}
			if scalars {
				out = append(out, argPath{k})
			}
		}
	}
	return out
}

func (m *model) tryUpdate(path []string, idField string, list argPath, before, after [][]any, ctxs []*ectx) (stmt, bool) {
	// Which elements each argument id names, and what they became.
	type hit struct {
		ctx    *ectx
		old    *jsonvalue.Object
		now    *jsonvalue.Object
		target int
	}
	var hits []hit
	changedKeys := map[string]bool{}
	var keyOrder []string
	for e := range before {
		v, ok := list.get(ctxs[e].args)
		if !ok {
			return nil, false
		}
		ids, ok := v.([]any)
		if !ok {
			return nil, false
		}
		used := map[int]bool{}
		for i, id := range ids {
			found := -1
			for j, el := range before[e] {
				o, ok := el.(*jsonvalue.Object)
				if !ok {
					return nil, false
				}
				if f, ok := o.Get(idField); ok && jsonvalue.Identical(f, id) && !used[j] {
					found = j
					break
				}
			}
			if found < 0 {
				return nil, false
			}
			used[found] = true
			old := before[e][found].(*jsonvalue.Object)
			now, ok := after[e][found].(*jsonvalue.Object)
			if !ok || strings.Join(old.Keys, "\x00") != strings.Join(now.Keys, "\x00") {
				return nil, false
			}
			cc := *ctxs[e]
			cc.i = i
			cc.elem = old
			hits = append(hits, hit{ctx: &cc, old: old, now: now, target: found})
			for k, key := range old.Keys {
				if !jsonvalue.Identical(old.Vals[k], now.Vals[k]) && !changedKeys[key] {
					changedKeys[key] = true
					keyOrder = append(keyOrder, key)
				}
			}
		}
		// Elements nobody named must be unchanged.
		for j := range before[e] {
			if !used[j] && !jsonvalue.Identical(before[e][j], after[e][j]) {
				return nil, false
			}
		}
	}
	if len(keyOrder) == 0 {
		return nil, false
	}
	// The id field is written first when it changes, as production code tends to.
	sort.SliceStable(keyOrder, func(a, b int) bool { return keyOrder[a] == idField && keyOrder[b] != idField })
	st := updateS{path: path, field: idField, list: list}
	for _, key := range keyOrder {
		ts := make([]any, len(hits))
		cs := make([]*ectx, len(hits))
		for h := range hits {
			ts[h], _ = hits[h].now.Get(key)
			cs[h] = hits[h].ctx
		}
		e, ok := m.learnValue(key, ts, cs)
		if !ok {
			return nil, false
		}
		st.keys = append(st.keys, key)
		st.vals = append(st.vals, e)
	}
	return st, true
}

// sortLikeSiblings makes a field copied from a list argument the list sorted when a sibling field of the same
// object is a sorted list argument and the recordings fit the sorted copy too: they never showed the list unsorted,
// and the backend sorts the lists it stores (an exchange's new items beside its sorted old ones).
func sortLikeSiblings(stmts []stmt, path []string, posts []*jsonvalue.Object, ctxs []*ectx) {
	sorts := false
	for _, st := range stmts {
		if s, ok := st.(setS); ok && slices.Equal(s.path, path) {
			if a, ok := s.val.(argE); ok && a.sorted {
				sorts = true
			}
		}
	}
	if !sorts {
		return
	}
	for i, st := range stmts {
		s, ok := st.(setS)
		if !ok || !slices.Equal(s.path, path) {
			continue
		}
		a, ok := s.val.(argE)
		if !ok || a.sorted {
			continue
		}
		targets := make([]any, len(posts))
		lists := true
		for j, p := range posts {
			targets[j], _ = p.Get(s.key)
			if _, isList := targets[j].([]any); !isList {
				lists = false
			}
		}
		if sorted := (argE{path: a.path, sorted: true}); lists && fits(sorted, targets, ctxs) {
			s.val = sorted
			stmts[i] = s
		}
	}
}
