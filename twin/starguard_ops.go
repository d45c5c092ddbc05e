package twin

import (
	"errors"
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// The guards of operators, slices and argument unpacking (starguard.go).

// guardedPredeclared adds the guards, and the built-ins they stand in for, to pre (a copy).
func guardedPredeclared(pre starlark.StringDict) starlark.StringDict {
	out := make(starlark.StringDict, len(pre)+64)
	for k, v := range pre {
		out[k] = v
	}
	for op := range guardedBinary {
		out[binaryGuardName(op)] = starlark.NewBuiltin(op.String(), binaryGuard(op))
	}
	for aug, op := range augmented {
		out[augGuardName(op)] = starlark.NewBuiltin(aug.String(), augGuard(op))
	}
	for _, op := range []syntax.Token{syntax.MINUS, syntax.TILDE, syntax.PLUS} {
		out[unaryGuardName(op)] = starlark.NewBuiltin(op.String(), unaryGuard(op))
	}
	out[guardAttr] = starlark.NewBuiltin("getattr", bGuardAttr)
	out[guardSlice] = starlark.NewBuiltin("slice", bGuardSlice)
	out[guardSpread] = starlark.NewBuiltin("*", bGuardSpread)
	out[guardKw] = starlark.NewBuiltin("**", bGuardSpreadKw)
	for name, g := range universeGuards {
		out[name] = starlark.NewBuiltin(name, g)
	}
	return out
}

// binarySize is an upper estimate of what x op y allocates, walking formatting arguments no further than limit.
func binarySize(op syntax.Token, x, y starlark.Value, limit int64) int64 {
	switch op {
	case syntax.PLUS:
		switch x := x.(type) {
		case starlark.String:
			if y, ok := y.(starlark.String); ok {
				return int64(len(x)) + int64(len(y))
			}
		case starlark.Bytes:
			if y, ok := y.(starlark.Bytes); ok {
				return int64(len(x)) + int64(len(y))
			}
		case *starlark.List, starlark.Tuple:
			return int64(lenOf(x)+max(lenOf(y), 0)) * slotBytes
		case starlark.Int:
			if y, ok := y.(starlark.Int); ok {
				return max(intBytes(x), intBytes(y)) + 8
			}
		}
	case syntax.STAR:
		if n, ok := y.(starlark.Int); ok {
			return repeatSize(x, n)
		}
		if n, ok := x.(starlark.Int); ok {
			if y, ok := y.(starlark.Int); ok {
				return intBytes(n) + intBytes(y)
			}
			return repeatSize(y, n)
		}
	case syntax.PERCENT:
		if s, ok := x.(starlark.String); ok {
			return formatSize(string(s), "%", y, limit)
		}
		if x, ok := x.(starlark.Int); ok {
			return intBytes(x)
		}
	case syntax.LTLT:
		if x, ok := x.(starlark.Int); ok {
			return intBytes(x) + 64
		}
	case syntax.MINUS, syntax.AMP, syntax.PIPE, syntax.CIRCUMFLEX, syntax.SLASHSLASH, syntax.SLASH, syntax.GTGT:
		switch x := x.(type) {
		case starlark.Int:
			if y, ok := y.(starlark.Int); ok {
				return max(intBytes(x), intBytes(y)) + 8
			}
		case *starlark.Dict, *starlark.Set:
			return int64(lenOf(x)+max(lenOf(y), 0)) * entryBytes
		}
	}
	return 0
}

// repeatSize is what x * n allocates.
func repeatSize(x starlark.Value, n starlark.Int) int64 {
	var unit int64
	switch x := x.(type) {
	case starlark.String:
		unit = int64(len(x))
	case starlark.Bytes:
		unit = int64(len(x))
	case *starlark.List:
		unit = int64(x.Len()) * slotBytes
	case starlark.Tuple:
		unit = int64(len(x)) * slotBytes
	default:
		return 0
	}
	k, ok := n.Int64()
	if !ok {
		if n.Sign() < 0 {
			return 0
		}
		return 1 << 62 // a repeat count past int64
	}
	if k <= 0 || unit == 0 {
		return 0
	}
	if unit > (1<<62)/k {
		return 1 << 62
	}
	return unit * k
}

// formatSize bounds what formatting template with args allocates: each conversion (at most one per occurrence of
// mark) writes at most the largest argument's text. It walks the arguments no further than limit.
func formatSize(template, mark string, args starlark.Value, limit int64) int64 {
	convs := int64(strings.Count(template, mark))
	if convs == 0 {
		return int64(len(template))
	}
	largest := int64(0)
	each := func(v starlark.Value) {
		largest = max(largest, deepSize(v, limit/convs+1))
	}
	switch a := args.(type) {
	case starlark.Tuple:
		for _, v := range a {
			each(v)
		}
	case *starlark.Dict:
		for _, v := range a.Entries() {
			each(v)
		}
	default:
		each(args)
	}
	return int64(len(template)) + convs*largest
}

func binaryGuard(op syntax.Token) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		x, y := args[0], args[1]
		what := x.Type() + " " + op.String() + " " + y.Type()
		if err := intFits(what, op, x, y); err != nil {
			return nil, err
		}
		if err := charge(th, what, binarySize(op, x, y, remainingOrZero(th))); err != nil {
			return nil, err
		}
		return starlark.Binary(op, x, y)
	}
}

// maxIntBits bounds the integers provided code makes (as calc's, about 19,700 decimal digits): an operation on
// larger ones is a step that can run for minutes (one step cannot be cancelled), so it is refused before it runs.
const maxIntBits = calcMaxBits

// intTooLarge refuses an integer past maxIntBits.
type intTooLarge struct {
	what string
	bits int64
}

func (e *intTooLarge) Error() string {
	return fmt.Sprintf("%s would make an integer of about %d bits, over the %d bits a handler's integers may have", e.what, e.bits, maxIntBits)
}

func (e *intTooLarge) Unwrap() error { return ErrHandlerMemory }

// intFits refuses x op y when both are ints and the result could pass maxIntBits.
func intFits(what string, op syntax.Token, x, y starlark.Value) error {
	xi, ok1 := x.(starlark.Int)
	yi, ok2 := y.(starlark.Int)
	if !ok1 || !ok2 {
		return nil
	}
	bx, by := bitLen(xi), bitLen(yi)
	var bits int64
	switch op {
	case syntax.STAR:
		bits = bx + by
	case syntax.LTLT:
		if n, ok := yi.Int64(); ok && n > 0 {
			bits = bx + n
		}
	default:
		bits = max(bx, by) + 1
	}
	if bits > maxIntBits {
		return &intTooLarge{what: what, bits: bits}
	}
	return nil
}

// augGuard is lhs op= rhs: a list += an iterable extends the list in place, a dict |= a dict updates it in place,
// anything else is lhs op rhs.
func augGuard(op syntax.Token) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	bin := binaryGuard(op)
	return func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		x, y := args[0], args[1]
		if l, ok := x.(*starlark.List); ok && op == syntax.PLUS {
			if _, ok := y.(starlark.Iterable); ok {
				elems, n, err := sized(th, "list +=", y)
				if err != nil {
					return nil, err
				}
				// The list's growth: its new slots, and the copy a reallocation makes.
				if err := charge(th, "list +=", int64(n+l.Len())*slotBytes); err != nil {
					return nil, err
				}
				seq, ok := elems.(starlark.Indexable)
				if !ok {
					t, err := materialize(th, "list +=", elems)
					if err != nil {
						return nil, err
					}
					seq = t
				}
				for i := range n { // by index up to n: l += l adds l's elements once
					if err := l.Append(seq.Index(i)); err != nil {
						return nil, fmt.Errorf("cannot apply += to frozen list")
					}
				}
				return l, nil
			}
		}
		if d, ok := x.(*starlark.Dict); ok && op == syntax.PIPE {
			if y, ok := y.(*starlark.Dict); ok {
				if err := charge(th, "dict |=", int64(y.Len())*entryBytes); err != nil {
					return nil, err
				}
				for k, v := range y.Entries() {
					if err := d.SetKey(k, v); err != nil {
						return nil, err
					}
				}
				return d, nil
			}
		}
		return bin(th, b, args, kw)
	}
}

func unaryGuard(op syntax.Token) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		x := args[0]
		if i, ok := x.(starlark.Int); ok {
			if err := charge(th, op.String()+"int", intBytes(i)+8); err != nil {
				return nil, err
			}
		}
		return starlark.Unary(op, x)
	}
}

// bGuardSlice is x[lo:hi:step], charging the copy it makes (a string sliced with step 1 shares x's bytes).
func bGuardSlice(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, lo, hi, stepV := args[0], args[1], args[2], args[3]
	sl, ok := x.(starlark.Sliceable)
	if !ok {
		return nil, fmt.Errorf("invalid slice operand %s", x.Type())
	}
	n := sl.Len()
	step := 1
	if stepV != starlark.None {
		var err error
		if step, err = starlark.AsInt32(stepV); err != nil {
			return nil, fmt.Errorf("invalid slice step: %s", err)
		}
		if step == 0 {
			return nil, errors.New("zero is not a valid slice step")
		}
	}
	index := func(v starlark.Value, def int, what string) (int, error) {
		if v == starlark.None {
			return def, nil
		}
		i, err := starlark.AsInt32(v)
		if err != nil {
			return 0, fmt.Errorf("invalid %s index: %s", what, err)
		}
		if i < 0 {
			i += n
		}
		return i, nil
	}
	var start, end int
	var err error
	if step > 0 {
		if start, err = index(lo, 0, "start"); err != nil {
			return nil, err
		}
		if end, err = index(hi, n, "end"); err != nil {
			return nil, err
		}
		start, end = min(max(start, 0), n), min(max(end, 0), n)
		end = max(end, start)
	} else {
		if start, err = index(lo, n-1, "start"); err != nil {
			return nil, err
		}
		if end, err = index(hi, -1, "end"); err != nil {
			return nil, err
		}
		start, end = min(start, n-1), max(end, -1)
		start = max(start, end)
	}
	count := 0
	if step > 0 {
		count = (end - start + step - 1) / step
	} else {
		count = (start - end + (-step) - 1) / (-step)
	}
	var size int64
	switch x.(type) {
	case starlark.String, starlark.Bytes:
		if step != 1 {
			size = int64(count)
		}
	default:
		size = int64(count) * slotBytes
	}
	if err := charge(th, "slice of "+x.Type(), size); err != nil {
		return nil, err
	}
	return sl.Slice(start, end, step), nil
}

// bGuardSpread is f(*x): the arguments tuple it makes.
func bGuardSpread(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	v, n, err := sized(th, "*args", args[0])
	if err != nil {
		return nil, err
	}
	if err := charge(th, "*args", int64(n)*slotBytes); err != nil {
		return nil, err
	}
	return v, nil
}

// bGuardSpreadKw is f(**x): the keyword arguments it makes.
func bGuardSpreadKw(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	if err := charge(th, "**kwargs", int64(max(lenOf(args[0]), 0))*entryBytes); err != nil {
		return nil, err
	}
	return args[0], nil
}
