package twin

import (
	"hash/fnv"
	"math/rand/v2"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// The foreign keys of made-up entities, both ways. A made-up entity's single key of another table (an order's
// user) names the row that lists it, when the world holds one (a user whose orders list the order id), before
// anything is made up; and a made-up entity's lists of keys of another table (a user's orders) name ids of its
// own, drawn in the recorded format, which the world holds for no one else: each, when read, is made up owned by
// the entity listing it.

// refListStream keys the PRNG that draws a made-up entity's listed ids: the session seed, this stream and the
// (table, key, field). It is apart from materializeStream, so the rest of the entity is drawn as before.
const refListStream = 0x7265666c69737473 // "reflists"

// backRef answers the field of table's rows that lists keys of table other (a user's "orders" for orders).
func (s *Session) backRef(table, other string) (string, bool) {
	bt := s.rt.tables[table]
	if bt == nil {
		return "", false
	}
	for _, r := range bt.def.Refs {
		if r.Many && r.Table == other {
			return r.Field, true
		}
	}
	return "", false
}

// baseListers answers, for table's base rows, which rows' list field names each key: key → listing rows'
// keys, sorted. Built once per (table, field).
func (bt *baseTable) baseListers(field string) map[string][]string {
	bt.backsMu.Lock()
	defer bt.backsMu.Unlock()
	if m, ok := bt.backs[field]; ok {
		return m
	}
	m := map[string][]string{}
	for _, k := range bt.keys { // sorted, so each list is sorted
		l, _ := bt.rows[k].Get(field)
		list, _ := l.([]any)
		for _, x := range list {
			if xs, ok := x.(string); ok {
				m[xs] = append(m[xs], k)
			}
		}
	}
	if bt.backs == nil {
		bt.backs = map[string]map[string][]string{}
	}
	bt.backs[field] = m
	return m
}

// lister answers the row of table whose list field names key, as this call sees the world (its writes and made-up
// rows, the session's rows, the base): the least such key, so the answer does not depend on map order.
func (e *callEnv) lister(table, field, key string) (string, bool) {
	s := e.sess
	bt := s.rt.tables[table]
	if bt == nil {
		return "", false
	}
	best, found := "", false
	consider := func(k string, r *jsonvalue.Object) {
		if r == nil || (found && k >= best) {
			return
		}
		l, _ := r.Get(field)
		list, _ := l.([]any)
		if containsValue(list, key) {
			best, found = k, true
		}
	}
	shadowed := func(k string) bool {
		tk := tableKey{table, k}
		_, inTxn := e.txn[tk]
		return e.dels[tk] || inTxn
	}
	for _, k := range bt.baseListers(field)[key] {
		if _, over := s.over[table][k]; !over && !shadowed(k) {
			consider(k, bt.rows[k])
		}
	}
	for k, r := range s.over[table] {
		if !shadowed(k) {
			consider(k, r)
		}
	}
	for _, tk := range e.order {
		if tk.table == table && !e.dels[tk] {
			consider(tk.key, e.txn[tk])
		}
	}
	for _, tk := range e.matOrder {
		if tk.table == table {
			if _, inTxn := e.txn[tk]; !inTxn {
				consider(tk.key, e.mat[tk])
			}
		}
	}
	return best, found
}

// takenKey tells whether key of table is spoken for: the world holds it, made it up or deleted it, production
// answered it not found, a fact names it, or a row lists it.
func (e *callEnv) takenKey(table, key string) bool {
	s := e.sess
	bt := s.rt.tables[table]
	if bt == nil {
		return true
	}
	if _, ok := e.rowOf(table, key); ok {
		return true
	}
	if _, ok := s.over[table][key]; ok {
		return true
	}
	if _, ok := bt.facts[key]; ok || bt.absent[key] || e.dels[tableKey{table, key}] {
		return true
	}
	for _, r := range bt.def.Refs {
		if r.Many {
			continue
		}
		if field, ok := s.backRef(r.Table, table); ok {
			if _, listed := e.lister(r.Table, field, key); listed {
				return true
			}
		}
	}
	return false
}

// freshRefLists sets row's lists of keys of other tables (made up as (table, key)): the fact's when it gives
// them; else, in an open world, as many new ids as the model row lists, each drawn in the format of the model's
// (digits redrawn) and in the other table's id format, spoken for by no one; back, when it is of that table,
// takes the last place (the entity this one was made up for). In a closed world a list starts empty (an id drawn
// there could never be read).
func (e *callEnv) freshRefLists(row *jsonvalue.Object, table, key string, fact *jsonvalue.Object, back tableKey) {
	s := e.sess
	bt := s.rt.tables[table]
	for _, r := range bt.def.Refs {
		if !r.Many {
			continue
		}
		old, ok := row.Get(r.Field)
		if !ok {
			continue
		}
		if fact != nil {
			if _, given := fact.Get(r.Field); given {
				continue
			}
		}
		model, _ := old.([]any)
		n := len(model)
		if back.table == r.Table && n > 0 {
			n--
		}
		list := []any{}
		other := s.rt.tables[r.Table]
		if s.world == WorldOpen && other != nil && other.keyRe != nil {
			h := fnv.New64a()
			for _, p := range []string{table, key, r.Field} {
				h.Write([]byte(p))
				h.Write([]byte{0})
			}
			rng := rand.New(rand.NewPCG(uint64(s.spec.Seed), refListStream^h.Sum64()))
			for i := 0; i < n; i++ {
				ms, _ := model[i].(string)
				for try := 0; try < 8 && ms != ""; try++ {
					id := freshLike(ms, rng)
					if other.keyRe.MatchString(id) && id != back.key && !containsValue(list, id) && !e.takenKey(r.Table, id) {
						list = append(list, id)
						break
					}
				}
			}
		}
		if back.table == r.Table && back.key != "" {
			list = append(list, back.key)
		}
		row.Set(r.Field, list)
	}
}

// ownerOf answers the row that owns a made-up (table, key) through a single key field of table ref: the row of
// the other table whose list names key, when the world holds one.
func (e *callEnv) ownerOf(table, key string, ref Ref) (string, bool) {
	field, ok := e.sess.backRef(ref.Table, table)
	if !ok {
		return "", false
	}
	return e.lister(ref.Table, field, key)
}
