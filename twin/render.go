package twin

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Style is how a backend spells JSON text: separators, string escapes and how it
// writes a float it computed. Recordings show it; the build picks the style that
// reproduces them.
type Style struct {
	Name string `json:"name"`
	// ItemSep and KeySep separate array/object items and keys from values: ", " and ": " for
	// Python's json.dumps, "," and ":" for JavaScript and Go.
	ItemSep string `json:"item_sep"`
	KeySep  string `json:"key_sep"`
	// ASCII escapes every non-ASCII character as \uXXXX (Python's ensure_ascii).
	ASCII bool `json:"ascii,omitempty"`
	// HTML escapes <, > and & as Go's encoding/json does.
	HTML bool `json:"html,omitempty"`
	// Floats is "python" (1200.0, 1e-05, 1e+16) or "js" (1200, 1e-7, 1e+21).
	Floats string `json:"floats"`
}

// The styles a build tries, most common first.
var (
	StylePython  = Style{Name: "python", ItemSep: ", ", KeySep: ": ", ASCII: true, Floats: "python"}
	StylePythonU = Style{Name: "python-unicode", ItemSep: ", ", KeySep: ": ", Floats: "python"}
	StyleCompact = Style{Name: "compact", ItemSep: ",", KeySep: ":", Floats: "js"}
	StyleGo      = Style{Name: "go", ItemSep: ",", KeySep: ":", HTML: true, Floats: "js"}
)

// Styles lists the known styles in the order a build tries them.
func Styles() []Style { return []Style{StylePython, StylePythonU, StyleCompact, StyleGo} }

// Render writes v as JSON text in style st.
func Render(v any, st Style) string {
	var b strings.Builder
	renderTo(&b, v, st)
	return b.String()
}

func renderTo(b *strings.Builder, v any, st Style) {
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
		writeStyledString(b, x, st)
	case jsonvalue.Number:
		b.WriteString(string(x))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(st.ItemSep)
			}
			renderTo(b, e, st)
		}
		b.WriteByte(']')
	case *jsonvalue.Object:
		b.WriteByte('{')
		for i, k := range x.Keys {
			if i > 0 {
				b.WriteString(st.ItemSep)
			}
			writeStyledString(b, k, st)
			b.WriteString(st.KeySep)
			renderTo(b, x.Vals[i], st)
		}
		b.WriteByte('}')
	default:
		writeStyledString(b, "", st)
	}
}

func writeStyledString(b *strings.Builder, s string, st Style) {
	const hex = "0123456789abcdef"
	u4 := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[(r>>12)&15])
		b.WriteByte(hex[(r>>8)&15])
		b.WriteByte(hex[(r>>4)&15])
		b.WriteByte(hex[r&15])
	}
	b.WriteByte('"')
	for i := 0; i < len(s); {
		if j := plainRun(s, i, st); j > i { // bytes written as they are, at once
			b.WriteString(s[i:j])
			i = j
			if i == len(s) {
				break
			}
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"':
				b.WriteString(`\"`)
			case c == '\\':
				b.WriteString(`\\`)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c == '\b':
				b.WriteString(`\b`)
			case c == '\f':
				b.WriteString(`\f`)
			case c < 0x20 || (c == 0x7f && st.ASCII):
				u4(rune(c))
			case st.HTML && (c == '<' || c == '>' || c == '&'):
				u4(rune(c))
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case st.ASCII:
			if r >= 0x10000 {
				r -= 0x10000
				u4(0xD800 + (r>>10)&0x3FF)
				u4(0xDC00 + r&0x3FF)
			} else {
				u4(r)
			}
		case st.HTML && (r == '\u2028' || r == '\u2029'):
			u4(r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}

// plainRun is the end of the run of ASCII bytes from s[i] that style st writes unescaped.
func plainRun(s string, i int, st Style) int {
	for ; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || (st.HTML && (c == '<' || c == '>' || c == '&')) {
			return i
		}
	}
	return i
}

// FormatFloat spells a computed float the way the style's language prints it.
func (st Style) FormatFloat(f float64) string {
	if st.Floats == "js" {
		return JSFloat(f)
	}
	return PyFloat(f)
}

// PyFloat is Python's repr of a float (as json.dumps writes it): shortest
// round-trip digits, a ".0" on integral values, exponent form below 1e-4 and
// from 1e16.
func PyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	neg, digits, decpt := shortestDigits(f)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if decpt > 16 || decpt < -3 {
		b.WriteByte(digits[0])
		if len(digits) > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		writeExp(&b, decpt-1, 2)
		return b.String()
	}
	writeFixed(&b, digits, decpt, true)
	return b.String()
}

// JSFloat is JavaScript's Number.prototype.toString for a float: no ".0" on
// integral values, exponent form below 1e-6 and from 1e21.
func JSFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	neg, digits, decpt := shortestDigits(f)
	var b strings.Builder
	if neg && f != 0 {
		b.WriteByte('-')
	}
	if decpt > 21 || decpt < -5 {
		b.WriteByte(digits[0])
		if len(digits) > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		writeExp(&b, decpt-1, 1)
		return b.String()
	}
	writeFixed(&b, digits, decpt, false)
	return b.String()
}

// shortestDigits answers the sign, the shortest round-trip decimal digits and the
// decimal point position: f = 0.d1d2d3... x 10^decpt.
func shortestDigits(f float64) (neg bool, digits string, decpt int) {
	s := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	e := strings.IndexByte(s, 'e')
	mant, exp := s[:e], s[e+1:]
	x, _ := strconv.Atoi(exp)
	digits = strings.Replace(mant, ".", "", 1)
	return neg, digits, x + 1
}

func writeExp(b *strings.Builder, e, minDigits int) {
	b.WriteByte('e')
	if e < 0 {
		b.WriteByte('-')
		e = -e
	} else {
		b.WriteByte('+')
	}
	s := strconv.Itoa(e)
	for i := len(s); i < minDigits; i++ {
		b.WriteByte('0')
	}
	b.WriteString(s)
}

func writeFixed(b *strings.Builder, digits string, decpt int, dotZero bool) {
	switch {
	case decpt <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -decpt))
		b.WriteString(digits)
	case decpt >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", decpt-len(digits)))
		if dotZero {
			b.WriteString(".0")
		}
	default:
		b.WriteString(digits[:decpt])
		b.WriteByte('.')
		b.WriteString(digits[decpt:])
	}
}

// PyRound is Python's round(f, n) for a float and n >= 0: the float nearest to
// the correctly rounded decimal (ties to even on the exact binary value).
func PyRound(f float64, n int) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) || n > 300 {
		return f
	}
	if n < 0 {
		p := math.Pow(10, float64(-n))
		return math.RoundToEven(f/p) * p
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', n, 64), 64)
	return r
}

// TextOf spells a scalar answer the way a backend's str() would; objects and arrays as JSON.
func TextOf(v any, st Style) string {
	switch x := v.(type) {
	case string:
		return x
	case jsonvalue.Number:
		return string(x)
	case nil:
		if st.Floats == "python" {
			return "None"
		}
		return "null"
	case bool:
		if st.Floats == "python" {
			if x {
				return "True"
			}
			return "False"
		}
	}
	return Render(v, st)
}

// AnswersAgree compares two tool answers the way the self-check does: JSON-equal
// where both parse as JSON, else text-equal.
func AnswersAgree(a, b string) bool {
	if a == b {
		return true
	}
	if jsonvalue.LooksJSON(a) && jsonvalue.LooksJSON(b) {
		va, err1 := jsonvalue.ParseString(a)
		vb, err2 := jsonvalue.ParseString(b)
		if err1 == nil && err2 == nil {
			return jsonvalue.Equal(va, vb)
		}
	}
	return false
}

// IsErrorAnswer reports whether a tool answer is the tool's own error, the way the
// build reads recordings: text that begins "Error", or a JSON object whose one key is
// "error" (or "Error").
func IsErrorAnswer(s string) bool {
	if isErrorText(s) {
		return true
	}
	if !jsonvalue.LooksJSON(s) {
		return false
	}
	v, err := jsonvalue.ParseString(s)
	if err != nil {
		return false
	}
	o, ok := v.(*jsonvalue.Object)
	return ok && o.Len() == 1 && (o.Keys[0] == "error" || o.Keys[0] == "Error")
}
