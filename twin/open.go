package twin

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// World policies: what a read of an id the world does not hold answers.
const (
	// WorldOpen materializes an unknown id of a known entity type, in the id format the recordings show, from
	// the session seed and the id (consistent with the facts the build learned about it), labelled B_inferred.
	WorldOpen = "open"
	// WorldClosed answers production's own not-found error for every id the world does not hold.
	WorldClosed = "closed"
)

// DefaultWorld is the policy of a bundle that names none.
const DefaultWorld = WorldOpen

// materializeStream keys the PRNG that invents an entity: the session seed, this stream and the (table, id).
const materializeStream = 0x6d6174657269616c // "material"

// checkWorld validates a world policy ("" is the default).
func checkWorld(w string) error {
	switch w {
	case "", WorldOpen, WorldClosed:
		return nil
	}
	return fmt.Errorf("must be %q or %q, not %q", WorldOpen, WorldClosed, w)
}

// worldOf resolves a session's policy: its own, else the bundle's, else the default.
func worldOf(spec, bundle string) string {
	switch {
	case spec != "":
		return spec
	case bundle != "":
		return bundle
	}
	return DefaultWorld
}

// World answers the session's world policy (open or closed).
func (s *Session) World() string { return s.world }

// materialized answers a row this call (or an earlier one) made up for an id, if any.
func (e *callEnv) materialized(table, key string) (*jsonvalue.Object, bool) {
	r, ok := e.mat[tableKey{table, key}]
	return r, ok
}

// lookupOrMaterialize answers the row (table, key) as this call sees it; when the world does not hold it, an
// entity the build knows from facts, or (open world) an id in the table's id format, is made up and kept.
func (e *callEnv) lookupOrMaterialize(table, key string) (*jsonvalue.Object, bool) {
	if r, ok := e.rowOf(table, key); ok {
		return r, true
	}
	if r, ok := e.materialized(table, key); ok {
		return r, true
	}
	tk := tableKey{table, key}
	if e.dels[tk] {
		return nil, false
	}
	if _, deleted := e.sess.over[table][key]; deleted {
		return nil, false // the session deleted it: gone, not unknown
	}
	return e.materialize(table, key, nil, tableKey{})
}

// canMaterialize tells whether (table, key) may be made up: a fact names it, or the world is open and the key
// has the table's id format.
func (s *Session) canMaterialize(bt *baseTable, key string) bool {
	if bt == nil || len(bt.keys) == 0 || key == "" || bt.absent[key] {
		return false
	}
	if _, ok := bt.facts[key]; ok {
		return true
	}
	return s.world == WorldOpen && bt.keyRe != nil && bt.keyRe.MatchString(key)
}

// materialize makes up row (table, key): a base row picked by the PRNG of (seed, table, key) as the model of
// its values, with the key, the name parts the key embeds, the build's facts about it and sets applied. Its
// lists of other tables' keys (a user's orders) name ids of its own (freshRefLists); a single key of another
// table (an order's user) names the row whose list names this key when the world holds one, else an entity
// made up with it that owns this one (back is the entity that asked for this one, which then owns it: refs.go).
// The rows are kept in the call's env and committed with it, whatever it answers.
func (e *callEnv) materialize(table, key string, sets *jsonvalue.Object, back tableKey) (*jsonvalue.Object, bool) {
	s := e.sess
	bt := s.rt.tables[table]
	if !s.canMaterialize(bt, key) {
		return nil, false
	}
	h := fnv.New64a()
	h.Write([]byte(table))
	h.Write([]byte{0})
	h.Write([]byte(key))
	rng := rand.New(rand.NewPCG(uint64(s.spec.Seed), materializeStream^h.Sum64()))
	tmpl := bt.rows[bt.keys[rng.IntN(len(bt.keys))]]
	row := jsonvalue.Clone(tmpl).(*jsonvalue.Object)
	if bt.def.KeyInRow {
		row.Set(bt.def.Key, key)
	}
	for _, kp := range bt.def.KeyParts {
		parts := strings.Split(key, keyPartSep)
		if kp.Index < len(parts) && parts[kp.Index] != "" {
			v := parts[kp.Index]
			if kp.Title {
				v = titleWord(v)
			}
			_ = setPath(row, kp.Path, v)
		}
	}
	spellKeyWords(row, bt.def, key)
	fact := bt.facts[key]
	e.freshRefLists(row, table, key, fact, back)
	for _, r := range bt.def.Refs {
		if r.Many {
			continue
		}
		old, ok := row.Get(r.Field)
		if !ok {
			continue
		}
		if owner, listed := e.ownerOf(table, key, r); listed {
			row.Set(r.Field, owner)
		} else if back.table == r.Table && back.key != "" {
			row.Set(r.Field, back.key)
		} else if os, ok := old.(string); ok {
			row.Set(r.Field, freshLike(os, rng))
		}
	}
	freshMapKeys(row, fact, bt.mapFields, rng)
	if fact != nil {
		mergeFact(row, fact, bt.mapFields)
	}
	if sets != nil {
		_ = applySets(row, sets)
	}
	if e.mat == nil {
		e.mat = map[tableKey]*jsonvalue.Object{}
	}
	tk := tableKey{table, key}
	e.mat[tk] = row
	e.matOrder = append(e.matOrder, tk)
	// The entities a single key names exist too, and own this one.
	for _, r := range bt.def.Refs {
		if r.Many {
			continue
		}
		v, ok := row.Get(r.Field)
		ref, isStr := v.(string)
		if !ok || !isStr {
			continue
		}
		if _, exists := e.rowOf(r.Table, ref); exists {
			continue
		}
		owner, made := e.materialize(r.Table, ref, nil, tk)
		if !made {
			continue
		}
		if field, ok := s.backRef(r.Table, table); ok {
			if l, ok := owner.Get(field); ok {
				list, _ := l.([]any)
				if !containsValue(list, key) {
					owner.Set(field, append(append([]any{}, list...), key))
				}
			}
		}
	}
	return row, true
}

// spellKeyWords makes the row's KeyWords fields begin with the words its key embeds: the model row's email
// ("ethan.garcia8085@example.com") spells another entity's names, the made-up one's is "fatima.taylor8085@…" for
// "fatima_taylor_3452", so a search by it finds this entity. The runs of letters are replaced in order (a run in
// title case gets the word in title case); the rest (digits, punctuation, the domain) stays the model's.
func spellKeyWords(row *jsonvalue.Object, def *Table, key string) {
	if len(def.KeyWords) == 0 || len(def.KeyParts) == 0 {
		return
	}
	parts := strings.Split(key, keyPartSep)
	words := make([]string, len(def.KeyParts))
	for i, kp := range def.KeyParts {
		if kp.Index >= len(parts) || parts[kp.Index] == "" || strings.IndexFunc(parts[kp.Index], func(r rune) bool { return !unicode.IsLetter(r) }) >= 0 {
			return // the key's part is no word: nothing to spell
		}
		words[i] = strings.ToLower(parts[kp.Index])
	}
	for _, f := range def.KeyWords {
		if v, ok := row.Get(f); ok {
			if sv, ok := v.(string); ok && len(LetterWords(sv)) > len(words) {
				row.Set(f, replaceLetterRuns(sv, words))
			}
		}
	}
}

// replaceLetterRuns replaces the first len(words) runs of letters in s by words, in order.
func replaceLetterRuns(s string, words []string) string {
	var b strings.Builder
	n := 0
	rs := []rune(s)
	for i := 0; i < len(rs); {
		if !unicode.IsLetter(rs[i]) || n >= len(words) {
			b.WriteRune(rs[i])
			i++
			continue
		}
		j := i
		for j < len(rs) && unicode.IsLetter(rs[j]) {
			j++
		}
		w := words[n]
		if unicode.IsUpper(rs[i]) {
			w = titleWord(w)
		}
		b.WriteString(w)
		n++
		i = j
	}
	return b.String()
}

// freshMapKeys redraws the member keys of the row's maps of entities (a user's payment methods, a product's
// variants) that the fact does not give: the model row's keys belong to another entity, so each is drawn anew
// in its format (freshLike) and the member's own key field follows; the members' values keep the model's shape.
func freshMapKeys(row, fact *jsonvalue.Object, mapFields map[string]bool, rng *rand.Rand) {
	for i, f := range row.Keys {
		if !mapFields[f] {
			continue
		}
		if fact != nil {
			if _, given := fact.Get(f); given {
				continue
			}
		}
		m, ok := row.Vals[i].(*jsonvalue.Object)
		if !ok {
			continue
		}
		idField, _ := EntityMapField(m)
		out := jsonvalue.NewObject(m.Len())
		for j, k := range m.Keys {
			nk := freshLike(k, rng)
			for try := 0; try < 8; try++ {
				if _, taken := out.Get(nk); !taken {
					break
				}
				nk = freshLike(k, rng)
			}
			v := m.Vals[j]
			if mo, ok := v.(*jsonvalue.Object); ok && idField != "" {
				c := jsonvalue.Clone(mo).(*jsonvalue.Object)
				c.Set(idField, nk)
				v = c
			}
			out.Set(nk, v)
		}
		row.Vals[i] = out
	}
}

func containsValue(list []any, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// freshLike draws a value in the shape of s: each digit redrawn, everything else kept.
func freshLike(s string, rng *rand.Rand) string {
	b := []byte(s)
	for i, c := range b {
		if c >= '0' && c <= '9' {
			b[i] = byte('0' + rng.IntN(10))
		}
	}
	return string(b)
}

// keyPartSep splits keys into the parts a KeyPart indexes.
const keyPartSep = "_"

func titleWord(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError {
		return s
	}
	return string(unicode.ToUpper(r)) + s[n:]
}

// setPath sets a dotted path's value in row, creating nothing: every object on the way must exist.
func setPath(row *jsonvalue.Object, path string, v any) error {
	segs := strings.Split(path, ".")
	o := row
	for _, seg := range segs[:len(segs)-1] {
		next, ok := o.Get(seg)
		if !ok {
			return fmt.Errorf("no %q", seg)
		}
		if o, ok = next.(*jsonvalue.Object); !ok {
			return fmt.Errorf("%q is not an object", seg)
		}
	}
	o.Set(segs[len(segs)-1], v)
	return nil
}

// mergeFact lays a fact (what the recordings show of an entity) over a row modelled on another: fields the fact
// has replace the row's; nested objects merge. A map of entities (mapFields: "variants" when a sub-index walks
// "variants.*") holds exactly the fact's members, each completed from the model row's first member.
func mergeFact(row, fact *jsonvalue.Object, mapFields map[string]bool) {
	for i, k := range fact.Keys {
		fv := fact.Vals[i]
		rv, has := row.Get(k)
		fo, fIsObj := fv.(*jsonvalue.Object)
		ro, rIsObj := rv.(*jsonvalue.Object)
		switch {
		case has && fIsObj && rIsObj && mapFields[k]:
			var model *jsonvalue.Object
			for _, x := range ro.Vals {
				if mo, ok := x.(*jsonvalue.Object); ok {
					model = mo
					break
				}
			}
			out := jsonvalue.NewObject(fo.Len())
			for j, mk := range fo.Keys {
				mv := fo.Vals[j]
				if mo, ok := mv.(*jsonvalue.Object); ok && model != nil {
					// A member's fields are its own (a variant's options): they replace the model's whole.
					c := jsonvalue.Clone(model).(*jsonvalue.Object)
					for fi, fk := range mo.Keys {
						c.Set(fk, jsonvalue.Clone(mo.Vals[fi]))
					}
					mv = c
				}
				out.Set(mk, mv)
			}
			row.Set(k, out)
		case has && fIsObj && rIsObj:
			c := jsonvalue.Clone(ro).(*jsonvalue.Object)
			mergeFact(c, fo, nil)
			row.Set(k, c)
		default:
			row.Set(k, jsonvalue.Clone(fv))
		}
	}
}

// compileKeyPattern compiles a table's id format ("" → none).
func compileKeyPattern(p string) (*regexp.Regexp, error) {
	if p == "" {
		return nil, nil
	}
	return regexp.Compile(p)
}

// materializeMatch answers an entity for a search the world has no row for (world.find(..., materialize=True)):
// an entity the build knows from facts whose id embeds the searched values, else, in an open world, a new
// one whose id is drawn in the table's id format (embedding the searched values where ids embed fields), made
// up with the searched fields set.
func (e *callEnv) materializeMatch(table string, cs []criterion) (string, bool) {
	s := e.sess
	bt := s.rt.tables[table]
	if bt == nil || len(bt.keys) == 0 {
		return "", false
	}
	sets := jsonvalue.NewObject(len(cs))
	for _, c := range cs {
		if !bt.def.KeyInRow && c.path == bt.def.Key {
			return "", false // the search names the key itself: a read, not a search
		}
		sets.Set(c.path, c.value)
	}
	byPath := map[string]criterion{}
	for _, c := range cs {
		byPath[c.path] = c
	}
	// A fact matches when nothing it knows (its fields, the values its id embeds) contradicts the search and
	// something confirms it.
	confirmed := func(key string, fact *jsonvalue.Object) bool {
		parts := strings.Split(key, keyPartSep)
		n := 0
		for _, kp := range bt.def.KeyParts {
			c, ok := byPath[kp.Path]
			if !ok {
				continue
			}
			if kp.Index >= len(parts) || !strings.EqualFold(parts[kp.Index], TextOf(c.value, s.rt.style)) {
				return false
			}
			n++
		}
		for _, c := range cs {
			if v, ok := PathGet(fact, c.path); ok {
				if indexValue(v, true) != indexValue(c.value, true) {
					return false
				}
				n++
			}
		}
		return n > 0
	}
	for _, k := range bt.factKeys {
		if _, held := e.rowOf(table, k); held {
			continue
		}
		if !confirmed(k, bt.facts[k]) {
			continue
		}
		if _, ok := e.materialize(table, k, sets, tableKey{}); ok {
			return k, true
		}
	}
	if s.world != WorldOpen || bt.keyRe == nil {
		return "", false
	}
	for _, c := range cs {
		if v, ok := c.value.(string); ok && !bt.knownFormat(c.path, v) {
			return "", false // a value in no format the world shows ("silva7872@…" where emails are first.last1234@…)
		}
	}
	words := wordsOf(bt, cs, s.rt.style)
	if s.namesHeldEntity(bt, words, e) {
		return "", false
	}
	h := fnv.New64a()
	h.Write([]byte(table))
	for _, c := range cs {
		h.Write([]byte{0})
		h.Write([]byte(c.path))
		h.Write([]byte{0})
		h.Write([]byte(indexValue(c.value, true)))
	}
	rng := rand.New(rand.NewPCG(uint64(s.spec.Seed), materializeStream^h.Sum64()))
	for try := 0; try < 20; try++ {
		model := bt.keys[rng.IntN(len(bt.keys))]
		parts := strings.Split(freshLike(model, rng), keyPartSep)
		for i, kp := range bt.def.KeyParts {
			if words != nil && kp.Index < len(parts) {
				parts[kp.Index] = words[i]
			}
		}
		k := strings.Join(parts, keyPartSep)
		if !bt.keyRe.MatchString(k) {
			continue
		}
		if _, taken := e.rowOf(table, k); taken {
			continue
		}
		if _, taken := e.materialized(table, k); taken {
			continue
		}
		if _, deleted := s.over[table][k]; deleted {
			continue
		}
		if _, ok := e.materialize(table, k, sets, tableKey{}); ok {
			return k, true
		}
	}
	return "", false
}

// minFormatValues is how many string values a field must show before its formats bound what a search may make up.
const minFormatValues = 3

// knownFormat tells whether v has a format (valueFormat) that the table's rows (base and facts) show at path;
// true when they show fewer than minFormatValues strings there, too few to know the field's format.
func (bt *baseTable) knownFormat(path, v string) bool {
	bt.formatsMu.Lock()
	defer bt.formatsMu.Unlock()
	fs, ok := bt.formats[path]
	if !ok {
		fs = map[string]bool{}
		n := 0
		add := func(r *jsonvalue.Object) {
			if x, ok := PathGet(r, path); ok {
				if xs, ok := x.(string); ok {
					fs[valueFormat(xs)] = true
					n++
				}
			}
		}
		for _, k := range bt.keys {
			add(bt.rows[k])
		}
		for _, k := range bt.factKeys {
			add(bt.facts[k])
		}
		if n < minFormatValues {
			fs = nil
		}
		if bt.formats == nil {
			bt.formats = map[string]map[string]bool{}
		}
		bt.formats[path] = fs
	}
	return fs == nil || fs[valueFormat(v)]
}

// valueFormat is a string's format: each run of letters "a", each run of digits "9", anything else kept
// ("james.kim1995@example.com" → "a.a9@a.a", "12345" → "9").
func valueFormat(s string) string {
	var b strings.Builder
	last := rune(0)
	for _, r := range s {
		c := r
		switch {
		case unicode.IsLetter(r):
			c = 'a'
		case unicode.IsDigit(r):
			c = '9'
		}
		if (c == 'a' || c == '9') && c == last {
			continue
		}
		b.WriteRune(c)
		last = c
	}
	return b.String()
}

// absentRead tells a read of an id the world does not hold and may not make up (a closed world, or an id
// outside the recorded format): the recordings must not invent it either, whichever rung answers.
func (s *Session) absentRead(t *rtTool, args *jsonvalue.Object) bool {
	if t.def.Kind != KindRead || t.def.Table == "" {
		return false
	}
	k, ok := keyArg(t.def, args)
	if !ok {
		return false
	}
	if _, held := s.row(t.def.Table, k); held {
		return false
	}
	bt := s.rt.tables[t.def.Table]
	if bt == nil {
		return false
	}
	return !s.canMaterialize(bt, k)
}

// inferNotFound answers a closed world's read of an absent id with production's own not-found answer: the
// closest recorded error of the tool, else of another tool of the same table, with this call's values in it.
func (s *Session) inferNotFound(t *rtTool, args *jsonvalue.Object) (*answer, string) {
	flat := flatten(args)
	pick := func(tt *rtTool) *rec {
		var best *rec
		bestD := -1
		for _, r := range tt.all {
			if !r.isErr {
				continue
			}
			if d := distance(flat, r.flat); bestD < 0 || d < bestD {
				best, bestD = r, d
			}
		}
		return best
	}
	best := pick(t)
	if best == nil {
		for _, name := range s.rt.toolNames {
			o := s.rt.tools[name]
			if o != t && o.def.Table == t.def.Table && (o.def.Kind == KindRead || o.def.Kind == KindLookup) {
				if best = pick(o); best != nil {
					break
				}
			}
		}
	}
	if best == nil {
		return nil, "no " + t.def.Table + " row with this key, and no recorded not-found answer"
	}
	content := substitute(best.answer, best.flat, flat, s.rt.style)
	return &answer{content: content, isErr: true}, ""
}

// LetterWords splits a value into its runs of letters, lower-cased ("James.Sanchez3954@x.com": james, sanchez,
// x, com).
func LetterWords(v string) []string {
	return strings.FieldsFunc(strings.ToLower(v), func(r rune) bool { return !unicode.IsLetter(r) })
}

// wordsOf answers the key parts a search's criteria name: the values of KeyParts paths, else the leading words
// of a KeyWords field; nil when they name none.
func wordsOf(bt *baseTable, cs []criterion, st Style) []string {
	byPath := map[string]any{}
	for _, c := range cs {
		byPath[c.path] = c.value
	}
	out := make([]string, len(bt.def.KeyParts))
	n := 0
	for i, kp := range bt.def.KeyParts {
		if v, ok := byPath[kp.Path]; ok {
			out[i] = strings.ToLower(TextOf(v, st))
			n++
		}
	}
	if n == len(out) && n > 0 {
		return out
	}
	for _, f := range bt.def.KeyWords {
		v, ok := byPath[f].(string)
		if !ok {
			continue
		}
		if w := LetterWords(v); len(w) > len(bt.def.KeyParts) {
			return w[:len(bt.def.KeyParts)]
		}
	}
	return nil
}

// namesHeldEntity tells a search whose criteria name an entity by the words its ids embed (a user's names, given
// or spelled by the email) when the world holds an entity of those names and the rest of the search does not
// match it: that entity, under other values, is not found rather than made up a second time.
func (s *Session) namesHeldEntity(bt *baseTable, words []string, e *callEnv) bool {
	if len(words) == 0 {
		return false
	}
	named := make([]criterion, len(words))
	for i, kp := range bt.def.KeyParts {
		named[i] = criterion{path: kp.Path, value: words[i], fold: true}
	}
	return len(s.find(bt.def.Name, named, e)) > 0
}

// EntityMapField answers the field that names each member of a map of entities: an object whose members are
// all objects carrying their own member key in one field ({"9472539378": {"item_id": "9472539378", …}} → item_id).
func EntityMapField(o *jsonvalue.Object) (string, bool) {
	if o == nil || o.Len() == 0 {
		return "", false
	}
	first, ok := o.Vals[0].(*jsonvalue.Object)
	if !ok {
		return "", false
	}
	for _, f := range first.Keys {
		all := true
		for i, k := range o.Keys {
			m, ok := o.Vals[i].(*jsonvalue.Object)
			if !ok {
				return "", false
			}
			if v, ok := m.Get(f); !ok || v != any(k) {
				all = false
				break
			}
		}
		if all {
			return f, true
		}
	}
	return "", false
}
