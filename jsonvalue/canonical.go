package jsonvalue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"sync"
)

// Canonical is the canonical JSON of v: object keys sorted, no insignificant
// whitespace, minimal string escapes, canonical numbers. Equal worlds have equal
// canonical bytes on any machine. It is doppel's one canonical writer: world and
// state hashes, bundle hashes and recording keys are all made of its bytes.
//
// v is a value from Parse (Number, *Object) or from Decode or encoding/json
// (json.Number, float64, map[string]any); both forms of the same JSON give the
// same bytes.
func Canonical(v any) []byte {
	var out []byte
	WithCanonical(v, func(b []byte) { out = bytes.Clone(b) })
	return out
}

// CanonicalText is string(Canonical(v)), in one allocation of its exact size.
func CanonicalText(v any) string {
	var out string
	WithCanonical(v, func(b []byte) { out = string(b) })
	return out
}

// WithCanonical calls f with the canonical JSON of v, in memory that f must not keep (it serves later
// calls): for hashing without an allocation.
func WithCanonical(v any, f func([]byte)) {
	b := scratch.Get().(*bytes.Buffer)
	writeCanonical(b, v)
	f(b.Bytes())
	if b.Cap() <= maxScratch {
		b.Reset()
		scratch.Put(b)
	}
}

// scratch holds the buffers Canonical writes in before copying out what it made: a large build makes
// millions of canonical forms, and a buffer grown from empty for each would allocate about twice each one.
var scratch = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxScratch is the largest buffer the pool keeps, so one huge value does not pin its memory.
const maxScratch = 1 << 20

// CanonicalString is string(Canonical(s)) for a string s, in one allocation when s needs no escape.
func CanonicalString(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return string(Canonical(s))
		}
	}
	return `"` + s + `"`
}

// CanonicalDoc is the canonical JSON of one JSON document (read with Decode, so
// trailing data and non-JSON such as NaN are errors).
func CanonicalDoc(doc []byte) ([]byte, error) {
	v, err := Decode(doc)
	if err != nil {
		return nil, err
	}
	return Canonical(v), nil
}

// AppendCanonical appends the canonical JSON of v to b.
func AppendCanonical(b *bytes.Buffer, v any) { writeCanonical(b, v) }

// AppendString appends the canonical JSON of the string s to b, as AppendCanonical writes it.
func AppendString(b *bytes.Buffer, s string) { writeMinimalString(b, s) }

func writeCanonical(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		writeMinimalString(b, x)
	case Number:
		b.WriteString(CanonicalNumber(x))
	case json.Number:
		b.WriteString(CanonicalNumber(Number(x)))
	case float64:
		b.WriteString(CanonicalNumber(floatNumber(x)))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, e)
		}
		b.WriteByte(']')
	case *Object:
		idx := make([]int, len(x.Keys))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(i, j int) bool { return x.Keys[idx[i]] < x.Keys[idx[j]] })
		b.WriteByte('{')
		for n, i := range idx {
			if n > 0 {
				b.WriteByte(',')
			}
			writeMinimalString(b, x.Keys[i])
			b.WriteByte(':')
			writeCanonical(b, x.Vals[i])
		}
		b.WriteByte('}')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for n, k := range keys {
			if n > 0 {
				b.WriteByte(',')
			}
			writeMinimalString(b, k)
			b.WriteByte(':')
			writeCanonical(b, x[k])
		}
		b.WriteByte('}')
	default:
		// Go values that are not part of the model are written through their fmt form, quoted, so a
		// hash never panics; the model's constructors never produce them.
		writeMinimalString(b, fmt.Sprint(x))
	}
}

// CanonicalNumber spells a number by its value: integers in plain decimal (so 2, 2.0 and 2e0
// agree, as JSON equality says they do), other finite numbers in Go's shortest round-trip form.
func CanonicalNumber(n Number) string {
	s := string(n)
	if !n.IsFloat() {
		var z big.Int
		if _, ok := z.SetString(s, 10); ok {
			return z.String()
		}
		return s
	}
	f := n.Float64()
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return s
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// floatNumber spells f as a Number: Go's shortest round-trip form, or Python's name for a non-finite value.
func floatNumber(f float64) Number {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return Number(strconv.FormatFloat(f, 'g', -1, 64))
}

func writeMinimalString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	start := 0 // the bytes from start on are not written yet; runs that need no escape go in one write
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.WriteString(s[start:i])
		start = i + 1
		if c < 0x20 {
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		} else {
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}
