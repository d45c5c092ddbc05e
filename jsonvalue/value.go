// Package jsonvalue holds doppel's JSON values: an order-keeping parser, JSON equality, the one canonical encoding and JSON-Schema checks.
package jsonvalue

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A JSON value in a world, a recording or an argument set is one of:
// nil, bool, string, Number, []any or *Object. Objects keep their key order and
// numbers keep their spelling, because an agent sees text and production's text
// has both.

// Number is a JSON number kept as it was spelled ("1200.0" is not "1200").
type Number string

// IsFloat reports whether the number is spelled as a float (a '.', an exponent, or a non-finite name).
func (n Number) IsFloat() bool {
	return strings.ContainsAny(string(n), ".eEnN") // NaN, Infinity carry n/N
}

// Float64 is the number's value as a float64.
func (n Number) Float64() float64 {
	switch string(n) {
	case "NaN":
		return math.NaN()
	case "Infinity":
		return math.Inf(1)
	case "-Infinity":
		return math.Inf(-1)
	}
	f, _ := strconv.ParseFloat(string(n), 64)
	return f
}

// Object is a JSON object that keeps its key order. Objects of one shape may share their Keys
// slice (a build shares them across every recorded answer): change Keys only through Set and
// Delete (which copy before they write), never in place.
type Object struct {
	Keys []string
	Vals []any
}

// NewObject returns an empty object with room for n keys.
func NewObject(n int) *Object { return &Object{Keys: make([]string, 0, n), Vals: make([]any, 0, n)} }

// Len is the number of keys.
func (o *Object) Len() int { return len(o.Keys) }

// Index is the position of key k, or -1.
func (o *Object) Index(k string) int {
	for i, kk := range o.Keys {
		if kk == k {
			return i
		}
	}
	return -1
}

// Get answers the value at key k.
func (o *Object) Get(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	if i := o.Index(k); i >= 0 {
		return o.Vals[i], true
	}
	return nil, false
}

// Set replaces the value at k in place, or appends k at the end.
func (o *Object) Set(k string, v any) {
	if i := o.Index(k); i >= 0 {
		o.Vals[i] = v
		return
	}
	o.Keys = append(o.Keys, k)
	o.Vals = append(o.Vals, v)
}

// Delete removes key k, keeping the order of the others.
func (o *Object) Delete(k string) {
	if i := o.Index(k); i >= 0 {
		o.Keys = append(o.Keys[:i:i], o.Keys[i+1:]...)
		o.Vals = append(o.Vals[:i:i], o.Vals[i+1:]...)
	}
}

// Clone deep-copies a value.
func Clone(v any) any {
	switch x := v.(type) {
	case *Object:
		c := &Object{Keys: append([]string(nil), x.Keys...), Vals: make([]any, len(x.Vals))}
		for i, e := range x.Vals {
			c.Vals[i] = Clone(e)
		}
		return c
	case []any:
		c := make([]any, len(x))
		for i, e := range x {
			c[i] = Clone(e)
		}
		return c
	default:
		return v
	}
}

// ErrInvalid is wrapped by every parse error.
var ErrInvalid = errors.New("invalid JSON")

// Parse parses one JSON document, keeping key order and number spelling.
// It also accepts NaN, Infinity and -Infinity, which Python's json module writes.
func Parse(data []byte) (any, error) {
	p := parser{s: data}
	return p.document()
}

func (p *parser) document() (any, error) {
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("%w: trailing data at offset %d", ErrInvalid, p.i)
	}
	return v, nil
}

// ParseString is Parse over a string.
func ParseString(s string) (any, error) { return Parse([]byte(s)) }

// ParseStringShared is ParseString whose strings (keys and values without escapes) are slices of s,
// not copies: for a caller that keeps s anyway (a build holds every recorded answer's text beside its
// parsed value), so the parsed value costs no second copy of its text. A small piece kept alone keeps
// all of s alive.
func ParseStringShared(s string) (any, error) {
	p := parser{s: []byte(s), src: s, shared: true}
	return p.document()
}

// LooksJSON reports whether s could be a JSON document worth parsing (object, array, string, number, literal).
func LooksJSON(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" {
		return false
	}
	switch c := s[0]; {
	case c == '{' || c == '[' || c == '"' || c == '-' || (c >= '0' && c <= '9'):
		return true
	case s == "true" || s == "false" || s == "null" || s == "NaN" || s == "Infinity":
		return true
	}
	return false
}

type parser struct {
	s []byte
	i int
	// keys and vals are a stack of the members of the objects and arrays being read; each is copied
	// out at its closing bracket into slices of its exact length (appending in place would leave
	// up to half of every slice unused, and parsed values may be held by the hundred thousand).
	keys []string
	vals []any
	// src is s as a string when shared is set (ParseStringShared): strings are sliced from it.
	src    string
	shared bool
}

// MaxDepth bounds the nesting of arrays and objects Parse accepts.
const MaxDepth = 512

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) errf(format string, a ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalid, fmt.Sprintf(format, a...), p.i)
}

func (p *parser) lit(word string) bool {
	if bytes.HasPrefix(p.s[p.i:], []byte(word)) {
		p.i += len(word)
		return true
	}
	return false
}

func (p *parser) value(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, p.errf("nesting too deep")
	}
	if p.i >= len(p.s) {
		return nil, p.errf("unexpected end")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == 't':
		if p.lit("true") {
			return true, nil
		}
	case c == 'f':
		if p.lit("false") {
			return false, nil
		}
	case c == 'n':
		if p.lit("null") {
			return nil, nil
		}
	case c == 'N':
		if p.lit("NaN") {
			return Number("NaN"), nil
		}
	case c == 'I':
		if p.lit("Infinity") {
			return Number("Infinity"), nil
		}
	case c == '-' || (c >= '0' && c <= '9'):
		if c == '-' && p.lit("-Infinity") {
			return Number("-Infinity"), nil
		}
		return p.number()
	}
	return nil, p.errf("unexpected character %q", p.s[p.i])
}

// bigObject is the size from which the parser indexes an object's keys.
const bigObject = 32

func (p *parser) object(depth int) (any, error) {
	p.i++ // {
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return NewObject(0), nil
	}
	mark := len(p.keys)
	var index map[string]int // key → position, once the object has bigObject keys
	for {
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, p.errf("expected object key")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, p.errf("expected ':'")
		}
		p.i++
		p.ws()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		// A repeated key keeps its first position and its last value, as Python's json does.
		// Large objects (maps keyed by ids) look their keys up in a map, not by a scan per key.
		if n := len(p.keys) - mark; index == nil && n >= bigObject {
			index = make(map[string]int, 2*n)
			for i, key := range p.keys[mark:] {
				index[key] = i
			}
		}
		i := -1
		if index != nil {
			if j, ok := index[k.(string)]; ok {
				i = j
			}
		} else {
			i = slices.Index(p.keys[mark:], k.(string))
		}
		if i >= 0 {
			p.vals[mark+i] = v
		} else {
			if index != nil {
				index[k.(string)] = len(p.keys) - mark
			}
			p.keys = append(p.keys, k.(string))
			p.vals = append(p.vals, v)
		}
		p.ws()
		if p.i >= len(p.s) {
			return nil, p.errf("unterminated object")
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] == '}' {
			p.i++
			o := &Object{Keys: slices.Clone(p.keys[mark:]), Vals: slices.Clone(p.vals[mark:])}
			p.pop(mark)
			return o, nil
		}
		return nil, p.errf("expected ',' or '}'")
	}
}

// pop drops the stacked members from mark on.
func (p *parser) pop(mark int) {
	clear(p.keys[mark:])
	clear(p.vals[mark:])
	p.keys, p.vals = p.keys[:mark], p.vals[:mark]
}

func (p *parser) array(depth int) (any, error) {
	p.i++ // [
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return []any{}, nil
	}
	mark := len(p.vals)
	for {
		p.ws()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		p.vals = append(p.vals, v)
		p.keys = append(p.keys, "") // the stacks stay level, so an object's members start at one mark in both
		p.ws()
		if p.i >= len(p.s) {
			return nil, p.errf("unterminated array")
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] == ']' {
			p.i++
			a := slices.Clone(p.vals[mark:])
			p.pop(mark)
			return a, nil
		}
		return nil, p.errf("expected ',' or ']'")
	}
}

func (p *parser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.i < len(p.s) && p.s[p.i] == '0' {
		p.i++
	} else if digits() == 0 {
		return nil, p.errf("bad number")
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return nil, p.errf("bad fraction")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.errf("bad exponent")
		}
	}
	if p.shared {
		return Number(p.src[start:p.i]), nil
	}
	return Number(p.s[start:p.i]), nil
}

func (p *parser) str() (any, error) {
	p.i++ // opening quote
	start := p.i
	// Fast path: no escapes, valid UTF-8.
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '"' {
			s := p.s[start:p.i]
			p.i++
			if utf8.Valid(s) {
				if p.shared {
					return p.src[start : p.i-1], nil
				}
				return string(s), nil
			}
			return strings.ToValidUTF8(string(s), "\uFFFD"), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		p.i++
	}
	var b strings.Builder
	b.Write(p.s[start:p.i])
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			s := b.String()
			if !utf8.ValidString(s) {
				s = strings.ToValidUTF8(s, "\uFFFD")
			}
			return s, nil
		case c < 0x20:
			return nil, p.errf("control character in string")
		case c == '\\':
			p.i++
			if p.i >= len(p.s) {
				return nil, p.errf("unterminated escape")
			}
			e := p.s[p.i]
			p.i++
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return nil, p.errf("bad \\u escape")
				}
				if utf16.IsSurrogate(r) {
					if p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						r2, ok := p.hex4()
						if ok {
							if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
								b.WriteRune(d)
								continue
							}
						}
						p.i = save
					}
					r = utf8.RuneError
				}
				b.WriteRune(r)
			default:
				return nil, p.errf("bad escape")
			}
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	return nil, p.errf("unterminated string")
}

func (p *parser) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range p.s[p.i : p.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// Equal is JSON equality, as Python's json.loads(a) == json.loads(b) sees it:
// object key order does not matter and numbers compare by value.
func Equal(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case Number:
		y, ok := b.(Number)
		return ok && numEqual(x, y)
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case *Object:
		y, ok := b.(*Object)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for i, k := range x.Keys {
			w, ok := y.Get(k)
			if !ok || !Equal(x.Vals[i], w) {
				return false
			}
		}
		return true
	}
	return false
}

// Identical is Equal that also requires the same key order and the same number spelling.
func Identical(a, b any) bool {
	switch x := a.(type) {
	case Number:
		y, ok := b.(Number)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !Identical(x[i], y[i]) {
				return false
			}
		}
		return true
	case *Object:
		y, ok := b.(*Object)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for i, k := range x.Keys {
			if y.Keys[i] != k || !Identical(x.Vals[i], y.Vals[i]) {
				return false
			}
		}
		return true
	}
	return Equal(a, b)
}

func numEqual(a, b Number) bool {
	if a == b {
		return true
	}
	if !a.IsFloat() && !b.IsFloat() {
		var x, y big.Int
		_, ok1 := x.SetString(string(a), 10)
		_, ok2 := y.SetString(string(b), 10)
		if ok1 && ok2 {
			return x.Cmp(&y) == 0
		}
	}
	return a.Float64() == b.Float64()
}
