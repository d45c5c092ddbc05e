package infer

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
	"go.starlark.net/starlark"
)

// detectStyle picks the JSON spelling that reproduces the most recorded answers (of the first
// maxStyleAnswers).
func (m *model) detectStyle() {
	best, bestN := twin.StylePython, -1
	for _, st := range twin.Styles() {
		n, seen := 0, 0
	traces:
		for _, t := range m.traces {
			for _, c := range t.calls {
				if !c.isJSON {
					continue
				}
				if seen++; seen > maxStyleAnswers {
					break traces
				}
				switch c.val.(type) {
				case *jsonvalue.Object, []any:
					if twin.RendersAs(c.val, st, c.text) {
						n++
					}
				case jsonvalue.Number:
					// A computed float's spelling tells Python (1200.0) from JavaScript (1200).
					if c.val.(jsonvalue.Number).IsFloat() && st.FormatFloat(c.val.(jsonvalue.Number).Float64()) == c.text {
						n++
					}
				}
			}
		}
		if n > bestN {
			best, bestN = st, n
		}
	}
	m.style = best
}

// maxStyleAnswers bounds the JSON answers detectStyle reads, the first ones in trace-id order: one backend
// spells all its answers alike, and reading every answer of a 100,000-trace build costs seconds per style.
const maxStyleAnswers = 20000

// synthesize writes each tool's handler, when the recordings show how.
func (m *model) synthesize() {
	defer func() { m.wexs = nil }()
	for _, name := range m.toolNames {
		ti := m.tools[name]
		ti.stringsAsJSON = stringsAsJSON(ti)
		switch {
		case len(ti.calls) == 0:
			ti.kind = twin.KindUnknown
			if ti.write {
				ti.kind = twin.KindWrite
				ti.notes = append(ti.notes, "a write never seen in a trace: only a model can answer it, and its answers never change the world")
			}
		case ti.write:
			m.synthWrite(ti)
		case ti.table != "":
			m.synthRead(ti)
		default:
			if !m.synthLookup(ti) && !m.synthTemplate(ti) && !m.synthConstant(ti) && !m.synthPure(ti) {
				ti.kind = twin.KindQuery
				ti.notes = append(ti.notes, "answered from recordings: no rule in the recordings explains its answers")
			}
		}
		if ti.source != "" {
			m.useSubs(ti.source)
		}
	}
}

func stringsAsJSON(ti *toolInfo) bool {
	quoted, bare := 0, 0
	for _, c := range ti.calls {
		if !c.success {
			continue
		}
		if _, ok := c.val.(string); ok && c.isJSON {
			quoted++
		} else if !c.isJSON && c.text != "" {
			bare++
		}
	}
	return quoted > bare
}

func successes(ti *toolInfo) []*call {
	var out []*call
	for _, c := range ti.calls {
		if c.success {
			out = append(out, c)
		}
	}
	return out
}

func errorCalls(ti *toolInfo) []*call {
	var out []*call
	for _, c := range ti.calls {
		if c.answer && c.isErr {
			out = append(out, c)
		}
	}
	return out
}

// synthRead makes a getter: the row by its key, or the recorded not-found answer.
func (m *model) synthRead(ti *toolInfo) {
	ti.kind = twin.KindRead
	t := m.tables[ti.table]
	notFound := m.notFound(ti)
	var b strings.Builder
	b.WriteString(header(
		fmt.Sprintf("%s answers one %s row by its key %q.", ti.name, t.name, t.keyField),
		fmt.Sprintf("Learned from %d recorded answers.", len(successes(ti)))))
	fmt.Fprintf(&b, "def %s(args):\n", funcName(ti.name))
	fmt.Fprintf(&b, "    key = args.get(%q)\n", ti.keyArg)
	fmt.Fprintf(&b, "    row = world.get(%q, key)\n", t.name)
	b.WriteString("    if row == None:\n")
	b.WriteString("        " + notFound + "\n")
	b.WriteString("    return row\n")
	ti.source = b.String()
}

// notFound is the statement a handler runs when the row it needs is missing: the
// tool's recorded error for keys the world does not hold, else a decline.
func (m *model) notFound(ti *toolInfo) string {
	var missing []*call
	for _, c := range errorCalls(ti) {
		tn, k, ok := m.target(c)
		if !ok {
			continue
		}
		if _, known := m.anyRow(tn, k); !known {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		if ps, ok := commonTemplate(missing); ok {
			return "return error(" + templateExpr(ps) + ")"
		}
		// Different texts: the most common one.
		count := map[string]int{}
		best := ""
		for _, c := range missing {
			count[c.text]++
			if count[c.text] > count[best] || (count[c.text] == count[best] && c.text < best) {
				best = c.text
			}
		}
		return "return error(" + strconv.Quote(best) + ")"
	}
	// The same table's getter may know the not-found text.
	for _, other := range m.tables[ti.table].tools {
		ot := m.tools[other]
		if ot == ti || ot.write {
			continue
		}
		for _, c := range errorCalls(ot) {
			tn, k, ok := m.target(c)
			if !ok {
				continue
			}
			if _, known := m.anyRow(tn, k); !known && !hasPlaceholder(templateOf(c.text, c.args)) {
				return "return error(" + strconv.Quote(c.text) + ")"
			}
		}
	}
	return "return decline(\"no " + m.tables[ti.table].name + " row \" + pystr(args.get(" + strconv.Quote(ti.keyArg) + ")))"
}

// synthLookup recognises a find-by-fields tool: its answer is a row's key (or the row),
// and each argument equals a field of that row.
func (m *model) synthLookup(ti *toolInfo) bool {
	succ := successes(ti)
	if len(succ) == 0 {
		return false
	}
	type hit struct {
		table, key string
		row        *jsonvalue.Object
		asRow      bool
		c          *call
	}
	var hits []hit
	var tableName string
	for _, c := range succ {
		if c.args == nil || c.args.Len() == 0 {
			return false
		}
		var h *hit
		if s, ok := c.val.(string); ok || !c.isJSON {
			key := c.text
			if ok {
				key = s
			}
			for _, tn := range m.tableNames {
				if r, ok := m.anyRow(tn, key); ok {
					h = &hit{tn, key, r, false, c}
					break
				}
			}
		} else if o, ok := c.val.(*jsonvalue.Object); ok {
			for _, tn := range m.tableNames {
				t := m.tables[tn]
				if !t.keyInRow {
					continue
				}
				if kv, ok := o.Get(t.keyField); ok {
					if k, ok := scalarText(kv); ok {
						if r, ok := m.anyRow(tn, k); ok && jsonvalue.Equal(r, o) {
							h = &hit{tn, k, r, true, c}
							break
						}
					}
				}
			}
		}
		if h == nil {
			continue // a key the world does not hold: no evidence either way
		}
		if tableName == "" {
			tableName = h.table
		} else if tableName != h.table {
			return false
		}
		hits = append(hits, *h)
	}
	if len(hits) == 0 || len(hits)*2 < len(succ) {
		return false
	}
	asRow := hits[0].asRow
	// For each argument, the row paths holding its value in every hit.
	var argNames []string
	for _, c := range succ {
		for _, a := range c.args.Keys {
			if !contains(argNames, a) {
				argNames = append(argNames, a)
			}
		}
	}
	t := m.tables[tableName]
	crit := map[string]string{}
	fold := map[string]bool{}
	for _, a := range argNames {
		var paths map[string]bool
		needFold := false
		for _, h := range hits {
			av, ok := h.c.args.Get(a)
			if !ok {
				return false
			}
			as, ok := scalarText(av)
			if !ok {
				return false
			}
			exact, folded := pathsWithValue(h.row, as)
			if !t.keyInRow {
				if as == h.key {
					exact[t.keyField] = true
				} else if strings.EqualFold(as, h.key) {
					folded[t.keyField] = true
				}
			}
			here := map[string]bool{}
			for p := range exact {
				here[p] = true
			}
			if len(here) == 0 {
				for p := range folded {
					here[p] = true
				}
				needFold = true
			}
			if paths == nil {
				paths = here
			} else {
				for p := range paths {
					if !here[p] {
						delete(paths, p)
					}
				}
			}
		}
		if len(paths) == 0 {
			return false
		}
		ps := sortedKeys(paths)
		// Prefer the path named like the argument.
		best := ps[0]
		for _, p := range ps {
			if p == a || strings.HasSuffix(p, "."+a) {
				best = p
				break
			}
		}
		crit[a] = best
		fold[a] = needFold
	}
	ti.kind = twin.KindLookup
	ti.table = tableName
	ti.lookupCrit = crit
	for _, a := range argNames {
		t.indexes[twin.Index{Path: crit[a], Fold: fold[a]}] = true
	}
	notFound := "return decline(\"no match\")"
	if errs := errorCalls(ti); len(errs) > 0 {
		if ps, ok := commonTemplate(errs); ok {
			notFound = "return error(" + templateExpr(ps) + ")"
		}
	}
	var b strings.Builder
	b.WriteString(header(
		fmt.Sprintf("%s finds a %s row by %s.", ti.name, tableName, strings.Join(argNames, ", ")),
		fmt.Sprintf("Learned from %d recorded answers.", len(succ))))
	fmt.Fprintf(&b, "def %s(args):\n", funcName(ti.name))
	b.WriteString("    criteria = {\n")
	var folds []string
	for _, a := range argNames {
		fmt.Fprintf(&b, "        %q: args.get(%q),\n", crit[a], a)
		if fold[a] {
			folds = append(folds, strconv.Quote(crit[a]))
		}
	}
	b.WriteString("    }\n")
	// materialize: in an open world a search the world has no row for finds an entity made up to match it.
	fmt.Fprintf(&b, "    keys = world.find(%q, criteria, ignore_case=[%s], materialize=True)\n", tableName, strings.Join(folds, ", "))
	b.WriteString("    if not keys:\n")
	b.WriteString("        " + notFound + "\n")
	if asRow {
		fmt.Fprintf(&b, "    return world.get(%q, keys[0])\n", tableName)
	} else {
		b.WriteString("    return keys[0]\n")
	}
	ti.source = b.String()
	return true
}

func contains(xs []string, x string) bool {
	for _, e := range xs {
		if e == x {
			return true
		}
	}
	return false
}

// pathsWithValue answers the dotted object paths in row whose scalar value is s,
// exactly and ignoring case.
func pathsWithValue(row *jsonvalue.Object, s string) (map[string]bool, map[string]bool) {
	exact, folded := map[string]bool{}, map[string]bool{}
	var walk func(prefix string, o *jsonvalue.Object)
	walk = func(prefix string, o *jsonvalue.Object) {
		for i, k := range o.Keys {
			if strings.Contains(k, ".") {
				continue // a dotted path cannot name this field
			}
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			switch x := o.Vals[i].(type) {
			case *jsonvalue.Object:
				walk(p, x)
			default:
				if v, ok := scalarText(x); ok {
					if v == s {
						exact[p] = true
					} else if strings.EqualFold(v, s) {
						folded[p] = true
					}
				}
			}
		}
	}
	walk("", row)
	return exact, folded
}

// synthConstant recognises a tool that always answers the same.
func (m *model) synthConstant(ti *toolInfo) bool {
	var answered []*call
	for _, c := range ti.calls {
		if c.answer {
			answered = append(answered, c)
		}
	}
	if len(answered) < 2 {
		return false
	}
	for _, c := range answered[1:] {
		if c.text != answered[0].text {
			return false
		}
	}
	c := answered[0]
	ti.kind = twin.KindConstant
	var ret string
	switch {
	case c.isErr:
		ret = "error(" + strconv.Quote(c.text) + ")"
	case c.isJSON && twin.Render(c.val, m.style) == c.text:
		if _, isStr := c.val.(string); isStr && !ti.stringsAsJSON {
			ret = strconv.Quote(c.text)
		} else {
			ret = lit(c.val)
		}
	default:
		ret = strconv.Quote(c.text)
	}
	var b strings.Builder
	b.WriteString(header(fmt.Sprintf("%s always answered the same in %d recorded calls.", ti.name, len(answered))))
	fmt.Fprintf(&b, "def %s(args):\n    return %s\n", funcName(ti.name), ret)
	ti.source = b.String()
	return true
}

// synthTemplate recognises a tool whose answer is fixed text with argument values in it.
func (m *model) synthTemplate(ti *toolInfo) bool {
	var answered []*call
	for _, c := range ti.calls {
		if c.answer && c.args != nil {
			answered = append(answered, c)
		}
	}
	if len(answered) < 2 {
		return false
	}
	var succ, errs []*call
	for _, c := range answered {
		if c.isErr {
			errs = append(errs, c)
		} else {
			succ = append(succ, c)
		}
	}
	if len(errs) > 0 || len(succ) < 2 {
		return false
	}
	for _, c := range succ {
		if c.isJSON {
			if _, ok := c.val.(string); !ok {
				return false
			}
		}
	}
	ps, ok := commonTemplate(succ)
	if !ok || !hasPlaceholder(ps) {
		return false
	}
	ti.kind = twin.KindTemplate
	var b strings.Builder
	b.WriteString(header(fmt.Sprintf("%s answers fixed text with its arguments in it (%d recorded calls agree).", ti.name, len(succ))))
	if ti.write {
		b.WriteString(header("It is a write, but the recordings do not show what it changes; this handler changes nothing."))
		ti.notes = append(ti.notes, "write whose effect on the world the recordings do not show: the twin answers but changes nothing")
	}
	fmt.Fprintf(&b, "def %s(args):\n    return %s\n", funcName(ti.name), templateExpr(ps))
	ti.source = b.String()
	return true
}

var reArith = regexp.MustCompile(`^[\d\s.+\-*/%()eE_]+$`)

// synthPure recognises an arithmetic calculator: one string argument holding an
// expression, a number for an answer, spelled the way production spells it.
func (m *model) synthPure(ti *toolInfo) bool {
	succ := successes(ti)
	if len(succ) < 2 {
		return false
	}
	arg := ""
	for _, c := range succ {
		if c.args == nil || c.args.Len() != 1 {
			return false
		}
		s, ok := c.args.Vals[0].(string)
		if !ok || !reArith.MatchString(s) || !strings.ContainsAny(s, "0123456789") {
			return false
		}
		if arg == "" {
			arg = c.args.Keys[0]
		} else if c.args.Keys[0] != arg {
			return false
		}
		if _, ok := c.val.(jsonvalue.Number); !ok || !c.isJSON {
			return false
		}
	}
	// Candidate spellings of the value: as computed, as a float, rounded to n places.
	type form struct {
		code string
		f    func(v any) (string, bool)
	}
	asFloat := func(v any) (float64, bool) {
		s, err := twin.Calc(v.(string))
		if err != nil {
			return 0, false
		}
		return starlark.AsFloat(s)
	}
	forms := []form{
		{"float(v)", func(v any) (string, bool) {
			f, ok := asFloat(v)
			return m.style.FormatFloat(f), ok
		}},
		{"v", func(v any) (string, bool) {
			s, err := twin.Calc(v.(string))
			if err != nil {
				return "", false
			}
			switch x := s.(type) {
			case starlark.Int:
				return x.String(), true
			case starlark.Float:
				return m.style.FormatFloat(float64(x)), true
			}
			return "", false
		}},
	}
	for n := 0; n <= 6; n++ {
		n := n
		forms = append(forms, form{fmt.Sprintf("round(float(v), %d)", n), func(v any) (string, bool) {
			f, ok := asFloat(v)
			return m.style.FormatFloat(twin.PyRound(f, n)), ok
		}})
	}
	for _, fm := range forms {
		good := true
		for _, c := range succ {
			got, ok := fm.f(c.args.Vals[0])
			if !ok || got != c.text {
				good = false
				break
			}
		}
		if !good {
			continue
		}
		ti.kind = twin.KindPure
		var b strings.Builder
		b.WriteString(header(fmt.Sprintf("%s is arithmetic over its %q argument (%d recorded answers agree).", ti.name, arg, len(succ))))
		fmt.Fprintf(&b, "def %s(args):\n", funcName(ti.name))
		fmt.Fprintf(&b, "    v = calc(args.get(%q, \"\"))\n", arg)
		b.WriteString("    if type(v) not in (\"int\", \"float\"):\n        return decline(\"not an arithmetic expression\")\n")
		fmt.Fprintf(&b, "    return %s\n", fm.code)
		ti.source = b.String()
		return true
	}
	return false
}
