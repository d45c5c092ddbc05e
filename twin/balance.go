package twin

import (
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Balances: a write whose list argument holds payments (payment_methods: [{payment_id, amount}]), each naming a
// member of a map in the row of the entity a scalar argument names (the user's payment_methods, by user_id) and
// paying a number, is refused when a payment's number exceeds a numeric field of the member it names (a gift
// card's amount). Members without that field (a credit card) and members the row does not hold are not judged,
// nor is a call whose entity the world does not hold. The relation is learned like the listed-row ones
// (precond.go): on the entity's row as the same trace last read it before the call (else as the base world holds
// it), no recorded success breaks it, at least minPrecondSuccesses successes are judged, and a recorded refusal
// breaks it whose text names the member ("not enough balance in payment method gift_card_…"); the refusal is
// rendered with the new call's member, payment and balance.

// balance is one learned relation.
type balance struct {
	table   string // the entity's table
	ent     string // the scalar argument naming the entity
	field   string // the row's map of members
	list    string // the list argument of payments
	idm     string // a payment's member naming the map's member
	amt     string // a payment's number
	bal     string // the member's number it may not exceed
	witness *rec
	wev     balanceEval
}

// balanceEval is one call judged by a balance relation.
type balanceEval struct {
	known, violated bool
	id              string // the member of the first violating payment
	amount, balance float64
}

// rowFunc answers an entity's row by table and key, as some world (or recording) sees it.
type rowFunc func(table, key string) (*jsonvalue.Object, bool)

func (b *balance) eval(args *jsonvalue.Object, row rowFunc) balanceEval {
	var ev balanceEval
	kv, _ := args.Get(b.ent)
	key, ok := kv.(string)
	if !ok {
		return ev
	}
	r, ok := row(b.table, key)
	if !ok {
		return ev
	}
	mv, _ := r.Get(b.field)
	members, ok := mv.(*jsonvalue.Object)
	if !ok {
		return ev
	}
	pays, ok := listArg(args, b.list)
	if !ok {
		return ev
	}
	for _, e := range pays {
		o, ok := e.(*jsonvalue.Object)
		if !ok {
			continue
		}
		iv, _ := o.Get(b.idm)
		id, isStr := iv.(string)
		av, _ := o.Get(b.amt)
		amount, isNum := numberOf(av)
		if !isStr || !isNum {
			continue
		}
		m, _ := members.Get(id)
		mo, ok := m.(*jsonvalue.Object)
		if !ok {
			continue
		}
		bv, _ := mo.Get(b.bal)
		bal, ok := numberOf(bv)
		if !ok {
			continue
		}
		ev.known = true
		if amount > bal && !ev.violated {
			ev.violated, ev.id, ev.amount, ev.balance = true, id, amount, bal
		}
	}
	return ev
}

// fit checks the relation against the recordings (rows as rowAt answers them before each call); it answers how
// many refusals witness it (0: not held).
func (b *balance) fit(all []*rec, rowAt func(*rec) rowFunc) int {
	var e evidence
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		ev := b.eval(a, rowAt(r))
		if !ev.known {
			continue
		}
		if e.add(r.isErr, ev.violated, strings.Contains(r.answer, ev.id)) && b.witness == nil {
			b.witness, b.wev = r, ev
		}
		if e.broken {
			return 0
		}
	}
	return e.witnesses()
}

// refusal renders the witness's refusal for a new call that violates the relation.
func (b *balance) refusal(ev balanceEval) string {
	// Through placeholders, so a value equal to another one (or inside the member's id) is not replaced twice.
	const hold = "\x00"
	text := strings.ReplaceAll(b.witness.answer, b.wev.id, hold+"i")
	text = replaceNumber(text, formatNumber(b.wev.amount), hold+"a")
	text = replaceNumber(text, formatNumber(b.wev.balance), hold+"b")
	text = strings.ReplaceAll(text, hold+"a", formatNumber(ev.amount))
	text = strings.ReplaceAll(text, hold+"b", formatNumber(ev.balance))
	return strings.ReplaceAll(text, hold+"i", ev.id)
}

// balanceRefusal answers the refusal of the first balance relation the call violates, on rows as row answers them.
func (t *rtTool) balanceRefusal(args *jsonvalue.Object, row rowFunc) (string, bool) {
	for _, b := range t.balances {
		if ev := b.eval(args, row); ev.known && ev.violated {
			return b.refusal(ev), true
		}
	}
	return "", false
}

// entityRead is one recorded successful read of an entity's row (its answer parsed when first asked for).
type entityRead struct {
	call   int
	key    string
	answer string
	parsed bool
	row    *jsonvalue.Object // nil: not an object
}

// rowOf answers the row the read's answer shows (nil: none).
func (e *entityRead) rowOf() *jsonvalue.Object {
	if !e.parsed {
		e.parsed = true
		if jsonvalue.LooksJSON(e.answer) {
			v, err := jsonvalue.ParseString(e.answer)
			if o, ok := v.(*jsonvalue.Object); ok && err == nil {
				e.row = o
			}
		}
	}
	return e.row
}

// entityReads indexes, per trace and table, the recorded successful reads of entities' rows, in call order.
func (rt *Runtime) entityReads() map[string]map[string][]*entityRead {
	out := map[string]map[string][]*entityRead{}
	for _, name := range rt.toolNames {
		t := rt.tools[name]
		if t.def.Kind != KindRead || t.def.Table == "" || t.def.KeyArg == "" {
			continue
		}
		for _, r := range t.all {
			a, ok := r.args.(*jsonvalue.Object)
			if r.isErr || !ok {
				continue
			}
			key, ok := keyArg(t.def, a)
			if !ok {
				continue
			}
			if out[r.trace] == nil {
				out[r.trace] = map[string][]*entityRead{}
			}
			out[r.trace][t.def.Table] = append(out[r.trace][t.def.Table], &entityRead{call: r.call, key: key, answer: r.answer})
		}
	}
	for _, byTable := range out {
		for _, reads := range byTable {
			sort.SliceStable(reads, func(i, j int) bool { return reads[i].call < reads[j].call })
		}
	}
	return out
}

// learnBalances learns a write's balance relation (at most one: the one most refusals witness).
func (rt *Runtime) learnBalances(t *rtTool, reads map[string]map[string][]*entityRead) []*balance {
	type at struct {
		r          *rec
		table, key string
	}
	memo := map[at]*jsonvalue.Object{}
	rowAt := func(r *rec) rowFunc {
		return func(table, key string) (*jsonvalue.Object, bool) {
			if row, ok := memo[at{r, table, key}]; ok {
				return row, row != nil
			}
			row := rowBefore(rt, reads, r, table, key)
			memo[at{r, table, key}] = row
			return row, row != nil
		}
	}
	var best *balance
	bestN := 0
	for _, b := range rt.balanceCandidates(t.all, rowAt) {
		if n := b.fit(t.all, rowAt); n > bestN {
			best, bestN = b, n
		}
	}
	if best == nil {
		return nil
	}
	return []*balance{best}
}

// rowBefore answers an entity's row as the recording's trace last read it before the call, else as the base world
// holds it (nil: neither).
func rowBefore(rt *Runtime, reads map[string]map[string][]*entityRead, r *rec, table, key string) *jsonvalue.Object {
	rs := reads[r.trace][table]
	for i := len(rs) - 1; i >= 0; i-- {
		if e := rs[i]; e.call < r.call && e.key == key {
			if row := e.rowOf(); row != nil {
				return row
			}
		}
	}
	if bt := rt.tables[table]; bt != nil {
		return bt.rows[key]
	}
	return nil
}

// balanceCandidates answers every balance relation a write's recorded arguments and the rows of the entities they
// name could hold, in a fixed order.
func (rt *Runtime) balanceCandidates(all []*rec, rowAt func(*rec) rowFunc) []*balance {
	scalars, lists, nums := argShapes(all)
	tables := make([]string, 0, len(rt.tables))
	for name := range rt.tables {
		tables = append(tables, name)
	}
	sort.Strings(tables)
	seen := map[balance]bool{}
	var out []*balance
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		for _, ent := range scalars {
			kv, _ := a.Get(ent)
			key, ok := kv.(string)
			if !ok {
				continue
			}
			rows := rowAt(r)
			for _, table := range tables {
				row, ok := rows(table, key)
				if !ok {
					continue
				}
				for _, list := range lists {
					for _, c := range paymentCandidates(a, row, list, nums[list]) {
						c.table, c.ent = table, ent
						if !seen[c] {
							seen[c] = true
							cc := c
							out = append(out, &cc)
						}
					}
				}
			}
		}
	}
	return out
}

// paymentCandidates answers the relations one recorded call's list argument shows on one row: a payment's string
// member naming a member of a row's map whose number field exists, and a numeric member of the payment (amts).
func paymentCandidates(args, row *jsonvalue.Object, list string, amts []string) []balance {
	pays, ok := listArg(args, list)
	if !ok {
		return nil
	}
	var out []balance
	for _, e := range pays {
		o, ok := e.(*jsonvalue.Object)
		if !ok {
			continue
		}
		for i, idm := range o.Keys {
			id, ok := o.Vals[i].(string)
			if !ok {
				continue
			}
			for j, field := range row.Keys {
				members, ok := row.Vals[j].(*jsonvalue.Object)
				if !ok {
					continue
				}
				m, _ := members.Get(id)
				mo, ok := m.(*jsonvalue.Object)
				if !ok {
					continue
				}
				for k, bal := range mo.Keys {
					if _, ok := mo.Vals[k].(jsonvalue.Number); !ok {
						continue
					}
					for _, amt := range amts {
						out = append(out, balance{field: field, list: list, idm: idm, amt: amt, bal: bal})
					}
				}
			}
		}
	}
	return out
}
