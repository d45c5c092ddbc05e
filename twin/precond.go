package twin

import (
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Preconditions of a write answered from the recordings, on the rows searches list (see listing.go). A list
// argument whose elements carry a listing's key and dimensions by name (a booking's flights: number and date)
// names rows; a row field that is an object keyed by a scalar argument's value (prices, seats by the cabin
// asked) gives each named row a number. Two relations are tried, each held only when the recordings with every
// named row known agree with it — no success violates it, and at least minPrecondSuccesses succeeded and one
// refusal violated it, its text naming what it is about:
//
//   - per row: the number is at least the length of a list argument (seats for the passengers); a refusal names
//     the row's key ("not enough seats on flight …"), and is rendered with the new row's key.
//   - total: a numeric member summed over a list argument (the payments' amounts) is at least the rows' numbers
//     summed, times the length of a list argument (fares for the passengers) — or, when the successes show it,
//     exactly that plus fees fitted on them (fees.go); a refusal shows the sum paid, and is rendered with the new
//     sum (and the new total where it showed the total).
//
// A call naming a row no recording listed is not judged. Relations the rows cannot express (a balance held by
// a user: balance.go; a flight's status on a date no answer showed) are not learned here.

// minPrecondSuccesses is how many judged successes a relation needs before it refuses a call.
const minPrecondSuccesses = 2

// evidence tallies what a tool's recordings say of one candidate relation: the judged successes, whether one broke
// it, and the refusals that break it and name what it is about (its witnesses).
type evidence struct {
	succ, wit int
	broken    bool
}

// add counts one recorded call the relation could judge; it answers whether the call is a witness.
func (e *evidence) add(isErr, violated, named bool) bool {
	switch {
	case !isErr && violated:
		e.broken = true
	case !isErr:
		e.succ++
	case violated && named:
		e.wit++
		return true
	}
	return false
}

// witnesses is how many refusals witness the relation, or 0 when it is not held: a success broke it, or too few
// successes were judged.
func (e *evidence) witnesses() int {
	if e.broken || e.succ < minPrecondSuccesses {
		return 0
	}
	return e.wit
}

// Relation kinds.
const (
	precondPerRow = iota
	precondTotal
)

// precond is one learned relation.
type precond struct {
	kind      int
	list      string // the list argument naming rows
	l         *listing
	field     string // the row field keyed by sel's value
	sel       string // the scalar argument selecting the member
	count     string // the list argument whose length the number is compared with (per row) or multiplied by (total)
	paid      string // total: the list argument whose elements' paidField is summed
	paidField string
	fees      []fee     // total: what the call pays beyond the fares (fees.go)
	exact     bool      // total: the sum paid must equal the total (fees.go), not merely reach the fares
	unseen    []feature // total: features every judged success had zero (fees.go)
	witness   *rec
	wargs     *jsonvalue.Object
}

// precondEval is one call judged by a relation.
type precondEval struct {
	known     bool
	violated  bool
	at        *jsonvalue.Object // per row: the element whose row violated
	sum, cost float64           // total: what was paid, what the rows cost
}

func listArg(args *jsonvalue.Object, name string) ([]any, bool) {
	v, ok := args.Get(name)
	l, isList := v.([]any)
	return l, ok && isList
}

// idOf answers the id (listing.rowID) of the row a list element names.
func (l *listing) idOf(e any) (string, bool) {
	o, ok := e.(*jsonvalue.Object)
	if !ok {
		return "", false
	}
	kv, ok := o.Get(l.key)
	k, isStr := kv.(string)
	if !ok || !isStr {
		return "", false
	}
	dims := make([]string, len(l.dims))
	for i, d := range l.dims {
		v, ok := o.Get(d)
		s, isStr := v.(string)
		if !ok || !isStr {
			return "", false
		}
		dims[i] = s
	}
	return l.rowID(k, dims), true
}

// rowOf answers the row a list element names, as view shows it.
func (l *listing) rowOf(e any, view rowView) (*jsonvalue.Object, bool) {
	id, ok := l.idOf(e)
	if !ok {
		return nil, false
	}
	return view(id)
}

func numberOf(v any) (float64, bool) {
	n, ok := v.(jsonvalue.Number)
	if !ok {
		return 0, false
	}
	return n.Float64(), true
}

// member answers a row's number: field[args[sel]].
func (p *precond) member(row, args *jsonvalue.Object) (float64, bool) {
	sv, ok := args.Get(p.sel)
	s, isStr := sv.(string)
	if !ok || !isStr {
		return 0, false
	}
	fv, _ := row.Get(p.field)
	fo, ok := fv.(*jsonvalue.Object)
	if !ok {
		return 0, false
	}
	mv, _ := fo.Get(s)
	return numberOf(mv)
}

// eval judges a call on the rows as view shows them.
func (p *precond) eval(args *jsonvalue.Object, view rowView) precondEval {
	var ev precondEval
	elems, ok := listArg(args, p.list)
	counted, ok2 := listArg(args, p.count)
	if !ok || !ok2 || len(elems) == 0 {
		return ev
	}
	n := float64(len(counted))
	for _, e := range elems {
		row, ok := p.l.rowOf(e, view)
		if !ok {
			return precondEval{}
		}
		x, ok := p.member(row, args)
		if !ok {
			return precondEval{}
		}
		ev.cost += x * n
		if p.kind == precondPerRow && x < n && ev.at == nil {
			ev.at, ev.violated = e.(*jsonvalue.Object), true
		}
	}
	ev.known = true
	if p.kind == precondTotal {
		pays, ok := listArg(args, p.paid)
		if !ok {
			return precondEval{}
		}
		for _, e := range pays {
			o, ok := e.(*jsonvalue.Object)
			if !ok {
				return precondEval{}
			}
			v, _ := o.Get(p.paidField)
			x, ok := numberOf(v)
			if !ok {
				return precondEval{}
			}
			ev.sum += x
		}
		fees, ok := p.feesCost(args)
		if !ok {
			return precondEval{}
		}
		ev.cost += fees
		ev.violated = ev.sum < ev.cost
		if p.exact && !p.beyondSeen(args) {
			ev.violated = !sameAmount(ev.sum, ev.cost)
		}
	}
	return ev
}

func formatNumber(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// names reports whether a refusal's text names what the relation is about (see precond).
func (p *precond) names(text string, ev precondEval) bool {
	if p.kind == precondPerRow {
		kv, _ := ev.at.Get(p.l.key)
		k, _ := kv.(string)
		return k != "" && strings.Contains(text, k)
	}
	return containsNumber(text, formatNumber(ev.sum))
}

// containsNumber reports whether text holds n as a whole number (not part of a longer one).
func containsNumber(text, n string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], n)
		if j < 0 {
			return false
		}
		a, b := i+j, i+j+len(n)
		if (a == 0 || !isDigitByte(text[a-1])) && (b == len(text) || !isDigitByte(text[b])) {
			return true
		}
		i = a + 1
	}
}

func isDigitByte(c byte) bool { return c >= '0' && c <= '9' }

func replaceNumber(text, from, to string) string {
	var b strings.Builder
	for i := 0; i < len(text); {
		j := strings.Index(text[i:], from)
		if j < 0 {
			b.WriteString(text[i:])
			break
		}
		a, e := i+j, i+j+len(from)
		b.WriteString(text[i:a])
		if (a == 0 || !isDigitByte(text[a-1])) && (e == len(text) || !isDigitByte(text[e])) {
			b.WriteString(to)
		} else {
			b.WriteString(from)
		}
		i = e
	}
	return b.String()
}

// refusal renders the witness's refusal for a new call that violates the relation.
func (p *precond) refusal(args *jsonvalue.Object, ev precondEval, st Style) string {
	w := p.eval(p.wargs, p.l.recorded)
	if p.kind == precondPerRow {
		return substitute(p.witness.answer, flatten(w.at), flatten(ev.at), st)
	}
	text := p.witness.answer
	// Through a placeholder, so a new sum equal to the old total (or the reverse) is not replaced twice.
	const hold = "\x00"
	text = replaceNumber(text, formatNumber(w.sum), hold+"s")
	text = replaceNumber(text, formatNumber(w.cost), hold+"c")
	text = strings.ReplaceAll(text, hold+"s", formatNumber(ev.sum))
	return strings.ReplaceAll(text, hold+"c", formatNumber(ev.cost))
}

// learnPreconds learns each write tool's relations on the listings' rows, and its balance relations (balance.go).
func (rt *Runtime) learnPreconds() {
	reads := rt.entityReads()
	for _, name := range rt.toolNames {
		if t := rt.tools[name]; t.def.Kind == KindWrite && len(t.all) > 0 {
			t.balances = rt.learnBalances(t, reads)
		}
	}
	var ls []*listing
	for _, name := range rt.toolNames {
		if l := rt.tools[name].listing; l != nil {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return
	}
	for _, name := range rt.toolNames {
		if t := rt.tools[name]; t.def.Kind == KindWrite && len(t.all) > 0 {
			t.preconds = learnPreconds(t, ls)
			t.effects = learnEffects(t, ls)
		}
	}
}

// argShapes answers, over a tool's recorded arguments, its top-level string arguments, its list arguments and,
// per list argument of objects, the members that are numbers in every element.
func argShapes(all []*rec) (scalars, lists []string, nums map[string][]string) {
	sc, ls := map[string]bool{}, map[string]bool{}
	numOK := map[string]map[string]bool{}
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		for i, k := range a.Keys {
			switch v := a.Vals[i].(type) {
			case string:
				sc[k] = true
			case []any:
				ls[k] = true
				for _, e := range v {
					o, ok := e.(*jsonvalue.Object)
					if !ok {
						continue
					}
					if numOK[k] == nil {
						numOK[k] = map[string]bool{}
						for j, mk := range o.Keys {
							_, isNum := o.Vals[j].(jsonvalue.Number)
							numOK[k][mk] = isNum
						}
					}
					for mk, was := range numOK[k] {
						v, _ := o.Get(mk)
						_, isNum := v.(jsonvalue.Number)
						numOK[k][mk] = was && isNum
					}
				}
			}
		}
	}
	nums = map[string][]string{}
	for k, m := range numOK {
		for mk, ok := range m {
			if ok {
				nums[k] = append(nums[k], mk)
			}
		}
		sort.Strings(nums[k])
	}
	return sortedSet(sc), sortedSet(ls), nums
}

// objectFields answers the fields of a listing's rows that are objects.
func (l *listing) objectFields() []string {
	var out []string
	for _, f := range l.fields {
		for _, id := range l.order {
			v, _ := l.rows[id].Get(f)
			if _, ok := v.(*jsonvalue.Object); ok {
				out = append(out, f)
			}
			break
		}
	}
	return out
}

func learnPreconds(t *rtTool, ls []*listing) []*precond {
	_, lists, nums := argShapes(t.all)
	var cands []*precond
	for _, p := range perRowCandidates(t.all, ls) {
		cands = append(cands, p)
		for _, paid := range lists {
			for _, pf := range nums[paid] {
				cands = append(cands, &precond{kind: precondTotal, list: p.list, l: p.l, field: p.field, sel: p.sel, count: p.count, paid: paid, paidField: pf})
			}
		}
	}
	var out []*precond
	for _, kind := range []int{precondPerRow, precondTotal} {
		var best *precond
		bestN := 0
		for _, p := range cands {
			if p.kind != kind {
				continue
			}
			if n := p.fit(t.all); n > bestN {
				best, bestN = p, n
			}
		}
		if best != nil {
			out = append(out, best)
		}
	}
	return out
}

// perRowCandidates answers every per-row relation a write's arguments could hold with the listings' rows: a list
// argument naming rows, a row field that is an object keyed by a scalar argument, a list argument counted.
func perRowCandidates(all []*rec, ls []*listing) []*precond {
	scalars, lists, _ := argShapes(all)
	var cands []*precond
	for _, list := range lists {
		for _, l := range ls {
			if !namesRows(all, list, l) {
				continue
			}
			for _, field := range l.objectFields() {
				for _, sel := range scalars {
					if !selects(all, sel, l, field) {
						continue
					}
					for _, count := range lists {
						cands = append(cands, &precond{kind: precondPerRow, list: list, l: l, field: field, sel: sel, count: count})
					}
				}
			}
		}
	}
	return cands
}

// namesRows reports whether a list argument's elements carry a listing's key and dimensions (in the first
// recording where it is not empty).
func namesRows(all []*rec, list string, l *listing) bool {
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		elems, ok := listArg(a, list)
		if !ok || len(elems) == 0 {
			continue
		}
		o, ok := elems[0].(*jsonvalue.Object)
		if !ok {
			return false
		}
		for _, f := range append([]string{l.key}, l.dims...) {
			if _, ok := o.Get(f); !ok {
				return false
			}
		}
		return true
	}
	return false
}

// selects reports whether a scalar argument's value (in the first recording that gives it) is a member of the
// row field's object (in the first row).
func selects(all []*rec, sel string, l *listing, field string) bool {
	if len(l.order) == 0 {
		return false
	}
	fv, _ := l.rows[l.order[0]].Get(field)
	fo, ok := fv.(*jsonvalue.Object)
	if !ok {
		return false
	}
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		if v, ok := a.Get(sel); ok {
			s, _ := v.(string)
			_, has := fo.Get(s)
			return has
		}
	}
	return false
}

// fit checks a relation against the recordings; it answers how many refusals witness it (0: not held).
func (p *precond) fit(all []*rec) int {
	if p.kind == precondTotal {
		p.fitFees(all)
	}
	var e evidence
	showsTotal := false
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		ev := p.eval(a, p.l.recorded)
		if !ev.known {
			continue
		}
		// The witness is the first refusal, or for a total the first that also shows the total computed (one
		// showing another total is rendered with it unreplaced).
		if e.add(r.isErr, ev.violated, r.isErr && ev.violated && p.names(r.answer, ev)) &&
			(p.witness == nil || !showsTotal && p.kind == precondTotal && containsNumber(r.answer, formatNumber(ev.cost))) {
			showsTotal = p.kind == precondTotal && containsNumber(r.answer, formatNumber(ev.cost))
			p.witness, p.wargs = r, a
		}
		if e.broken {
			return 0
		}
	}
	return e.witnesses()
}

// precondRefusal answers the refusal of the first relation the call violates, on the rows as views shows them
// (per listing: a session's world; nil: as recorded).
func (t *rtTool) precondRefusal(args *jsonvalue.Object, st Style, views func(*listing) rowView) (string, bool) {
	for _, p := range t.preconds {
		view := p.l.recorded
		if views != nil {
			view = views(p.l)
		}
		if ev := p.eval(args, view); ev.known && ev.violated {
			return p.refusal(args, ev, st), true
		}
	}
	return "", false
}
