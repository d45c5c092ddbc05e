package ingest

// The parser's JSON lexing: whitespace, keys and elements, strings (escapes, surrogates, invalid UTF-8), numbers,
// literals and skipping values, each failure recorded at its byte offset and JSON path.

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// syntax records a syntax error at byte offset at and stops decoding.
func (p *parser) syntax(at int, msg string) error {
	if !p.stopped {
		p.errs = append(p.errs, FieldError{Path: p.pathString(), Message: fmt.Sprintf("invalid JSON at byte %d: %s", at, msg)})
		p.stopped = true
	}
	return errStop
}

func (p *parser) ws() {
	for p.pos < len(p.buf) {
		switch p.buf[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// kind names the JSON type of the value starting with c, or "" when c cannot start a value.
func kind(c byte) string {
	switch {
	case c == '"':
		return "string"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == 't' || c == 'f':
		return "boolean"
	case c == 'n':
		return "null"
	case c == '-' || c >= '0' && c <= '9':
		return "number"
	}
	return ""
}

// peek skips white space and returns the next byte; at the end of the body it records a syntax error.
func (p *parser) peek() (byte, error) {
	p.ws()
	if p.pos >= len(p.buf) {
		return 0, p.syntax(p.pos, "unexpected end of body")
	}
	return p.buf[p.pos], nil
}

// wrongType reports that the value at the current path is not of the wanted type, and skips it.
func (p *parser) wrongType(want string) error {
	c, err := p.peek()
	if err != nil {
		return err
	}
	k := kind(c)
	if k == "" {
		return p.syntax(p.pos, fmt.Sprintf("invalid character %s looking for a value", quoteByte(c)))
	}
	if err := p.skip(0); err != nil {
		return err
	}
	p.fail(fmt.Sprintf("must be %s, got %s", want, k))
	return nil
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("0x%02x", c)
}

// nextKey reads the next field name of an object whose '{' is consumed, and the ':' after it.
// It answers end=true after the closing '}'. The key may point into a scratch buffer.
func (p *parser) nextKey(first *bool) (key []byte, end bool, err error) {
	c, err := p.peek()
	if err != nil {
		return nil, false, err
	}
	if c == '}' {
		p.pos++
		return nil, true, nil
	}
	if *first {
		*first = false
	} else {
		if c != ',' {
			return nil, false, p.syntax(p.pos, fmt.Sprintf("invalid character %s after an object field, expecting ',' or '}'", quoteByte(c)))
		}
		p.pos++
		if c, err = p.peek(); err != nil {
			return nil, false, err
		}
	}
	if c != '"' {
		return nil, false, p.syntax(p.pos, fmt.Sprintf("invalid character %s looking for a field name", quoteByte(c)))
	}
	if key, err = p.rawString(); err != nil {
		return nil, false, err
	}
	if c, err = p.peek(); err != nil {
		return nil, false, err
	}
	if c != ':' {
		return nil, false, p.syntax(p.pos, fmt.Sprintf("invalid character %s after a field name, expecting ':'", quoteByte(c)))
	}
	p.pos++
	return key, false, nil
}

// nextElem moves to the next element of an array whose '[' is consumed; end=true after the closing ']'.
func (p *parser) nextElem(first *bool) (end bool, err error) {
	c, err := p.peek()
	if err != nil {
		return false, err
	}
	if c == ']' {
		p.pos++
		return true, nil
	}
	if *first {
		*first = false
		return false, nil
	}
	if c != ',' {
		return false, p.syntax(p.pos, fmt.Sprintf("invalid character %s after an array element, expecting ',' or ']'", quoteByte(c)))
	}
	p.pos++
	_, err = p.peek()
	return false, err
}

// rawString reads the string at p.pos (which holds '"') and returns its unescaped bytes: a view of the
// body when the string has no escapes, else the scratch buffer, valid until the next rawString.
func (p *parser) rawString() ([]byte, error) {
	start := p.pos + 1
	buf := p.buf
	i := start
	for {
		i = nextSpecial(buf, i)
		if i >= len(buf) {
			return nil, p.syntax(len(buf), "unexpected end of body in a string")
		}
		switch c := buf[i]; {
		case c == '"':
			p.pos = i + 1
			return buf[start:i], nil
		case c >= 0x80:
			n := validRune(buf, i)
			if n == 0 {
				return nil, p.syntax(i, "invalid UTF-8 in a string")
			}
			i += n
		default:
			return p.stringSlow(start, i)
		}
	}
}

// skipString reads the string at p.pos (which holds '"') as rawString does, with the same errors, but only
// checks it: nothing is unescaped or copied.
func (p *parser) skipString() error {
	buf := p.buf
	i := p.pos + 1
	for {
		i = nextSpecial(buf, i)
		if i >= len(buf) {
			return p.syntax(len(buf), "unexpected end of body in a string")
		}
		switch c := buf[i]; {
		case c == '"':
			p.pos = i + 1
			return nil
		case c == '\\':
			if i+1 >= len(buf) {
				return p.syntax(len(buf), "unexpected end of body in a string")
			}
			switch e := buf[i+1]; e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := hex4(buf[i+2:]); !ok {
					return p.syntax(i, `invalid \u escape in a string`)
				}
				i += 6 // a surrogate is checked no further: alone or paired, it reads as a rune
			default:
				return p.syntax(i, fmt.Sprintf("invalid escape %s in a string", quoteByte(e)))
			}
		case c < 0x20:
			return p.syntax(i, "control character in a string (it must be escaped)")
		default:
			n := validRune(buf, i)
			if n == 0 {
				return p.syntax(i, "invalid UTF-8 in a string")
			}
			i += n
		}
	}
}

// stringSlow goes on from rawString at buf[i], a backslash or a control character, unescaping into scratch.
func (p *parser) stringSlow(start, i int) ([]byte, error) {
	buf := p.buf
	out := append(p.scratch[:0], buf[start:i]...)
	defer func() { p.scratch = out[:0] }()
	for {
		j := nextSpecial(buf, i)
		out = append(out, buf[i:j]...)
		i = j
		if i >= len(buf) {
			return nil, p.syntax(len(buf), "unexpected end of body in a string")
		}
		c := buf[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return out, nil
		case c == '\\':
			if i+1 >= len(buf) {
				return nil, p.syntax(len(buf), "unexpected end of body in a string")
			}
			e := buf[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(buf[i:])
				if !ok {
					return nil, p.syntax(i-2, `invalid \u escape in a string`)
				}
				i += 4
				if utf16.IsSurrogate(r) {
					// A valid pair is consumed whole; anything else becomes U+FFFD, as encoding/json does.
					r2 := rune(-1)
					if i+1 < len(buf) && buf[i] == '\\' && buf[i+1] == 'u' {
						if v, ok := hex4(buf[i+2:]); ok {
							r2 = v
						}
					}
					if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
						r = d
						i += 6
					} else {
						r = unicode.ReplacementChar
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return nil, p.syntax(i-2, fmt.Sprintf("invalid escape %s in a string", quoteByte(e)))
			}
		case c < 0x20:
			return nil, p.syntax(i, "control character in a string (it must be escaped)")
		default:
			n := validRune(buf, i)
			if n == 0 {
				return nil, p.syntax(i, "invalid UTF-8 in a string")
			}
			out = append(out, buf[i:i+n]...)
			i += n
		}
	}
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r*16 + rune(c)
	}
	return r, true
}

// skip reads and checks one JSON value of any type.
func (p *parser) skip(depth int) error {
	c, err := p.peek()
	if err != nil {
		return err
	}
	switch c {
	case '{', '[':
		if depth >= maxDepth {
			return p.syntax(p.pos, fmt.Sprintf("nested deeper than %d levels", maxDepth))
		}
		p.pos++
		first := true
		for {
			var end bool
			if c == '{' {
				_, end, err = p.nextKey(&first)
			} else {
				end, err = p.nextElem(&first)
			}
			if err != nil {
				return err
			}
			if end {
				return nil
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
		}
	case '"':
		return p.skipString()
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	}
	if c == '-' || c >= '0' && c <= '9' {
		return p.number()
	}
	return p.syntax(p.pos, fmt.Sprintf("invalid character %s looking for a value", quoteByte(c)))
}

func (p *parser) literal(lit string) error {
	if !bytes.HasPrefix(p.buf[p.pos:], []byte(lit)) {
		return p.syntax(p.pos, fmt.Sprintf("invalid literal, expecting %s", lit))
	}
	p.pos += len(lit)
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) number() error {
	b, i := p.buf, p.pos
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return p.syntax(i, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return p.syntax(i, "invalid number: digits expected after '.'")
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return p.syntax(i, "invalid number: digits expected in the exponent")
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	p.pos = i
	return nil
}

// jsonError answers "" when b is exactly one JSON value (white space around it allowed), else why not.
func jsonError(b []byte) string {
	q := parser{buf: b, opts: Options{MaxErrors: 1}}
	err := q.skip(0)
	if err == nil {
		q.ws()
		if q.pos < len(b) {
			return fmt.Sprintf("invalid JSON at byte %d: unexpected data after the value", q.pos)
		}
		return ""
	}
	return q.errs[0].Message
}

// str reads a string value. A wrong type is reported at the current path and answered with ok=false;
// null answers ok=false, null=true and is reported only when nullOK is false.
func (p *parser) str(nullOK bool) (s string, ok, null bool, err error) {
	b, ok, null, err := p.strBytes(nullOK, true)
	if ok {
		s = p.share(b)
	}
	return s, ok, null, err
}

// strBytes is str answering the string's bytes as rawString does (valid until the next read), not a copy; unless
// keep, it only checks the string (skipString) and answers no bytes.
func (p *parser) strBytes(nullOK, keep bool) (b []byte, ok, null bool, err error) {
	c, err := p.peek()
	if err != nil {
		return nil, false, false, err
	}
	switch c {
	case '"':
		if !keep {
			return nil, true, false, p.skipString()
		}
		b, err := p.rawString()
		if err != nil {
			return nil, false, false, err
		}
		return b, true, false, nil
	case 'n':
		if err := p.literal("null"); err != nil {
			return nil, false, false, err
		}
		if !nullOK {
			p.fail("must be a string, got null")
		}
		return nil, false, true, nil
	}
	return nil, false, false, p.wrongType("a string")
}

// open consumes the '[' or '{' wanted; any other type is reported (null too unless nullOK) and skipped.
func (p *parser) open(want byte, nullOK bool) (ok, null bool, err error) {
	c, err := p.peek()
	if err != nil {
		return false, false, err
	}
	if c == want {
		p.pos++
		return true, false, nil
	}
	what := "an object"
	if want == '[' {
		what = "an array"
	}
	if c == 'n' {
		if err := p.literal("null"); err != nil {
			return false, false, err
		}
		if !nullOK {
			p.fail("must be " + what + ", got null")
		}
		return false, true, nil
	}
	return false, false, p.wrongType(what)
}
