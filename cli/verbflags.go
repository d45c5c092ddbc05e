package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

var pathParamRE = regexp.MustCompile(`\{([^}]+)\}`)

func pathParams(path string) []string {
	var out []string
	for _, m := range pathParamRE.FindAllStringSubmatch(path, -1) {
		out = append(out, m[1])
	}
	return out
}

// prop is one input property as a flag.
type prop struct {
	name   string // the property
	flag   string // the flag
	schema map[string]any
	typ    string // string, integer, number, boolean or json
	enum   []string
	req    bool
	in     string
}

// flagName renders a property as a flag: snake_case and camelCase both become kebab-case.
func flagName(p string) string {
	var b strings.Builder
	for i, r := range p {
		switch {
		case r == '_':
			b.WriteByte('-')
		case unicode.IsUpper(r):
			if i > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if x, ok := x.(string); ok && x != "null" {
				return x
			}
		}
	}
	return "json"
}

// props lists a verb's input properties as flags. Two properties that render to the same flag (seed_instructions and
// seedInstructions) are one flag, the snake_case or lower-case one, with the other a hidden alias.
func props(v *Verb) (list []*prop, aliases map[string]string) {
	properties, _ := v.Input["properties"].(map[string]any)
	required := map[string]bool{}
	if rs, ok := v.Input["required"].([]any); ok {
		for _, r := range rs {
			if s, ok := r.(string); ok {
				required[s] = true
			}
		}
	}
	names := make([]string, 0, len(properties))
	for n := range properties {
		names = append(names, n)
	}
	// Properties with no capitals first, so they own their flag; camelCase duplicates become aliases.
	sort.Slice(names, func(i, j int) bool {
		ci, cj := strings.ToLower(names[i]) != names[i], strings.ToLower(names[j]) != names[j]
		if ci != cj {
			return !ci
		}
		return names[i] < names[j]
	})
	byFlag := map[string]*prop{}
	aliases = map[string]string{}
	for _, n := range names {
		s, _ := properties[n].(map[string]any)
		if s == nil {
			s = map[string]any{}
		}
		f := flagName(n)
		if owner, dup := byFlag[f]; dup {
			aliases[n] = owner.flag
			if required[n] {
				owner.req = true
			}
			continue
		}
		p := &prop{name: n, flag: f, schema: s, typ: schemaType(s), req: required[n]}
		p.in, _ = s["x-in"].(string)
		if en, ok := s["enum"].([]any); ok {
			for _, e := range en {
				p.enum = append(p.enum, fmt.Sprint(e))
			}
		}
		if p.typ == "object" || p.typ == "array" {
			p.typ = "json"
		}
		if n != f {
			aliases[n] = f
		}
		byFlag[f] = p
		list = append(list, p)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].flag < list[j].flag })
	return list, aliases
}

func (p *prop) usage() string {
	d, _ := p.schema["description"].(string)
	d = strings.TrimSpace(d)
	var extra []string
	if p.req {
		extra = append(extra, "required")
	}
	if p.in == "path" {
		extra = append(extra, "or positional")
	}
	if len(p.enum) > 0 {
		extra = append(extra, "one of "+strings.Join(p.enum, "|"))
	}
	if p.typ == "json" {
		extra = append(extra, "JSON")
	}
	if def, ok := p.schema["default"]; ok {
		b, _ := json.Marshal(def)
		extra = append(extra, "server default "+string(b))
	}
	if len(extra) > 0 {
		if d != "" {
			d += " "
		}
		d += "(" + strings.Join(extra, "; ") + ")"
	}
	return d
}

// value turns flag text into the property's JSON value: strings stay strings, numbers and JSON are parsed.
func (p *prop) value(s string) (any, error) {
	switch p.typ {
	case "string":
		return s, nil
	case "integer":
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", s)
		}
		return n, nil
	case "number":
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", s)
		}
		return f, nil
	case "boolean":
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a boolean", s)
		}
		return b, nil
	}
	if name, ok := strings.CutPrefix(s, "@"); ok && name != "" {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %v", name, err)
		}
		s = string(data)
	}
	var x any
	if err := json.Unmarshal([]byte(s), &x); err != nil {
		if p.takesString() {
			return s, nil // a value that is not JSON is the string the schema also takes (a trace's id)
		}
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	return json.RawMessage(s), nil
}

// takesString tells a JSON flag whose schema also takes a string (oneOf or anyOf with a string alternative).
func (p *prop) takesString() bool {
	for _, k := range []string{"oneOf", "anyOf"} {
		alts, _ := p.schema[k].([]any)
		for _, a := range alts {
			if m, ok := a.(map[string]any); ok && schemaType(m) == "string" {
				return true
			}
		}
	}
	return false
}

func (p *prop) checkEnum(v any) error {
	if len(p.enum) == 0 {
		return nil
	}
	s := fmt.Sprint(v)
	for _, e := range p.enum {
		if e == s {
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", s, strings.Join(p.enum, ", "))
}
