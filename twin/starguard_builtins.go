package twin

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
)

// The guards of the built-in functions and of the methods of built-in types (starguard.go).

// bGuardAttr is x.name: a method of a built-in type that copies or grows comes wrapped in its guard.
func bGuardAttr(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, name := args[0], string(args[1].(starlark.String))
	return guardedAttr(x, name)
}

func guardedAttr(x starlark.Value, name string) (starlark.Value, error) {
	ha, ok := x.(starlark.HasAttrs)
	if !ok {
		return nil, fmt.Errorf("%s has no .%s field or method", x.Type(), name)
	}
	v, err := ha.Attr(name)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("%s has no .%s field or method", x.Type(), name)
	}
	m, ok := v.(*starlark.Builtin)
	if !ok || m.Receiver() != x {
		return v, nil
	}
	g := methodGuards[methodKey{typeOf(x), name}]
	if g == nil {
		return v, nil
	}
	return starlark.NewBuiltin(name, func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := g(th, x, args, kwargs); err != nil {
			return nil, err
		}
		return m.CallInternal(th, args, kwargs)
	}).BindReceiver(x), nil
}

// typeOf names the built-in types whose methods are guarded ("" for any other).
func typeOf(x starlark.Value) string {
	switch x.(type) {
	case starlark.String:
		return "string"
	case starlark.Bytes:
		return "bytes"
	case *starlark.List:
		return "list"
	case *starlark.Dict:
		return "dict"
	case *starlark.Set:
		return "set"
	}
	return ""
}

type methodKey struct{ typ, name string }

// methodGuard charges what a method call will allocate before it runs.
type methodGuard func(th *starlark.Thread, recv starlark.Value, args starlark.Tuple, kwargs []starlark.Tuple) error

// guardedMethod reports whether a field name is that of a guarded method of some built-in type (the rewrite routes
// every such lookup through ·attr, which wraps the method only for the type it guards).
func guardedMethod(name string) bool {
	_, ok := guardedMethodNames[name]
	return ok
}

var guardedMethodNames = func() map[string]bool {
	m := map[string]bool{}
	for k := range methodGuards {
		m[k.name] = true
	}
	return m
}()

// strLen is a string receiver's length.
func strLen(x starlark.Value) int64 {
	switch x := x.(type) {
	case starlark.String:
		return int64(len(x))
	case starlark.Bytes:
		return int64(len(x))
	}
	return 0
}

// copies charges a method that makes a string as long as its receiver (lower, strip, …).
func copies(what string) methodGuard {
	return func(th *starlark.Thread, recv starlark.Value, _ starlark.Tuple, _ []starlark.Tuple) error {
		return charge(th, what, strLen(recv))
	}
}

// pieces charges a method that splits its receiver: a list of at most len+1 strings.
func pieces(what string) methodGuard {
	return func(th *starlark.Thread, recv starlark.Value, _ starlark.Tuple, _ []starlark.Tuple) error {
		return charge(th, what, (strLen(recv)+1)*(slotBytes+headBytes))
	}
}

// entries charges a method that lists a dict's or set's n entries (keys, values, items, …) or copies them.
func entries(what string, per int64) methodGuard {
	return func(th *starlark.Thread, recv starlark.Value, _ starlark.Tuple, _ []starlark.Tuple) error {
		return charge(th, what, int64(max(lenOf(recv), 0))*per)
	}
}

// argEntries charges a method that adds its argument's elements (extend, update, union, …).
func argEntries(what string, per int64) methodGuard {
	return func(th *starlark.Thread, recv starlark.Value, args starlark.Tuple, kwargs []starlark.Tuple) error {
		n := int64(len(kwargs)) + int64(max(lenOf(recv), 0))
		for _, a := range args {
			if k := lenOf(a); k >= 0 {
				n += int64(k)
			} else {
				n += int64(remainingOrZero(th)/per + 1) // an iterable of unknown length: bound it by the budget
			}
		}
		return charge(th, what, n*per)
	}
}

func remainingOrZero(th *starlark.Thread) int64 { return max(remaining(th), 0) }

// methodGuards are the methods of built-in types that can allocate more than a constant, by type and name. Every
// other method of those types allocates at most a constant (append, get, pop, find, startswith, …) or a lazy
// iterator (elems, codepoints): TestEveryBuiltinIsClassified holds the two lists to go.starlark.net's.
var methodGuards = map[methodKey]methodGuard{
	{"string", "capitalize"}:   copies("capitalize"),
	{"string", "lower"}:        copies("lower"),
	{"string", "upper"}:        copies("upper"),
	{"string", "title"}:        copies("title"),
	{"string", "strip"}:        copies("strip"),
	{"string", "lstrip"}:       copies("lstrip"),
	{"string", "rstrip"}:       copies("rstrip"),
	{"string", "removeprefix"}: copies("removeprefix"),
	{"string", "removesuffix"}: copies("removesuffix"),
	{"string", "split"}:        pieces("split"),
	{"string", "rsplit"}:       pieces("rsplit"),
	{"string", "splitlines"}:   pieces("splitlines"),
	{"string", "replace"}: func(th *starlark.Thread, recv starlark.Value, args starlark.Tuple, _ []starlark.Tuple) error {
		s := string(recv.(starlark.String))
		if len(args) < 2 {
			return nil // the method reports the missing arguments
		}
		old, ok1 := args[0].(starlark.String)
		repl, ok2 := args[1].(starlark.String)
		if !ok1 || !ok2 {
			return nil
		}
		n := int64(strings.Count(s, string(old)))
		if len(args) > 2 {
			if c, err := starlark.AsInt32(args[2]); err == nil && c >= 0 {
				n = min(n, int64(c))
			}
		}
		return charge(th, "replace", int64(len(s))+n*int64(len(repl)))
	},
	{"string", "join"}: func(th *starlark.Thread, recv starlark.Value, args starlark.Tuple, _ []starlark.Tuple) error {
		if len(args) != 1 {
			return nil
		}
		it, ok := args[0].(starlark.Iterable)
		if !ok {
			return nil
		}
		sep := int64(len(recv.(starlark.String)))
		left := remainingOrZero(th)
		var n int64
		for e := range starlark.Elements(it) {
			s, ok := e.(starlark.String)
			if !ok {
				return nil // the method reports it
			}
			n += int64(len(s)) + sep
			if n > left {
				break
			}
		}
		return charge(th, "join", n)
	},
	{"string", "format"}: func(th *starlark.Thread, recv starlark.Value, args starlark.Tuple, kwargs []starlark.Tuple) error {
		all := append(starlark.Tuple{}, args...)
		for _, kv := range kwargs {
			all = append(all, kv[1])
		}
		return charge(th, "format", formatSize(string(recv.(starlark.String)), "{", all, remainingOrZero(th)))
	},
	{"list", "extend"}:              argEntries("extend", slotBytes),
	{"dict", "items"}:               entries("items", slotBytes+headBytes+2*slotBytes),
	{"dict", "keys"}:                entries("keys", slotBytes),
	{"dict", "values"}:              entries("values", slotBytes),
	{"dict", "update"}:              argEntries("update", entryBytes),
	{"set", "union"}:                argEntries("union", entryBytes),
	{"set", "update"}:               argEntries("update", entryBytes),
	{"set", "difference"}:           entries("difference", entryBytes),
	{"set", "intersection"}:         entries("intersection", entryBytes),
	{"set", "symmetric_difference"}: argEntries("symmetric_difference", entryBytes),
}

// unsizedMethods are the methods of built-in types that allocate at most a constant, or a lazy iterator.
var unsizedMethods = map[methodKey]bool{
	{"string", "codepoint_ords"}: true, {"string", "codepoints"}: true, {"string", "count"}: true,
	{"string", "elem_ords"}: true, {"string", "elems"}: true, {"string", "endswith"}: true, {"string", "find"}: true,
	{"string", "index"}: true, {"string", "isalnum"}: true, {"string", "isalpha"}: true, {"string", "isdigit"}: true,
	{"string", "islower"}: true, {"string", "isspace"}: true, {"string", "istitle"}: true, {"string", "isupper"}: true,
	{"string", "partition"}: true, {"string", "rfind"}: true, {"string", "rindex"}: true, {"string", "rpartition"}: true,
	{"string", "startswith"}: true,
	{"bytes", "elems"}:       true,
	{"list", "append"}:       true, {"list", "clear"}: true, {"list", "index"}: true, {"list", "insert"}: true,
	{"list", "pop"}: true, {"list", "remove"}: true,
	{"dict", "clear"}: true, {"dict", "get"}: true, {"dict", "pop"}: true, {"dict", "popitem"}: true,
	{"dict", "setdefault"}: true,
	{"set", "add"}:         true, {"set", "clear"}: true, {"set", "discard"}: true, {"set", "issubset"}: true,
	{"set", "issuperset"}: true, {"set", "pop"}: true, {"set", "remove"}: true,
}

// universeGuards stand in for the built-in functions that copy or grow: each charges what it will make, then calls
// the built-in. The others (len, min, int, …) allocate at most a constant or what their argument already holds.
var universeGuards = map[string]func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error){
	"list":      collecting("list", slotBytes),
	"tuple":     collecting("tuple", slotBytes),
	"sorted":    collecting("sorted", 2*slotBytes),
	"reversed":  collecting("reversed", slotBytes),
	"set":       collecting("set", entryBytes),
	"enumerate": collecting("enumerate", slotBytes+headBytes+2*slotBytes),
	"dict": func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		args, n, err := sizedArgs(th, "dict", args)
		if err != nil {
			return nil, err
		}
		if err := charge(th, "dict", (n+int64(len(kwargs)))*entryBytes); err != nil {
			return nil, err
		}
		return callUniverse(th, "dict", args, kwargs)
	},
	"zip": func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		shortest := int64(-1)
		for i, a := range args {
			v, n, err := sized(th, "zip", a)
			if err != nil {
				return nil, err
			}
			args[i] = v
			if shortest < 0 || int64(n) < shortest {
				shortest = int64(n)
			}
		}
		if err := charge(th, "zip", max(shortest, 0)*(slotBytes+headBytes+int64(len(args))*slotBytes)); err != nil {
			return nil, err
		}
		return callUniverse(th, "zip", args, kwargs)
	},
	"int": func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		// Parsing a long run of digits is a step of quadratic time, and makes an integer past maxIntBits.
		if len(args) > 0 {
			if s, ok := args[0].(starlark.String); ok && int64(len(s)) > maxIntBits/3 {
				return nil, &intTooLarge{what: "int() of a string of " + fmt.Sprint(len(s)) + " characters", bits: int64(len(s)) * 10 / 3}
			}
		}
		return callUniverse(th, "int", args, kwargs)
	},
	"str":   texting("str", false),
	"repr":  texting("repr", false),
	"fail":  texting("fail", false),
	"print": texting("print", true),
	"bytes": func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var n int64
		for _, a := range args {
			switch a := a.(type) {
			case starlark.String:
				n += int64(len(a))
			default:
				if k := lenOf(a); k >= 0 {
					n += int64(k)
				}
			}
		}
		if err := charge(th, "bytes", n); err != nil {
			return nil, err
		}
		return callUniverse(th, "bytes", args, kwargs)
	},
	"getattr": func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if len(args) >= 2 && len(kwargs) == 0 {
			if name, ok := args[1].(starlark.String); ok {
				if v, err := guardedAttr(args[0], string(name)); err == nil {
					return v, nil
				}
				// Missing: the built-in answers its default, or refuses in its own words.
			}
		}
		return callUniverse(th, "getattr", args, kwargs)
	},
}

// unsizedUniverse are the built-in functions that allocate at most a constant or what their argument holds.
var unsizedUniverse = map[string]bool{
	"None": true, "True": true, "False": true, "abs": true, "any": true, "all": true, "bool": true, "chr": true,
	"dir": true, "float": true, "hasattr": true, "hash": true, "len": true, "max": true, "min": true,
	"ord": true, "range": true, "type": true,
}

func callUniverse(th *starlark.Thread, name string, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return starlark.Universe[name].(*starlark.Builtin).CallInternal(th, args, kwargs)
}

// sizedArgs makes the first argument's length known (gathering an iterable of unknown length, charged) and answers
// it.
func sizedArgs(th *starlark.Thread, what string, args starlark.Tuple) (starlark.Tuple, int64, error) {
	if len(args) == 0 {
		return args, 0, nil
	}
	args = append(starlark.Tuple{}, args...)
	v, n, err := sized(th, what, args[0])
	if err != nil {
		return nil, 0, err
	}
	args[0] = v
	return args, int64(n), nil
}

// collecting guards a built-in that makes a collection of its first argument's elements, per bytes each.
func collecting(name string, per int64) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		args, n, err := sizedArgs(th, name, args)
		if err != nil {
			return nil, err
		}
		if err := charge(th, name, n*per); err != nil {
			return nil, err
		}
		return callUniverse(th, name, args, kwargs)
	}
}

// texting guards a built-in that writes its arguments as text; discard drops the text (print: a handler's output
// goes nowhere).
func texting(name string, discard bool) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		left := remaining(th)
		if left >= 0 {
			var n int64
			for _, a := range args {
				if _, ok := a.(starlark.String); ok && name == "str" {
					continue // str of a string is the string itself
				}
				n += deepSize(a, left-n)
				if n > left {
					break
				}
			}
			if err := charge(th, name, n); err != nil {
				return nil, err
			}
		}
		if discard {
			return starlark.None, nil
		}
		return callUniverse(th, name, args, kwargs)
	}
}
