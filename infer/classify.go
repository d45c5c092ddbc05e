package infer

import (
	"bytes"
	"crypto/sha256"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// model is a build in progress.
type model struct {
	traces     []*ptrace
	opts       *Options
	w          *warnings
	style      twin.Style
	tools      map[string]*toolInfo
	toolNames  []string
	tables     map[string]*tableInfo
	tableNames []string
	// base is the base world: table → key → row.
	base map[string]map[string]*jsonvalue.Object
	// sightings is every row seen anywhere: table → key → rows in trace order (first per trace).
	sightings map[string]map[string][]*jsonvalue.Object
	// wexs are the write tools' examples while handlers are synthesized (writeExamples).
	wexs map[string][]wex
	// facts are what mentions show of entities the base world does not hold (facts.go).
	facts *facts
	// subs index nested objects by id (see subIndex).
	subs    map[string]map[string]*jsonvalue.Object
	subDefs map[string]twin.SubIndex
	// release has the build drop answers' parsed trees once done with them (buildPrepared).
	release bool
	// stateTable names the table of state beyond rows and stateTools the tools answering from it (state.go).
	stateTable string
	stateTools map[string]*stateTool
	// stateTraces holds, by trace index, the variables as each trace's world had them before its calls (fit puts
	// them in place, as it does the rows the trace knew).
	stateTraces map[int]map[string]any
	// hidden are the effects of each tool its answers do not show (hidden.go).
	hidden map[string][]hiddenEffect
}

// toolInfo is what the build learns about one tool.
type toolInfo struct {
	name  string
	calls []*call
	def   *ToolDef
	kind  string
	write bool
	// Row-returning tools: the table, the argument holding the key and the answer's key field.
	table    string
	keyArg   string
	keyField string
	source   string
	notes    []string
	// stringsAsJSON: string answers were JSON-quoted.
	stringsAsJSON bool
	// lookupCrit maps a lookup's argument to the row field it matches.
	lookupCrit map[string]string
	// state says which variables the tool's answers show and set (state.go).
	state *twin.ToolState
}

// tableInfo is an entity type.
type tableInfo struct {
	name     string
	keyField string
	keyInRow bool
	tools    []string
	indexes  map[twin.Index]bool
	subs     map[string]twin.SubIndex
	refs     []twin.Ref
}

var readVerbs = set("get", "find", "list", "search", "lookup", "look", "fetch", "read", "query", "show", "check",
	"view", "describe", "retrieve", "calculate", "compute", "think", "count", "verify", "validate", "estimate",
	"preview", "browse", "explain", "summarize", "is", "has", "can", "lookup", "load", "inspect", "resolve", "locate")

var writeVerbs = set("cancel", "modify", "update", "book", "create", "add", "delete", "remove", "set", "exchange",
	"return", "send", "pay", "refund", "insert", "put", "post", "patch", "edit", "change", "reset", "assign",
	"register", "submit", "place", "apply", "approve", "reject", "close", "move", "upgrade", "downgrade", "enable",
	"disable", "grant", "revoke", "schedule", "reschedule", "rename", "upload", "issue", "charge", "transfer",
	"reserve", "purchase", "buy", "make", "mark", "save", "store", "write", "append", "archive", "restore",
	"confirm", "claim", "redeem", "activate", "deactivate", "toggle", "start", "stop", "complete", "finish",
	"open", "accept", "decline", "withdraw", "deposit", "link", "unlink", "upsert", "replace", "swap", "merge",
	"split", "void", "credit", "debit", "ship", "deliver", "dispatch", "order", "subscribe", "unsubscribe",
	"restock", "refill", "topup", "enroll", "invite", "block", "unblock", "pause", "resume", "rebook", "upgrade")

func set(xs ...string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// nameWords splits a tool name (snake, kebab or camel case) into lower-case words.
func nameWords(name string) []string { return twin.NameWords(name) }

func verbOf(name string) string {
	w := nameWords(name)
	if len(w) == 0 {
		return ""
	}
	return w[0]
}

// tableNameFor derives an entity table name from a key field ("order_id" → "orders").
func tableNameFor(field string) string {
	words := nameWords(field)
	if n := len(words); n > 1 && (words[n-1] == "id" || words[n-1] == "key" || words[n-1] == "code" || words[n-1] == "number") {
		words = words[:n-1]
	} else if n == 1 && strings.HasSuffix(words[0], "id") && len(words[0]) > 2 {
		words[0] = strings.TrimSuffix(words[0], "id")
	}
	if len(words) == 0 || (len(words) == 1 && (words[0] == "id" || words[0] == "key")) {
		return "rows"
	}
	last := words[len(words)-1]
	switch {
	case strings.HasSuffix(last, "s") || strings.HasSuffix(last, "x") || strings.HasSuffix(last, "ch") || strings.HasSuffix(last, "sh"):
		last += "es"
	case strings.HasSuffix(last, "y") && len(last) > 1 && !strings.ContainsRune("aeiou", rune(last[len(last)-2])):
		last = last[:len(last)-1] + "ies"
	default:
		last += "s"
	}
	words[len(words)-1] = last
	return strings.Join(words, "_")
}

// scalarText answers a scalar's text (strings as they are, numbers as spelled).
func scalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case jsonvalue.Number:
		return string(x), true
	}
	return "", false
}

// findKey looks for the argument whose value the answer rows carry as a field:
// that field is the row key. It answers the argument, the field and whether one was found.
func findKey(ti *toolInfo) (string, string, bool) {
	type cand struct{ arg, field string }
	counts := map[cand]int{}
	var order []cand
	n := 0
	for _, c := range ti.calls {
		if !c.success || c.args == nil {
			continue
		}
		o, ok := c.val.(*jsonvalue.Object)
		if !ok || !c.isJSON {
			continue
		}
		n++
		for ai, a := range c.args.Keys {
			av, ok := scalarText(c.args.Vals[ai])
			if !ok || av == "" {
				continue
			}
			for fi, f := range o.Keys {
				fv, ok := scalarText(o.Vals[fi])
				if ok && fv == av {
					k := cand{a, f}
					if counts[k] == 0 {
						order = append(order, k)
					}
					counts[k]++
				}
			}
		}
	}
	if n == 0 {
		return "", "", false
	}
	var best cand
	bestScore := -1
	for _, k := range order {
		if counts[k]*10 < n*9 {
			continue
		}
		score := counts[k] * 4
		if k.arg == k.field {
			score += 4 * n
		}
		if strings.HasSuffix(strings.ToLower(k.field), "id") {
			score += 2 * n
		}
		if score > bestScore {
			best, bestScore = k, score
		}
	}
	if bestScore < 0 {
		return "", "", false
	}
	return best.arg, best.field, true
}

// externalKey recognises a getter whose rows do not carry their key: a read tool
// with one identifier-like argument answering objects.
func externalKey(ti *toolInfo) (string, bool) {
	if !readVerbs[verbOf(ti.name)] {
		return "", false
	}
	objects, arg := 0, ""
	for _, c := range ti.calls {
		if c.args == nil {
			continue
		}
		if c.args.Len() != 1 {
			return "", false
		}
		a := c.args.Keys[0]
		if arg == "" {
			arg = a
		} else if a != arg {
			return "", false
		}
		s, ok := c.args.Vals[0].(string)
		if !ok || s == "" || strings.ContainsAny(s, " \t\n") || len(s) > 64 {
			return "", false
		}
		if c.success {
			if _, ok := c.val.(*jsonvalue.Object); !ok || !c.isJSON {
				return "", false
			}
			objects++
		}
	}
	if objects == 0 || arg == "" {
		return "", false
	}
	return arg, true
}

// classify decides each tool's table and read/write nature. Read tools go first:
// a getter's argument that its answers carry as a field names the table and its key.
// Write tools then join the table whose rows their answers resemble.
func (m *model) classify() {
	m.tables = map[string]*tableInfo{}
	byField := map[string]string{} // key field → table name
	fields := map[string]map[string]bool{}
	for _, name := range m.toolNames {
		ti := m.tools[name]
		v := verbOf(name)
		ti.write = writeVerbs[v] && !readVerbs[v]
	}
	join := func(ti *toolInfo, tn, arg, field string) {
		ti.table, ti.keyArg, ti.keyField = tn, arg, field
		m.tables[tn].tools = append(m.tables[tn].tools, ti.name)
		if fields[tn] == nil {
			fields[tn] = map[string]bool{}
		}
		for _, c := range ti.calls {
			if o, ok := c.val.(*jsonvalue.Object); ok && c.success && c.isJSON {
				for _, k := range o.Keys {
					fields[tn][k] = true
				}
			}
		}
	}
	newTable := func(field string, inRow bool) string {
		tn := tableNameFor(field)
		if t, exists := m.tables[tn]; exists && (t.keyInRow != inRow || t.keyField != field) {
			tn = uniqueName(m.tables, tn+"_by_"+field)
		}
		if _, exists := m.tables[tn]; !exists {
			m.tables[tn] = &tableInfo{name: tn, keyField: field, keyInRow: inRow, indexes: map[twin.Index]bool{}, subs: map[string]twin.SubIndex{}}
		}
		if inRow {
			byField[field] = tn
		}
		return tn
	}
	for pass := 0; pass < 2; pass++ {
		for _, name := range m.toolNames {
			ti := m.tools[name]
			if ti.write != (pass == 1) {
				continue
			}
			if pass == 1 {
				if tn, arg, ok := m.resembles(ti, fields); ok {
					join(ti, tn, arg, m.tables[tn].keyField)
					continue
				}
			}
			if arg, field, ok := findKey(ti); ok {
				tn, ok := byField[field]
				if !ok {
					tn = newTable(field, true)
				}
				join(ti, tn, arg, field)
				continue
			}
			if arg, ok := externalKey(ti); ok {
				join(ti, newTable(arg, false), arg, arg)
			}
		}
	}
	m.dropKeyOnlyTables()
	m.tableNames = m.tableNames[:0]
	for tn := range m.tables {
		m.tableNames = append(m.tableNames, tn)
	}
	sort.Strings(m.tableNames)
	m.behaviouralWrites()
}

// dropKeyOnlyTables dissolves the tables whose recorded rows hold nothing but their key (cd answering
// {"current_working_directory": "temp"} for folder "temp"): an argument echoed is no entity, and its tools are
// left to the other rules (the state learner's).
func (m *model) dropKeyOnlyTables() {
	for _, tn := range sortedKeys(m.tables) {
		t := m.tables[tn]
		keyOnly, rows := true, 0
		for _, name := range t.tools {
			for _, c := range m.tools[name].calls {
				o, ok := c.val.(*jsonvalue.Object)
				if !c.success || !c.isJSON || !ok {
					continue
				}
				rows++
				for _, k := range o.Keys {
					if k != t.keyField {
						keyOnly = false
					}
				}
			}
		}
		if !keyOnly || rows == 0 {
			continue
		}
		for _, name := range t.tools {
			ti := m.tools[name]
			ti.table, ti.keyArg, ti.keyField = "", "", ""
		}
		delete(m.tables, tn)
	}
}

// resembles finds the table whose rows a write's answers are: the answers carry the
// table's key field and share most of its fields. The key argument is the one whose
// value the answers carry as that field; none when the write creates rows.
func (m *model) resembles(ti *toolInfo, fields map[string]map[string]bool) (string, string, bool) {
	var objs []*call
	for _, c := range ti.calls {
		if _, ok := c.val.(*jsonvalue.Object); ok && c.success && c.isJSON && c.args != nil {
			objs = append(objs, c)
		}
	}
	if len(objs) == 0 {
		return "", "", false
	}
	bestT, bestArg, bestSim := "", "", 0.0
	for _, tn := range sortedKeys(fields) {
		t := m.tables[tn]
		if !t.keyInRow {
			continue
		}
		inter, union := 0, len(fields[tn])
		carried := 0
		for _, c := range objs {
			o := c.val.(*jsonvalue.Object)
			if _, ok := o.Get(t.keyField); ok {
				carried++
			}
		}
		if carried*10 < len(objs)*9 {
			continue
		}
		o := objs[0].val.(*jsonvalue.Object)
		for _, k := range o.Keys {
			if fields[tn][k] {
				inter++
			} else {
				union++
			}
		}
		sim := float64(inter) / float64(max(union, 1))
		if sim < 0.5 || sim <= bestSim {
			continue
		}
		// The argument carrying the key, if any.
		arg := ""
		argNames := map[string]int{}
		for _, c := range objs {
			o := c.val.(*jsonvalue.Object)
			ki := o.Index(t.keyField)
			if ki < 0 {
				continue
			}
			kv, _ := scalarText(o.Vals[ki])
			for ai, a := range c.args.Keys {
				if av, ok := scalarText(c.args.Vals[ai]); ok && av == kv {
					argNames[a]++
				}
			}
		}
		for _, a := range sortedKeys(argNames) {
			if argNames[a]*10 >= len(objs)*9 && (arg == "" || a == t.keyField) {
				arg = a
			}
		}
		bestT, bestArg, bestSim = tn, arg, sim
	}
	return bestT, bestArg, bestT != ""
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func uniqueName(tables map[string]*tableInfo, name string) string {
	if _, ok := tables[name]; !ok {
		return name
	}
	for i := 2; ; i++ {
		n := name + "_" + itoa(i)
		if _, ok := tables[n]; !ok {
			return n
		}
	}
}

// behaviouralWrites marks as writes the row-returning tools whose verbs say nothing
// but whose answers show a row changed since it was last seen with no write in between.
func (m *model) behaviouralWrites() {
	for _, name := range m.toolNames {
		ti := m.tools[name]
		v := verbOf(name)
		if ti.write || readVerbs[v] || writeVerbs[v] || ti.table == "" {
			continue
		}
		changed := false
		for _, t := range m.traces {
			last := map[string]*jsonvalue.Object{}
			for _, c := range t.calls {
				tc := m.tools[c.tool]
				if tc.write && c.success {
					last = map[string]*jsonvalue.Object{}
					continue
				}
				tn, k, row, ok := m.rowOf(c)
				if !ok {
					continue
				}
				id := tn + "\x00" + k
				if prev, seen := last[id]; seen && c.tool == name && !jsonvalue.Equal(prev, row) {
					changed = true
				}
				last[id] = row
			}
		}
		if changed {
			ti.write = true
		}
	}
}

// rowOf answers the table row a call's answer holds, if any.
func (m *model) rowOf(c *call) (string, string, *jsonvalue.Object, bool) {
	ti := m.tools[c.tool]
	if ti == nil || ti.table == "" || !c.success || !c.isJSON || c.args == nil {
		return "", "", nil, false
	}
	o, ok := c.val.(*jsonvalue.Object)
	if !ok {
		return "", "", nil, false
	}
	t := m.tables[ti.table]
	var key string
	if t.keyInRow {
		kv, ok := o.Get(t.keyField)
		if !ok {
			return "", "", nil, false
		}
		if key, ok = scalarText(kv); !ok {
			return "", "", nil, false
		}
		// The key must be the one the call asked about.
		if av, ok := c.args.Get(ti.keyArg); ok && ti.keyArg != "" {
			if at, ok := scalarText(av); !ok || at != key {
				return "", "", nil, false
			}
		}
	} else {
		av, ok := c.args.Get(ti.keyArg)
		if !ok {
			return "", "", nil, false
		}
		if key, ok = scalarText(av); !ok {
			return "", "", nil, false
		}
	}
	return ti.table, key, o, true
}

// leafStrings collects the short string and number leaves of a value.
func leafStrings(v any, into map[string]bool) {
	switch x := v.(type) {
	case string:
		if len(x) <= 80 {
			into[x] = true
		}
	case jsonvalue.Number:
		into[string(x)] = true
	case []any:
		for _, e := range x {
			leafStrings(e, into)
		}
	case *jsonvalue.Object:
		for _, e := range x.Vals {
			leafStrings(e, into)
		}
	}
}

// buildBase makes the base world: each row as first seen in each trace before the
// trace's first write, or later when no write so far named it. A row seen differently
// by different traces takes the state most traces saw. Rows seen only after a write
// that merely mentioned them (an order's write mentions its user) are a fallback for
// entities seen no other way.
func (m *model) buildBase() {
	type cand struct {
		row *jsonvalue.Object
		// sum is the SHA-256 of row's canonical JSON, taken only once a second sighting of the key needs
		// comparing (most entities of a large build are seen once): neither a canonical copy of every row
		// nor the time to write it.
		sum    [sha256.Size]byte
		summed bool
		votes  int
		first  int
		prio   int // 0: clean sighting; 1: after a write that mentioned it; 2: after a write that changed it
	}
	var buf bytes.Buffer
	sumOf := func(cd *cand) [sha256.Size]byte {
		if !cd.summed {
			buf.Reset()
			jsonvalue.AppendCanonical(&buf, cd.row)
			cd.sum, cd.summed = sha256.Sum256(buf.Bytes()), true
		}
		return cd.sum
	}
	cands := map[string]map[string][]*cand{}
	m.sightings = map[string]map[string][]*jsonvalue.Object{}
	for ti, t := range m.traces {
		cut := false
		touched := map[string]bool{}
		targeted := map[string]bool{}
		seenHere := map[string]bool{}
		sightHere := map[string]bool{}
		for _, c := range t.calls {
			tc := m.tools[c.tool]
			tn, k, row, ok := m.rowOf(c)
			if ok {
				id := tn + "\x00" + k
				if !sightHere[id] {
					sightHere[id] = true
					if m.sightings[tn] == nil {
						m.sightings[tn] = map[string][]*jsonvalue.Object{}
					}
					m.sightings[tn][k] = append(m.sightings[tn][k], row)
				}
			}
			if tc.write {
				if c.success {
					cut = true
					if c.args != nil {
						leafStrings(c.args, touched)
					}
					if c.isJSON {
						leafStrings(c.val, touched)
					}
					if ttn, tk, ok := m.target(c); ok {
						targeted[ttn+"\x00"+tk] = true
					}
					if ok {
						targeted[tn+"\x00"+k] = true
					}
				}
				continue
			}
			if !ok {
				continue
			}
			id := tn + "\x00" + k
			if seenHere[id] {
				continue
			}
			prio := 0
			switch {
			case targeted[id]:
				prio = 2 // after a write that changed it: a last resort
			case cut && touched[k]:
				prio = 1
			}
			seenHere[id] = true
			if cands[tn] == nil {
				cands[tn] = map[string][]*cand{}
			}
			nc := &cand{row: row, votes: 1, first: ti, prio: prio}
			found := false
			for _, cd := range cands[tn][k] {
				if cd.prio == prio && sumOf(cd) == sumOf(nc) {
					cd.votes++
					found = true
					break
				}
			}
			if !found {
				cands[tn][k] = append(cands[tn][k], nc)
			}
		}
	}
	m.base = map[string]map[string]*jsonvalue.Object{}
	for _, tn := range m.tableNames {
		m.base[tn] = map[string]*jsonvalue.Object{}
		for k, cs := range cands[tn] {
			best := cs[0]
			for _, cd := range cs[1:] {
				if cd.prio < best.prio || (cd.prio == best.prio && (cd.votes > best.votes || (cd.votes == best.votes && cd.first < best.first))) {
					best = cd
				}
			}
			m.base[tn][k] = best.row
		}
	}
}

// view tracks, through one trace, the latest row of each entity the trace has shown,
// over the base world.
type view struct {
	m    *model
	rows map[string]*jsonvalue.Object
}

func (m *model) newView() *view { return &view{m: m, rows: map[string]*jsonvalue.Object{}} }

// get answers the row as the trace knows it before the current call.
func (v *view) get(table, key string) (*jsonvalue.Object, bool) {
	if r, ok := v.rows[table+"\x00"+key]; ok {
		return r, r != nil
	}
	r, ok := v.m.base[table][key]
	return r, ok
}

// observe records what a call's answer shows.
func (v *view) observe(c *call) {
	if tn, k, row, ok := v.m.rowOf(c); ok {
		v.rows[tn+"\x00"+k] = row
	}
}

// target answers the table and key a call is about, when its tool has one.
func (m *model) target(c *call) (string, string, bool) {
	ti := m.tools[c.tool]
	if ti == nil || ti.table == "" || ti.keyArg == "" || c.args == nil {
		return "", "", false
	}
	av, ok := c.args.Get(ti.keyArg)
	if !ok {
		return "", "", false
	}
	k, ok := scalarText(av)
	if !ok {
		return "", "", false
	}
	return ti.table, k, true
}

// anyRow answers some known version of a row: the base one, else any sighting.
func (m *model) anyRow(table, key string) (*jsonvalue.Object, bool) {
	if r, ok := m.base[table][key]; ok {
		return r, true
	}
	if s := m.sightings[table][key]; len(s) > 0 {
		return s[0], true
	}
	return nil, false
}
