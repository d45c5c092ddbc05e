package jsonvalue

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"testing"
)

func mustParse(s string) any {
	v, err := ParseString(s)
	if err != nil {
		panic(err)
	}
	return v
}

// text is a JSON document in a test table, read with Parse (and, where it says so, with Decode).
type text string

// canonicalGolden is a fixed set of values with their canonical bytes and the hex SHA-256 of those bytes.
// World and state hashes are SHA-256 trees over exactly these bytes (see twin/hash.go), so a change here
// changes world hashes: it must be deliberate.
var canonicalGolden = []struct {
	name string
	v    any
	want string
	sum  string
}{
	{
		"unsorted nested object",
		text(`{"zeta": 1, "alpha": {"y": [3, 2, 1], "x": {"b": null, "a": true}}, "Beta": false, "": "empty key", "é": "e-acute", "aa": 0}`),
		`{"":"empty key","Beta":false,"aa":0,"alpha":{"x":{"a":true,"b":null},"y":[3,2,1]},"zeta":1,"é":"e-acute"}`,
		"8b273519917df2b594cc4bcd0cca1aaaf24946b57022d6063c49c3b41a71b87c",
	},
	{
		"unicode, escaped and raw",
		text(`"héllo wörld, 日本語, 🎉, \u00e9\ud83d\ude00"`),
		`"héllo wörld, 日本語, 🎉, é😀"`,
		"96c3d366e4aecd4e5cb9de4c212acbdda4f6306b49f616f8dcb5174d38a72056",
	},
	{
		"escapes: only quote, backslash and control characters, as \\u00xx",
		text(`"quote\" backslash\\ slash\/ nl\n tab\t cr\r bs\b ff\f nul\u0000 us\u001f del\u007f"`),
		"\"quote\\\" backslash\\\\ slash/ nl\\u000a tab\\u0009 cr\\u000d bs\\u0008 ff\\u000c nul\\u0000 us\\u001f del\x7f\"",
		"704fac4af07ab969989ed0187c06cf5e444796ec5a28aa69fe7dddbe5561fc88",
	},
	{
		"no HTML escapes, no line-separator escapes",
		text(`"html <b>&amp;</b> and \u2028 \u2029 separators"`),
		"\"html <b>&amp;</b> and \u2028 \u2029 separators\"",
		"96eab143146614234ec078eb1198eff11889a31dfc0d40efaf6df0c04b03584a",
	},
	{
		"invalid UTF-8 written as it is",
		"raw invalid \xff\xfe utf8",
		"\"raw invalid \xff\xfe utf8\"",
		"4e73d38b8f9344de2dbb6a184456da84b6f0b94cd08c73eb564a9140d01e89e3",
	},
	{
		"numbers by value: 1200.0 is 1200",
		text(`[1200.0, 1200, -0, -0.0, 1e2, 1E+2, 0.1, 1.5e-7, -123.456, 2.50, 100e-2]`),
		`[1200,1200,0,0,100,100,0.1,1.5e-07,-123.456,2.5,1]`,
		"e32a43c9384304465e9399c19616bc37b5ff94668156f7f4bd84c346e49e1f50",
	},
	{
		"integers beyond int64 stay exact",
		text(`[12345678901234567890, -98765432109876543210, 9007199254740993, 9223372036854775807, -9223372036854775808, 9223372036854775808]`),
		`[12345678901234567890,-98765432109876543210,9007199254740993,9223372036854775807,-9223372036854775808,9223372036854775808]`,
		"8869a627451064ac8527bde2b6cd278b22a0c9e015aaee562d985a7c40a05833",
	},
	{
		"large, small and out-of-range floats",
		text(`[1e16, 1.0e300, 5e-324, 1e400, -1e400, 68.92000000000004, 0.30000000000000004]`),
		`[1e+16,1e+300,5e-324,1e400,-1e400,68.92000000000004,0.30000000000000004]`,
		"28f97f94a48890bfabc9b8e82302aff2545dc7754eda77f22602b4470673f766",
	},
	{
		"non-finite numbers as Python spells them",
		[]any{Number("NaN"), Number("Infinity"), Number("-Infinity")},
		`[NaN,Infinity,-Infinity]`,
		"b1ec71618b1e885b866bc52473ebb29432cd8babf979d53a05c12053c0f1a9c9",
	},
	{
		"null, bools, empty containers",
		text(`[null, true, false, [], {}, [[]], [{}], "", 0]`),
		`[null,true,false,[],{},[[]],[{}],"",0]`,
		"a2a7a9dd6506158beceddcbe3b772173cc83e7611968d0a71bee320631cb1322",
	},
	{
		"deep nesting",
		text(`{"b": [1, {"d": "x", "c": [null]}], "a": {"nested": {"deeper": {"deepest": [1.5, "s", null, true]}}}}`),
		`{"a":{"nested":{"deeper":{"deepest":[1.5,"s",null,true]}}},"b":[1,{"c":[null],"d":"x"}]}`,
		"098de963727c54af35c58a14cb17e5339f4ce101e528b94a099b521216de00de",
	},
}

// canonicalGoldenSet is the hex SHA-256 of the canonical JSON of the array of every canonicalGolden value.
const canonicalGoldenSet = "4a92d2bfad25b8ea5cfdae8b86d1691fb60cc9019ab068d3c2a26bc52dba882e"

func TestCanonicalGolden(t *testing.T) {
	all := make([]any, 0, len(canonicalGolden))
	for _, g := range canonicalGolden {
		v := g.v
		if s, ok := v.(text); ok {
			v = mustParse(string(s))
		}
		all = append(all, v)
		got := Canonical(v)
		if string(got) != g.want {
			t.Errorf("%s: Canonical = %q, want %q", g.name, got, g.want)
		}
		if sum := sha256.Sum256(got); hex.EncodeToString(sum[:]) != g.sum {
			t.Errorf("%s: sha256 = %x, want %s", g.name, sum, g.sum)
		}
	}
	if sum := sha256.Sum256(Canonical(all)); hex.EncodeToString(sum[:]) != canonicalGoldenSet {
		t.Errorf("the whole set: sha256 = %x, want %s", sum, canonicalGoldenSet)
	}
}

// TestCanonicalDecodedForm: a document read with Decode (map[string]any, json.Number) has the same canonical
// bytes as read with Parse.
func TestCanonicalDecodedForm(t *testing.T) {
	for _, g := range canonicalGolden {
		s, ok := g.v.(text)
		if !ok {
			continue
		}
		v, err := Decode([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		if got := Canonical(v); string(got) != g.want {
			t.Errorf("%s: Canonical(Decode) = %q, want %q", g.name, got, g.want)
		}
	}
}

// TestCanonicalGoValues pins the forms encoding/json gives and what the writer does with other Go values.
func TestCanonicalGoValues(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"json.Number by value", json.Number("1200.0"), `1200`},
		{"json.Number beyond int64", json.Number("-12345678901234567890"), `-12345678901234567890`},
		{"float64 integral", float64(1200), `1200`},
		{"float64", 0.1, `0.1`},
		{"float64 large", 1e21, `1e+21`},
		{"float64 non-finite", []any{math.NaN(), math.Inf(1), math.Inf(-1)}, `[NaN,Infinity,-Infinity]`},
		{"map with sorted keys", map[string]any{"b": json.Number("2.50"), "a": []any{float64(1), nil, "<&>\n"}, "é": true}, `{"a":[1,null,"<&>\u000a"],"b":2.5,"é":true}`},
		{"other Go values: fmt form, quoted", []any{7, int64(-1), struct{}{}}, `["7","-1","{}"]`},
	}
	for _, tt := range tests {
		if got := string(Canonical(tt.v)); got != tt.want {
			t.Errorf("%s: Canonical = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestCanonicalDoc(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b":1,"a":[true,null,"x"]}`, `{"a":[true,null,"x"],"b":1}`},
		{`{"n":1.0,"m":1e3,"f":0.5,"big":12345678901234567890}`, `{"big":12345678901234567890,"f":0.5,"m":1000,"n":1}`},
		{` "s" `, `"s"`},
	}
	for _, tt := range tests {
		got, err := CanonicalDoc([]byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("CanonicalDoc(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	if _, err := CanonicalDoc([]byte(`{"a":1} {"b":2}`)); err == nil {
		t.Error("two documents accepted")
	}
}

func TestCanonicalString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote`, `back\slash`, "tab\there", "\x01", "é\u2028<>&", "bad \xff"} {
		if got, want := CanonicalString(s), string(Canonical(s)); got != want {
			t.Errorf("CanonicalString(%q) = %s, want %s", s, got, want)
		}
	}
}

// Canonical, CanonicalText and WithCanonical write from one pool of buffers: what the first two answer is the
// caller's own, so later calls never change it.
func TestCanonicalOwnsItsBytes(t *testing.T) {
	docs := []string{`{"b":[1,2.50,"x\u0001"],"a":null}`, `"plain"`, `[{"z":1,"y":{"k":true}}]`, `{}`}
	var got [][]byte
	var texts []string
	for _, d := range docs {
		v, err := ParseString(d)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, Canonical(v))
		texts = append(texts, CanonicalText(v))
		WithCanonical(v, func(b []byte) {
			if string(b) != texts[len(texts)-1] {
				t.Errorf("WithCanonical %q, CanonicalText %q", b, texts[len(texts)-1])
			}
		})
	}
	want := []string{`{"a":null,"b":[1,2.5,"x\u0001"]}`, `"plain"`, `[{"y":{"k":true},"z":1}]`, `{}`}
	for i := range want {
		if string(got[i]) != want[i] || texts[i] != want[i] {
			t.Errorf("%s: Canonical %s, CanonicalText %s, want %s", docs[i], got[i], texts[i], want[i])
		}
	}
}
