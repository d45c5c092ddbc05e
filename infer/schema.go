package infer

import (
	"encoding/json"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// shape accumulates what observed values of one schema position look like.
type shape struct {
	n       int
	types   map[string]int
	strs    map[string]int
	strOver bool
	props   map[string]*shape
	order   []string
	present map[string]int
	items   *shape
	// mapVals, once an object position has seen more than maxProps distinct keys, is the shape of all
	// its members' values: the keys are data (ids), so the position is a map (additionalProperties), and
	// props, order and present are dropped. A build of many traces would otherwise grow one property
	// per id, in memory and in the tool's output schema.
	mapVals *shape
}

const (
	maxEnumSeen = 32
	maxProps    = 128
)

func newShape() *shape { return &shape{types: map[string]int{}} }

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case jsonvalue.Number:
		if x.IsFloat() {
			return "number"
		}
		return "integer"
	case []any:
		return "array"
	case *jsonvalue.Object:
		return "object"
	}
	return "string"
}

func (s *shape) add(v any) {
	s.n++
	t := jsonType(v)
	s.types[t]++
	switch x := v.(type) {
	case string:
		if s.strs == nil {
			s.strs = map[string]int{}
		}
		if _, ok := s.strs[x]; ok || len(s.strs) < maxEnumSeen {
			s.strs[x]++
		} else {
			s.strOver = true
		}
	case []any:
		if s.items == nil {
			s.items = newShape()
		}
		for _, e := range x {
			s.items.add(e)
		}
	case *jsonvalue.Object:
		if s.props == nil && s.mapVals == nil {
			s.props = map[string]*shape{}
			s.present = map[string]int{}
		}
		for i, k := range x.Keys {
			if s.mapVals == nil && s.props[k] == nil && len(s.props) == maxProps {
				s.toMap()
			}
			if s.mapVals != nil {
				s.mapVals.add(x.Vals[i])
				continue
			}
			p := s.props[k]
			if p == nil {
				p = newShape()
				s.props[k] = p
				s.order = append(s.order, k)
			}
			p.add(x.Vals[i])
			s.present[k]++
		}
	}
}

// toMap turns s's properties into one shape of map members (see shape.mapVals).
func (s *shape) toMap() {
	m := newShape()
	for _, k := range s.order {
		m.merge(s.props[k])
	}
	s.mapVals, s.props, s.order, s.present = m, nil, nil, nil
}

// merge adds what o saw to s, as if s had seen o's values too (o is not used afterwards).
func (s *shape) merge(o *shape) {
	s.n += o.n
	for t, c := range o.types {
		s.types[t] += c
	}
	if o.strOver {
		s.strOver = true
	}
	if len(o.strs) > 0 && !s.strOver {
		if s.strs == nil {
			s.strs = map[string]int{}
		}
		for v, c := range o.strs {
			s.strs[v] += c
		}
		if len(s.strs) > maxEnumSeen {
			s.strOver = true // the values past the cap would be another order's pick: none is used
		}
	}
	if o.items != nil {
		if s.items == nil {
			s.items = o.items
		} else {
			s.items.merge(o.items)
		}
	}
	if o.props != nil && s.props == nil && s.mapVals == nil {
		s.props, s.present = map[string]*shape{}, map[string]int{}
	}
	for _, k := range o.order {
		if s.mapVals == nil && s.props[k] == nil && len(s.props) == maxProps {
			s.toMap()
		}
		switch p := s.props[k]; {
		case s.mapVals != nil:
			s.mapVals.merge(o.props[k])
		case p == nil:
			s.props[k] = o.props[k]
			s.order = append(s.order, k)
			s.present[k] = o.present[k]
		default:
			p.merge(o.props[k])
			s.present[k] += o.present[k]
		}
	}
	if o.mapVals != nil {
		if s.mapVals == nil {
			s.toMap()
		}
		s.mapVals.merge(o.mapVals)
	}
}

// schema renders the accumulated shape as a JSON Schema (as an ordered object).
func (s *shape) schema() *jsonvalue.Object { return s.schemaNamed("") }

// enumNameStop are words in a property name that say its values are open-ended.
var enumNameStop = []string{"id", "name", "email", "phone", "address", "zip", "code", "number", "date", "time", "summary", "thought", "description", "text", "note", "comment"}

// enumWorthy reports whether the values seen look like a small closed set.
func (s *shape) enumWorthy(name string, vals []string) bool {
	if len(vals) < 2 || len(vals) > 4 || s.n < 5*len(vals) || idLike(vals) {
		return false
	}
	for _, v := range vals {
		if s.strs[v] < 2 || len(v) > 32 {
			return false
		}
	}
	for _, w := range nameWords(name) {
		for _, stop := range enumNameStop {
			if w == stop {
				return false
			}
		}
	}
	return true
}

func (s *shape) schemaNamed(name string) *jsonvalue.Object {
	o := jsonvalue.NewObject(6)
	var types []string
	for t := range s.types {
		types = append(types, t)
	}
	sort.Strings(types)
	// An integer position that also saw floats is a number.
	if s.types["integer"] > 0 && s.types["number"] > 0 {
		types = remove(types, "integer")
	}
	switch len(types) {
	case 0:
	case 1:
		o.Set("type", types[0])
	default:
		l := make([]any, len(types))
		for i, t := range types {
			l[i] = t
		}
		o.Set("type", l)
	}
	if s.props != nil && s.types["object"] > 0 {
		props := jsonvalue.NewObject(len(s.order))
		var req []any
		for _, k := range s.order {
			// s.order holds each key once: append, not Set (which searches the keys so far).
			props.Keys = append(props.Keys, k)
			props.Vals = append(props.Vals, s.props[k].schemaNamed(k))
			if s.present[k] == s.types["object"] {
				req = append(req, k)
			}
		}
		o.Set("properties", props)
		if len(req) > 0 {
			o.Set("required", req)
		}
	} else if s.mapVals != nil && s.types["object"] > 0 {
		o.Set("additionalProperties", s.mapVals.schemaNamed(""))
	} else if s.types["object"] > 0 && len(types) == 1 {
		o.Set("properties", jsonvalue.NewObject(0))
	}
	if s.items != nil {
		o.Set("items", s.items.schemaNamed(name))
	}
	if s.types["string"] > 0 && s.types["string"] == s.n && !s.strOver {
		vals := make([]string, 0, len(s.strs))
		for v := range s.strs {
			vals = append(vals, v)
		}
		sort.Strings(vals)
		if s.enumWorthy(name, vals) {
			l := make([]any, len(vals))
			for i, v := range vals {
				l[i] = v
			}
			o.Set("enum", l)
		} else if f := formatOf(vals); f != "" {
			o.Set("format", f)
		} else if p := patternOf(vals); p != "" && s.n >= 3 {
			o.Set("pattern", p)
		}
	}
	return o
}

func remove(xs []string, x string) []string {
	out := xs[:0]
	for _, e := range xs {
		if e != x {
			out = append(out, e)
		}
	}
	return out
}

var (
	reDate     = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
	reDateTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$`)
	reEmail    = regexp.MustCompile(`^[^@\s]+@[^@\s]+\.[^@\s]+$`)
)

func formatOf(vals []string) string {
	if len(vals) == 0 {
		return ""
	}
	all := func(re *regexp.Regexp) bool {
		for _, v := range vals {
			if !re.MatchString(v) {
				return false
			}
		}
		return true
	}
	switch {
	case all(reDate):
		return "date"
	case all(reDateTime):
		return "date-time"
	case all(reEmail):
		return "email"
	}
	return ""
}

// idLike reports whether strings look like identifiers: no spaces, and digits or separators in them.
func idLike(vals []string) bool {
	if len(vals) == 0 {
		return false
	}
	for _, v := range vals {
		if v == "" || len(v) > 64 || strings.ContainsAny(v, " \t\n") || !strings.ContainsAny(v, "0123456789_#-") {
			return false
		}
	}
	return true
}

func charClass(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return '9'
	case c >= 'A' && c <= 'Z':
		return 'A'
	case c >= 'a' && c <= 'z':
		return 'a'
	}
	return c
}

// patternOf infers an id pattern shared by every value ("#W" then 7 digits is ^#W\d{7}$).
func patternOf(vals []string) string {
	if !idLike(vals) {
		return ""
	}
	sameLen := true
	for _, v := range vals[1:] {
		if len(v) != len(vals[0]) {
			sameLen = false
			break
		}
	}
	classRe := map[byte]string{'9': `\d`, 'A': `[A-Z]`, 'a': `[a-z]`}
	var b strings.Builder
	b.WriteByte('^')
	if sameLen {
		n := len(vals[0])
		type tok struct {
			re  string
			cnt int
		}
		var toks []tok
		for i := 0; i < n; i++ {
			c := vals[0][i]
			lit := true
			cls := charClass(c)
			for _, v := range vals[1:] {
				if v[i] != c {
					lit = false
				}
				if charClass(v[i]) != cls {
					cls = 0
				}
			}
			var re string
			switch {
			case lit && cls != '9':
				re = regexp.QuoteMeta(string(c))
			case cls == '9' || cls == 'A' || cls == 'a':
				re = classRe[cls]
			default:
				re = `[A-Za-z0-9]`
			}
			if len(toks) > 0 && toks[len(toks)-1].re == re && (re == `\d` || strings.HasPrefix(re, "[")) {
				toks[len(toks)-1].cnt++
			} else {
				toks = append(toks, tok{re, 1})
			}
		}
		for _, t := range toks {
			b.WriteString(t.re)
			if t.cnt > 1 {
				b.WriteString("{" + itoa(t.cnt) + "}")
			}
		}
		b.WriteByte('$')
		return b.String()
	}
	collapse := func(v string) string {
		var out []byte
		for i := 0; i < len(v); i++ {
			c := charClass(v[i])
			if len(out) > 0 && out[len(out)-1] == c && (c == '9' || c == 'A' || c == 'a') {
				continue
			}
			out = append(out, c)
		}
		return string(out)
	}
	sh := collapse(vals[0])
	for _, v := range vals[1:] {
		if collapse(v) != sh {
			return ""
		}
	}
	for i := 0; i < len(sh); i++ {
		if re, ok := classRe[sh[i]]; ok {
			b.WriteString(re + "+")
		} else {
			b.WriteString(regexp.QuoteMeta(string(sh[i])))
		}
	}
	b.WriteByte('$')
	return b.String()
}

// keyShape is a key template for generated keys: digits become 9, letters that vary
// become A or a, constant letters and punctuation are kept.
func keyShape(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	ref := keys[0]
	sameLen := true
	for _, k := range keys[1:] {
		if len(k) != len(ref) {
			sameLen = false
			break
		}
	}
	b := []byte(ref)
	for i := range b {
		c := ref[i]
		cls := charClass(c)
		if cls == '9' {
			b[i] = '9'
			continue
		}
		constant := sameLen
		if sameLen {
			for _, k := range keys[1:] {
				if k[i] != c {
					constant = false
					break
				}
			}
		}
		if constant {
			// A constant letter (or backslash) would read as a class: escape it.
			if cls == 'A' || cls == 'a' || c == '\\' {
				b[i] = 0
			}
			continue
		}
		b[i] = cls
	}
	var out strings.Builder
	for i, c := range b {
		if c == 0 {
			out.WriteByte('\\')
			out.WriteByte(ref[i])
			continue
		}
		out.WriteByte(c)
	}
	return out.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

// schemaJSON renders a schema object compactly.
func schemaJSON(o *jsonvalue.Object) json.RawMessage {
	return json.RawMessage(twin.Render(o, twin.StyleCompact))
}
