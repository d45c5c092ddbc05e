package twin

import (
	"slices"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Listings: a search (a query tool whose answers list objects) answered from the rows that every recorded query
// answer shows, when its arguments map to the rows' fields. Learned from its recordings: the field naming a row
// (its key: a string with letters and digits, different in every element of an answer), the arguments each
// element always equals a field of (origin → origin), and the arguments no field equals (a date): the row's
// dimensions, part of its identity (a flight's seats and prices on that date). Rows come from this tool's
// answers (dimensions from the call's arguments) and from other query tools' answers whose elements carry the
// same fields, the dimensions as fields of their own (a connecting search's legs, each with its date); a later
// recording wins. A new search lists the rows whose matched fields and dimensions equal its arguments, in the
// order the recordings list them (by key when every recorded answer is sorted so); with no such row it is not
// answered here (the world may hold rows no recording showed).

// listing is what a query tool's recordings teach about answering it from rows.
type listing struct {
	name   string            // the query tool's name
	key    string            // the element field naming a row
	fields []string          // an element's fields, as recorded
	match  map[string]string // argument → the element field it equals
	dims   []string          // arguments no field equals, sorted
	sorted bool              // every recorded answer lists its rows in key order
	rows   map[string]*jsonvalue.Object
	order  []string // row ids, in the order first seen
	// seen is every recorded sighting of a row, per trace in recording order: what a write's effect on the
	// rows is learned from (listed.go).
	seen map[string][]sighting
}

// minListingAnswers is how many non-empty recorded answers a query needs before it is answered from rows.
const minListingAnswers = 2

// listElements answers the objects a JSON answer lists, flattening lists of lists (connections of legs).
func listElements(v any) ([]*jsonvalue.Object, bool) {
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	var out []*jsonvalue.Object
	for _, e := range l {
		switch x := e.(type) {
		case *jsonvalue.Object:
			out = append(out, x)
		case []any:
			sub, ok := listElements(x)
			if !ok {
				return nil, false
			}
			out = append(out, sub...)
		default:
			return nil, false
		}
	}
	return out, true
}

// parsedAnswer is one successful recorded answer that lists objects directly (not lists of lists).
type parsedAnswer struct {
	args  *jsonvalue.Object
	elems []*jsonvalue.Object
}

func flatObjects(v any) ([]*jsonvalue.Object, bool) {
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]*jsonvalue.Object, 0, len(l))
	for _, e := range l {
		o, ok := e.(*jsonvalue.Object)
		if !ok {
			return nil, false
		}
		out = append(out, o)
	}
	return out, true
}

// learnListing answers a query tool's listing, or nil when its recordings do not support one.
func learnListing(t *rtTool, parse func(string) (any, bool), st Style) *listing {
	if t.def.Kind != KindQuery {
		return nil
	}
	var ans []parsedAnswer
	for _, r := range t.all {
		if r.isErr || !jsonvalue.LooksJSON(r.answer) {
			continue
		}
		args, ok := r.args.(*jsonvalue.Object)
		if !ok {
			return nil
		}
		v, ok := parse(r.answer)
		if !ok {
			continue
		}
		elems, ok := flatObjects(v)
		if !ok {
			return nil // not a flat list of objects: not learned
		}
		if len(elems) > 0 {
			ans = append(ans, parsedAnswer{args: args, elems: elems})
		}
	}
	if len(ans) < minListingAnswers {
		return nil
	}
	l := &listing{fields: ans[0].elems[0].Keys, match: map[string]string{}, sorted: true, rows: map[string]*jsonvalue.Object{}}
	for _, a := range ans {
		for _, e := range a.elems {
			if !slices.Equal(e.Keys, l.fields) {
				return nil
			}
		}
	}
	if l.key = listingKey(ans, l.fields); l.key == "" {
		return nil
	}
	for _, a := range ans {
		if !keysSorted(a.elems, l.key, st) {
			l.sorted = false
		}
	}
	// Arguments: each top-level scalar either equals one same field in every element, or is a dimension.
	args := map[string]bool{}
	for _, a := range ans {
		for i, k := range a.args.Keys {
			if _, scalar := a.args.Vals[i].(string); !scalar {
				return nil
			}
			args[k] = true
		}
	}
	for _, arg := range sortedSet(args) {
		field := ""
		for _, f := range l.fields {
			if equalsInAll(ans, arg, f) {
				field = f
				break
			}
		}
		if field != "" {
			l.match[arg] = field
		} else {
			l.dims = append(l.dims, arg)
		}
	}
	if len(l.match) == 0 {
		return nil
	}
	return l
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// listingKey answers the first field that is an id (letters and digits) in every element and differs between
// the elements of every answer.
func listingKey(ans []parsedAnswer, fields []string) string {
next:
	for _, f := range fields {
		for _, a := range ans {
			seen := map[string]bool{}
			for _, e := range a.elems {
				v, _ := e.Get(f)
				s, ok := v.(string)
				if !ok {
					continue next
				}
				if _, isID := idKind(jsonvalue.CanonicalText(s)); !isID || seen[s] {
					continue next
				}
				seen[s] = true
			}
		}
		return f
	}
	return ""
}

func keysSorted(elems []*jsonvalue.Object, key string, st Style) bool {
	prev := ""
	for i, e := range elems {
		v, _ := e.Get(key)
		s := TextOf(v, st)
		if i > 0 && s < prev {
			return false
		}
		prev = s
	}
	return true
}

// equalsInAll reports whether the argument equals the element field in every element of every answer.
func equalsInAll(ans []parsedAnswer, arg, field string) bool {
	for _, a := range ans {
		av, ok := a.args.Get(arg)
		if !ok {
			return false
		}
		for _, e := range a.elems {
			ev, ok := e.Get(field)
			if !ok || !jsonvalue.Identical(av, ev) {
				return false
			}
		}
	}
	return true
}

// rowID is a row's identity: its key and its dimensions' values.
func (l *listing) rowID(key string, dims []string) string {
	return key + "\x00" + strings.Join(dims, "\x00")
}

// add merges one element as a row: its key from the element, its dimensions from dimVal (by argument name).
// A later element replaces an earlier one of the same row.
func (l *listing) add(e *jsonvalue.Object, dimVal func(string) (string, bool), st Style, at sighting) {
	kv, ok := e.Get(l.key)
	if !ok {
		return
	}
	row := jsonvalue.NewObject(len(l.fields))
	for _, f := range l.fields {
		v, ok := e.Get(f)
		if !ok {
			return
		}
		row.Set(f, v)
	}
	dims := make([]string, len(l.dims))
	for i, d := range l.dims {
		if dims[i], ok = dimVal(d); !ok {
			return
		}
	}
	id := l.rowID(TextOf(kv, st), dims)
	if _, seen := l.rows[id]; !seen {
		l.order = append(l.order, id)
	}
	l.rows[id] = row
	at.id, at.row = id, row
	if l.seen == nil {
		l.seen = map[string][]sighting{}
	}
	l.seen[at.trace] = append(l.seen[at.trace], at)
}

// learnRows learns the listings, then the write preconditions on their rows. It runs once per runtime, on the
// first call a recording with the very arguments does not answer (NewRuntime stays as fast as before).
func (rt *Runtime) learnRows() {
	rt.learnListings()
	rt.learnPreconds()
}

// learnListings learns each query tool's listing and fills its rows from every query tool's recorded answers, in
// recording order (a later answer's row wins). Each distinct answer is parsed once.
func (rt *Runtime) learnListings() {
	cache := map[string]any{}
	parse := func(text string) (any, bool) {
		if v, ok := cache[text]; ok {
			return v, v != nil
		}
		var v any
		if jsonvalue.LooksJSON(text) {
			if x, err := jsonvalue.ParseString(text); err == nil {
				v = x
			}
		}
		cache[text] = v
		return v, v != nil
	}
	var ls []*rtTool
	for _, name := range rt.toolNames {
		t := rt.tools[name]
		if t.listing = learnListing(t, parse, rt.style); t.listing != nil {
			t.listing.name = name
			ls = append(ls, t)
		}
	}
	if len(ls) == 0 {
		return
	}
	for i := range rt.b.Recordings {
		r := &rt.b.Recordings[i]
		from := rt.tools[r.Tool]
		if from == nil || from.def.Kind != KindQuery || r.Error {
			continue
		}
		v, ok := parse(rt.b.Answers[r.Answer])
		if !ok {
			continue
		}
		elems, ok := listElements(v)
		if !ok {
			continue
		}
		args, _ := jsonvalue.ParseString(r.Args)
		ao, _ := args.(*jsonvalue.Object)
		for _, t := range ls {
			t.listing.addAll(elems, ao, from == t, rt.style, sighting{trace: r.Trace, call: r.Call})
		}
	}
}

// addAll merges the rows one recorded answer lists: the tool's own answers take their dimensions from the
// call's arguments, other tools' elements from their fields named as the dimensions.
func (l *listing) addAll(elems []*jsonvalue.Object, args *jsonvalue.Object, own bool, st Style, at sighting) {
	for _, e := range elems {
		dimVal := func(d string) (string, bool) {
			var x any
			var ok bool
			if own && args != nil {
				x, ok = args.Get(d)
			} else {
				x, ok = e.Get(d)
			}
			s, isStr := x.(string)
			return s, ok && isStr
		}
		l.add(e, dimVal, st, at)
	}
}

// answer lists the rows a search's arguments select, as view shows them (a session's world), or nil when the
// arguments are not the learned ones or no row matches.
func (l *listing) answer(args *jsonvalue.Object, view rowView) []any {
	ids := l.selected(args, view)
	if len(ids) == 0 {
		return nil
	}
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i], _ = view(id)
	}
	return out
}

// selected answers the ids of the rows a search's arguments select, in the order it lists them; nil when the
// arguments are not the learned ones.
func (l *listing) selected(args *jsonvalue.Object, view rowView) []string {
	want := map[string]any{}
	dimVals := make([]string, len(l.dims))
	for i, k := range args.Keys {
		if f, ok := l.match[k]; ok {
			want[f] = args.Vals[i]
			continue
		}
		j := sort.SearchStrings(l.dims, k)
		if j == len(l.dims) || l.dims[j] != k {
			return nil
		}
		s, ok := args.Vals[i].(string)
		if !ok {
			return nil
		}
		dimVals[j] = s
	}
	if len(want) != len(l.match) || args.Len() != len(l.match)+len(l.dims) {
		return nil
	}
	suffix := "\x00" + strings.Join(dimVals, "\x00")
	var ids []string
	for _, id := range l.order {
		if !strings.HasSuffix(id, suffix) || strings.Count(id, "\x00") != len(l.dims) {
			continue
		}
		row, _ := view(id)
		okRow := true
		for f, v := range want {
			rv, _ := row.Get(f)
			if !jsonvalue.Identical(rv, v) {
				okRow = false
				break
			}
		}
		if okRow {
			ids = append(ids, id)
		}
	}
	if l.sorted {
		sort.Strings(ids)
	}
	return ids
}
