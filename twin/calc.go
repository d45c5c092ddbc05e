package twin

// Calc, the arithmetic handlers call through calc(): a small recursive-descent evaluator with Python's number
// semantics.

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// calcMaxBits bounds the integers calc makes (about 19,700 decimal digits): a product or power past it is refused
// rather than computed, so an expression cannot make a value of any size in one call.
const calcMaxBits = 1 << 16

// errCalcTooLarge refuses an integer result past calcMaxBits.
var errCalcTooLarge = fmt.Errorf("integer result over %d bits", calcMaxBits)

// bitLen is an int's magnitude in bits (0 for anything else).
func bitLen(v starlark.Value) int64 {
	i, ok := v.(starlark.Int)
	if !ok {
		return 0
	}
	if x, small := i.Int64(); small {
		if x < 0 {
			x = -x
		}
		return int64(bits.Len64(uint64(x)))
	}
	return int64(i.BigInt().BitLen())
}

// Calc evaluates an arithmetic expression with Python's semantics: integers stay
// exact until a '/' or a float makes the value a float. Integers past calcMaxBits are refused.
func Calc(expr string) (starlark.Value, error) {
	c := calcParser{s: expr}
	v, err := c.sum()
	if err != nil {
		return nil, err
	}
	c.ws()
	if c.i != len(c.s) {
		return nil, fmt.Errorf("unexpected %q in expression", c.s[c.i:])
	}
	return v, nil
}

type calcParser struct {
	s     string
	i     int
	depth int
}

func (c *calcParser) ws() {
	for c.i < len(c.s) && (c.s[c.i] == ' ' || c.s[c.i] == '\t') {
		c.i++
	}
}

func (c *calcParser) sum() (starlark.Value, error) {
	l, err := c.term()
	if err != nil {
		return nil, err
	}
	for {
		c.ws()
		if c.i >= len(c.s) || (c.s[c.i] != '+' && c.s[c.i] != '-') {
			return l, nil
		}
		op := syntax.PLUS
		if c.s[c.i] == '-' {
			op = syntax.MINUS
		}
		c.i++
		r, err := c.term()
		if err != nil {
			return nil, err
		}
		if l, err = starlark.Binary(op, l, r); err != nil {
			return nil, err
		}
	}
}

func (c *calcParser) term() (starlark.Value, error) {
	l, err := c.unary()
	if err != nil {
		return nil, err
	}
	for {
		c.ws()
		var op syntax.Token
		switch {
		case strings.HasPrefix(c.s[c.i:], "//"):
			op = syntax.SLASHSLASH
			c.i += 2
		case strings.HasPrefix(c.s[c.i:], "**"):
			return l, nil
		case c.i < len(c.s) && c.s[c.i] == '*':
			op = syntax.STAR
			c.i++
		case c.i < len(c.s) && c.s[c.i] == '/':
			op = syntax.SLASH
			c.i++
		case c.i < len(c.s) && c.s[c.i] == '%':
			op = syntax.PERCENT
			c.i++
		default:
			return l, nil
		}
		r, err := c.unary()
		if err != nil {
			return nil, err
		}
		if op == syntax.STAR && bitLen(l)+bitLen(r) > calcMaxBits {
			return nil, errCalcTooLarge
		}
		if l, err = starlark.Binary(op, l, r); err != nil {
			if strings.Contains(err.Error(), "division by zero") {
				return nil, errors.New("division by zero")
			}
			return nil, err
		}
	}
}

func (c *calcParser) unary() (starlark.Value, error) {
	c.ws()
	if c.i < len(c.s) && (c.s[c.i] == '-' || c.s[c.i] == '+') {
		neg := c.s[c.i] == '-'
		c.i++
		v, err := c.unary()
		if err != nil || !neg {
			return v, err
		}
		return starlark.Unary(syntax.MINUS, v)
	}
	return c.power()
}

func (c *calcParser) power() (starlark.Value, error) {
	base, err := c.atom()
	if err != nil {
		return nil, err
	}
	c.ws()
	if strings.HasPrefix(c.s[c.i:], "**") {
		c.i += 2
		exp, err := c.unary()
		if err != nil {
			return nil, err
		}
		bf, ok1 := starlark.AsFloat(base)
		ef, ok2 := starlark.AsFloat(exp)
		if !ok1 || !ok2 {
			return nil, errors.New("bad power")
		}
		bi, bInt := base.(starlark.Int)
		ei, eInt := exp.(starlark.Int)
		if bInt && eInt {
			if e64, ok := ei.Int64(); ok && e64 >= 0 && e64 <= 1024 {
				if bitLen(base)*e64 > calcMaxBits && bi.BigInt().CmpAbs(big.NewInt(1)) > 0 {
					return nil, errCalcTooLarge
				}
				return starlark.MakeBigInt(new(big.Int).Exp(bi.BigInt(), big.NewInt(e64), nil)), nil
			}
		}
		return starlark.Float(math.Pow(bf, ef)), nil
	}
	return base, nil
}

func (c *calcParser) atom() (starlark.Value, error) {
	c.ws()
	if c.i >= len(c.s) {
		return nil, errors.New("unexpected end of expression")
	}
	if c.s[c.i] == '(' {
		c.depth++
		if c.depth > 64 {
			return nil, errors.New("expression nested too deeply")
		}
		c.i++
		v, err := c.sum()
		if err != nil {
			return nil, err
		}
		c.ws()
		if c.i >= len(c.s) || c.s[c.i] != ')' {
			return nil, errors.New("missing ')'")
		}
		c.i++
		c.depth--
		return v, nil
	}
	start := c.i
	for c.i < len(c.s) && (c.s[c.i] >= '0' && c.s[c.i] <= '9' || c.s[c.i] == '.' || c.s[c.i] == '_') {
		c.i++
	}
	// An exponent part: 1e5, 2.5E-3.
	if c.i < len(c.s) && c.i > start && (c.s[c.i] == 'e' || c.s[c.i] == 'E') {
		j := c.i + 1
		if j < len(c.s) && (c.s[j] == '+' || c.s[j] == '-') {
			j++
		}
		if j < len(c.s) && c.s[j] >= '0' && c.s[j] <= '9' {
			c.i = j
			for c.i < len(c.s) && c.s[c.i] >= '0' && c.s[c.i] <= '9' {
				c.i++
			}
		}
	}
	lit := strings.ReplaceAll(c.s[start:c.i], "_", "")
	if lit == "" {
		return nil, fmt.Errorf("unexpected %q in expression", c.s[c.i:c.i+1])
	}
	if !strings.ContainsAny(lit, ".eE") {
		var z big.Int
		if _, ok := z.SetString(lit, 10); ok {
			return starlark.MakeBigInt(&z), nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return nil, fmt.Errorf("bad number %q", lit)
	}
	return starlark.Float(f), nil
}
