package infer

import (
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Preconditions the successes alone show. A refusal the recordings never show for a tool can still be
// known: every successful call found the row in one state (an order "delivered"), while the table's rows
// are in other states often enough that so many successes would not all have met that state by chance. The
// tool is then refused in the other states, as its refusals of other kinds are, with a text in the format of
// the recorded refusals.

// successGuardChance bounds the chance that the successes met one state by luck: with a share q of the
// table's rows in other states, n successes all meet it with probability (1-q)^n.
const successGuardChance = 0.01

// maxStates is the most distinct values a field may take in the table's rows to be a state (more are data:
// names, ids, amounts).
const maxStates = 8

// minStateRows is how many of the table's rows must show the field before its states are known.
const minStateRows = 10

// successGuards answers the preconditions succ implies on the row's state fields (string fields, outside
// lists, of at most maxStates values in the base rows) that no guard in have already tests.
func (m *model) successGuards(table string, succ []wex, have []guard) []guard {
	if len(succ) == 0 || succ[0].pre == nil {
		return nil
	}
	rows := m.base[table]
	if len(rows) < minStateRows {
		return nil
	}
	keys := sortedKeys(rows)
	var out []guard
	for _, p := range valuePaths(succ[0].pre, 3) {
		if !fieldPath(p) || guarded(have, p) {
			continue
		}
		var seen []string
		ok := true
		for _, x := range succ {
			v, has := rowState(x.pre, p)
			if !has {
				ok = false
				break
			}
			if !slices.Contains(seen, v) {
				if seen = append(seen, v); len(seen) > maxNotIn {
					ok = false
					break
				}
			}
		}
		if !ok {
			continue
		}
		states := map[string]bool{}
		n, other := 0, 0
		for _, k := range keys {
			v, ok := rowState(rows[k], p)
			if !ok {
				continue
			}
			n++
			states[v] = true
			if !slices.Contains(seen, v) {
				other++
			}
		}
		if n < minStateRows || other == 0 || len(states) > maxStates {
			continue
		}
		if math.Pow(1-float64(other)/float64(n), float64(len(succ))) > successGuardChance {
			continue
		}
		sort.Strings(seen)
		vals := make([]any, len(seen))
		for i, v := range seen {
			vals[i] = v
		}
		name, _ := p[len(p)-1].(string)
		text := m.errorText(strings.ReplaceAll(name, "_", " ") + " must be " + strings.Join(seen, " or "))
		out = append(out, guard{pred: fieldNotIn{path: p, vals: vals}, text: []part{{lit: text}}})
	}
	return out
}

// fieldPath tells a path of object fields only (no list elements).
func fieldPath(p []any) bool {
	for _, e := range p {
		if _, ok := e.(string); !ok {
			return false
		}
	}
	return len(p) > 0
}

// guarded tells whether a guard in have already tests the row's field at p.
func guarded(have []guard, p []any) bool {
	for _, g := range have {
		if f, ok := g.pred.(fieldNotIn); ok && slices.Equal(f.path, p) {
			return true
		}
	}
	return false
}

// rowState answers the string at path p of row.
func rowState(row *jsonvalue.Object, p []any) (string, bool) {
	var v any = row
	for _, e := range p {
		o, ok := v.(*jsonvalue.Object)
		if !ok {
			return "", false
		}
		if v, ok = o.Get(e.(string)); !ok {
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}

// errorText writes a refusal's message in the format of the recorded error answers: {"error": msg} when they are
// JSON objects of one same key, their common prefix up to and including its first ": " ("Error: ") when they
// are text sharing one, else "Error: " (what an error answer is recognized by).
func (m *model) errorText(msg string) string {
	prefix, key := "", ""
	seen, text, obj := false, true, true
	for _, t := range m.traces {
		for _, c := range t.calls {
			if !c.isErr {
				continue
			}
			if o, ok := c.val.(*jsonvalue.Object); ok && c.isJSON && o.Len() == 1 && (!seen || key == o.Keys[0]) {
				key, text = o.Keys[0], false
			} else {
				obj = false
			}
			if i := strings.Index(c.text, ": "); i < 0 || c.isJSON || seen && c.text[:i+2] != prefix {
				text = false
			} else {
				prefix = c.text[:i+2]
			}
			seen = true
		}
	}
	switch {
	case seen && obj:
		o := jsonvalue.NewObject(1)
		o.Set(key, msg)
		return jsonvalue.CanonicalText(o)
	case seen && text:
		return prefix + msg
	}
	return "Error: " + msg
}
