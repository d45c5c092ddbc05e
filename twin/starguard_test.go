package twin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"

	"go.starlark.net/starlark"
)

// guardBundle is a bundle with one provided tool, "run", whose handler is src, over a table "t" of one row.
func guardBundle(src string) *Bundle {
	return &Bundle{Format: FormatVersion, SchemaSource: "provided",
		Tools: []Tool{{Name: "run", Binding: BindingProvided, Rung: RungProvided, Kind: KindWrite, Provided: src, Table: "t", KeyArg: "id"}},
		Tables: []Table{{Name: "t", Key: "id", KeyInRow: true, Rows: []Row{
			{Key: "r1", JSON: `{"id": "r1", "text": "` + strings.Repeat("x", 1000) + `", "tags": ["a", "b", "c"], "n": 7}`}}}},
	}
}

// allocated is what f allocates on the heap, in bytes.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A provided handler that builds a large value in one step — or in a few dozen — is stopped before it allocates
// it: the call answers the tool's own error naming the budget, the world is unchanged, and what the call allocated
// stays within a few budgets. Without the guard each of these allocates hundreds of MiB to GiBs (or never ends).
func TestProvidedHandlerMemoryBudget(t *testing.T) {
	const budget = 4 << 20
	attacks := []struct{ name, body, want string }{
		{"string repeat", `return "a" * (256 << 20)`, ""},
		{"repeat on the left", `return (256 << 20) * "a"`, ""},
		{"string doubling", "s = \"a\"\n    for i in range(40):\n        s = s + s\n    return s", ""},
		{"augmented doubling", "s = \"a\"\n    for i in range(40):\n        s += s\n    return s", ""},
		{"list doubling", "l = [0]\n    for i in range(40):\n        l += l\n    return len(l)", ""},
		{"extend doubling", "l = [0]\n    for i in range(40):\n        l.extend(l)\n    return len(l)", ""},
		{"list repeat", `return len([0] * (1 << 28))`, ""},
		{"tuple repeat", `return len((0,) * (1 << 28))`, ""},
		{"list of a range", `return len(list(range(1 << 28)))`, ""},
		{"sorted range", `return len(sorted(range(1 << 28)))`, ""},
		{"tuple of a range", `return len(tuple(range(1 << 28)))`, ""},
		{"dict of zip", `return len(dict(zip(range(1 << 26), range(1 << 26))))`, ""},
		{"enumerate", `return len(enumerate(range(1 << 26)))`, ""},
		{"spread arguments", "f = lambda *a: len(a)\n    return f(*range(1 << 28))", ""},
		{"join", `return len("x".join(["a" * 1000] * 100000))`, ""},
		{"replace", `return len(("a" * 10000).replace("a", "b" * 10000))`, ""},
		{"percent format", `return len(("%s" * 1000) % tuple(["a" * 100000] * 1000))`, ""},
		{"str.format", `return len(("{0}" * 10000).format("a" * 100000))`, ""},
		{"upper in a loop", "s = \"a\" * 1000000\n    keep = []\n    for i in range(1000):\n        keep.append(s.upper())\n    return len(keep)", ""},
		{"slices in a loop", "l = [0] * 1000000\n    keep = []\n    for i in range(1000):\n        keep.append(l[:])\n    return len(keep)", ""},
		{"reversed slices", "s = \"ab\" * 500000\n    keep = []\n    for i in range(1000):\n        keep.append(s[::-1])\n    return len(keep)", ""},
		{"big int squaring", "x = 3\n    for i in range(40):\n        x = x * x\n    return x > 0", "65536 bits"},
		{"big int shifts kept", "x = 1 << 500\n    keep = []\n    for i in range(100000):\n        x = x << 500\n        keep.append(x)\n    return len(keep)", "65536 bits"},
		{"int of digits", `return int("9" * 100000)`, "65536 bits"},
		{"nested list str", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    return len(str(a))", ""},
		{"nested list answer", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    return {\"a\": a}", ""},
		{"nested list put", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    world.put(\"t\", \"r2\", {\"id\": \"r2\", \"a\": a})\n    return \"ok\"", ""},
		{"nested list deepcopy", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    return len(deepcopy(a))", ""},
		{"nested list repr", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    return len(repr(a))", ""},
		{"nested list pystr", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    return len(pystr(a))", ""},
		{"nested list fail", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    fail(a)", ""},
		{"nested list print", "a = [1]\n    for i in range(40):\n        a = [a, a]\n    print(a)\n    return 1", ""},
		{"world.get copies kept", "keep = []\n    for i in range(200000):\n        keep.append(world.get(\"t\", \"r1\"))\n    return len(keep)", ""},
		{"method through getattr", `return len(getattr("x", "join")(["a" * 1000] * 100000))`, ""},
		{"method kept as a value", "j = \"x\".join\n    return len(j([\"a\" * 1000] * 100000))", ""},
		{"calc power", `return calc("(2**1024)**1024")`, "65536 bits"},
		{"calc product", `return calc("*".join(["(2**1000)"] * 100000))`, "65536 bits"},
		{"dict union", "d = {i: i for i in range(1000)}\n    keep = []\n    for i in range(20000):\n        keep.append(d | d)\n    return len(keep)", ""},
		{"list concatenation kept", "l = [0] * 100000\n    keep = []\n    for i in range(1000):\n        keep.append(l + l)\n    return len(keep)", ""},
		{"split", `return len(("a," * 5000000).split(","))`, ""},
		{"items kept", "d = {i: i for i in range(10000)}\n    keep = []\n    for i in range(1000):\n        keep.append(d.items())\n    return len(keep)", ""},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			src := "def handle(args):\n    " + a.body + "\n"
			rt, err := NewRuntime(guardBundle(src), RuntimeOptions{MaxAllocBytes: budget, MaxSteps: 10_000_000})
			if err != nil {
				t.Fatal(err)
			}
			s := open(t, rt, SessionSpec{})
			h0 := s.StateHash()
			var res Result
			n := allocated(func() {
				res, err = s.Call(context.Background(), "run", json.RawMessage(`{}`))
			})
			if err != nil {
				t.Fatal(err)
			}
			want := a.want
			if want == "" {
				want = "memory budget"
			}
			if !res.Error || res.Rung != RungProvided || res.Fidelity != FidelityExecuted || !strings.Contains(res.Content, want) {
				t.Fatalf("answer %+v, want the tool's own error naming %q", res, want)
			}
			if s.StateHash() != h0 || res.Changed {
				t.Errorf("a call over its budget changed the world")
			}
			if n > 8*budget {
				t.Errorf("the call allocated %d MiB, want at most a few budgets of %d MiB", n>>20, budget>>20)
			}
		})
	}
}

// The file's top level runs under the budget too, where the bundle loads and where uploaded code is checked.
func TestProvidedTopLevelMemoryBudget(t *testing.T) {
	src := "big = \"a\" * (256 << 20)\ndef handle(args):\n    return len(big)\n"
	if _, err := NewRuntime(guardBundle(src), RuntimeOptions{MaxAllocBytes: 4 << 20}); !errors.Is(err, ErrHandlerMemory) {
		t.Fatalf("NewRuntime = %v, want ErrHandlerMemory", err)
	}
	if err := CheckHandler("run", src); !errors.Is(err, ErrHandlerMemory) || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("CheckHandler = %v, want a refusal naming the memory budget", err)
	}
}

// A call's budget is its own: the next call starts afresh, and a handler that uses most of it every call keeps
// answering.
func TestBudgetIsPerCall(t *testing.T) {
	src := "def handle(args):\n    s = \"a\" * (3 << 20)\n    return len(s)\n"
	rt, err := NewRuntime(guardBundle(src), RuntimeOptions{MaxAllocBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, rt, SessionSpec{})
	for i := range 5 {
		res, err := s.Call(context.Background(), "run", json.RawMessage(`{}`))
		if err != nil || res.Error || res.Content != fmt.Sprint(3<<20) {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
	}
}

// The rewrite changes what provided code allocates, not what it computes: each snippet answers the same in a
// guarded handler as in an unguarded one (aliasing of +=, index and field targets evaluated once, slices of every
// kind, the guarded methods and built-ins, errors).
func TestGuardedCodeComputesTheSame(t *testing.T) {
	snippets := []string{
		`1 + 2 * 3 - 4 // 3 % 5`, `7 / 2`, `-(3 << 70) >> 3`, `~5`, `+5`, `2 * "ab"`, `"ab" * 2`, `[1, 2] * 2`, `(1,) * 3`,
		`"%s-%d" % ("a", 3)`, `"%(x)s" % {"x": 1}`, `{1: 2} | {3: 4}`, `set([1, 2]) | set([3])`, `set([1, 2]) & set([2])`,
		`set([1, 2]) ^ set([2, 3])`, `set([1, 2]) - set([2])`, `5 & 3`, `5 | 3`, `5 ^ 3`, `1.5 + 2`, `"a" + "b"`, `[1] + [2]`,
		`(1,) + (2,)`, `b"ab" + b"c"`, `b"ab" * 2`,
		`"hello"[1:4]`, `"hello"[::-1]`, `"hello"[::2]`, `"hello"[-3:]`, `"hello"[:-10]`, `"hello"[10:]`, `"hello"[4:1:-1]`,
		`[1, 2, 3, 4, 5][1::2]`, `[1, 2, 3, 4, 5][::-2]`, `[1, 2, 3][-100:100]`, `(1, 2, 3)[1:]`, `range(10)[2:8:3]`,
		`b"hello"[1:3]`, `[1, 2, 3][5:1]`, `"hello"[-1:-6:-1]`,
		`"a,b,c".split(",")`, `"a b".split()`, `"a\nb".splitlines()`, `"-".join(["a", "b"])`, `"aXbX".replace("X", "--")`,
		`"aXbX".replace("X", "", 1)`, `"{} {x}".format(1, x=2)`, `"Abc".lower() + "Abc".upper() + " x ".strip()`,
		`"abc".title() + "abc".capitalize()`, `"abc".removeprefix("a") + "abc".removesuffix("c")`,
		`{1: 2}.items()`, `{1: 2}.keys()`, `{1: 2}.values()`, `set([1]).union([2])`, `set([1, 2]).difference([1])`,
		`set([1, 2]).intersection([1])`, `set([1, 2]).symmetric_difference([2, 3])`,
		`list("abc".elems())`, `tuple([1, 2])`, `sorted([3, 1, 2], reverse=True)`, `reversed([1, 2])`, `enumerate("ab".elems())`,
		`dict([(1, 2)], x=3)`, `zip([1, 2], "ab".elems())`, `str(1.5) + repr("a") + str([1, "b"])`, `bytes("ab")`,
		`getattr("a,b", "split")(",")`, `getattr([], "nope", 7)`, `hasattr("", "join")`, `len(range(5))`,
		`[x * 2 for x in range(3) if x + 1 > 1]`, `{k: v + 1 for k, v in {"a": 1}.items()}`, `(lambda x=1 + 1: x * 2)()`,
		`calc("2**10 * 3")`, `deepcopy([[1], {"a": (1, 2)}])`, `pystr([1.0, None])`,
		// errors answer the same text
		`1 + "a"`, `"a" * "b"`, `[1][1:2:0]`, `"x".nope`, `{}.nope()`, `(1).bit_length()`,
		`"a".join(1)`, `"a".join([1])`, `"a".replace(1, 2)`, `"{".format()`, `"%d" % "x"`, `list(1)`, `sorted(1)`, `zip(1)`,
		`dict(1)`, `int("12") + int("ff", 16)`, `str()`, `getattr("a", "nope")`, `"ab"[1.5:]`, `[1, 2]["a":]`, `1 << -1`,
		`(1 << 70) * (1 << 70)`, `-(1 << 200)`, `"a" * -3`, `[1] * 0`, `"a,b".split(",", 1)`, `bytes([65, 66])`, `(1).join`, `[].upper()`,
	}
	var stmts []string
	stmts = append(stmts,
		"l = [1]\n    m = l\n    l += [2]\n    return (l, m)",
		"s = \"a\"\n    s += \"b\"\n    s *= 2\n    return s",
		"d = {\"a\": [1]}\n    d[\"a\"] += [2]\n    d[\"a\"] *= 2\n    return d",
		"n = [0]\n    c = [0]\n    def k():\n        c[0] += 1\n        return 0\n    n[k()] += 5\n    return (n, c)",
		"x = {\"a\": 1}\n    x |= {\"b\": 2}\n    y = set([1])\n    y |= set([2])\n    return (x, y)",
		"t = (1,)\n    t += (2,)\n    return t",
		"f = frozen_list()\n    f += [1]\n    return f",
	)
	for _, e := range snippets {
		stmts = append(stmts, "return "+e)
	}
	for _, body := range stmts {
		src := "def frozen_list():\n    return FROZEN\nFROZEN = [0]\ndef handle(args):\n    " + body + "\n"
		got := evalBoth(t, src)
		if got[0] != got[1] {
			t.Errorf("%s\n  guarded:   %s\n  unguarded: %s", body, got[0], got[1])
		}
	}
}

// evalBoth runs src's handle() guarded and unguarded and answers what each gave (its answer's text or its error).
func evalBoth(t *testing.T, src string) [2]string {
	t.Helper()
	pre := predeclared()
	pre.Freeze()
	guarded := guardedPredeclared(pre)
	guarded.Freeze()
	var out [2]string
	for i := range 2 {
		var fn starlark.Callable
		var err error
		if i == 0 {
			fn, err = compileProvided("handle", src, guarded, DefaultMaxAllocBytes)
		} else {
			fn, err = compileHandler("handle", "synthesized", src, pre)
		}
		if err != nil {
			out[i] = "compile: " + err.Error()
			continue
		}
		th := &starlark.Thread{}
		if i == 0 {
			guard(th, DefaultMaxAllocBytes)
		}
		v, err := starlark.Call(th, fn, starlark.Tuple{starlark.NewDict(0)}, nil)
		if err != nil {
			out[i] = "error: " + err.Error()
			continue
		}
		out[i] = v.Type() + " " + v.String()
	}
	return out
}

// Every built-in function and every method of go.starlark.net's built-in types is classified: guarded (it can
// allocate more than a constant, and is charged) or known to allocate at most a constant. A new one, after an
// upgrade of go.starlark.net, fails here until it is classified.
func TestEveryBuiltinIsClassified(t *testing.T) {
	for name := range starlark.Universe {
		if universeGuards[name] == nil && !unsizedUniverse[name] {
			t.Errorf("built-in %s is neither guarded nor known to allocate at most a constant", name)
		}
	}
	values := map[string]starlark.Value{"string": starlark.String(""), "bytes": starlark.Bytes(""),
		"list": starlark.NewList(nil), "dict": starlark.NewDict(0), "set": starlark.NewSet(0)}
	var names []string
	for typ, v := range values {
		for _, m := range v.(starlark.HasAttrs).AttrNames() {
			k := methodKey{typ, m}
			if methodGuards[k] == nil && !unsizedMethods[k] {
				names = append(names, typ+"."+m)
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		t.Errorf("method %s is neither guarded nor known to allocate at most a constant", n)
	}
	for k := range methodGuards {
		if unsizedMethods[k] {
			t.Errorf("method %s.%s is in both lists", k.typ, k.name)
		}
	}
}
