package infer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// The handlers state tools get (state.go), and the state table they read and write.

// stateGen writes one handler's reads of variables: each variable read once, at the top, into a local; a variable
// the world does not hold makes the handler decline (the recordings answer instead).
type stateGen struct {
	table string
	reads []varRef
	names map[string]string
}

// read answers the local holding the variable's value before the call.
func (g *stateGen) read(r varRef) string {
	k := r.String()
	if n, ok := g.names[k]; ok {
		return n
	}
	if g.names == nil {
		g.names = map[string]string{}
	}
	n := "v" + strconv.Itoa(len(g.reads))
	g.names[k] = n
	g.reads = append(g.reads, r)
	return n
}

// addStateTable adds the table of variables to the world: named "state" (or, when an entity has that name, the
// first free "state_N"), keyed by the variable's name, each row {"value": v} holding its base value.
func (m *model) addStateTable(base map[string]any) {
	name := twin.DefaultStateTable
	for i := 2; m.tables[name] != nil; i++ {
		name = twin.DefaultStateTable + "_" + strconv.Itoa(i)
	}
	m.stateTable = name
	m.tables[name] = &tableInfo{name: name, keyField: "variable", indexes: map[twin.Index]bool{}, subs: map[string]twin.SubIndex{}}
	m.tableNames = append(m.tableNames, name)
	sort.Strings(m.tableNames)
	rows := make(map[string]*jsonvalue.Object, len(base))
	for k, v := range base {
		rows[k] = twin.StateRow(v)
	}
	m.base[name] = rows
}

// synthState writes st's handler and what its answers show of the state.
func (m *model) synthState(st *stateTool) {
	ti := st.ti
	g := &stateGen{table: m.stateTable}
	var body strings.Builder
	used := st.shapesUsed()
	if st.sel != "" {
		fmt.Fprintf(&body, "    pick = pystr(args.get(%q))\n", st.sel)
		vals := sortedKeys(st.picks)
		for _, v := range vals {
			fmt.Fprintf(&body, "    if pick == %q:\n", v)
			st.writeShape(&body, g, st.picks[v], "        ")
		}
	}
	st.writeShape(&body, g, st.def, "    ")

	var b strings.Builder
	lines := []string{fmt.Sprintf("%s answers from state beyond rows, learned from %d recorded answers:", ti.name, len(st.obs))}
	for _, s := range used {
		for _, f := range st.shape[s] {
			r := st.rules[s][f]
			what := r.e.describe()
			switch {
			case st.sets[f]:
				what += " (sets variable " + f + ")"
			case st.shows[f]:
				what += " (shows it)"
			}
			lines = append(lines, fmt.Sprintf("  %s: %s", f, what))
		}
	}
	if st.sel != "" {
		lines = append(lines, fmt.Sprintf("The fields answered depend on argument %q.", st.sel))
	}
	b.WriteString(header(lines...))
	fmt.Fprintf(&b, "def %s(args):\n", funcName(ti.name))
	// The variables read, each once: those keying others (read by keyCode) first.
	keys := make([]string, 0, len(g.reads))
	for i := 0; i < len(g.reads); i++ {
		keys = append(keys, g.reads[i].keyCode(g))
	}
	for _, pass := range []bool{false, true} {
		for i, r := range g.reads {
			if (r.keyVar != "") != pass {
				continue
			}
			fmt.Fprintf(&b, "    row%d = world.get(%q, %s)\n", i, g.table, keys[i])
			fmt.Fprintf(&b, "    if row%d == None:\n", i)
			fmt.Fprintf(&b, "        return decline(%q)\n", "the world holds no value of "+r.String())
			fmt.Fprintf(&b, "    v%d = row%d[\"value\"]\n", i, i)
		}
	}
	b.WriteString(body.String())
	ti.source = b.String()

	ts := &twin.ToolState{}
	if st.text != nil {
		ts.Text = st.text
	}
	for _, s := range used {
		for i, f := range st.shape[s] {
			field := f
			if st.text != nil {
				field = "#" + strconv.Itoa(i)
			}
			ref := st.refOf(f)
			sf := twin.StateField{Field: field, Var: f, KeyArg: ref.keyArg, KeyVar: ref.keyVar}
			switch {
			case st.shows[f] && !containsField(ts.Shows, sf):
				ts.Shows = append(ts.Shows, sf)
			case st.sets[f] && !containsField(ts.Sets, sf):
				ts.Sets = append(ts.Sets, sf)
			}
		}
	}
	for _, r := range g.reads {
		ts.Reads = append(ts.Reads, twin.StateField{Var: r.name, KeyArg: r.keyArg, KeyVar: r.keyVar})
	}
	ti.state = ts
	if ti.table != "" {
		ti.table, ti.keyArg, ti.keyField = "", "", "" // an echoed argument named no entity (echoKeyed)
	}
	switch {
	case st.writes() || ti.write:
		ti.kind = twin.KindWrite
	case len(ts.Shows) > 0:
		ti.kind = twin.KindState
	case st.text != nil:
		ti.kind = twin.KindTemplate
	default:
		ti.kind = twin.KindPure
	}
	ti.notes = append(ti.notes, "answers from state beyond rows (variables in table "+m.stateTable+")")
}

func containsField(fs []twin.StateField, f twin.StateField) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

// writeShape writes the statements answering with shape s: each field's value in answer order, the variables it
// sets, and the answer (an object, or the text template filled).
func (st *stateTool) writeShape(b *strings.Builder, g *stateGen, s int, ind string) {
	fields := st.shape[s]
	fmt.Fprintf(b, "%sout = {}\n", ind)
	for _, f := range fields {
		fmt.Fprintf(b, "%sout[%q] = %s\n", ind, f, st.rules[s][f].e.code(g))
	}
	for _, f := range fields {
		if st.sets[f] {
			ref := st.refOf(f)
			fmt.Fprintf(b, "%sworld.put(%q, %s, {\"value\": out[%q]})\n", ind, g.table, ref.keyCode(g), f)
		}
	}
	if st.text == nil {
		fmt.Fprintf(b, "%sreturn out\n", ind)
		return
	}
	parts := []string{strconv.Quote(st.text[0])}
	for i, f := range fields {
		parts = append(parts, "pystr(out["+strconv.Quote(f)+"])")
		if lit := st.text[i+1]; lit != "" {
			parts = append(parts, strconv.Quote(lit))
		}
	}
	fmt.Fprintf(b, "%sreturn %s\n", ind, strings.Join(parts, " + "))
}

// putState puts what a recorded call's answer shows of the state into s (teacher forcing, as fit does with rows);
// get reads a variable's value (a key variable's).
func (m *model) putState(put func(table, key string, row *jsonvalue.Object), get func(key string) (any, bool), c *call) {
	st := m.stateTools[c.tool]
	if st == nil || st.sets == nil {
		return
	}
	fields := st.fieldsOf(c)
	if fields == nil {
		return
	}
	for i, f := range fields.Keys {
		if !st.sets[f] && !st.shows[f] {
			continue
		}
		key, ok := st.refOf(f).keyWith(c.args, get)
		if ok {
			put(m.stateTable, key, twin.StateRow(fields.Vals[i]))
		}
	}
}
