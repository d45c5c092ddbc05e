package twin

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// seedStream keys the seeding PRNG: the session seed and a constant stream id.
const seedStream = 0x646f7070656c // "doppel"

var countWords = map[string]int{"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
	"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}

// maxSeedRows bounds how many rows one instruction may create.
const maxSeedRows = 1000

// seeder turns plain instructions into rows of the session overlay.
type seeder struct {
	s      *Session
	rng    *rand.Rand
	pinned map[string][]string
}

// seed applies instructions such as "3 orders for user X with status pending;
// user Y with membership gold". It answers the pinned keys, or a note saying
// which words could not be turned into rows (and then nothing is applied).
func (s *Session) seed(instr string) (map[string][]string, string) {
	h := fnv.New64a()
	h.Write([]byte(instr))
	sd := &seeder{s: s, rng: rand.New(rand.NewPCG(uint64(s.spec.Seed), seedStream^h.Sum64())), pinned: map[string][]string{}}
	for _, clause := range splitClauses(instr) {
		if err := sd.clause(clause); err != nil {
			return nil, fmt.Sprintf("could not seed %q: %v", clause, err)
		}
	}
	for t := range sd.pinned {
		sd.pinned[t] = dedupe(sd.pinned[t])
	}
	return sd.pinned, ""
}

func dedupe(xs []string) []string {
	seen := map[string]bool{}
	out := xs[:0]
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func splitClauses(s string) []string {
	s = strings.NewReplacer("\n", ";", ". ", ";").Replace(strings.TrimSpace(s))
	s = strings.TrimSuffix(s, ".")
	var out []string
	for _, c := range strings.Split(s, ";") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// tokens splits on spaces, keeping "quoted strings" whole.
func tokens(s string) []string {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' || s[0] == '\'' {
			if j := strings.IndexByte(s[1:], s[0]); j >= 0 {
				out = append(out, s[:j+2])
				s = s[j+2:]
				continue
			}
		}
		j := strings.IndexAny(s, " \t")
		if j < 0 {
			out = append(out, strings.TrimSuffix(s, ","))
			break
		}
		out = append(out, strings.TrimSuffix(s[:j], ","))
		s = s[j:]
	}
	return out
}

func unquote(tok string) string {
	if len(tok) >= 2 && (tok[0] == '"' || tok[0] == '\'') && tok[len(tok)-1] == tok[0] {
		return tok[1 : len(tok)-1]
	}
	return tok
}

// tableFor answers the table a noun names ("orders", "order", "Order").
func (sd *seeder) tableFor(noun string) (*baseTable, bool) {
	n := strings.ToLower(strings.ReplaceAll(noun, " ", "_"))
	for _, name := range sd.s.rt.tableNames {
		t := sd.s.rt.tables[name]
		l := strings.ToLower(name)
		if n == l || n+"s" == l || n+"es" == l || strings.TrimSuffix(l, "s") == n || strings.TrimSuffix(n, "s") == strings.TrimSuffix(l, "s") {
			return t, true
		}
		if strings.HasSuffix(l, "ies") && n == strings.TrimSuffix(l, "ies")+"y" {
			return t, true
		}
	}
	return nil, false
}

func (sd *seeder) clause(c string) error {
	toks := tokens(c)
	if len(toks) == 0 {
		return nil
	}
	i := 0
	count := 0
	if n, err := strconv.Atoi(toks[0]); err == nil {
		count, i = n, 1
	} else if n, ok := countWords[strings.ToLower(toks[0])]; ok {
		count, i = n, 1
	}
	if count < 0 || count > maxSeedRows {
		return fmt.Errorf("count %d out of range 0..%d", count, maxSeedRows)
	}
	if i >= len(toks) {
		return fmt.Errorf("no entity named")
	}
	t, ok := sd.tableFor(toks[i])
	if !ok {
		return fmt.Errorf("%q is not an entity of this environment (entities: %s)", toks[i], strings.Join(sd.s.rt.tableNames, ", "))
	}
	i++
	key := ""
	if i < len(toks) && !isKeyword(toks[i]) {
		key = unquote(toks[i])
		i++
	}
	if key != "" && count > 1 {
		return fmt.Errorf("a key names one row, not %d", count)
	}
	if count == 0 && key == "" {
		if i == len(toks) || isKeyword(toks[i]) {
			count = 1
		}
	}
	var parent *baseTable
	parentKey := ""
	sets := jsonvalue.NewObject(4)
	for i < len(toks) {
		switch strings.ToLower(toks[i]) {
		case "for", "of", "belonging":
			i++
			if i < len(toks) && strings.EqualFold(toks[i], "to") {
				i++
			}
			if i >= len(toks) {
				return fmt.Errorf("'for' needs an entity and a key")
			}
			if pt, ok := sd.tableFor(toks[i]); ok && i+1 < len(toks) {
				parent, parentKey = pt, unquote(toks[i+1])
				i += 2
				break
			}
			// "for <key>": the one table this entity refers to.
			var refs []Ref
			for _, r := range t.def.Refs {
				if !r.Many {
					refs = append(refs, r)
				}
			}
			if len(refs) != 1 {
				return fmt.Errorf("%q is not an entity of this environment", toks[i])
			}
			parent, parentKey = sd.s.rt.tables[refs[0].Table], unquote(toks[i])
			i++
		case "with", "and", "where":
			i++
			var err error
			i, err = sd.fieldValue(t, toks, i, sets)
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("did not understand %q", toks[i])
		}
	}
	if parent != nil {
		if _, ok := sd.s.row(parent.def.Name, parentKey); !ok {
			if err := sd.create(parent, parentKey, jsonvalue.NewObject(0)); err != nil {
				return err
			}
		}
		ref, ok := refTo(t.def, parent.def.Name)
		if !ok {
			return fmt.Errorf("a %s does not refer to a %s", t.def.Name, parent.def.Name)
		}
		sets.Set(ref.Field, parentKey)
		sd.pin(parent.def.Name, parentKey)
	}
	if key != "" {
		if r, ok := sd.s.row(t.def.Name, key); ok {
			c := jsonvalue.Clone(r).(*jsonvalue.Object)
			if err := applySets(c, sets); err != nil {
				return err
			}
			sd.s.put(t.def.Name, key, c)
			sd.pin(t.def.Name, key)
			return sd.link(t, key, parent, parentKey)
		}
		if err := sd.create(t, key, sets); err != nil {
			return err
		}
		return sd.link(t, key, parent, parentKey)
	}
	for n := 0; n < count; n++ {
		k, err := sd.newKey(t)
		if err != nil {
			return err
		}
		if err := sd.create(t, k, sets); err != nil {
			return err
		}
		if err := sd.link(t, k, parent, parentKey); err != nil {
			return err
		}
	}
	return nil
}

func isKeyword(tok string) bool {
	switch strings.ToLower(tok) {
	case "for", "of", "with", "and", "where", "belonging":
		return true
	}
	return false
}

func refTo(t *Table, parent string) (Ref, bool) {
	for _, r := range t.Refs {
		if r.Table == parent && !r.Many {
			return r, true
		}
	}
	return Ref{}, false
}

// fieldValue reads "<field> <value...>" (field words may be joined by spaces or
// underscores; the value runs to the next "and"/"with" or the end).
func (sd *seeder) fieldValue(t *baseTable, toks []string, i int, sets *jsonvalue.Object) (int, error) {
	fields := sd.fieldNames(t)
	// The longest run of words naming a field.
	best, bestLen := "", 0
	for n := 1; n <= 4 && i+n <= len(toks); n++ {
		cand := strings.ToLower(strings.Join(toks[i:i+n], "_"))
		cand2 := strings.ToLower(strings.Join(toks[i:i+n], " "))
		for _, f := range fields {
			lf := strings.ToLower(f)
			if lf == cand || lf == cand2 {
				best, bestLen = f, n
			}
		}
	}
	if best == "" {
		if i < len(toks) {
			return i, fmt.Errorf("%q is not a field of %s", toks[i], t.def.Name)
		}
		return i, fmt.Errorf("a field name is missing")
	}
	i += bestLen
	if i < len(toks) && (toks[i] == "=" || toks[i] == ":" || strings.EqualFold(toks[i], "is") || strings.EqualFold(toks[i], "of")) {
		i++
	}
	j := i
	for j < len(toks) && !(strings.EqualFold(toks[j], "and") || strings.EqualFold(toks[j], "with") || strings.EqualFold(toks[j], "for")) {
		j++
	}
	if j == i {
		return i, fmt.Errorf("no value for %s", best)
	}
	raw := unquote(strings.Join(toks[i:j], " "))
	sets.Set(best, sd.typed(t, best, raw))
	return j, nil
}

// fieldNames lists the top-level fields of a table's rows (and dotted nested ones).
func (sd *seeder) fieldNames(t *baseTable) []string {
	set := map[string]bool{}
	for _, k := range t.keys {
		r := t.rows[k]
		for i, f := range r.Keys {
			set[f] = true
			if o, ok := r.Vals[i].(*jsonvalue.Object); ok {
				for _, g := range o.Keys {
					set[f+"."+g] = true
				}
			}
		}
		if len(set) > 200 {
			break
		}
	}
	if !t.def.KeyInRow {
		set[t.def.Key] = true
	}
	out := make([]string, 0, len(set))
	for f := range set {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// typed converts an instruction's value to the type the field has in the base rows.
func (sd *seeder) typed(t *baseTable, field, raw string) any {
	var sample any
	for _, k := range t.keys {
		if v, ok := PathGet(t.rows[k], field); ok && v != nil {
			sample = v
			break
		}
	}
	switch strings.ToLower(raw) {
	case "null", "none":
		return nil
	}
	switch sample.(type) {
	case jsonvalue.Number:
		if _, err := strconv.ParseFloat(raw, 64); err == nil {
			return jsonvalue.Number(raw)
		}
	case bool:
		switch strings.ToLower(raw) {
		case "true", "yes":
			return true
		case "false", "no":
			return false
		}
	}
	return raw
}

func applySets(row *jsonvalue.Object, sets *jsonvalue.Object) error {
	for i, f := range sets.Keys {
		if !strings.Contains(f, ".") {
			row.Set(f, sets.Vals[i])
			continue
		}
		parts := strings.Split(f, ".")
		cur := row
		for _, p := range parts[:len(parts)-1] {
			v, ok := cur.Get(p)
			o, isObj := v.(*jsonvalue.Object)
			if !ok || !isObj {
				o = jsonvalue.NewObject(1)
				cur.Set(p, o)
			}
			cur = o
		}
		cur.Set(parts[len(parts)-1], sets.Vals[i])
	}
	return nil
}

func (sd *seeder) pin(table, key string) { sd.pinned[table] = append(sd.pinned[table], key) }

// create adds row key to t, copied from a base row the PRNG picks (preferring rows
// that already have the requested field values), with the requested fields set.
func (sd *seeder) create(t *baseTable, key string, sets *jsonvalue.Object) error {
	if len(t.keys) == 0 {
		return fmt.Errorf("no %s rows to model a new one on", t.def.Name)
	}
	var pool []string
	for _, k := range t.keys {
		ok := true
		for i, f := range sets.Keys {
			if v, has := PathGet(t.rows[k], f); !has || !jsonvalue.Equal(v, sets.Vals[i]) {
				ok = false
				break
			}
		}
		if ok {
			pool = append(pool, k)
		}
	}
	if len(pool) == 0 {
		pool = t.keys
	}
	tmpl := pool[sd.rng.IntN(len(pool))]
	row := jsonvalue.Clone(t.rows[tmpl]).(*jsonvalue.Object)
	if t.def.KeyInRow {
		row.Set(t.def.Key, key)
	}
	// Lists of keys of other tables start empty: the new row owns nothing yet.
	for _, r := range t.def.Refs {
		if r.Many {
			if _, ok := row.Get(r.Field); ok {
				row.Set(r.Field, []any{})
			}
		}
	}
	if err := applySets(row, sets); err != nil {
		return err
	}
	sd.s.put(t.def.Name, key, row)
	sd.pin(t.def.Name, key)
	return nil
}

// link appends a child's key to the parent's list of such keys, when the parent keeps one.
func (sd *seeder) link(child *baseTable, key string, parent *baseTable, parentKey string) error {
	if parent == nil {
		return nil
	}
	for _, r := range parent.def.Refs {
		if r.Table != child.def.Name || !r.Many {
			continue
		}
		pr, ok := sd.s.row(parent.def.Name, parentKey)
		if !ok {
			return nil
		}
		c := jsonvalue.Clone(pr).(*jsonvalue.Object)
		l, _ := c.Get(r.Field)
		list, _ := l.([]any)
		for _, e := range list {
			if e == key {
				return nil
			}
		}
		c.Set(r.Field, append(append([]any{}, list...), key))
		sd.s.put(parent.def.Name, parentKey, c)
	}
	return nil
}

// newKey draws a fresh key in the table's key shape: 9 → a digit, A → an upper-case
// letter, a → a lower-case letter, a backslash keeps the next character, anything
// else is kept.
func (sd *seeder) newKey(t *baseTable) (string, error) {
	shape := t.def.KeyShape
	if shape == "" {
		shape = `\k\e\y_99999999`
	}
	for try := 0; try < 100; try++ {
		var b strings.Builder
		escaped := false
		for _, c := range shape {
			switch {
			case escaped:
				b.WriteRune(c)
				escaped = false
			case c == '\\':
				escaped = true
			case c == '9':
				b.WriteByte(byte('0' + sd.rng.IntN(10)))
			case c == 'A':
				b.WriteByte(byte('A' + sd.rng.IntN(26)))
			case c == 'a':
				b.WriteByte(byte('a' + sd.rng.IntN(26)))
			default:
				b.WriteRune(c)
			}
		}
		k := b.String()
		if _, taken := sd.s.row(t.def.Name, k); !taken {
			return k, nil
		}
	}
	return "", fmt.Errorf("could not draw a free %s key in shape %q", t.def.Name, shape)
}
