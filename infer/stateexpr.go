package infer

import (
	"math"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// State expressions: what one field of a state tool's answer is (state.go). Each evaluates on a recorded call —
// its arguments and the variables as the trace showed them before it — and writes itself as Starlark.

// sctx is what a state expression reads: the call's arguments and the variables before it.
type sctx struct {
	args *jsonvalue.Object
	get  func(key string) (any, bool)
}

// sexpr is one field's value.
type sexpr interface {
	eval(x *sctx) (any, bool)
	code(g *stateGen) string
	// stateful: the value rests on a variable's value before the call.
	stateful() bool
	describe() string
}

// varRef names a variable: its name, keyed by an argument's value when keyArg is set, or by another variable's
// value when keyVar is (a directory's entries by the current directory).
type varRef struct {
	name   string
	keyArg string
	keyVar string
}

// key answers the variable's row key for a call with args, reading a key variable through get.
func (r varRef) keyWith(args *jsonvalue.Object, get func(string) (any, bool)) (string, bool) {
	var v any
	var ok bool
	switch {
	case r.keyArg != "":
		v, ok = args.Get(r.keyArg)
	case r.keyVar != "":
		if get == nil {
			return "", false
		}
		v, ok = get(r.keyVar)
	default:
		return r.name, true
	}
	if !ok || !keyable(v) {
		return "", false
	}
	return twin.StateKey(r.name, twin.StateKeyText(v)), true
}

func (r varRef) key(args *jsonvalue.Object) (string, bool) { return r.keyWith(args, nil) }

// keyable tells a value a variable may be keyed by: a string or an integer (pystr spells them as StateKeyText).
func keyable(v any) bool {
	switch x := v.(type) {
	case string:
		return !strings.ContainsAny(x, "[]")
	case jsonvalue.Number:
		return !x.IsFloat()
	}
	return false
}

func (r varRef) get(x *sctx) (any, bool) {
	k, ok := r.keyWith(x.args, x.get)
	if !ok {
		return nil, false
	}
	return x.get(k)
}

// keyCode is the Starlark expression of the variable's row key; a key variable's value is read through g.
func (r varRef) keyCode(g *stateGen) string {
	switch {
	case r.keyArg != "":
		return strconv.Quote(r.name+"[") + " + pystr(args.get(" + strconv.Quote(r.keyArg) + ")) + \"]\""
	case r.keyVar != "":
		return strconv.Quote(r.name+"[") + " + pystr(" + g.read(varRef{name: r.keyVar}) + ") + \"]\""
	}
	return strconv.Quote(r.name)
}

func (r varRef) String() string {
	switch {
	case r.keyArg != "":
		return r.name + "[" + r.keyArg + "]"
	case r.keyVar != "":
		return r.name + "[" + r.keyVar + "]"
	}
	return r.name
}

// constS: always the same value.
type constS struct{ v any }

func (e constS) eval(*sctx) (any, bool) { return e.v, true }
func (e constS) code(*stateGen) string  { return lit(e.v) }
func (e constS) stateful() bool         { return false }
func (e constS) describe() string       { return "always " + lit(e.v) }

// argS: an argument's value (as a float when production spells it so), or def when the call does not give it and
// hasDef is set (the value production answered whenever the argument was left out).
type argS struct {
	name   string
	float  bool
	hasDef bool
	def    any
}

func (e argS) eval(x *sctx) (any, bool) {
	v, ok := x.args.Get(e.name)
	if !ok {
		if e.hasDef {
			return e.def, true
		}
		return nil, false
	}
	if e.float {
		n, ok := v.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		return floatNumber(n.Float64()), true
	}
	return v, true
}
func (e argS) code(*stateGen) string {
	c := "args.get(" + strconv.Quote(e.name) + ")"
	if e.float {
		c = "float(" + c + ")"
	}
	if e.hasDef {
		return "(" + c + " if " + strconv.Quote(e.name) + " in args else " + lit(e.def) + ")"
	}
	return c
}
func (e argS) stateful() bool { return false }
func (e argS) describe() string {
	if e.hasDef {
		return "argument " + e.name + ", " + lit(e.def) + " when not given"
	}
	return "argument " + e.name
}

// tmplS: text with argument values in it.
type tmplS struct{ parts []part }

func (e tmplS) eval(x *sctx) (any, bool) {
	var b strings.Builder
	for _, p := range e.parts {
		if p.path == nil {
			b.WriteString(p.lit)
			continue
		}
		v, ok := p.path.get(x.args)
		if !ok {
			return nil, false
		}
		s, ok := scalarText(v)
		if !ok {
			return nil, false
		}
		b.WriteString(s)
	}
	return b.String(), true
}
func (e tmplS) code(*stateGen) string { return templateExpr(e.parts) }
func (e tmplS) stateful() bool        { return false }
func (e tmplS) describe() string      { return "text with its arguments in it" }

// scaleS: a numeric argument times a constant (a unit conversion).
type scaleS struct {
	name string
	k    float64
}

func (e scaleS) eval(x *sctx) (any, bool) {
	v, ok := x.args.Get(e.name)
	n, isNum := v.(jsonvalue.Number)
	if !ok || !isNum {
		return nil, false
	}
	return floatNumber(n.Float64() * e.k), true
}
func (e scaleS) code(*stateGen) string {
	return "float(args.get(" + strconv.Quote(e.name) + ")) * " + strconv.FormatFloat(e.k, 'g', -1, 64)
}
func (e scaleS) stateful() bool { return false }
func (e scaleS) describe() string {
	return "argument " + e.name + " times " + strconv.FormatFloat(e.k, 'g', -1, 64)
}

// aggS: a sum, mean, least or greatest of a list argument's numbers.
type aggS struct {
	name, fn string
}

func (e aggS) eval(x *sctx) (any, bool) {
	v, ok := x.args.Get(e.name)
	l, isList := v.([]any)
	if !ok || !isList || len(l) == 0 {
		return nil, false
	}
	var acc float64
	for i, el := range l {
		n, ok := el.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		f := n.Float64()
		switch {
		case i == 0 && e.fn != "sum" && e.fn != "mean":
			acc = f
		case e.fn == "min":
			acc = math.Min(acc, f)
		case e.fn == "max":
			acc = math.Max(acc, f)
		default:
			acc += f
		}
	}
	if e.fn == "mean" {
		acc /= float64(len(l))
	}
	return floatNumber(acc), true
}
func (e aggS) code(*stateGen) string {
	a := "args.get(" + strconv.Quote(e.name) + ")"
	switch e.fn {
	case "sum":
		return "float(fsum(" + a + "))"
	case "mean":
		return "float(fsum(" + a + ")) / len(" + a + ")"
	}
	return "float(" + e.fn + "(" + a + "))"
}
func (e aggS) stateful() bool   { return false }
func (e aggS) describe() string { return e.fn + " of argument " + e.name }

// readS: a variable's value before the call (as a float when production spells it so).
type readS struct {
	v     varRef
	float bool
}

func (e readS) eval(x *sctx) (any, bool) {
	v, ok := e.v.get(x)
	if !ok {
		return nil, false
	}
	if e.float {
		n, ok := v.(jsonvalue.Number)
		if !ok {
			return nil, false
		}
		return floatNumber(n.Float64()), true
	}
	return v, true
}
func (e readS) code(g *stateGen) string {
	c := g.read(e.v)
	if e.float {
		return "float(" + c + ")"
	}
	return c
}
func (e readS) stateful() bool   { return true }
func (e readS) describe() string { return "variable " + e.v.String() }

// addS: a variable plus (or minus) a numeric argument, or a constant step when name is "".
type addS struct {
	v    varRef
	name string
	sign float64
	step float64
}

func (e addS) eval(x *sctx) (any, bool) {
	old, ok := e.v.get(x)
	n, isNum := old.(jsonvalue.Number)
	if !ok || !isNum {
		return nil, false
	}
	d := e.step
	if e.name != "" {
		a, ok := x.args.Get(e.name)
		an, isNum := a.(jsonvalue.Number)
		if !ok || !isNum {
			return nil, false
		}
		d = an.Float64()
	}
	r := n.Float64() + e.sign*d
	if e.name == "" && !n.IsFloat() && r == math.Trunc(r) {
		return jsonvalue.Number(strconv.FormatFloat(r, 'f', -1, 64)), true // a counter stays whole
	}
	return floatNumber(r), true
}
func (e addS) code(g *stateGen) string {
	op := " + "
	if e.sign < 0 {
		op = " - "
	}
	if e.name == "" {
		return g.read(e.v) + op + strconv.FormatFloat(e.step, 'g', -1, 64)
	}
	return "float(" + g.read(e.v) + op + "args.get(" + strconv.Quote(e.name) + "))"
}
func (e addS) stateful() bool { return true }
func (e addS) describe() string {
	by := "1"
	if e.name != "" {
		by = "argument " + e.name
	} else {
		by = strconv.FormatFloat(e.step, 'g', -1, 64)
	}
	if e.sign < 0 {
		return "variable " + e.v.String() + " less " + by
	}
	return "variable " + e.v.String() + " plus " + by
}

// notS: a boolean variable flipped.
type notS struct{ v varRef }

func (e notS) eval(x *sctx) (any, bool) {
	old, ok := e.v.get(x)
	b, isBool := old.(bool)
	if !ok || !isBool {
		return nil, false
	}
	return !b, true
}
func (e notS) code(g *stateGen) string { return "not " + g.read(e.v) }
func (e notS) stateful() bool          { return true }
func (e notS) describe() string        { return "variable " + e.v.String() + " flipped" }

// flipS: a variable holding one of two values, turned to the other.
type flipS struct {
	v    varRef
	a, b any
}

func (e flipS) eval(x *sctx) (any, bool) {
	old, ok := e.v.get(x)
	switch {
	case !ok:
		return nil, false
	case jsonvalue.Equal(old, e.a):
		return e.b, true
	case jsonvalue.Equal(old, e.b):
		return e.a, true
	}
	return nil, false
}
func (e flipS) code(g *stateGen) string {
	return "(" + lit(e.b) + " if " + g.read(e.v) + " == " + lit(e.a) + " else " + lit(e.a) + ")"
}
func (e flipS) stateful() bool { return true }
func (e flipS) describe() string {
	return "variable " + e.v.String() + " turned between " + lit(e.a) + " and " + lit(e.b)
}

// listS: a list variable with an argument appended (or removed, each element equal to it).
type listS struct {
	v      varRef
	name   string
	remove bool
}

func (e listS) eval(x *sctx) (any, bool) {
	old, ok := e.v.get(x)
	l, isList := old.([]any)
	a, ok2 := x.args.Get(e.name)
	if !ok || !isList || !ok2 {
		return nil, false
	}
	if !e.remove {
		return append(append([]any{}, l...), a), true
	}
	out := make([]any, 0, len(l))
	for _, el := range l {
		if !jsonvalue.Equal(el, a) {
			out = append(out, el)
		}
	}
	return out, true
}
func (e listS) code(g *stateGen) string {
	a := "args.get(" + strconv.Quote(e.name) + ")"
	if e.remove {
		return "[x for x in " + g.read(e.v) + " if x != " + a + "]"
	}
	return g.read(e.v) + " + [" + a + "]"
}
func (e listS) stateful() bool { return true }
func (e listS) describe() string {
	if e.remove {
		return "variable " + e.v.String() + " without argument " + e.name
	}
	return "variable " + e.v.String() + " with argument " + e.name + " appended"
}

// floatNumber spells a float as Python does (1200.0, 5.283440000000001).
func floatNumber(f float64) jsonvalue.Number {
	return jsonvalue.Number(twin.StylePython.FormatFloat(f))
}

// condS: one rule when a text argument holds a character, another when it does not (a file moved into a
// directory, or renamed to a name with an extension).
type condS struct {
	arg, ch   string
	then, els sexpr
}

func (e condS) eval(x *sctx) (any, bool) {
	v, ok := x.args.Get(e.arg)
	s, isStr := v.(string)
	if !ok || !isStr {
		return nil, false
	}
	if strings.Contains(s, e.ch) {
		return e.then.eval(x)
	}
	return e.els.eval(x)
}
func (e condS) code(g *stateGen) string {
	return "(" + e.then.code(g) + " if " + strconv.Quote(e.ch) + " in pystr(args.get(" + strconv.Quote(e.arg) + ")) else " + e.els.code(g) + ")"
}
func (e condS) stateful() bool { return e.then.stateful() || e.els.stateful() }
func (e condS) describe() string {
	return e.then.describe() + " when argument " + e.arg + " holds " + strconv.Quote(e.ch) + ", else " + e.els.describe()
}
