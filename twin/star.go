package twin

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// fileOptions are the Starlark dialect handlers are written in.
var fileOptions = &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true}

// toStar converts a model value into a fresh, mutable Starlark value.
func toStar(v any) starlark.Value {
	switch x := v.(type) {
	case nil:
		return starlark.None
	case bool:
		return starlark.Bool(x)
	case string:
		return starlark.String(x)
	case jsonvalue.Number:
		if !x.IsFloat() {
			if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
				return starlark.MakeInt64(i)
			}
			var z big.Int
			if _, ok := z.SetString(string(x), 10); ok {
				return starlark.MakeBigInt(&z)
			}
		}
		return starlark.Float(x.Float64())
	case []any:
		elems := make([]starlark.Value, len(x))
		for i, e := range x {
			elems[i] = toStar(e)
		}
		return starlark.NewList(elems)
	case *jsonvalue.Object:
		d := starlark.NewDict(len(x.Keys))
		for i, k := range x.Keys {
			_ = d.SetKey(starlark.String(k), toStar(x.Vals[i]))
		}
		return d
	}
	return starlark.None
}

// fromStar converts a Starlark value back into the model; floats are spelled in style st.
func fromStar(v starlark.Value, st Style) (any, error) {
	return fromStarDepth(v, st, 0)
}

func fromStarDepth(v starlark.Value, st Style, depth int) (any, error) {
	if depth > jsonvalue.MaxDepth {
		return nil, errors.New("value nested too deeply")
	}
	switch x := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		return bool(x), nil
	case starlark.String:
		return string(x), nil
	case starlark.Int:
		return jsonvalue.Number(x.String()), nil
	case starlark.Float:
		return jsonvalue.Number(st.FormatFloat(float64(x))), nil
	case *starlark.List:
		out := make([]any, x.Len())
		for i := range out {
			e, err := fromStarDepth(x.Index(i), st, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case starlark.Tuple:
		out := make([]any, len(x))
		for i := range x {
			e, err := fromStarDepth(x[i], st, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case *starlark.Dict:
		items := x.Items()
		o := jsonvalue.NewObject(len(items))
		for _, it := range items {
			var k string
			if s, ok := it[0].(starlark.String); ok {
				k = string(s)
			} else {
				k = it[0].String()
			}
			e, err := fromStarDepth(it[1], st, depth+1)
			if err != nil {
				return nil, err
			}
			o.Keys = append(o.Keys, k)
			o.Vals = append(o.Vals, e)
		}
		return o, nil
	case *starlark.Set:
		var out []any
		iter := x.Iterate()
		defer iter.Done()
		var e starlark.Value
		for iter.Next(&e) {
			m, err := fromStarDepth(e, st, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		return out, nil
	}
	return nil, fmt.Errorf("a %s cannot be part of an answer or a row", v.Type())
}

// errorAnswer is what error("...") returns: the tool's own error text.
type errorAnswer struct{ text string }

func (e *errorAnswer) String() string        { return "error(" + strconv.Quote(e.text) + ")" }
func (e *errorAnswer) Type() string          { return "error_answer" }
func (e *errorAnswer) Freeze()               {}
func (e *errorAnswer) Truth() starlark.Bool  { return starlark.True }
func (e *errorAnswer) Hash() (uint32, error) { return starlark.String(e.text).Hash() }

// declined is what decline("...") returns: this rung cannot answer, try the next.
type declined struct{ reason string }

func (d *declined) String() string        { return "decline(" + strconv.Quote(d.reason) + ")" }
func (d *declined) Type() string          { return "decline" }
func (d *declined) Freeze()               {}
func (d *declined) Truth() starlark.Bool  { return starlark.False }
func (d *declined) Hash() (uint32, error) { return starlark.String(d.reason).Hash() }

// callEnv is what builtins see of the call in progress (a thread local).
type callEnv struct {
	sess  *Session
	txn   map[tableKey]*jsonvalue.Object // writes of this call, committed when it answers
	order []tableKey                     // write order, for determinism
	dels  map[tableKey]bool
	// mat holds the rows this call made up for ids the world did not hold (open.go), in matOrder; they stay
	// for the session whatever the call answers.
	mat      map[tableKey]*jsonvalue.Object
	matOrder []tableKey
}

type tableKey struct{ table, key string }

const envKey = "doppel.env"

func envOf(th *starlark.Thread) (*callEnv, error) {
	e, _ := th.Local(envKey).(*callEnv)
	if e == nil {
		return nil, errors.New("world is only available inside a tool call")
	}
	return e, nil
}

// rowOf answers the row (table, key) as this call sees it: its own writes, then the session, then the base.
func (e *callEnv) rowOf(table, key string) (*jsonvalue.Object, bool) {
	tk := tableKey{table, key}
	if e.dels[tk] {
		return nil, false
	}
	if r, ok := e.txn[tk]; ok {
		return r, true
	}
	if r, ok := e.mat[tk]; ok {
		return r, true
	}
	return e.sess.row(table, key)
}

// Predeclared builds the names every handler sees. They are documented in HandlerAPI.
func predeclared() starlark.StringDict {
	world := &module{name: "world", members: starlark.StringDict{
		"get":    starlark.NewBuiltin("world.get", bWorldGet),
		"put":    starlark.NewBuiltin("world.put", bWorldPut),
		"delete": starlark.NewBuiltin("world.delete", bWorldDelete),
		"find":   starlark.NewBuiltin("world.find", bWorldFind),
		"keys":   starlark.NewBuiltin("world.keys", bWorldKeys),
		"sub":    starlark.NewBuiltin("world.sub", bWorldSub),
	}}
	return starlark.StringDict{
		"world":    world,
		"error":    starlark.NewBuiltin("error", bError),
		"decline":  starlark.NewBuiltin("decline", bDecline),
		"now":      starlark.NewBuiltin("now", bNow),
		"round":    starlark.NewBuiltin("round", bRound),
		"pystr":    starlark.NewBuiltin("pystr", bPyStr),
		"calc":     starlark.NewBuiltin("calc", bCalc),
		"deepcopy": starlark.NewBuiltin("deepcopy", bDeepCopy),
		"fsum":     starlark.NewBuiltin("fsum", bFsum),
	}
}

// IsPredeclared reports whether a name is one handlers see predeclared (world, error,
// round, ...) or a Starlark built-in (len, sorted, ...): a handler named so would shadow it.
func IsPredeclared(name string) bool {
	if _, ok := starlark.Universe[name]; ok {
		return true
	}
	_, ok := predeclared()[name]
	return ok
}

// HandlerAPI documents what a handler (synthesized or provided) may call. A
// handler is a Starlark function named after its tool (or handle) taking the
// arguments dict and returning the answer: a dict, list, string or number
// (rendered the way production spells it), error(text) for the tool's own error,
// or decline(reason) to let the next rung answer.
const HandlerAPI = `world.get(table, key)          -> row dict (a private copy) or None
world.put(table, key, row)     -> stores the row in this session (kept only if the call answers)
world.delete(table, key)       -> removes the row from this session
world.find(table, criteria, ignore_case=[]) -> sorted keys of rows whose fields equal criteria {"a.b": value}
world.keys(table)              -> sorted keys of the table
world.sub(table, index, value) -> the nested object an index names (e.g. a product variant by item id), or None
error(text)                    -> the tool's own error answer
decline(reason)                -> this rung cannot answer; the next rung will
now()                          -> the session clock (RFC 3339)
round(x, n)                    -> Python's round
pystr(x)                       -> Python's str (1200.0, True, None)
calc(expression)               -> arithmetic (+ - * / // % ** parentheses) with Python semantics
deepcopy(x)                    -> a deep copy
fsum(xs)                       -> Python's sum(xs) (left to right, int start)`

type module struct {
	name    string
	members starlark.StringDict
}

func (m *module) String() string        { return "<module " + m.name + ">" }
func (m *module) Type() string          { return "module" }
func (m *module) Freeze()               { m.members.Freeze() }
func (m *module) Truth() starlark.Bool  { return starlark.True }
func (m *module) Hash() (uint32, error) { return 0, errors.New("unhashable: module") }
func (m *module) Attr(n string) (starlark.Value, error) {
	if v, ok := m.members[n]; ok {
		return v, nil
	}
	return nil, nil
}
func (m *module) AttrNames() []string { return m.members.Keys() }

func keyString(v starlark.Value) (string, error) {
	switch x := v.(type) {
	case starlark.String:
		return string(x), nil
	case starlark.Int:
		return x.String(), nil
	}
	return "", fmt.Errorf("a key must be a string or an int, not %s", v.Type())
}

func bWorldGet(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table string
	var key starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &table, &key); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	if key == starlark.None {
		return starlark.None, nil
	}
	k, err := keyString(key)
	if err != nil {
		return starlark.None, nil
	}
	r, ok := e.lookupOrMaterialize(table, k)
	if !ok {
		return starlark.None, nil
	}
	left := remaining(th)
	row, size := e.sess.rowStarSized(table, k, r, left)
	if err := charge(th, "world.get", size); err != nil { // a private copy each time
		return nil, err
	}
	return row, nil
}

func bWorldPut(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table string
	var key, row starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 3, &table, &key, &row); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	if !e.sess.rt.hasTable(table) {
		return nil, fmt.Errorf("world.put: no table %q", table)
	}
	k, err := keyString(key)
	if err != nil {
		return nil, err
	}
	if err := chargeStruct(th, "world.put", row); err != nil { // before converting it: a row holding one list many times is as large as its copy
		return nil, err
	}
	v, err := fromStar(row, e.sess.rt.style)
	if err != nil {
		return nil, fmt.Errorf("world.put: %w", err)
	}
	o, ok := v.(*jsonvalue.Object)
	if !ok {
		return nil, fmt.Errorf("world.put: a row must be a dict, not %s", row.Type())
	}
	tk := tableKey{table, k}
	if e.txn == nil {
		e.txn = map[tableKey]*jsonvalue.Object{}
	}
	if _, seen := e.txn[tk]; !seen {
		e.order = append(e.order, tk)
	}
	delete(e.dels, tk)
	e.txn[tk] = o
	return starlark.None, nil
}

func bWorldDelete(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table string
	var key starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &table, &key); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	k, err := keyString(key)
	if err != nil {
		return nil, err
	}
	tk := tableKey{table, k}
	if e.dels == nil {
		e.dels = map[tableKey]bool{}
	}
	if _, seen := e.txn[tk]; !seen {
		e.order = append(e.order, tk)
	}
	delete(e.txn, tk)
	e.dels[tk] = true
	return starlark.None, nil
}

func bWorldFind(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table string
	var crit *starlark.Dict
	var ci *starlark.List
	var open bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "table", &table, "criteria", &crit, "ignore_case?", &ci, "materialize?", &open); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	fold := map[string]bool{}
	if ci != nil {
		for i := 0; i < ci.Len(); i++ {
			if s, ok := ci.Index(i).(starlark.String); ok {
				fold[string(s)] = true
			}
		}
	}
	if err := chargeStruct(th, "world.find", crit); err != nil {
		return nil, err
	}
	var cs []criterion
	for _, it := range crit.Items() {
		p, ok := it[0].(starlark.String)
		if !ok {
			return nil, fmt.Errorf("world.find: criteria keys are field paths (strings)")
		}
		v, err := fromStar(it[1], e.sess.rt.style)
		if err != nil {
			return nil, err
		}
		cs = append(cs, criterion{path: string(p), value: v, fold: fold[string(p)]})
	}
	keys := e.sess.find(table, cs, e)
	if len(keys) == 0 && open {
		if k, ok := e.materializeMatch(table, cs); ok {
			keys = []string{k}
		}
	}
	if err := charge(th, "world.find", int64(len(keys))*(slotBytes+headBytes)); err != nil {
		return nil, err
	}
	out := make([]starlark.Value, len(keys))
	for i, k := range keys {
		out[i] = starlark.String(k)
	}
	return starlark.NewList(out), nil
}

func bWorldKeys(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table string
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &table); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	keys := e.sess.keys(table, e)
	if err := charge(th, "world.keys", int64(len(keys))*(slotBytes+headBytes)); err != nil {
		return nil, err
	}
	out := make([]starlark.Value, len(keys))
	for i, k := range keys {
		out[i] = starlark.String(k)
	}
	return starlark.NewList(out), nil
}

func bWorldSub(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var table, index string
	var value starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 3, &table, &index, &value); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	if err := chargeStruct(th, "world.sub", value); err != nil {
		return nil, err
	}
	v, err := fromStar(value, e.sess.rt.style)
	if err != nil {
		return nil, err
	}
	o := e.sess.sub(table, index, v, e)
	if o == nil {
		return starlark.None, nil
	}
	sub := toStar(o)
	if err := chargeStruct(th, "world.sub", sub); err != nil {
		return nil, err
	}
	return sub, nil
}

func bError(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var text string
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &text); err != nil {
		return nil, err
	}
	return &errorAnswer{text: text}, nil
}

func bDecline(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var reason string
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 0, &reason); err != nil {
		return nil, err
	}
	return &declined{reason: reason}, nil
}

func bNow(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 0); err != nil {
		return nil, err
	}
	e, err := envOf(th)
	if err != nil {
		return nil, err
	}
	return starlark.String(e.sess.clock), nil
}

func bRound(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	var nd starlark.Value = starlark.None
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &x, &nd); err != nil {
		return nil, err
	}
	if nd == starlark.None {
		switch v := x.(type) {
		case starlark.Int:
			return v, nil
		case starlark.Float:
			r := math.RoundToEven(float64(v))
			return starlark.MakeInt64(int64(r)), nil
		}
		return nil, fmt.Errorf("round: not a number: %s", x.Type())
	}
	n, err := starlark.AsInt32(nd)
	if err != nil {
		return nil, fmt.Errorf("round: %w", err)
	}
	switch v := x.(type) {
	case starlark.Int:
		if n >= 0 {
			return v, nil
		}
		f, _ := starlark.AsFloat(v)
		return starlark.MakeInt64(int64(PyRound(f, n))), nil
	case starlark.Float:
		return starlark.Float(PyRound(float64(v), n)), nil
	}
	return nil, fmt.Errorf("round: not a number: %s", x.Type())
}

// PyStr is Python's str() of a value as a handler holds it.
func pyStr(v starlark.Value) string {
	switch x := v.(type) {
	case starlark.String:
		return string(x)
	case starlark.Float:
		return PyFloat(float64(x))
	case starlark.Bool:
		if x {
			return "True"
		}
		return "False"
	case starlark.NoneType:
		return "None"
	}
	return v.String()
}

func bPyStr(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &x); err != nil {
		return nil, err
	}
	if _, ok := x.(starlark.String); !ok {
		if err := chargeDeep(th, "pystr", x); err != nil {
			return nil, err
		}
	}
	return starlark.String(pyStr(x)), nil
}

func bDeepCopy(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &x); err != nil {
		return nil, err
	}
	if err := chargeStruct(th, "deepcopy", x); err != nil {
		return nil, err
	}
	// toStar(fromStar(x)) without the model value in between (floats survive that trip: PyFloat round-trips).
	return deepCopyStar(x, 0)
}

func bFsum(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var xs starlark.Iterable
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &xs); err != nil {
		return nil, err
	}
	var acc starlark.Value = starlark.MakeInt(0)
	it := xs.Iterate()
	defer it.Done()
	var x starlark.Value
	for it.Next(&x) {
		r, err := starlark.Binary(syntax.PLUS, acc, x)
		if err != nil {
			return nil, err
		}
		acc = r
	}
	return acc, nil
}

func bCalc(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var expr string
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &expr); err != nil {
		return nil, err
	}
	v, err := Calc(expr)
	if err != nil {
		return &errorAnswer{text: "Error: " + err.Error()}, nil
	}
	if err := charge(th, "calc", int64(bitLen(v)/8)); err != nil {
		return nil, err
	}
	return v, nil
}
