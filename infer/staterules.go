package infer

import (
	"sort"
	"strconv"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// The rules a state tool's answer fields are learned as (state.go): functions of the arguments, then the
// variables', each scored on every recorded answer it applies to.

// learnRules learns each field's rule for every shape the handler answers with; names are the variables a
// variable may be keyed by.
func (st *stateTool) learnRules(names []string) {
	st.rules = make([]map[string]*sRule, len(st.shape))
	st.floats = map[string]bool{}
	for _, s := range st.shapesUsed() {
		var obs []*stateObs
		for _, o := range st.obs {
			if o.shape == s {
				obs = append(obs, o)
			}
		}
		st.rules[s] = map[string]*sRule{}
		for _, f := range st.shape[s] {
			st.rules[s][f] = st.learnField(f, obs, keyVars(f, obs, names), names)
		}
	}
}

// learnField picks field f's rule over the answers obs (see the file comment): nil when none explains them.
func (st *stateTool) learnField(f string, obs []*stateObs, keyVarNames, names []string) *sRule {
	vals := make([]any, len(obs))
	floats, nums := 0, 0
	for i, o := range obs {
		vals[i], _ = o.fields.Get(f)
		if n, ok := vals[i].(jsonvalue.Number); ok {
			nums++
			if n.IsFloat() {
				floats++
			}
		}
	}
	isFloat := nums > 0 && floats == nums
	if isFloat {
		st.floats[f] = true
	}
	n := len(obs)
	if allEqual(vals) {
		return &sRule{e: constS{v: vals[0]}, correct: n, seen: n} // every answer the same: nothing to score
	}
	score := func(e sexpr, abort bool) *sRule {
		r := &sRule{e: e}
		alias := ""
		if ref, ok := refOfRule(e); ok && ref.name != f {
			alias = ref.name
		}
		for i, o := range obs {
			x := &sctx{args: o.c.args, get: o.get}
			if alias != "" && i > 0 && obs[i-1].trace == o.trace {
				// The hypothesis sets the other variable to this field's value: after this tool's previous call
				// the variable is what that call answered, unless the trace showed it since.
				prev, prevVal := obs[i-1], vals[i-1]
				x.get = func(k string) (any, bool) {
					if k == alias && o.log.lastPos(k, o.pos) < prev.pos {
						return prevVal, prevVal != nil
					}
					return o.get(k)
				}
			}
			v, ok := e.eval(x)
			if !ok {
				continue
			}
			r.seen++
			if jsonvalue.Equal(v, vals[i]) {
				r.correct++
			} else if abort && 5*(r.seen-r.correct) > n+5 {
				return nil // contradicted too often for any tier below: stop scoring it
			}
		}
		return r
	}
	var pure, stateful []*sRule
	for _, e := range argCandidates(f, obs, vals, isFloat) {
		r := score(e, false) // scored whole: conditions pair the partial ones
		if r == nil {
			continue
		}
		if r.correct == n {
			return r // a function of the arguments every answer agrees with
		}
		pure = append(pure, r)
	}
	for _, e := range conditions(pure, obs) {
		if r := score(e, true); r != nil {
			if r.correct == n {
				return r
			}
			pure = append(pure, r)
		}
	}
	for _, e := range stateCandidates(f, obs, vals, isFloat, st.keyArgs(obs), keyVarNames, names) {
		if r := score(e, true); r != nil {
			stateful = append(stateful, r)
		}
	}
	// A variable rule no answer contradicts, on the most answers.
	var best *sRule
	for _, r := range stateful {
		if r.seen > 0 && r.correct == r.seen && (best == nil || r.seen > best.seen) {
			best = r
		}
	}
	if best != nil {
		return best
	}
	// The rule explaining the most answers, when at most a fifth contradict it.
	for _, r := range append(pure, stateful...) {
		if r.correct >= 2 && 5*(r.seen-r.correct) <= r.seen && (best == nil || r.correct > best.correct) {
			best = r
		}
	}
	if best != nil {
		return best
	}
	// Values that vary and nothing explains: the variable of the field's name, as the trace last showed it (its
	// base value until then) — keyed by an argument whose value always gave the same value of it (a city's zip
	// code), when one does — unless they are text made of the arguments, which no variable holds.
	if !allEqual(vals) && !argTexts(obs, vals) {
		return &sRule{e: readS{v: varRef{name: f, keyArg: lookupArg(obs, vals, st.keyArgs(obs), st.unit)}, float: isFloat}}
	}
	return nil
}

// lookupArg answers the argument whose value picks the field's value in every recorded call (the same argument,
// the same value; at least two values of it, and one of them given in calls of two different tasks — a lookup
// shared by worlds, not a value of one conversation), "" when none does. unit names a call's task (or trace).
func lookupArg(obs []*stateObs, vals []any, keyArgs []string, unit func(*stateObs) string) string {
next:
	for _, a := range keyArgs {
		by := map[string]any{}
		units := map[string]map[string]bool{}
		shared := false
		for i, o := range obs {
			v, _ := o.c.args.Get(a)
			k := twin.StateKeyText(v)
			if prev, ok := by[k]; ok && !jsonvalue.Equal(prev, vals[i]) {
				continue next
			}
			by[k] = vals[i]
			if units[k] == nil {
				units[k] = map[string]bool{}
			}
			units[k][unit(o)] = true
			shared = shared || len(units[k]) > 1
		}
		if len(by) >= 2 && shared {
			return a
		}
	}
	return ""
}

func allEqual(vals []any) bool {
	for _, v := range vals[1:] {
		if !jsonvalue.Equal(v, vals[0]) {
			return false
		}
	}
	return true
}

// unit names the task (or, when its id names none, the trace) of a call.
func (st *stateTool) unit(o *stateObs) string {
	id := st.traceIDs[o.trace]
	if k, ok := taskKey(id); ok {
		return k
	}
	return id
}

// keyArgs are the arguments a variable may be keyed by: top-level, a string or integer in every call.
func (st *stateTool) keyArgs(obs []*stateObs) []string {
	var out []string
	for _, a := range obs[0].c.args.Keys {
		ok := true
		for _, o := range obs {
			if v, has := o.c.args.Get(a); !has || !keyable(v) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// keyVars are the variables field f's variable may be keyed by: of names, those (not f) at least minStateCalls
// calls of obs had seen a whole number or short text of before them.
func keyVars(f string, obs []*stateObs, names []string) []string {
	var out []string
	for _, g := range names {
		if g == f {
			continue
		}
		n := 0
		for _, o := range obs {
			if v, ok := o.get(g); ok && shortKey(v) {
				n++
			}
		}
		if n >= minStateCalls {
			out = append(out, g)
		}
	}
	return out
}

// argCandidates are the functions of the arguments field f might be, in the order they are preferred.
func argCandidates(f string, obs []*stateObs, vals []any, isFloat bool) []sexpr {
	out := []sexpr{constS{v: mostCommon(vals)}}
	first := obs[0].c.args
	// Arguments some calls leave out: production's answer then (one same value) is their default.
	for _, a := range optionalArgs(obs) {
		var absent []any
		for i, o := range obs {
			if _, ok := o.c.args.Get(a); !ok {
				absent = append(absent, vals[i])
			}
		}
		if allEqual(absent) {
			out = append(out, argS{name: a, float: isFloat, hasDef: true, def: absent[0]})
		}
	}
	for i, a := range first.Keys {
		out = append(out, argS{name: a, float: isFloat})
		n, isNum := first.Vals[i].(jsonvalue.Number)
		if v, ok := vals[0].(jsonvalue.Number); ok && isNum && n.Float64() != 0 {
			if k, ok := niceRatio(v.Float64(), n.Float64()); ok {
				out = append(out, scaleS{name: a, k: k})
			}
		}
		if _, isList := first.Vals[i].([]any); isList {
			for _, fn := range []string{"sum", "mean", "min", "max"} {
				out = append(out, aggS{name: a, fn: fn})
			}
		}
	}
	out = append(out, templates(obs, vals)...)
	return out
}

// maxTemplates bounds the text templates tried for one field: the most common ones.
const maxTemplates = 3

// templates are the text templates of a string field with argument values in it, most common first.
func templates(obs []*stateObs, vals []any) []sexpr {
	count := map[string]int{}
	var keys []string
	tmpl := map[string][]part{}
	for i, o := range obs {
		s, ok := vals[i].(string)
		if !ok {
			continue
		}
		ps := templateOf(s, o.c.args)
		if !hasPlaceholder(ps) {
			continue
		}
		k := partsKey(ps)
		if count[k] == 0 {
			keys = append(keys, k)
			tmpl[k] = ps
		}
		count[k]++
	}
	sort.SliceStable(keys, func(i, j int) bool { return count[keys[i]] > count[keys[j]] })
	var out []sexpr
	for _, k := range keys[:min(len(keys), maxTemplates)] {
		out = append(out, tmplS{parts: tmpl[k]})
	}
	return out
}

// argTexts tells whether most of a field's values are text with argument values in it.
func argTexts(obs []*stateObs, vals []any) bool {
	n := 0
	for i, o := range obs {
		if s, ok := vals[i].(string); ok && hasPlaceholder(templateOf(s, o.c.args)) {
			n++
		}
	}
	return 2*n > len(obs)
}

// condChars are the characters a condition may test a text argument for.
const condChars = "./_-: @"

// maxCondRules bounds the rules conditions pair: those explaining the most answers.
const maxCondRules = 4

// conditions pair the functions of the arguments that explain some answers each: one when a text argument holds
// a character, the other when it does not.
func conditions(pure []*sRule, obs []*stateObs) []sexpr {
	var rs []*sRule
	for _, r := range pure {
		if r.correct >= minStateCalls {
			rs = append(rs, r)
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].correct > rs[j].correct })
	rs = rs[:min(len(rs), maxCondRules)]
	if len(rs) < 2 {
		return nil
	}
	var texts []string
	for i, a := range obs[0].c.args.Keys {
		if _, ok := obs[0].c.args.Vals[i].(string); ok {
			texts = append(texts, a)
		}
	}
	sort.Strings(texts)
	var out []sexpr
	for _, a := range texts {
		for _, ch := range condChars {
			for i, x := range rs {
				for j, y := range rs {
					if i != j {
						out = append(out, condS{arg: a, ch: string(ch), then: x.e, els: y.e})
					}
				}
			}
		}
	}
	return out
}

// optionalArgs are the top-level arguments some calls of obs give and others do not, sorted.
func optionalArgs(obs []*stateObs) []string {
	count := map[string]int{}
	for _, o := range obs {
		for _, k := range o.c.args.Keys {
			count[k]++
		}
	}
	var out []string
	for k, n := range count {
		if n < len(obs) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// niceRatio answers v/a rounded to the fewest significant digits (up to 12) whose product with a gives v exactly.
func niceRatio(v, a float64) (float64, bool) {
	for d := 1; d <= 12; d++ {
		k, err := strconv.ParseFloat(strconv.FormatFloat(v/a, 'g', d, 64), 64)
		if err == nil && a*k == v {
			return k, true
		}
	}
	return 0, false
}

// stateCandidates are the variable rules field f might be: its variable as it was, keyed by an argument, plus or
// minus a numeric argument or a step, turned between two values, with an argument appended or removed.
func stateCandidates(f string, obs []*stateObs, vals []any, isFloat bool, keyArgs, keyVarNames, names []string) []sexpr {
	refs := []varRef{{name: f}}
	for _, a := range keyArgs {
		refs = append(refs, varRef{name: f, keyArg: a})
	}
	var out []sexpr
	first := obs[0].c.args
	for _, r := range refs {
		out = append(out, readS{v: r, float: isFloat})
		for i, a := range first.Keys {
			switch first.Vals[i].(type) {
			case jsonvalue.Number:
				out = append(out, addS{v: r, name: a, sign: 1}, addS{v: r, name: a, sign: -1})
			default:
				out = append(out, listS{v: r, name: a}, listS{v: r, name: a, remove: true})
			}
		}
		out = append(out, addS{v: r, sign: 1, step: 1}, addS{v: r, sign: -1, step: 1}, notS{v: r})
		if two := twoValues(vals); two != nil {
			out = append(out, flipS{v: r, a: two[0], b: two[1]})
		}
	}
	// A variable keyed by another variable is read (a directory's entries), not computed; after the simpler
	// rules, which win a tie.
	for _, g := range keyVarNames {
		out = append(out, readS{v: varRef{name: f, keyVar: g}, float: isFloat})
	}
	// Another variable's new value: a numeric field that is some other variable plus or minus an argument or a
	// step (a funding's "new_balance" is the balance plus the amount; a new note's id the notes counted plus one).
	if _, isNum := vals[0].(jsonvalue.Number); isNum {
		for _, g := range numericVars(f, obs, names) {
			r := varRef{name: g}
			for i, a := range first.Keys {
				if _, ok := first.Vals[i].(jsonvalue.Number); ok {
					out = append(out, addS{v: r, name: a, sign: 1}, addS{v: r, name: a, sign: -1})
				}
			}
			out = append(out, addS{v: r, sign: 1, step: 1}, addS{v: r, sign: -1, step: 1})
		}
	}
	return out
}

// numericVars are the variables (of names, not f) at least minStateCalls calls of obs had seen a number of before.
func numericVars(f string, obs []*stateObs, names []string) []string {
	var out []string
	for _, g := range names {
		if g == f {
			continue
		}
		n := 0
		for _, o := range obs {
			if v, ok := o.get(g); ok {
				if _, isNum := v.(jsonvalue.Number); isNum {
					n++
				}
			}
		}
		if n >= minStateCalls {
			out = append(out, g)
		}
	}
	return out
}

// twoValues answers the two values vals hold, when they hold exactly two (sorted by their canonical text).
func twoValues(vals []any) []any {
	var out []any
	for _, v := range vals {
		found := false
		for _, x := range out {
			if jsonvalue.Equal(x, v) {
				found = true
			}
		}
		if !found {
			if out = append(out, v); len(out) > 2 {
				return nil
			}
		}
	}
	if len(out) != 2 {
		return nil
	}
	if jsonvalue.CanonicalText(out[0]) > jsonvalue.CanonicalText(out[1]) {
		out[0], out[1] = out[1], out[0]
	}
	return out
}

func mostCommon(vals []any) any {
	best, bestN := vals[0], 0
	for _, v := range vals {
		n := 0
		for _, w := range vals {
			if jsonvalue.Equal(v, w) {
				n++
			}
		}
		if n > bestN {
			best, bestN = v, n
		}
	}
	return best
}
