package infer

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// Facts: every mention of an entity the base world does not hold contributes what it shows of it — nested
// copies (an order's items are copies of products and their variants), foreign keys (an order's user_id: that
// user exists and owns the order; a user's orders: each names its user), lookups (find_user_id_by_name_zip
// answering an id: that user has that name and zip). One entity, one row: mentions merge field by field, a
// later mention (trace order, then call order) winning a conflict, which the build report counts.

// factRow is one entity's merged facts.
type factRow struct {
	row  *jsonvalue.Object
	at   map[string]int // top-level field (or "field.member") → order of the mention that set it
	from []string       // first mentions, "trace#call"
}

// facts is the build's fact store: table → key → row.
type facts struct {
	m         *model
	rows      map[string]map[string]*factRow
	conflicts int
	examples  []FactConflict
	mentions  int
	absent    map[string]map[string]bool
}

// FactConflict is one field two mentions of an entity disagreed on: the later mention's value was kept.
type FactConflict struct {
	Table   string `json:"table"`
	Key     string `json:"key"`
	Field   string `json:"field"`
	Kept    string `json:"kept"`
	KeptBy  string `json:"kept_by"`
	Dropped string `json:"dropped"`
}

// FactsReport tells what the build learned of entities beyond the base world.
type FactsReport struct {
	// Entities are entities the base world does not hold that mentions show (per table); Mentions the
	// mentions merged into them; Conflicts the fields mentions disagreed on (resolved by recency).
	Entities  map[string]int `json:"entities"`
	Mentions  int            `json:"mentions"`
	Conflicts int            `json:"conflicts"`
	Examples  []FactConflict `json:"examples,omitempty"`
}

const maxFactExamples = 10

// maxFactSources bounds the mentions a fact row names as its provenance.
const maxFactSources = 3

func (f *facts) entity(table, key string, src string) *factRow {
	if _, inBase := f.m.base[table][key]; inBase || key == "" {
		return nil
	}
	t := f.rows[table]
	if t == nil {
		t = map[string]*factRow{}
		f.rows[table] = t
	}
	r := t[key]
	if r == nil {
		r = &factRow{row: jsonvalue.NewObject(4), at: map[string]int{}}
		if tb := f.m.tables[table]; tb.keyInRow {
			r.row.Set(tb.keyField, key)
		}
		t[key] = r
	}
	f.mentions++
	if len(r.from) < maxFactSources && (len(r.from) == 0 || r.from[len(r.from)-1] != src) {
		r.from = append(r.from, src)
	}
	return r
}

// set merges one field: a later mention wins a conflict.
func (f *facts) set(table, key string, r *factRow, field string, v any, at int, src string) {
	id := field
	parent := r.row
	if i := strings.IndexByte(field, '\x00'); i >= 0 { // a member of a map of entities: "variants\x00<id>"
		name, member := field[:i], field[i+1:]
		pv, _ := r.row.Get(name)
		po, ok := pv.(*jsonvalue.Object)
		if !ok {
			po = jsonvalue.NewObject(2)
			r.row.Set(name, po)
		}
		parent, field, id = po, member, name+"."+member
	}
	old, had := parent.Get(field)
	if had {
		if jsonvalue.Equal(old, v) {
			return
		}
		if mo, ok := old.(*jsonvalue.Object); ok {
			if no, ok := v.(*jsonvalue.Object); ok {
				// Members of a nested entity merge field by field.
				for i, k := range no.Keys {
					ov, has := mo.Get(k)
					if has && !jsonvalue.Equal(ov, no.Vals[i]) {
						f.conflict(table, key, id+"."+k, ov, no.Vals[i], at >= r.at[id], src)
					}
					if !has || at >= r.at[id] {
						mo.Set(k, no.Vals[i])
					}
				}
				r.at[id] = max(r.at[id], at)
				return
			}
		}
		if l, ok := old.([]any); ok {
			if nl, ok := v.([]any); ok { // lists of keys: union, in order of mention
				for _, e := range nl {
					if !containsAny(l, e) {
						l = append(l, e)
					}
				}
				parent.Set(field, l)
				return
			}
		}
		f.conflict(table, key, id, old, v, at >= r.at[id], src)
		if at < r.at[id] {
			return
		}
	}
	parent.Set(field, jsonvalue.Clone(v))
	r.at[id] = at
}

func containsAny(l []any, x any) bool {
	for _, e := range l {
		if jsonvalue.Equal(e, x) {
			return true
		}
	}
	return false
}

func (f *facts) conflict(table, key, field string, old, v any, newWins bool, src string) {
	f.conflicts++
	if len(f.examples) >= maxFactExamples {
		return
	}
	kept, dropped := v, old
	if !newWins {
		kept, dropped = old, v
	}
	f.examples = append(f.examples, FactConflict{Table: table, Key: key, Field: field,
		Kept: jsonvalue.CanonicalText(kept), KeptBy: "recency", Dropped: jsonvalue.CanonicalText(dropped)})
	_ = src
}

// learnFacts walks every answer of every trace for mentions of entities the base world does not hold.
func (m *model) learnFacts() {
	f := &facts{m: m, rows: map[string]map[string]*factRow{}}
	keyFields := map[string]string{} // key field → table (tables whose rows carry their key)
	for _, tn := range m.tableNames {
		if t := m.tables[tn]; t.keyInRow {
			keyFields[t.keyField] = tn
		}
	}
	fieldSets := m.fieldSets()
	for ti, t := range m.traces {
		for _, c := range t.calls {
			at := ti<<20 | c.idx
			src := fmt.Sprintf("%s#%d", t.id, c.idx)
			if c.success && c.isJSON {
				m.factsIn(f, c.val, keyFields, fieldSets, at, src, true)
				// A row whose key is not a field of it (an airline user) is known by the call that read it.
				if tn, k, row, ok := m.rowOf(c); ok && !m.tables[tn].keyInRow {
					m.rowRefFacts(f, tn, k, row, at, src)
				}
			}
			m.lookupFacts(f, c, at, src)
		}
	}
	// Ids a read answered an error for, that no answer ever showed, do not exist.
	f.absent = map[string]map[string]bool{}
	for _, t := range m.traces {
		for _, c := range t.calls {
			if ti := m.tools[c.tool]; ti == nil || ti.kind != twin.KindRead || !c.answer || !c.isErr {
				continue
			}
			tn, k, ok := m.target(c)
			if !ok {
				continue
			}
			if _, known := m.anyRow(tn, k); known || f.rows[tn][k] != nil {
				continue
			}
			if f.absent[tn] == nil {
				f.absent[tn] = map[string]bool{}
			}
			f.absent[tn][k] = true
		}
	}
	m.facts = f
}

// absentKeys answers the ids of a table production answered not found for, sorted.
func (m *model) absentKeys(table string) []string {
	if m.facts == nil {
		return nil
	}
	return sortedKeys(m.facts.absent[table])
}

// tableFields are the top-level fields of a table's rows and, per map-of-entities field ("variants" when
// a sub-index walks "variants.*"), its id field and its members' fields.
type tableFields struct {
	top  map[string]bool
	maps map[string]mapField
}

type mapField struct {
	idField string
	fields  map[string]bool
}

func (m *model) fieldSets() map[string]*tableFields {
	out := map[string]*tableFields{}
	for _, tn := range m.tableNames {
		t := m.tables[tn]
		fs := &tableFields{top: map[string]bool{}, maps: map[string]mapField{}}
		for _, sd := range t.subs {
			name, ok := strings.CutSuffix(sd.Path, ".*")
			if ok && !strings.ContainsAny(name, ".[") {
				fs.maps[name] = mapField{idField: sd.Field, fields: map[string]bool{}}
			}
		}
		for _, rk := range sortedKeys(m.base[tn]) {
			r := m.base[tn][rk]
			for i, k := range r.Keys {
				fs.top[k] = true
				if o, ok := r.Vals[i].(*jsonvalue.Object); ok {
					if idf, isMap := twin.EntityMapField(o); isMap {
						if _, known := fs.maps[k]; !known {
							fs.maps[k] = mapField{idField: idf, fields: map[string]bool{}}
						}
					}
				}
				if mf, ok := fs.maps[k]; ok {
					if o, ok := r.Vals[i].(*jsonvalue.Object); ok {
						for _, mv := range o.Vals {
							if mo, ok := mv.(*jsonvalue.Object); ok {
								for _, mk := range mo.Keys {
									mf.fields[mk] = true
								}
							}
						}
					}
				}
			}
		}
		out[tn] = fs
	}
	return out
}

// factsIn walks one answer value. An object carrying exactly one table's key field is a copy of that entity
// (an order's item: a product); an object carrying several is a row whose other key fields are foreign keys.
func (m *model) factsIn(f *facts, v any, keyFields map[string]string, fs map[string]*tableFields, at int, src string, top bool) {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			m.factsIn(f, e, keyFields, fs, at, src, false)
		}
		return
	case *jsonvalue.Object:
		var named []string
		for _, k := range x.Keys {
			if tn, ok := keyFields[k]; ok {
				if s, ok := x.Vals[x.Index(k)].(string); ok && s != "" {
					named = append(named, tn)
				}
			}
		}
		switch {
		case len(named) == 1 && !top:
			m.copyFacts(f, named[0], x, fs[named[0]], at, src)
		case len(named) >= 1:
			m.refFacts(f, x, named, at, src)
		}
		for _, e := range x.Vals {
			m.factsIn(f, e, keyFields, fs, at, src, false)
		}
	}
}

// copyFacts merges a nested copy of an entity: its top-level fields, and the members of a map of entities
// it carries the id of (an order item's item_id, options and price are the product's variant).
func (m *model) copyFacts(f *facts, table string, o *jsonvalue.Object, fs *tableFields, at int, src string) {
	t := m.tables[table]
	kv, _ := o.Get(t.keyField)
	key, _ := kv.(string)
	r := f.entity(table, key, src)
	if r == nil {
		return
	}
	for i, k := range o.Keys {
		if k != t.keyField && fs.top[k] && fs.maps[k].idField == "" {
			f.set(table, key, r, k, o.Vals[i], at, src)
		}
	}
	for _, name := range sortedKeys(fs.maps) {
		mf := fs.maps[name]
		idv, ok := o.Get(mf.idField)
		id, isStr := idv.(string)
		if !ok || !isStr {
			continue
		}
		member := jsonvalue.NewObject(4)
		for i, k := range o.Keys {
			if mf.fields[k] && !(fs.top[k] && k != mf.idField) {
				member.Set(k, o.Vals[i])
			}
		}
		f.set(table, key, r, name+"\x00"+id, member, at, src)
	}
}

// refFacts merges what a row's foreign keys imply: each key it names exists, and owns (or is owned by) it.
func (m *model) refFacts(f *facts, o *jsonvalue.Object, named []string, at int, src string) {
	for _, tn := range named {
		kv, _ := o.Get(m.tables[tn].keyField)
		key, _ := kv.(string)
		m.rowRefFacts(f, tn, key, o, at, src)
	}
}

// rowRefFacts merges what row (tn, key)'s foreign keys imply.
func (m *model) rowRefFacts(f *facts, tn, key string, o *jsonvalue.Object, at int, src string) {
	t := m.tables[tn]
	for _, ref := range t.refs {
		v, ok := o.Get(ref.Field)
		if !ok {
			continue
		}
		var keys []string
		if s, ok := v.(string); ok && !ref.Many {
			keys = []string{s}
		} else if l, ok := v.([]any); ok && ref.Many {
			for _, e := range l {
				if s, ok := e.(string); ok {
					keys = append(keys, s)
				}
			}
		}
		for _, k := range keys {
			r := f.entity(ref.Table, k, src)
			if r == nil {
				continue
			}
			for _, back := range m.tables[ref.Table].refs {
				if back.Table != tn {
					continue
				}
				if back.Many && !ref.Many {
					f.set(ref.Table, k, r, back.Field, []any{key}, at, src)
				} else if !back.Many && ref.Many {
					f.set(ref.Table, k, r, back.Field, key, at, src)
				}
			}
		}
	}
}

// lookupFacts merges what a lookup's answer shows: the entity whose key it answered has the fields it was found
// by (find_user_id_by_name_zip's first_name, last_name and zip).
func (m *model) lookupFacts(f *facts, c *call, at int, src string) {
	ti := m.tools[c.tool]
	if ti == nil || ti.kind != twin.KindLookup || len(ti.lookupCrit) == 0 || !c.success || c.args == nil {
		return
	}
	key, ok := lookupKey(c)
	if !ok {
		return
	}
	r := f.entity(ti.table, key, src)
	if r == nil {
		return
	}
	for _, a := range sortedKeys(ti.lookupCrit) {
		v, ok := c.args.Get(a)
		if !ok {
			continue
		}
		path := strings.Split(ti.lookupCrit[a], ".")
		// "name.first_name" = v is the field "name" = {"first_name": v}.
		for i := len(path) - 1; i > 0; i-- {
			o := jsonvalue.NewObject(1)
			o.Set(path[i], v)
			v = o
		}
		f.set(ti.table, key, r, path[0], v, at, src)
	}
}

// factRows answers a table's fact rows for the bundle, sorted by key.
func (m *model) factRows(table string) []twin.Row {
	if m.facts == nil {
		return nil
	}
	rows := m.facts.rows[table]
	out := make([]twin.Row, 0, len(rows))
	for _, k := range sortedKeys(rows) {
		r := rows[k]
		out = append(out, twin.Row{Key: k, JSON: twin.Render(r.row, twin.StylePythonU), From: r.from})
	}
	return out
}

// factsReport summarizes the fact store.
func (m *model) factsReport() *FactsReport {
	if m.facts == nil {
		return nil
	}
	rep := &FactsReport{Entities: map[string]int{}, Mentions: m.facts.mentions, Conflicts: m.facts.conflicts, Examples: m.facts.examples}
	for tn, rows := range m.facts.rows {
		rep.Entities[tn] = len(rows)
	}
	return rep
}

// keyPatternOf is the id format of a table's keys as a regular expression: patternOf's, else, for keys of
// one length, each position's character classes ("4WQ150" and "HXDUBJ": ^[0-9A-Z]{6}$).
func keyPatternOf(keys []string) string {
	if p := patternOf(keys); p != "" || len(keys) < 2 {
		return p
	}
	n := len(keys[0])
	for _, k := range keys {
		if len(k) != n || n == 0 || n > 64 {
			return ""
		}
	}
	var b strings.Builder
	b.WriteByte('^')
	prev, run := "", 0
	flush := func() {
		if run == 0 {
			return
		}
		b.WriteString(prev)
		if run > 1 {
			fmt.Fprintf(&b, "{%d}", run)
		}
	}
	for i := 0; i < n; i++ {
		cls := map[byte]bool{}
		for _, k := range keys {
			switch c := charClass(k[i]); c {
			case '9', 'A', 'a':
				cls[c] = true
			default:
				return "" // punctuation that varies: no simple format
			}
		}
		var set strings.Builder
		set.WriteByte('[')
		if cls['9'] {
			set.WriteString("0-9")
		}
		if cls['A'] {
			set.WriteString("A-Z")
		}
		if cls['a'] {
			set.WriteString("a-z")
		}
		set.WriteByte(']')
		if set.String() == prev {
			run++
			continue
		}
		flush()
		prev, run = set.String(), 1
	}
	flush()
	b.WriteByte('$')
	if _, err := regexp.Compile(b.String()); err != nil {
		return ""
	}
	return b.String()
}

// keyParts learns the fields a table's keys embed: key part i (split at "_") equals a string field of the
// row (as it is, or title-cased) in at least 9 of 10 rows.
func (m *model) keyParts(table string) []twin.KeyPart {
	rows := m.base[table]
	if len(rows) < 3 {
		return nil
	}
	type cand struct {
		idx   int
		path  string
		title bool
	}
	count := map[cand]int{}
	for _, k := range sortedKeys(rows) {
		parts := strings.Split(k, "_")
		if len(parts) < 2 {
			return nil
		}
		for i, p := range parts {
			if p == "" || strings.Trim(p, "0123456789") == "" {
				continue
			}
			exact, folded := pathsWithValue(rows[k], p)
			for path := range exact {
				count[cand{i, path, false}]++
			}
			for path := range folded {
				if v, ok := twin.PathGet(rows[k], path); ok {
					if s, ok := v.(string); ok && s == strings.ToUpper(p[:1])+p[1:] {
						count[cand{i, path, true}]++
					}
				}
			}
		}
	}
	var out []twin.KeyPart
	used := map[int]bool{}
	var cs []cand
	for c := range count {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool {
		if count[cs[i]] != count[cs[j]] {
			return count[cs[i]] > count[cs[j]]
		}
		if cs[i].idx != cs[j].idx {
			return cs[i].idx < cs[j].idx
		}
		return cs[i].path < cs[j].path
	})
	for _, c := range cs {
		if used[c.idx] || count[c]*10 < len(rows)*9 {
			continue
		}
		used[c.idx] = true
		out = append(out, twin.KeyPart{Index: c.idx, Path: c.path, Title: c.title})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// keyWords learns the top-level string fields whose value begins with the words the key embeds, in order
// (a user's email "james.sanchez3954@…" for "james_sanchez_3954"), in at least 9 of 10 rows.
func (m *model) keyWords(table string, parts []twin.KeyPart) []string {
	rows := m.base[table]
	if len(parts) == 0 || len(rows) < 3 {
		return nil
	}
	count := map[string]int{}
	for _, k := range sortedKeys(rows) {
		kp := strings.Split(k, "_")
		r := rows[k]
		for i, f := range r.Keys {
			v, ok := r.Vals[i].(string)
			if !ok {
				continue
			}
			w := twin.LetterWords(v)
			if len(w) <= len(parts) {
				continue
			}
			all := true
			for j, p := range parts {
				if p.Index >= len(kp) || w[j] != strings.ToLower(kp[p.Index]) {
					all = false
					break
				}
			}
			if all {
				count[f]++
			}
		}
	}
	var out []string
	for _, f := range sortedKeys(count) {
		if count[f]*10 >= len(rows)*9 {
			out = append(out, f)
		}
	}
	return out
}
