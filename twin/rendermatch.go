package twin

import (
	"strings"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// RendersAs reports whether Render(v, st) == text without building the rendering: it walks v
// against text and stops at the first byte that differs (a build tries every style on every
// recorded answer, and most styles differ within a few bytes). It mirrors renderTo and
// writeStyledString; TestRendersAsMatchesRender holds the two together.
func RendersAs(v any, st Style, text string) bool {
	m := matcher{s: text}
	return m.value(v, st) && m.i == len(m.s)
}

type matcher struct {
	s string
	i int
}

func (m *matcher) lit(x string) bool {
	if strings.HasPrefix(m.s[m.i:], x) {
		m.i += len(x)
		return true
	}
	return false
}

func (m *matcher) char(c byte) bool {
	if m.i < len(m.s) && m.s[m.i] == c {
		m.i++
		return true
	}
	return false
}

func (m *matcher) value(v any, st Style) bool {
	switch x := v.(type) {
	case nil:
		return m.lit("null")
	case bool:
		if x {
			return m.lit("true")
		}
		return m.lit("false")
	case string:
		return m.str(x, st)
	case jsonvalue.Number:
		return m.lit(string(x))
	case []any:
		if !m.char('[') {
			return false
		}
		for i, e := range x {
			if (i > 0 && !m.lit(st.ItemSep)) || !m.value(e, st) {
				return false
			}
		}
		return m.char(']')
	case *jsonvalue.Object:
		if !m.char('{') {
			return false
		}
		for i, k := range x.Keys {
			if (i > 0 && !m.lit(st.ItemSep)) || !m.str(k, st) || !m.lit(st.KeySep) || !m.value(x.Vals[i], st) {
				return false
			}
		}
		return m.char('}')
	default:
		return m.str("", st)
	}
}

func (m *matcher) u4(r rune) bool {
	const hex = "0123456789abcdef"
	if m.i+6 > len(m.s) || m.s[m.i] != '\\' || m.s[m.i+1] != 'u' ||
		m.s[m.i+2] != hex[(r>>12)&15] || m.s[m.i+3] != hex[(r>>8)&15] || m.s[m.i+4] != hex[(r>>4)&15] || m.s[m.i+5] != hex[r&15] {
		return false
	}
	m.i += 6
	return true
}

func (m *matcher) str(s string, st Style) bool {
	if !m.char('"') {
		return false
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			ok := true
			switch {
			case c == '"':
				ok = m.lit(`\"`)
			case c == '\\':
				ok = m.lit(`\\`)
			case c == '\n':
				ok = m.lit(`\n`)
			case c == '\r':
				ok = m.lit(`\r`)
			case c == '\t':
				ok = m.lit(`\t`)
			case c == '\b':
				ok = m.lit(`\b`)
			case c == '\f':
				ok = m.lit(`\f`)
			case c < 0x20 || (c == 0x7f && st.ASCII):
				ok = m.u4(rune(c))
			case st.HTML && (c == '<' || c == '>' || c == '&'):
				ok = m.u4(rune(c))
			default:
				ok = m.char(c)
			}
			if !ok {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		ok := true
		switch {
		case st.ASCII:
			if r >= 0x10000 {
				r -= 0x10000
				ok = m.u4(0xD800+(r>>10)&0x3FF) && m.u4(0xDC00+r&0x3FF)
			} else {
				ok = m.u4(r)
			}
		case st.HTML && (r == '\u2028' || r == '\u2029'):
			ok = m.u4(r)
		default:
			ok = m.lit(s[i : i+size])
		}
		if !ok {
			return false
		}
		i += size
	}
	return m.char('"')
}
