package jsonvalue

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseKeepsOrderAndSpelling(t *testing.T) {
	in := `{"b": 1, "a": [1.0, 2e3, -0, "x\u00e9\ud83d\ude00"], "c": {"z": null, "y": true}}`
	v, err := ParseString(in)
	if err != nil {
		t.Fatal(err)
	}
	o := v.(*Object)
	if got := o.Keys; len(got) != 3 || got[0] != "b" || got[1] != "a" || got[2] != "c" {
		t.Fatalf("keys = %v, want [b a c]", got)
	}
	a, _ := o.Get("a")
	l := a.([]any)
	if l[0] != Number("1.0") || l[1] != Number("2e3") || l[2] != Number("-0") {
		t.Fatalf("numbers = %v, want spellings kept", l[:3])
	}
	if l[3] != "xé😀" {
		t.Fatalf("string = %q", l[3])
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{``, `{`, `{"a" 1}`, `[1,]`, `{"a":1}x`, `"\x"`, `01`, `1.`, `tru`} {
		if _, err := ParseString(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b": 2.0, "a": {"d": 1, "c": [3, 4.50]}}`, `{"a":{"c":[3,4.5],"d":1},"b":2}`},
		{`"tab\there\u0001"`, `"tab\u0009here\u0001"`},
		{`1e2`, `100`},
		{`-0.0`, `0`},
		{`12345678901234567890`, `12345678901234567890`},
		{`0.1`, `0.1`},
	}
	for _, tt := range tests {
		v, err := ParseString(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(Canonical(v)); got != tt.want {
			t.Errorf("Canonical(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestEqualAndIdentical(t *testing.T) {
	tests := []struct {
		a, b             string
		equal, identical bool
	}{
		{`{"a": 1, "b": 2}`, `{"b": 2, "a": 1}`, true, false},
		{`{"a": 1, "b": 2}`, `{"a": 1, "b": 2}`, true, true},
		{`1200.0`, `1200`, true, false},
		{`12345678901234567890`, `12345678901234567891`, false, false},
		{`{"a": [1, 2]}`, `{"a": [2, 1]}`, false, false},
		{`"x"`, `"x"`, true, true},
		{`null`, `false`, false, false},
		{`68.92000000000004`, `68.92`, false, false},
	}
	for _, tt := range tests {
		a, b := mustParse(tt.a), mustParse(tt.b)
		if got := Equal(a, b); got != tt.equal {
			t.Errorf("Equal(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.equal)
		}
		if got := Identical(a, b); got != tt.identical {
			t.Errorf("Identical(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.identical)
		}
	}
}

// Nested objects and arrays read back whole, a repeated key keeps its first place and last value,
// and every parsed object and array is exactly as long as its members (no spare capacity held).
func TestParseNestedExact(t *testing.T) {
	in := `{"a": [1, {"k": [], "j": {}}, [2, [3, 4]], "s"], "b": {"x": 1, "y": [true, false], "x": 2}, "c": [], "d": {}}`
	v, err := ParseString(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(Canonical(v)); got != `{"a":[1,{"j":{},"k":[]},[2,[3,4]],"s"],"b":{"x":2,"y":[true,false]},"c":[],"d":{}}` {
		t.Fatalf("canonical = %s", got)
	}
	b, _ := v.(*Object).Get("b")
	if keys := b.(*Object).Keys; len(keys) != 2 || keys[0] != "x" || keys[1] != "y" {
		t.Fatalf("b's keys = %v, want [x y]", keys)
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case *Object:
			if cap(x.Keys) != len(x.Keys) || cap(x.Vals) != len(x.Vals) || x.Keys == nil {
				t.Errorf("object keys %d/%d vals %d/%d (len/cap)", len(x.Keys), cap(x.Keys), len(x.Vals), cap(x.Vals))
			}
			for _, m := range x.Vals {
				walk(m)
			}
		case []any:
			if cap(x) != len(x) || x == nil {
				t.Errorf("array %d/%d (len/cap)", len(x), cap(x))
			}
			for _, m := range x {
				walk(m)
			}
		}
	}
	walk(v)
}

// Objects past bigObject keys look their keys up by index: a key repeated before and after that
// size still keeps its first place and last value, and nested objects keep their own keys apart.
func TestParseBigObjectRepeatedKeys(t *testing.T) {
	for _, n := range []int{bigObject - 1, bigObject, bigObject + 1, 3 * bigObject} {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, `"k%d": %d, `, i, i)
		}
		fmt.Fprintf(&b, `"k0": "last", "k%d": {"k0": 1, "k0": 2}, "k1": "again"}`, n-1)
		v, err := ParseString(b.String())
		if err != nil {
			t.Fatal(err)
		}
		o := v.(*Object)
		if o.Len() != n {
			t.Fatalf("n=%d: %d keys, want %d", n, o.Len(), n)
		}
		for i, k := range o.Keys {
			if k != fmt.Sprintf("k%d", i) {
				t.Fatalf("n=%d: key %d is %q", n, i, k)
			}
		}
		first, _ := o.Get("k0")
		second, _ := o.Get("k1")
		last, _ := o.Get(fmt.Sprintf("k%d", n-1))
		if first != "last" || second != "again" || string(Canonical(last)) != `{"k0":2}` {
			t.Fatalf("n=%d: k0=%v k1=%v last=%s", n, first, second, Canonical(last))
		}
	}
}

// ParseStringShared reads every document as ParseString does (same keys, order, spelling and
// errors) while allocating no copy of unescaped strings and numbers.
func TestParseStringSharedSameAsParseString(t *testing.T) {
	docs := []string{
		`{"b": 1, "a": [1.0, 2e3, -0, "x\u00e9\ud83d\ude00"], "c": {"z": null, "y": true}}`,
		`{"k": "plain", "k": "again", "esc": "tab\there", "bad": "` + "\xff\xfe" + `", "n": -12.50e+3}`,
		`"just a string"`, `42`, `[NaN, Infinity, -Infinity]`, `{}`, `[]`,
		`{"unterminated": "x`, `{"a": 1} trailing`, `[1, 2,]`,
	}
	for _, d := range docs {
		want, werr := ParseString(d)
		got, gerr := ParseStringShared(d)
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("%q: err %v, ParseString's %v", d, gerr, werr)
		}
		if werr == nil && (string(Canonical(got)) != string(Canonical(want)) || !Identical(got, want)) {
			t.Fatalf("%q: %s, ParseString gave %s", d, Canonical(got), Canonical(want))
		}
		if o, ok := want.(*Object); ok && fmt.Sprint(o.Keys) != fmt.Sprint(got.(*Object).Keys) {
			t.Fatalf("%q: keys %v, want %v", d, got.(*Object).Keys, o.Keys)
		}
	}
	var b strings.Builder
	b.WriteString("[")
	for i := range 200 {
		fmt.Fprintf(&b, `{"name": "value %d", "price": %d.5},`, i, i)
	}
	b.WriteString(`{}]`)
	doc := b.String()
	plain := testing.AllocsPerRun(5, func() { _, _ = ParseString(doc) })
	shared := testing.AllocsPerRun(5, func() { _, _ = ParseStringShared(doc) })
	if shared >= plain-500 {
		t.Fatalf("ParseStringShared made %.0f allocations, ParseString %.0f: its 600 strings and numbers were copied", shared, plain)
	}
}
