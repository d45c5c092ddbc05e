package infer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// lit writes a model value as a Starlark literal that converts back to the same
// value (numbers keep int/float, objects keep key order).
func lit(v any) string {
	var b strings.Builder
	writeLit(&b, v, "", len(twin.Render(v, twin.StyleCompact)) > 100)
	return b.String()
}

func writeLit(b *strings.Builder, v any, indent string, multi bool) {
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case string:
		b.WriteString(strconv.Quote(x))
	case jsonvalue.Number:
		switch string(x) {
		case "NaN":
			b.WriteString(`float("nan")`)
		case "Infinity":
			b.WriteString(`float("inf")`)
		case "-Infinity":
			b.WriteString(`float("-inf")`)
		default:
			// JSON number spellings are Starlark literals of the same type (1200.0 and 1e5 are floats).
			b.WriteString(string(x))
		}
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		inner := indent + "    "
		b.WriteByte('[')
		for i, e := range x {
			if multi {
				b.WriteString("\n" + inner)
			} else if i > 0 {
				b.WriteByte(' ')
			}
			writeLit(b, e, inner, multi && len(twin.Render(e, twin.StyleCompact)) > 80)
			if multi || i < len(x)-1 {
				b.WriteByte(',')
			}
		}
		if multi {
			b.WriteString("\n" + indent)
		}
		b.WriteByte(']')
	case *jsonvalue.Object:
		if x.Len() == 0 {
			b.WriteString("{}")
			return
		}
		inner := indent + "    "
		b.WriteByte('{')
		for i, k := range x.Keys {
			if multi {
				b.WriteString("\n" + inner)
			} else if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.Quote(k))
			b.WriteString(": ")
			writeLit(b, x.Vals[i], inner, multi && len(twin.Render(x.Vals[i], twin.StyleCompact)) > 80)
			if multi || i < x.Len()-1 {
				b.WriteByte(',')
			}
		}
		if multi {
			b.WriteString("\n" + indent)
		}
		b.WriteByte('}')
	default:
		b.WriteString("None")
	}
}

// argPath is a path into the arguments: object keys and list indexes.
type argPath []any

func (p argPath) key() string {
	var parts []string
	for _, e := range p {
		parts = append(parts, fmt.Sprint(e))
	}
	return strings.Join(parts, "/")
}

// expr is the Starlark expression reading the path from args.
func (p argPath) expr() string {
	if len(p) == 1 {
		if s, ok := p[0].(string); ok {
			return "args.get(" + strconv.Quote(s) + ")"
		}
	}
	var b strings.Builder
	b.WriteString("args")
	for _, e := range p {
		switch x := e.(type) {
		case string:
			b.WriteString("[" + strconv.Quote(x) + "]")
		case int:
			if x == loopIndex {
				b.WriteString("[i]")
			} else {
				b.WriteString("[" + strconv.Itoa(x) + "]")
			}
		}
	}
	return b.String()
}

// loopIndex in an argPath stands for the index of the loop the code is in.
const loopIndex = -1 << 30

func (p argPath) get(args *jsonvalue.Object) (any, bool) { return p.getAt(args, -1) }

// getAt reads the path, with loopIndex standing for index at.
func (p argPath) getAt(args *jsonvalue.Object, at int) (any, bool) {
	var cur any = args
	for _, e := range p {
		if x, ok := e.(int); ok && x == loopIndex {
			e = at
		}
		switch x := e.(type) {
		case string:
			o, ok := cur.(*jsonvalue.Object)
			if !ok {
				return nil, false
			}
			if cur, ok = o.Get(x); !ok {
				return nil, false
			}
		case int:
			l, ok := cur.([]any)
			if !ok || x < 0 || x >= len(l) {
				return nil, false
			}
			cur = l[x]
		}
	}
	return cur, true
}

// scalarLeaves lists the scalar leaves of the arguments with their paths, in order.
func scalarLeaves(args *jsonvalue.Object) []struct {
	path argPath
	v    any
} {
	var out []struct {
		path argPath
		v    any
	}
	var walk func(p argPath, v any)
	walk = func(p argPath, v any) {
		switch x := v.(type) {
		case *jsonvalue.Object:
			for i, k := range x.Keys {
				walk(append(append(argPath{}, p...), k), x.Vals[i])
			}
		case []any:
			for i, e := range x {
				walk(append(append(argPath{}, p...), i), e)
			}
		case string, jsonvalue.Number:
			out = append(out, struct {
				path argPath
				v    any
			}{p, v})
		}
	}
	walk(nil, args)
	return out
}

// part is a piece of a text template: a literal or an argument's text.
type part struct {
	lit  string
	path argPath
}

func wordChar(c byte) bool {
	return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// templateOf splits a text into literals and the argument values it quotes.
func templateOf(text string, args *jsonvalue.Object) []part {
	leaves := scalarLeaves(args)
	type occ struct {
		at, end int
		path    argPath
	}
	// Longer values first, so "12" inside "123" never wins.
	sort.SliceStable(leaves, func(i, j int) bool {
		a, _ := scalarText(leaves[i].v)
		b, _ := scalarText(leaves[j].v)
		return len(a) > len(b)
	})
	taken := make([]bool, len(text))
	var occs []occ
	for _, l := range leaves {
		s, _ := scalarText(l.v)
		if s == "" {
			continue
		}
		for from := 0; from < len(text); {
			i := strings.Index(text[from:], s)
			if i < 0 {
				break
			}
			at, end := from+i, from+i+len(s)
			from = at + 1
			if (at > 0 && wordChar(text[at-1]) && wordChar(s[0])) || (end < len(text) && wordChar(text[end]) && wordChar(s[len(s)-1])) {
				continue
			}
			free := true
			for k := at; k < end; k++ {
				if taken[k] {
					free = false
					break
				}
			}
			if !free {
				continue
			}
			for k := at; k < end; k++ {
				taken[k] = true
			}
			occs = append(occs, occ{at, end, l.path})
		}
	}
	sort.Slice(occs, func(i, j int) bool { return occs[i].at < occs[j].at })
	var parts []part
	pos := 0
	for _, o := range occs {
		if o.at > pos {
			parts = append(parts, part{lit: text[pos:o.at]})
		}
		parts = append(parts, part{path: o.path})
		pos = o.end
	}
	if pos < len(text) {
		parts = append(parts, part{lit: text[pos:]})
	}
	return parts
}

func partsKey(ps []part) string {
	var b strings.Builder
	for _, p := range ps {
		if p.path != nil {
			b.WriteString("\x00" + p.path.key() + "\x00")
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

// commonTemplate finds one template every call's text fits; ok is false when they disagree.
func commonTemplate(calls []*call) ([]part, bool) {
	var tmpl []part
	key := ""
	for i, c := range calls {
		args := c.args
		if args == nil {
			args = jsonvalue.NewObject(0)
		}
		ps := templateOf(c.text, args)
		k := partsKey(ps)
		if i == 0 {
			tmpl, key = ps, k
			continue
		}
		if k != key {
			return nil, false
		}
	}
	return tmpl, len(calls) > 0
}

// templateExpr is the Starlark expression building a template's text.
func templateExpr(ps []part) string {
	if len(ps) == 0 {
		return `""`
	}
	var out []string
	for _, p := range ps {
		if p.path != nil {
			out = append(out, "pystr("+p.path.expr()+")")
		} else {
			out = append(out, strconv.Quote(p.lit))
		}
	}
	return strings.Join(out, " + ")
}

func hasPlaceholder(ps []part) bool {
	for _, p := range ps {
		if p.path != nil {
			return true
		}
	}
	return false
}

// header is a handler's opening comment.
func header(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

// starKeywords are Starlark's keywords and reserved words.
var starKeywords = set("and", "break", "continue", "def", "elif", "else", "for", "if", "in", "lambda", "load", "not",
	"or", "pass", "return", "while", "as", "assert", "async", "await", "class", "del", "except", "finally", "from",
	"global", "import", "is", "nonlocal", "raise", "try", "with", "yield", "True", "False", "None")

// funcName is the name a handler's function gets: the tool's own when it is a plain
// identifier that shadows nothing the handler uses, else "handle".
func funcName(tool string) string {
	if tool == "" || starKeywords[tool] || twin.IsPredeclared(tool) || tool == "args" {
		return "handle"
	}
	for i, r := range tool {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return "handle"
		}
	}
	return tool
}
