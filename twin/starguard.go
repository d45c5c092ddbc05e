package twin

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"go.starlark.net/starlark"
)

// Provided code (the caller's own handlers) runs in the process that hosts the twin, so it is held to a memory
// budget. go.starlark.net bounds a thread's steps, not its memory, and one step can allocate without bound: "a" *
// (1 << 29), a string doubled thirty times, list(range(1 << 30)), a repr of a list that holds itself a thousand
// times over. So every operation that can allocate more than a step's constant is charged, before it allocates,
// to a budget per call (RuntimeOptions.MaxAllocBytes): the operators (rewritten, when the file is compiled, into
// calls of guard functions the source cannot name), slices, augmented assignments, argument unpacking, the
// built-in functions that copy or grow (overridden) and the methods of strings, lists, dicts and sets that do
// (wrapped where they are looked up), and doppel's own world.get, world.put, deepcopy and the answer's rendering.
// What is left allocates a bounded amount per step, so a call holds at most its budget plus its steps times a
// constant. A call past its budget stops there and answers the tool's own error (ErrHandlerMemory); the file's top
// level, run once when the bundle loads, has the same budget. Synthesized handlers are doppel's own code and run
// unguarded.

// DefaultMaxAllocBytes is a provided handler's memory budget per call unless RuntimeOptions.MaxAllocBytes says
// otherwise.
const DefaultMaxAllocBytes = 64 << 20

// ErrHandlerMemory: a provided handler's call would allocate past its memory budget.
var ErrHandlerMemory = errors.New("handler memory budget exceeded")

// memoryError is the refusal of an allocation past the budget.
type memoryError struct {
	what        string
	want, limit int64
}

func (e *memoryError) Error() string {
	return fmt.Sprintf("%s would allocate %s, past the handler's memory budget of %s per call", e.what, bytesText(e.want), bytesText(e.limit))
}

func (e *memoryError) Unwrap() error { return ErrHandlerMemory }

func bytesText(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

const allocKey = "doppel.alloc"

// allocBudget is what a guarded thread may still allocate through charged operations.
type allocBudget struct {
	used, limit int64
}

// guard gives th a fresh budget of limit bytes.
func guard(th *starlark.Thread, limit int64) {
	th.SetLocal(allocKey, &allocBudget{limit: limit})
}

// budgetOf is th's budget, nil for an unguarded thread.
func budgetOf(th *starlark.Thread) *allocBudget {
	b, _ := th.Local(allocKey).(*allocBudget)
	return b
}

// charge takes n bytes of th's budget for what, or refuses them (the budget unchanged) when they would pass it. An
// unguarded thread is never refused.
func charge(th *starlark.Thread, what string, n int64) error {
	b := budgetOf(th)
	if b == nil || n <= 0 {
		return nil
	}
	if n > b.limit-b.used {
		return &memoryError{what: what, want: n, limit: b.limit}
	}
	b.used += n
	return nil
}

// remaining is what th may still allocate (-1: unguarded).
func remaining(th *starlark.Thread) int64 {
	b := budgetOf(th)
	if b == nil {
		return -1
	}
	return b.limit - b.used
}

// chargeDeep charges what writing v as text takes (deepSize), walking no further than th's budget.
func chargeDeep(th *starlark.Thread, what string, v starlark.Value) error {
	left := remaining(th)
	if left < 0 {
		return nil
	}
	return charge(th, what, deepSize(v, left))
}

// chargeStruct charges what copying or converting v takes when its strings are shared, not copied (structSize).
func chargeStruct(th *starlark.Thread, what string, v starlark.Value) error {
	left := remaining(th)
	if left < 0 {
		return nil
	}
	return charge(th, what, structSize(v, left))
}

// Sizes of the model charged: a value slot (an interface: a list element, a tuple's, an argument), a dict or set
// entry, and a value's own header.
const (
	slotBytes  = 16
	entryBytes = 64
	headBytes  = 32
)

// deepSize is an upper estimate of the bytes a deep copy, conversion or rendering of v takes — its text as repr
// writes it, plus the slots and entries of its containers — walking at most limit bytes' worth: past it, it answers
// more than limit. A value that holds one list many times over is counted as many times as a copy or its text
// would hold it.
func deepSize(v starlark.Value, limit int64) int64 {
	w := sizeWalk{limit: limit}
	w.walk(v, 0)
	return w.n
}

// structSize is deepSize of a copy or conversion that shares v's strings (deepcopy, world.get's row, world.put's
// conversion): its containers' slots and entries, and a header per leaf.
func structSize(v starlark.Value, limit int64) int64 {
	w := sizeWalk{limit: limit, shared: true}
	w.walk(v, 0)
	return w.n
}

type sizeWalk struct {
	n, limit int64
	shared   bool // strings and bytes are shared, not copied
}

func (w *sizeWalk) over() bool { return w.n > w.limit }

func (w *sizeWalk) walk(v starlark.Value, depth int) {
	if w.over() {
		return
	}
	if depth > maxSizeDepth {
		w.n = w.limit + 1 // too deep to convert or render anyway
		return
	}
	switch x := v.(type) {
	case starlark.NoneType, starlark.Bool:
		w.n += 8
	case starlark.Int:
		w.n += intBytes(x)*3 + 8 // decimal digits take up to ~2.4 bytes per byte of magnitude
	case starlark.Float:
		w.n += 32
	case starlark.String:
		w.n += headBytes
		if !w.shared {
			w.n += reprLen(string(x))
		}
	case starlark.Bytes:
		w.n += headBytes
		if !w.shared {
			w.n += 4 * int64(len(x))
		}
	case *starlark.List:
		w.n += headBytes
		for i := 0; i < x.Len() && !w.over(); i++ {
			w.n += slotBytes
			w.walk(x.Index(i), depth+1)
		}
	case starlark.Tuple:
		w.n += headBytes
		for _, e := range x {
			if w.over() {
				return
			}
			w.n += slotBytes
			w.walk(e, depth+1)
		}
	case *starlark.Dict:
		w.n += headBytes
		for k, e := range x.Entries() {
			if w.over() {
				return
			}
			w.n += entryBytes
			w.walk(k, depth+1)
			w.walk(e, depth+1)
		}
	case *starlark.Set:
		w.n += headBytes
		for e := range starlark.Elements(x) {
			if w.over() {
				return
			}
			w.n += entryBytes
			w.walk(e, depth+1)
		}
	default:
		w.n += int64(len(v.String())) + headBytes
	}
}

// maxSizeDepth bounds how deep deepSize walks: deeper values are refused (the JSON model nests no deeper).
const maxSizeDepth = 512

// intBytes is the size of an int's magnitude in bytes.
func intBytes(x starlark.Int) int64 {
	if _, ok := x.Int64(); ok {
		return 8
	}
	return int64(x.BigInt().BitLen()/8 + 1)
}

// reprLen is the length of a string's quoted form: printable text as it is, escapes for the rest.
func reprLen(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\t' || c == '\r':
				n += 2
			case c < 0x20 || c == 0x7f:
				n += 4
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError && unicode.IsPrint(r) {
			n += int64(size)
		} else {
			n += 10
		}
		i += size
	}
	return n
}

// lenOf is the number of elements of an iterable, -1 when it cannot say without iterating.
func lenOf(v starlark.Value) int {
	return starlark.Len(v)
}

// materialize iterates an iterable of unknown length into a tuple, charging its slots as it goes.
func materialize(th *starlark.Thread, what string, v starlark.Value) (starlark.Tuple, error) {
	it, ok := v.(starlark.Iterable)
	if !ok {
		return nil, fmt.Errorf("%s: got %s, want iterable", what, v.Type())
	}
	var out starlark.Tuple
	iter := it.Iterate()
	defer iter.Done()
	var e starlark.Value
	for iter.Next(&e) {
		if err := charge(th, what, slotBytes); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// sized answers v as a value whose length is known: v itself, or its elements gathered into a tuple (charged). A
// value that is not iterable is answered as it is, with length 0, for the built-in to refuse in its own words.
func sized(th *starlark.Thread, what string, v starlark.Value) (starlark.Value, int, error) {
	if n := lenOf(v); n >= 0 {
		return v, n, nil
	}
	if _, ok := v.(starlark.Iterable); !ok {
		return v, 0, nil
	}
	t, err := materialize(th, what, v)
	return t, len(t), err
}
