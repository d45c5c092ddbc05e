package infer

import (
	"math"
	"sort"
	"strconv"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Which fields of a state tool read or set which variables, and the variables' base values (state.go).

// bindVars decides which fields read their variable and which set it: a field whose name is a variable sets it
// to the field's value, unless its rule is a plain read of it.
func (st *stateTool) bindVars(vars map[string]bool) {
	st.sets, st.shows, st.refs = map[string]bool{}, map[string]bool{}, map[string]varRef{}
	for _, s := range st.shapesUsed() {
		for f, r := range st.rules[s] {
			if rd, ok := r.e.(readS); ok && rd.v.name == f {
				st.shows[f] = true
				st.refs[f] = rd.v
				continue
			}
			ref, stateful := refOfRule(r.e)
			switch {
			case stateful && ref.name != f:
				// Another variable's new value (an alias): the call sets that variable.
				st.sets[f] = true
				st.refs[f] = ref
			case vars[f]:
				st.sets[f] = true
				if stateful {
					st.refs[f] = ref
				}
			}
		}
	}
}

// refOf is the variable field f of the tool's answers reads or sets.
func (st *stateTool) refOf(f string) varRef {
	if r, ok := st.refs[f]; ok {
		return r
	}
	return varRef{name: f}
}

// refOfRule is the variable a stateful rule rests on.
func refOfRule(e sexpr) (varRef, bool) {
	switch x := e.(type) {
	case readS:
		return x.v, true
	case addS:
		return x.v, true
	case notS:
		return x.v, true
	case flipS:
		return x.v, true
	case listS:
		return x.v, true
	}
	return varRef{}, false
}

// writes tells whether the tool sets a variable.
func (st *stateTool) writes() bool { return len(st.sets) > 0 }

// stateBase makes the base value of each variable: per trace, the value before the first call that showed or set
// it (a read's value, or a learned write inverted), the value most traces gave (ties to the earlier trace). It
// answers those per-trace values too, by trace index (what fit puts in place before a trace's calls).
func (m *model) stateBase(tools []*stateTool) (map[string]any, map[int]map[string]any) {
	perTrace := map[int]map[string]any{}
	type vote struct {
		v     any
		n     int
		first int
	}
	votes := map[string][]*vote{}
	var obs []*stateObs
	for _, st := range tools {
		for _, o := range st.obs {
			obs = append(obs, o)
		}
	}
	sort.SliceStable(obs, func(i, j int) bool {
		if obs[i].trace != obs[j].trace {
			return obs[i].trace < obs[j].trace
		}
		return obs[i].c.idx < obs[j].c.idx
	})
	byTool := map[*call]*stateTool{}
	for _, st := range tools {
		for _, o := range st.obs {
			byTool[o.c] = st
		}
	}
	decided := map[string]bool{} // per trace: variables whose value before the trace's writes is known or lost
	lastTrace := -1
	for _, o := range obs {
		if o.trace != lastTrace {
			clear(decided)
			lastTrace = o.trace
		}
		st := byTool[o.c]
		rules := st.rules[o.shape]
		if rules == nil {
			continue
		}
		for i, f := range o.fields.Keys {
			r := rules[f]
			if r == nil || (!st.shows[f] && !st.sets[f]) {
				continue
			}
			key, ok := st.refOf(f).keyWith(o.c.args, o.get)
			if !ok || decided[key] {
				continue
			}
			decided[key] = true
			before, ok := invert(r.e, o.fields.Vals[i], o.c.args, st.shows[f])
			if !ok {
				continue
			}
			if perTrace[o.trace] == nil {
				perTrace[o.trace] = map[string]any{}
			}
			perTrace[o.trace][key] = before
			found := false
			for _, vt := range votes[key] {
				if jsonvalue.Equal(vt.v, before) {
					vt.n++
					found = true
					break
				}
			}
			if !found {
				votes[key] = append(votes[key], &vote{v: before, n: 1, first: o.trace})
			}
		}
	}
	base := map[string]any{}
	for key, vs := range votes {
		best := vs[0]
		for _, vt := range vs[1:] {
			if vt.n > best.n || vt.n == best.n && vt.first < best.first {
				best = vt
			}
		}
		base[key] = best.v
	}
	return base, perTrace
}

// invert answers a variable's value before a call from the field's value after it: a read's own value, a write
// undone by its rule; false when the rule loses it (a constant or argument set).
func invert(e sexpr, after any, args *jsonvalue.Object, shows bool) (any, bool) {
	if shows {
		return after, true
	}
	switch x := e.(type) {
	case addS:
		n, ok := after.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		d := x.step
		if x.name != "" {
			a, ok := args.Get(x.name)
			an, isNum := a.(jsonvalue.Number)
			if !ok || !isNum {
				return nil, false
			}
			d = an.Float64()
		}
		r := n.Float64() - x.sign*d
		if x.name == "" && !n.IsFloat() && r == math.Trunc(r) {
			return jsonvalue.Number(strconv.FormatFloat(r, 'f', -1, 64)), true
		}
		return floatNumber(r), true
	case notS:
		b, ok := after.(bool)
		return !b, ok
	case flipS:
		switch {
		case jsonvalue.Equal(after, x.a):
			return x.b, true
		case jsonvalue.Equal(after, x.b):
			return x.a, true
		}
	case listS:
		l, ok := after.([]any)
		a, ok2 := args.Get(x.name)
		if ok && ok2 && !x.remove && len(l) > 0 && jsonvalue.Equal(l[len(l)-1], a) {
			return append([]any{}, l[:len(l)-1]...), true
		}
	}
	return nil, false
}
