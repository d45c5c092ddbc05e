package twin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// baseTable is one entity table of the immutable base world, shared by every session.
type baseTable struct {
	def  *Table
	rows map[string]*jsonvalue.Object
	keys []string // sorted
	// body is the canonical JSON of the table's members ("k":row,...) and off[i] the start of
	// the i-th key's member in it (after its comma), so hashing reads a base row's canonical bytes as they are.
	body []byte
	off  []int
	// nb is the table's hash bucket count, bucketRows the row indexes of each bucket (in key order), digests
	// each bucket's digest and digest the table's (see hash.go).
	nb         int
	bucketRows [][]int
	digests    []digest
	digest     digest
	// indexes maps an index id to canonical value → sorted keys.
	indexes map[string]map[string][]string
	// subs maps a sub-index name to canonical field value → where the nested object lives.
	subs    map[string]map[string]subHit
	subDefs map[string]SubIndex
	// facts are partial rows of entities the base does not hold (Table.Facts); keyRe the id format;
	// mapFields the top-level fields that are maps of entities (a sub-index path "f.*").
	absent    map[string]bool
	facts     map[string]*jsonvalue.Object
	factKeys  []string // sorted
	keyRe     *regexp.Regexp
	mapFields map[string]bool
	// formats caches, per field path, the formats (valueFormat) of the string values the table's rows hold.
	formatsMu sync.Mutex
	formats   map[string]map[string]bool
	// backs caches, per list field of keys of another table, which base rows list each key (refs.go).
	backsMu sync.Mutex
	backs   map[string]map[string][]string
	// stars caches, per key of a row world.get read, the row's Starlark template (startmpl.go).
	stars sync.Map
}

type subHit struct {
	key string
	obj *jsonvalue.Object
}

func indexID(path string, fold bool) string {
	if fold {
		return path + "|fold"
	}
	return path
}

// indexValue is the normalized form a lookup compares: canonical JSON, lowercased when folded.
func indexValue(v any, fold bool) string {
	if fold {
		if s, ok := v.(string); ok {
			v = strings.ToLower(s)
		}
	}
	return jsonvalue.CanonicalText(v)
}

// PathGet walks a dotted path ("name.first_name") through nested objects.
func PathGet(v any, path string) (any, bool) {
	for path != "" {
		o, ok := v.(*jsonvalue.Object)
		if !ok {
			return nil, false
		}
		seg := path
		rest := ""
		if i := strings.IndexByte(path, '.'); i >= 0 {
			seg, rest = path[:i], path[i+1:]
		}
		v, ok = o.Get(seg)
		if !ok {
			return nil, false
		}
		path = rest
	}
	return v, true
}

// subObjects walks a sub-index path ("variants.*", "items[]", "a.b[]") to the nested objects it names.
func subObjects(row *jsonvalue.Object, path string) []*jsonvalue.Object {
	cur := []any{row}
	for _, seg := range strings.Split(path, ".") {
		var next []any
		each := false
		if strings.HasSuffix(seg, "[]") {
			each = true
			seg = strings.TrimSuffix(seg, "[]")
		}
		for _, c := range cur {
			o, ok := c.(*jsonvalue.Object)
			if !ok {
				continue
			}
			if seg == "*" {
				next = append(next, o.Vals...)
				continue
			}
			v, ok := o.Get(seg)
			if !ok {
				continue
			}
			if each {
				if l, ok := v.([]any); ok {
					next = append(next, l...)
				}
				continue
			}
			next = append(next, v)
		}
		cur = next
	}
	out := make([]*jsonvalue.Object, 0, len(cur))
	for _, c := range cur {
		if o, ok := c.(*jsonvalue.Object); ok {
			out = append(out, o)
		}
	}
	return out
}

// newBaseTable indexes a table's rows; parsed holds rows already parsed by key (nil: parse them all).
func newBaseTable(def *Table, parsed map[string]*jsonvalue.Object) (*baseTable, error) {
	t := &baseTable{def: def, indexes: map[string]map[string][]string{}, subs: map[string]map[string]subHit{},
		subDefs: map[string]SubIndex{}}
	var err error
	if t.rows, t.keys, err = parseRows(def.Name, "rows", def.Rows, parsed); err != nil {
		return nil, err
	}
	// The canonical members are about as long as the rows' rendered JSON (which spaces its separators), so
	// the body is sized once from those where the rows are rendered: a doubling buffer can leave up to half of
	// a large world's body unused (and where they are not, the body is copied to its size below).
	size := 0
	for i := range def.Rows {
		size += len(def.Rows[i].Key) + len(def.Rows[i].JSON) + 4
	}
	body := bytes.NewBuffer(make([]byte, 0, size))
	t.off = make([]int, len(t.keys)+1)
	for i, k := range t.keys {
		t.off[i] = body.Len()
		if i > 0 {
			body.WriteByte(',')
		}
		jsonvalue.AppendString(body, k)
		body.WriteByte(':')
		jsonvalue.AppendCanonical(body, t.rows[k])
	}
	t.off[len(t.keys)] = body.Len()
	t.body = body.Bytes()
	if cap(t.body)-len(t.body) > len(t.body)/8 {
		t.body = bytes.Clone(t.body)
	}
	t.hashBuckets()
	for _, ix := range def.Indexes {
		t.addIndex(ix.Path, ix.Fold)
	}
	t.mapFields = map[string]bool{}
	if t.facts, t.factKeys, err = parseRows(def.Name, "facts", def.Facts, nil); err != nil {
		return nil, err
	}
	t.absent = map[string]bool{}
	for _, k := range def.Absent {
		t.absent[k] = true
	}
	re, err := compileKeyPattern(def.KeyPattern)
	if err != nil {
		return nil, fmt.Errorf("%w: tables[%s].key_pattern: %w", ErrBadBundle, def.Name, err)
	}
	t.keyRe = re
	for _, k := range t.keys {
		r := t.rows[k]
		for i, f := range r.Keys {
			if o, ok := r.Vals[i].(*jsonvalue.Object); ok {
				if _, isMap := EntityMapField(o); isMap {
					t.mapFields[f] = true
				}
			}
		}
	}
	for _, sd := range def.Subs {
		if f, ok := strings.CutSuffix(sd.Path, ".*"); ok && !strings.ContainsAny(f, ".[") {
			t.mapFields[f] = true
		}
		t.subDefs[sd.Name] = sd
		m := map[string]subHit{}
		for _, k := range t.keys {
			for _, o := range subObjects(t.rows[k], sd.Path) {
				if v, ok := o.Get(sd.Field); ok {
					cv := jsonvalue.CanonicalText(v)
					if _, seen := m[cv]; !seen {
						m[cv] = subHit{key: k, obj: o}
					}
				}
			}
		}
		t.subs[sd.Name] = m
	}
	return t, nil
}

// parseRows parses a table's rows (or its facts: field names which, for errors) into objects by key, and the keys
// sorted. A row that parsed holds by its key is taken as it is, not parsed again.
func parseRows(table, field string, rows []Row, parsed map[string]*jsonvalue.Object) (map[string]*jsonvalue.Object, []string, error) {
	byKey := make(map[string]*jsonvalue.Object, len(rows))
	keys := make([]string, 0, len(rows))
	for i, r := range rows {
		o := parsed[r.Key]
		if o == nil {
			v, err := jsonvalue.ParseString(r.JSON)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: tables[%s].%s[%d]: %w", ErrBadBundle, table, field, i, err)
			}
			var ok bool
			if o, ok = v.(*jsonvalue.Object); !ok {
				return nil, nil, fmt.Errorf("%w: tables[%s].%s[%d]: not an object", ErrBadBundle, table, field, i)
			}
		}
		if _, dup := byKey[r.Key]; dup {
			return nil, nil, fmt.Errorf("%w: tables[%s].%s[%d]: duplicate key %q", ErrBadBundle, table, field, i, r.Key)
		}
		byKey[r.Key] = o
		keys = append(keys, r.Key)
	}
	sort.Strings(keys)
	return byKey, keys, nil
}

func (t *baseTable) addIndex(path string, fold bool) map[string][]string {
	id := indexID(path, fold)
	if m, ok := t.indexes[id]; ok {
		return m
	}
	m := map[string][]string{}
	for _, k := range t.keys { // sorted, so each list is sorted
		if v, ok := t.rowField(k, path); ok {
			iv := indexValue(v, fold)
			m[iv] = append(m[iv], k)
		}
	}
	t.indexes[id] = m
	return m
}

// rowField answers a row's field; the key field of a table whose rows do not carry it is the key.
func (t *baseTable) rowField(key, path string) (any, bool) {
	if !t.def.KeyInRow && path == t.def.Key {
		return key, true
	}
	return PathGet(t.rows[key], path)
}

type criterion struct {
	path  string
	value any
	fold  bool
}

func matches(def *Table, key string, row *jsonvalue.Object, cs []criterion) bool {
	for _, c := range cs {
		var v any
		var ok bool
		if !def.KeyInRow && c.path == def.Key {
			v, ok = key, true
		} else {
			v, ok = PathGet(row, c.path)
		}
		if !ok || indexValue(v, c.fold) != indexValue(c.value, c.fold) {
			return false
		}
	}
	return true
}

// fingerprint is a short, stable digest of a row (or "-" for no row), used to match recordings to state.
func fingerprint(row *jsonvalue.Object) string {
	if row == nil {
		return "-"
	}
	var s [sha256.Size]byte
	jsonvalue.WithCanonical(row, func(b []byte) { s = sha256.Sum256(b) })
	return hex.EncodeToString(s[:12])
}

// Fingerprint is the state fingerprint recordings carry for a target row (nil: absent).
func Fingerprint(row *jsonvalue.Object) string { return fingerprint(row) }
