package twin

import (
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// targetState fingerprints the tool's target row as the session holds it now.
func (s *Session) targetState(t *rtTool, args *jsonvalue.Object) string {
	if t.def.Table == "" {
		return ""
	}
	k, ok := keyArg(t.def, args)
	if !ok {
		return ""
	}
	r, ok := s.row(t.def.Table, k)
	if !ok {
		return fingerprint(nil)
	}
	return fingerprint(r)
}

// replaySameState answers the recording made with these arguments from this very target state, if any.
func (s *Session) replaySameState(t *rtTool, args *jsonvalue.Object) *answer {
	state := s.targetState(t, args)
	if state == "" {
		return nil
	}
	for _, r := range t.byArgs[jsonvalue.CanonicalText(args)] {
		if r.state == state {
			a := &answer{content: r.answer, isErr: r.isErr}
			if t.def.Kind == KindWrite && !r.isErr {
				a.applyKey, a.apply = s.rt.rowFromAnswer(t, args, r.answer)
			}
			return a
		}
	}
	return nil
}

func (s *Session) replay(t *rtTool, args *jsonvalue.Object) (*answer, string) {
	if a := s.observedAnswer(t, args); a != nil && !s.listedTouched(t, args) {
		return a, "" // the trace the session opened from made this very call
	}
	recs := t.byArgs[jsonvalue.CanonicalText(args)]
	if len(recs) == 0 {
		return nil, "no recording with these arguments"
	}
	if s.listedTouched(t, args) {
		return nil, "the session's writes changed rows this search lists"
	}
	if a := s.replaySameState(t, args); a != nil {
		return a, ""
	}
	// No recording from this state: the most common recorded answer, which changes nothing,
	// unless the write creates rows (it has no target whose state could differ).
	best, n := recs[0], 0
	count := map[string]int{}
	for _, r := range recs {
		count[r.answer]++
		if count[r.answer] > n {
			best, n = r, count[r.answer]
		}
	}
	a := &answer{content: best.answer, isErr: best.isErr}
	if t.def.Kind == KindWrite && t.def.KeyArg == "" && t.def.Table != "" && !best.isErr {
		a.applyKey, a.apply = s.rt.rowFromAnswer(t, args, best.answer)
	}
	return a, ""
}

// rowFromAnswer answers the row (and its key) a write's recorded answer holds, when it is
// the target row, or for a write that creates rows (no key argument) any row of its table.
func (rt *Runtime) rowFromAnswer(t *rtTool, args *jsonvalue.Object, text string) (string, *jsonvalue.Object) {
	bt := rt.tables[t.def.Table]
	if bt == nil || !jsonvalue.LooksJSON(text) {
		return "", nil
	}
	v, err := jsonvalue.ParseString(text)
	if err != nil {
		return "", nil
	}
	o, ok := v.(*jsonvalue.Object)
	if !ok {
		return "", nil
	}
	var rowKey string
	if bt.def.KeyInRow {
		kv, ok := o.Get(bt.def.Key)
		if !ok {
			return "", nil
		}
		rowKey = TextOf(kv, rt.style)
	}
	if t.def.KeyArg == "" {
		if !bt.def.KeyInRow || rowKey == "" {
			return "", nil
		}
		return rowKey, o
	}
	k, ok := keyArg(t.def, args)
	if !ok || (bt.def.KeyInRow && rowKey != k) {
		return "", nil
	}
	return k, o
}

func (s *Session) infer(t *rtTool, args *jsonvalue.Object) (*answer, string) {
	if len(t.all) == 0 {
		if t.def.Defined {
			return s.inferFromSimilar(t, args)
		}
		return nil, "no recordings of this tool"
	}
	s.rt.rowsOnce.Do(s.rt.learnRows)
	if t.listing != nil {
		if rows := t.listing.answer(args, s.listedView(t.listing)); rows != nil {
			return &answer{content: Render(rows, s.rt.style)}, ""
		}
	}
	flat := flatten(args)
	if t.def.Kind == KindWrite {
		if r := refusalByKind(t.all, flat); r != nil {
			content := substitute(r.answer, r.flat, flat, s.rt.style)
			return &answer{content: content, isErr: true}, ""
		}
		if content, ok := t.precondRefusal(args, s.rt.style, s.listedView); ok {
			return &answer{content: content, isErr: true}, ""
		}
		if content, ok := t.balanceRefusal(args, s.row); ok {
			return &answer{content: content, isErr: true}, ""
		}
	}
	var best *rec
	bestD := -1
	for _, r := range t.all {
		d := distance(flat, r.flat)
		if bestD < 0 || d < bestD || (d == bestD && !r.isErr && best.isErr) {
			best, bestD = r, d
		}
	}
	content := substitute(best.answer, best.flat, flat, s.rt.style)
	return &answer{content: content, isErr: best.isErr || isErrorText(content)}, ""
}

// minKindValues is how many different values of one kind of id the recordings must refuse before a write
// refuses every id of that kind.
const minKindValues = 2

// refusalByKind answers a write's refusal that the kind of an id argument explains: a string argument with
// digits whose kind (idKind: "certificate_7504069" → "certificate_#") the recordings show only in calls refused
// with one same answer, for at least minKindValues different ids, while calls with other kinds of id there
// succeeded ("Error: certificate cannot be used to update reservation"). It needs no row: it applies to entities
// made up as to recorded ones. Nil when no argument's kind explains a refusal.
func refusalByKind(all []*rec, flat map[string]string) *rec {
	paths := make([]string, 0, len(flat))
	for p := range flat {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		kind, ok := idKind(flat[p])
		if !ok {
			continue
		}
		var first *rec
		values := map[string]bool{}
		refusedOnly, otherSucceeded := true, false
		for _, r := range all {
			v, has := r.flat[p]
			if !has {
				continue
			}
			k, ok := idKind(v)
			if !ok || k != kind {
				otherSucceeded = otherSucceeded || !r.isErr
				continue
			}
			if !r.isErr || (first != nil && r.answer != first.answer) {
				refusedOnly = false
				break
			}
			if first == nil {
				first = r
			}
			values[v] = true
		}
		if refusedOnly && otherSucceeded && first != nil && len(values) >= minKindValues {
			return first
		}
	}
	return nil
}

// idKind is the kind of an id a JSON string names: its text with each run of digits as "#" (only for strings
// holding digits and letters).
func idKind(canonical string) (string, bool) {
	if len(canonical) < 2 || canonical[0] != '"' {
		return "", false
	}
	var b strings.Builder
	digits, letters, prevDigit := false, false, false
	for i := 1; i < len(canonical)-1; i++ {
		c := canonical[i]
		isDigit := c >= '0' && c <= '9'
		switch {
		case isDigit && !prevDigit:
			b.WriteByte('#')
		case !isDigit:
			b.WriteByte(c)
			letters = letters || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		}
		digits = digits || isDigit
		prevDigit = isDigit
	}
	return b.String(), digits && letters
}

// flatten maps each leaf path of a JSON value to its canonical text.
func flatten(v any) map[string]string {
	out := map[string]string{}
	var walk func(p string, v any)
	walk = func(p string, v any) {
		switch x := v.(type) {
		case *jsonvalue.Object:
			for i, k := range x.Keys {
				walk(p+"/"+k, x.Vals[i])
			}
			if x.Len() == 0 {
				out[p] = "{}"
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s/%d", p, i), e)
			}
			if len(x) == 0 {
				out[p] = "[]"
			}
		default:
			out[p] = jsonvalue.CanonicalText(v)
		}
	}
	walk("", v)
	return out
}

func distance(a, b map[string]string) int {
	d := 0
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			d++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d++
		}
	}
	return d
}

// substitute puts the new call's values where the recorded call's values appear in its answer.
func substitute(answer string, old, cur map[string]string, st Style) string {
	type pair struct{ from, to any }
	var pairs []pair
	paths := make([]string, 0, len(old))
	for p := range old {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		nv, ok := cur[p]
		if !ok || nv == old[p] {
			continue
		}
		ov, err1 := jsonvalue.ParseString(old[p])
		nw, err2 := jsonvalue.ParseString(nv)
		if err1 != nil || err2 != nil {
			continue
		}
		pairs = append(pairs, pair{ov, nw})
	}
	if len(pairs) == 0 {
		return answer
	}
	if jsonvalue.LooksJSON(answer) {
		if v, err := jsonvalue.ParseString(answer); err == nil {
			var walk func(v any) any
			walk = func(v any) any {
				switch x := v.(type) {
				case *jsonvalue.Object:
					c := &jsonvalue.Object{Keys: x.Keys, Vals: make([]any, len(x.Vals))}
					for i, e := range x.Vals {
						c.Vals[i] = walk(e)
					}
					return c
				case []any:
					c := make([]any, len(x))
					for i, e := range x {
						c[i] = walk(e)
					}
					return c
				}
				for _, p := range pairs {
					if jsonvalue.Identical(v, p.from) {
						return p.to
					}
				}
				return v
			}
			return Render(walk(v), st)
		}
	}
	for _, p := range pairs {
		from, to := TextOf(p.from, st), TextOf(p.to, st)
		if len(from) < 2 {
			continue
		}
		answer = strings.ReplaceAll(answer, from, to)
	}
	return answer
}
