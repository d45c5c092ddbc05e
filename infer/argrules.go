package infer

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/doppel-dev/doppel/twin"
)

// minArgRuleCalls is how many recorded calls with arguments a tool needs before its inferred schema's rules are
// applied: fewer do not show which arguments it requires or which names it takes.
const minArgRuleCalls = 3

// argRules derives a tool's argument rules (see twin.ArgRules): from its uploaded definition — the arguments it
// requires, the names it declares (closed unless additionalProperties allows more), its types — or, without one,
// from the schema inferred from its recorded calls (the arguments every call gave, the names recorded, the
// top-level kinds), once it has minArgRuleCalls calls. Every rule is then tried on every recorded successful
// call: one that would refuse a call production answered is dropped and named in Dropped (and the tool's
// attention), so no recorded success is ever refused.
func (m *model) argRules(ti *toolInfo, t *twin.Tool) *twin.ArgRules {
	var r *twin.ArgRules
	switch {
	case ti.def != nil:
		r = definitionRules(ti.def.InputSchema)
	default:
		n := 0
		for _, c := range ti.calls {
			if c.args != nil {
				n++
			}
		}
		if n < minArgRuleCalls {
			return nil
		}
		r = definitionRules(t.InputSchema)
		r.From = twin.ArgsFromRecordings
	}
	if r == nil {
		return nil
	}
	m.verifyArgRules(ti, t, r)
	if len(r.Required) == 0 && !r.Closed && !r.Types {
		return nil
	}
	return r
}

// definitionRules reads the rules a JSON Schema states: required, the properties' names (closed unless
// additionalProperties allows others), types. nil when the schema is not an object schema.
func definitionRules(schema json.RawMessage) *twin.ArgRules {
	var sc struct {
		Properties           map[string]json.RawMessage `json:"properties"`
		Required             []string                   `json:"required"`
		AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	}
	if json.Unmarshal(schema, &sc) != nil {
		return nil
	}
	r := &twin.ArgRules{From: twin.ArgsFromDefinition, Required: slices.Clone(sc.Required), Types: true}
	sort.Strings(r.Required)
	for name := range sc.Properties {
		r.Names = append(r.Names, name)
	}
	sort.Strings(r.Names)
	ap := string(sc.AdditionalProperties)
	r.Closed = ap == "" || ap == "false"
	return r
}

// verifyArgRules drops the rules a recorded successful call of the tool breaks.
func (m *model) verifyArgRules(ti *toolInfo, t *twin.Tool, r *twin.ArgRules) {
	check := twin.NewArgChecker(r, t.InputSchema)
	broken := map[string]string{} // rule → the first call that breaks it
	note := func(rule string, c *call) {
		if _, ok := broken[rule]; !ok {
			broken[rule] = fmt.Sprintf("%s: %s#%d", rule, m.traceOf(c), c.idx)
		}
	}
	for _, c := range ti.calls {
		if !c.success || c.args == nil {
			continue
		}
		for _, name := range r.Required {
			if _, ok := c.args.Get(name); !ok {
				note("required "+name, c)
			}
		}
		if r.Closed {
			for _, k := range c.args.Keys {
				if !slices.Contains(r.Names, k) {
					note("closed names", c)
				}
			}
		}
		if r.Types && check.TypeProblem(c.args) != "" {
			note("types", c)
		}
	}
	if len(broken) == 0 {
		return
	}
	var req []string
	for _, name := range r.Required {
		if _, ok := broken["required "+name]; !ok {
			req = append(req, name)
		}
	}
	r.Required = req
	if _, ok := broken["closed names"]; ok {
		r.Closed = false
	}
	if _, ok := broken["types"]; ok {
		r.Types = false
	}
	for _, rule := range sortedKeys(broken) {
		r.Dropped = append(r.Dropped, broken[rule])
	}
	ti.notes = append(ti.notes, fmt.Sprintf("argument rules not applied, as recorded successful calls break them: %v", r.Dropped))
}

// traceOf answers the id of the trace holding c (a search: only for the few calls a note names).
func (m *model) traceOf(c *call) string {
	for _, t := range m.traces {
		if slices.Contains(t.calls, c) {
			return t.id
		}
	}
	return "?"
}
