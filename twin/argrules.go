package twin

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Argument rules: what a call's arguments must be for production to run it, refused before any rung answers, as
// production refuses them — with the tool's own error (error: true), in the style its recordings show, the world
// untouched. The build derives them (infer/argrules.go) from the tool's uploaded definition (required arguments,
// the names it declares, the JSON types of its schema, checked deeply) or, without one, from its inferred schema,
// keeping only what the recordings justify (arguments every recorded call gave, the names recorded, the top-level
// JSON kinds recorded, a whole number counting as a number); a rule that would refuse a recorded successful call
// is not applied and is named in Dropped.

// ArgRules are the argument rules of one tool.
type ArgRules struct {
	// From is ArgsFromDefinition or ArgsFromRecordings.
	From string `json:"from"`
	// Required arguments must be given.
	Required []string `json:"required,omitempty"`
	// Names, when Closed, are every argument the tool takes: others are refused.
	Names  []string `json:"names,omitempty"`
	Closed bool     `json:"closed,omitempty"`
	// Types: arguments must have the input schema's types (From a definition: deeply; from recordings: the
	// top-level JSON kinds, integer counting as number).
	Types bool `json:"types,omitempty"`
	// Dropped are the rules a recorded successful call breaks (e.g. "required user_id: trace t#3"), not applied.
	Dropped []string `json:"dropped,omitempty"`
}

// Sources of argument rules.
const (
	ArgsFromDefinition = "definition"
	ArgsFromRecordings = "recordings"
)

// ArgsRefusedNote is the note of an answer that refused the call's arguments.
const ArgsRefusedNote = "the arguments break the tool's argument rules: refused as production refuses them, the world unchanged"

// ArgChecker is one tool's argument rules, ready to check (the build verifies its rules on the recorded calls with
// the checker the twin uses).
type ArgChecker struct {
	rules    *ArgRules
	schema   *jsonvalue.Schema   // a definition's input schema (types)
	kinds    map[string][]string // recordings: argument → JSON kinds its schema allows
	errStyle errStyle
}

// errStyle is how the tool spells its own errors: JSON {key: text} when key is set, else prefix + text.
type errStyle struct {
	key    string
	prefix string
}

// NewArgChecker prepares rules over the tool's input schema.
func NewArgChecker(rules *ArgRules, inputSchema json.RawMessage) *ArgChecker {
	c := &ArgChecker{rules: rules}
	if rules == nil || !rules.Types {
		return c
	}
	if rules.From == ArgsFromDefinition {
		c.schema, _ = jsonvalue.ParseSchema(inputSchema) // a schema that does not parse checks nothing
		return c
	}
	var sc struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
	}
	if json.Unmarshal(inputSchema, &sc) == nil {
		c.kinds = map[string][]string{}
		for name, p := range sc.Properties {
			switch x := p.Type.(type) {
			case string:
				c.kinds[name] = []string{x}
			case []any:
				for _, e := range x {
					if s, ok := e.(string); ok {
						c.kinds[name] = append(c.kinds[name], s)
					}
				}
			}
		}
	}
	return c
}

// newArgCheck prepares t's rules and error style.
func (rt *Runtime) newArgCheck(t *rtTool) *ArgChecker {
	c := NewArgChecker(t.def.Args, t.def.InputSchema)
	c.errStyle = rt.errorStyle(t)
	return c
}

// problem says what in args the tool refuses ("" when nothing); a bundle without rules checks its schema's types.
func (c *ArgChecker) problem(t *rtTool, raw []byte, args *jsonvalue.Object) string {
	if c.rules == nil {
		return t.argsProblem(raw, args)
	}
	return c.Problem(args)
}

// Problem says what in args the rules refuse ("" when nothing): a missing required argument, then an unknown name,
// then a wrong type.
func (c *ArgChecker) Problem(args *jsonvalue.Object) string {
	r := c.rules
	if r == nil {
		return ""
	}
	for _, name := range r.Required {
		if _, ok := args.Get(name); !ok {
			return "missing required argument " + name
		}
	}
	if r.Closed {
		for _, k := range args.Keys {
			if !slices.Contains(r.Names, k) {
				return "unexpected argument " + k
			}
		}
	}
	return c.TypeProblem(args)
}

// TypeProblem says which argument has a type the rules refuse ("" when none, or when types are not checked).
func (c *ArgChecker) TypeProblem(args *jsonvalue.Object) string {
	if c.rules == nil || !c.rules.Types {
		return ""
	}
	if c.schema != nil {
		if err := c.schema.CheckTypes(decodedForm(args)); err != nil {
			return schemaProblem(err)
		}
		return ""
	}
	for i, k := range args.Keys {
		kinds := c.kinds[k]
		if len(kinds) > 0 && !kindAllowed(kinds, args.Vals[i]) {
			return k + ": want " + strings.Join(kinds, " or ") + ", got " + kindOf(args.Vals[i])
		}
	}
	return ""
}

// kindAllowed tells whether v is of one of the JSON kinds (a whole number counts as a number, any number as an
// integer: the recordings do not say a tool refuses 2.5 where they showed 2).
func kindAllowed(kinds []string, v any) bool {
	k := kindOf(v)
	for _, x := range kinds {
		if x == k || (x == "integer" || x == "number") && k == "number" {
			return true
		}
	}
	return false
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case jsonvalue.Number:
		return "number"
	case []any:
		return "array"
	}
	return "object"
}

// errorStyle learns how t spells its errors: from its recorded errors, else the bundle's other tools', else JSON
// {"error": …} when its recorded answers are JSON objects, else "Error: " text.
func (rt *Runtime) errorStyle(t *rtTool) errStyle {
	if st, ok := styleOf(t.all); ok {
		return st
	}
	for _, name := range rt.toolNames {
		if st, ok := styleOf(rt.tools[name].all); ok {
			return st
		}
	}
	for _, r := range t.all {
		if !r.isErr && strings.HasPrefix(strings.TrimSpace(r.answer), "{") {
			return errStyle{key: "error"}
		}
	}
	return errStyle{prefix: "Error: "}
}

// styleOf answers the style of the first recorded error among recs.
func styleOf(recs []*rec) (errStyle, bool) {
	for _, r := range recs {
		if !r.isErr {
			continue
		}
		a := strings.TrimSpace(r.answer)
		if strings.HasPrefix(a, "{") {
			if v, err := jsonvalue.ParseString(a); err == nil {
				if o, ok := v.(*jsonvalue.Object); ok && o.Len() == 1 {
					return errStyle{key: o.Keys[0]}, true
				}
			}
		}
		if i := strings.Index(r.answer, ": "); i > 0 && i < 40 {
			return errStyle{prefix: r.answer[:i+2]}, true
		}
		return errStyle{prefix: "Error: "}, true
	}
	return errStyle{}, false
}

// text spells an error message in the style.
func (st errStyle) text(msg string, style Style) string {
	if st.key != "" {
		o := jsonvalue.NewObject(1)
		o.Set(st.key, msg)
		return Render(o, style)
	}
	return st.prefix + msg
}
