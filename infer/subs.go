package infer

import (
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// subIndex finds nested objects addressable by an id field (a product's variants by
// item_id, an order's items by item_id) in every row the traces showed. The map is
// keyed by table + "\x00" + index name, then by the id's canonical JSON.
func (m *model) subIndex() map[string]map[string]*jsonvalue.Object {
	if m.subs != nil {
		return m.subs
	}
	m.subs = map[string]map[string]*jsonvalue.Object{}
	m.subDefs = map[string]twin.SubIndex{}
	for _, tn := range m.tableNames {
		var rows []*jsonvalue.Object
		for _, k := range sortedKeys(m.base[tn]) {
			rows = append(rows, m.base[tn][k])
		}
		for _, k := range sortedKeys(m.sightings[tn]) {
			rows = append(rows, m.sightings[tn][k]...)
		}
		// Candidates are keyed by path and field, and indexed by the id's raw string while scanning (no
		// allocation per element); the canonical JSON keys are made once, for the indexes kept.
		type candKey struct{ path, field string }
		type cand struct {
			def    twin.SubIndex
			idx    map[string]*jsonvalue.Object
			broken bool
		}
		type seenKey struct {
			c  *cand
			id string
		}
		cands := map[candKey]*cand{}
		seenHere := map[seenKey]bool{}
		for _, r := range rows {
			for i, f := range r.Keys {
				var path string
				var elems []*jsonvalue.Object
				switch x := r.Vals[i].(type) {
				case *jsonvalue.Object:
					path = f + ".*"
					for _, v := range x.Vals {
						o, ok := v.(*jsonvalue.Object)
						if !ok {
							elems = nil
							break
						}
						elems = append(elems, o)
					}
				case []any:
					path = f + "[]"
					for _, v := range x {
						o, ok := v.(*jsonvalue.Object)
						if !ok {
							elems = nil
							break
						}
						elems = append(elems, o)
					}
				}
				if len(elems) == 0 {
					continue
				}
				clear(seenHere)
				for _, o := range elems {
					for j, g := range o.Keys {
						s, ok := o.Vals[j].(string)
						if !ok || !idLike([]string{s}) {
							continue
						}
						c := cands[candKey{path, g}]
						if c == nil {
							name := path + ":" + g
							c = &cand{def: twin.SubIndex{Name: name, Path: path, Field: g}, idx: map[string]*jsonvalue.Object{}}
							cands[candKey{path, g}] = c
						}
						if c.broken {
							continue
						}
						if seenHere[seenKey{c, s}] {
							c.broken = true // not unique within a row: not an id
							c.idx = nil
							continue
						}
						seenHere[seenKey{c, s}] = true
						if _, ok := c.idx[s]; !ok {
							c.idx[s] = o
						}
					}
				}
			}
		}
		for _, c := range cands {
			if c.broken || len(c.idx) < 2 {
				continue
			}
			idx := make(map[string]*jsonvalue.Object, len(c.idx))
			for s, o := range c.idx {
				idx[jsonvalue.CanonicalString(s)] = o
			}
			id := tn + "\x00" + c.def.Name
			m.subs[id] = idx
			m.subDefs[id] = c.def
		}
	}
	return m.subs
}

// subNames lists the discovered nested-object indexes, sorted.
func (m *model) subNames() []string {
	m.subIndex()
	out := make([]string, 0, len(m.subs))
	for k := range m.subs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func splitSub(id string) (string, string) {
	i := strings.IndexByte(id, 0)
	return id[:i], id[i+1:]
}

// useSubs records in the tables the nested-object indexes a handler's code uses.
func (m *model) useSubs(src string) {
	for _, id := range m.subNames() {
		tn, name := splitSub(id)
		if strings.Contains(src, "world.sub(\""+tn+"\", \""+name+"\"") {
			m.tables[tn].subs[name] = m.subDefs[id]
		}
	}
}
