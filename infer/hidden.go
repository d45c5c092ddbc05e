package infer

import (
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// Hidden effects: a call that sets a variable its own answer does not show (a login's user, who then posts; a file
// written by echo, then read by cat). A read of a variable that shows a value an argument of a call since the
// variable was last shown held — for a variable keyed by the reader's argument, a call whose other argument held
// that key — witnesses that the call's tool sets the variable to that argument. Kept when at least
// minHiddenWitnesses reads witness it and no read contradicts it (the tool's last such call before a read gave
// another value than the read shows), for a tool whose answer is no function of its arguments alone (a unit
// conversion whose argument happens to be the next fuel level sets nothing).

// minHiddenWitnesses is how many reads must witness a hidden effect.
const minHiddenWitnesses = 2

// hiddenEffect says tool sets variable name (keyed by its argument keyArg's value when keyArg is set) to its
// argument from.
type hiddenEffect struct {
	tool, name, keyArg, from string
}

// sighting is one read of a variable: the reader's call, the variable's key and value, and where it was last shown.
type stateSighting struct {
	o      *stateObs
	key    any // the key argument's value (nil: not keyed)
	v      any
	since  int // the place of the variable's last showing before this read (0: none)
	name   string
	keyArg string
}

// learnHidden finds the hidden effects the synthesized state tools' reads witness.
func (m *model) learnHidden(synth []*stateTool) []hiddenEffect {
	var sights []stateSighting
	for _, st := range synth {
		for _, o := range st.obs {
			for i, f := range o.fields.Keys {
				if !st.shows[f] {
					continue
				}
				ref := st.refOf(f)
				if ref.keyVar != "" {
					continue
				}
				k, ok := ref.keyWith(o.c.args, o.get)
				if !ok {
					continue
				}
				sg := stateSighting{o: o, v: o.fields.Vals[i], since: o.log.lastPos(k, o.pos), name: f, keyArg: ref.keyArg}
				if ref.keyArg != "" {
					sg.key, _ = o.c.args.Get(ref.keyArg)
				}
				sights = append(sights, sg)
			}
		}
	}
	support := map[hiddenEffect]int{}
	for _, sg := range sights {
		seen := map[hiddenEffect]bool{}
		for _, pc := range between(sg.o.log.calls, sg.since, sg.o.pos) {
			if pc.c.tool == sg.o.c.tool {
				continue
			}
			keyArg := ""
			if sg.key != nil {
				if keyArg = argHolding(pc.c.args, sg.key, ""); keyArg == "" {
					continue
				}
			}
			for j, a := range pc.c.args.Keys {
				if a == keyArg || !jsonvalue.Equal(pc.c.args.Vals[j], sg.v) {
					continue
				}
				h := hiddenEffect{tool: pc.c.tool, name: sg.name, keyArg: keyArg, from: a}
				if !seen[h] {
					seen[h] = true
					support[h]++
				}
			}
		}
	}
	var out []hiddenEffect
	for h, n := range support {
		if n >= minHiddenWitnesses && m.tools[h.tool].kind != twin.KindPure && !m.showsVar(h.tool, h.name) && !contradicted(h, sights) {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.tool+"\x00"+a.name+"\x00"+a.from < b.tool+"\x00"+b.name+"\x00"+b.from
	})
	// One argument per (tool, variable): two that both fit every read are not told apart.
	var kept []hiddenEffect
	for i, h := range out {
		ambiguous := false
		for j, o := range out {
			if i != j && o.tool == h.tool && o.name == h.name {
				ambiguous = true
			}
		}
		if !ambiguous {
			kept = append(kept, h)
		}
	}
	return kept
}

// between answers the calls placed strictly between from and to.
func between(calls []placed, from, to int) []placed {
	i := sort.Search(len(calls), func(i int) bool { return calls[i].pos > from })
	j := sort.Search(len(calls), func(i int) bool { return calls[i].pos >= to })
	return calls[i:j]
}

// argHolding answers the (first by name) argument of args holding v, other than except; "" when none.
func argHolding(args *jsonvalue.Object, v any, except string) string {
	names := append([]string(nil), args.Keys...)
	sort.Strings(names)
	for _, k := range names {
		if x, _ := args.Get(k); k != except && jsonvalue.Equal(x, v) {
			return k
		}
	}
	return ""
}

// contradicted tells whether a read of h's variable shows another value than h's tool's last call before it (since
// the variable was last shown, for the read's key) set.
func contradicted(h hiddenEffect, sights []stateSighting) bool {
	for _, sg := range sights {
		if sg.name != h.name || (sg.key != nil) != (h.keyArg != "") {
			continue
		}
		calls := between(sg.o.log.calls, sg.since, sg.o.pos)
		for i := len(calls) - 1; i >= 0; i-- {
			c := calls[i].c
			if c.tool != h.tool {
				continue
			}
			if h.keyArg != "" {
				if kv, ok := c.args.Get(h.keyArg); !ok || !jsonvalue.Equal(kv, sg.key) {
					continue
				}
			}
			v, ok := c.args.Get(h.from)
			if !ok || !jsonvalue.Equal(v, sg.v) {
				return true
			}
			break
		}
	}
	return false
}

// showsVar tells whether tool's own answers show or set variable name (then the effect is not hidden).
func (m *model) showsVar(tool, name string) bool {
	st := m.stateTools[tool]
	return st != nil && (st.shows[name] || st.sets[name])
}

// applyHidden gives each tool its hidden effects: its handler (when it has one) sets the variables after it
// answers without an error, and its state says so (a recording replayed for it sets them too: twin.ToolState).
func (m *model) applyHidden(hs []hiddenEffect) {
	by := map[string][]hiddenEffect{}
	for _, h := range hs {
		by[h.tool] = append(by[h.tool], h)
	}
	m.hidden = by
	for _, name := range sortedKeys(by) {
		ti := m.tools[name]
		if ti.state == nil {
			ti.state = &twin.ToolState{}
		}
		for _, h := range by[name] {
			ti.state.Effects = append(ti.state.Effects, twin.StateEffect{Var: h.name, KeyArg: h.keyArg, From: h.from})
		}
		ti.kind = twin.KindWrite
		if ti.source == "" {
			continue
		}
		fn := funcName(name)
		def := "def " + fn + "(args):\n"
		if !strings.Contains(ti.source, def) {
			continue
		}
		var b strings.Builder
		b.WriteString(strings.Replace(ti.source, def, "def answer_of_"+fn+"(args):\n", 1))
		var lines []string
		for _, h := range by[name] {
			what := fmt.Sprintf("argument %s sets variable %s", h.from, h.name)
			if h.keyArg != "" {
				what += " keyed by argument " + h.keyArg
			}
			lines = append(lines, what+" (later reads show it)")
		}
		b.WriteString("\n" + header(append([]string{"Effects its answer does not show, learned from later reads:"}, lines...)...))
		fmt.Fprintf(&b, "def %s(args):\n", fn)
		fmt.Fprintf(&b, "    out = answer_of_%s(args)\n", fn)
		b.WriteString("    if type(out) in (\"error_answer\", \"decline\"):\n        return out\n")
		for _, h := range by[name] {
			ref := varRef{name: h.name, keyArg: h.keyArg}
			fmt.Fprintf(&b, "    world.put(%q, %s, {\"value\": args.get(%q)})\n", m.stateTable, ref.keyCode(nil), h.from)
		}
		b.WriteString("    return out\n")
		ti.source = b.String()
	}
}

// putHidden puts a recorded call's hidden effects into the world (teacher forcing, as putState does).
func (m *model) putHidden(put func(table, key string, row *jsonvalue.Object), c *call) {
	if !c.success || c.args == nil {
		return
	}
	for _, h := range m.hidden[c.tool] {
		v, ok := c.args.Get(h.from)
		key, ok2 := varRef{name: h.name, keyArg: h.keyArg}.key(c.args)
		if ok && ok2 {
			put(m.stateTable, key, twin.StateRow(v))
		}
	}
}
