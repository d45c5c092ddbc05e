package twin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
)

// evalStar evaluates one Starlark expression in the handlers' dialect.
func evalStar(t *testing.T, expr string) starlark.Value {
	t.Helper()
	v, err := starlark.EvalOptions(fileOptions, &starlark.Thread{Name: "test"}, "expr", expr, nil)
	if err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	return v
}

// The direct renderer answers exactly what converting to the model and rendering did, text and error alike.
func TestRenderStarMatchesFromStarThenRender(t *testing.T) {
	exprs := []string{
		`None`, `True`, `False`, `0`, `-7`, `9223372036854775807`, `-9223372036854775808`,
		`123456789012345678901234567890`, `-123456789012345678901234567890`,
		`1.0`, `1200.0`, `0.1 + 0.2`, `1e-05`, `1e16`, `1e21`, `-0.0`, `float("nan")`, `float("inf")`, `-float("inf")`,
		`""`, `"plain"`, `"quote \" backslash \\ nl \n tab \t cr \r"`, `"ctl \x01 \x7f"`, `"<a href='x'>&</a>"`,
		`"é ü 中 😀 \u2028 \u2029"`, `"a" * 300`,
		`[]`, `()`, `[1, "two", 3.5, None, [True, {}]]`, `(1, (2, (3,)))`,
		`{}`, `{"b": 1, "a": [1, 2], "c": {"z": None, "y": "é"}}`, `{1: "int key", "1": "string key", (1, "x"): 2}`,
		`{"order": {"items": [{"price": 10.5, "qty": 2}, {"price": 1e-7, "qty": 0}], "status": "pending"}}`,
		`set([3, 1, 2])`, `set()`, `{"s": set(["x", "y"])}`,
		`[len]`, `{"f": len}`, `{"ok": 1, "bad": [1, len], "later": "x"}`,
	}
	values := make([]starlark.Value, len(exprs))
	for i, e := range exprs {
		values[i] = evalStar(t, e)
	}
	// Nested past the model's depth limit (deeper than Starlark's parser accepts), so built here.
	var deep starlark.Value = starlark.NewList(nil)
	for range jsonvalue.MaxDepth + 1 {
		deep = starlark.NewList([]starlark.Value{deep})
	}
	exprs, values = append(exprs, "a list nested past the depth limit"), append(values, deep)
	for _, st := range Styles() {
		for i, e := range exprs {
			v := values[i]
			var want, wantErr string
			if m, err := fromStar(v, st); err != nil {
				wantErr = err.Error()
			} else {
				want = Render(m, st)
			}
			got, err := renderStar(v, st, i%3*16)
			gotErr := ""
			if err != nil {
				gotErr, got = err.Error(), ""
			}
			if got != want || gotErr != wantErr {
				t.Errorf("%s, style %s: renderStar %q (error %q), want %q (error %q)", e, st.Name, got, gotErr, want, wantErr)
			}
		}
	}
}

// A row's template builds the same Starlark value toStar converts, fresh and mutable each time.
func TestStarTemplateMatchesToStar(t *testing.T) {
	rows := []string{
		`{}`, `{"a": 1}`, `{"b": [1, 2.5, 1200.0, "x", null, true], "a": {"n": 12345678901234567890, "m": -3}}`,
		`{"items": [{"id": "1", "opts": {"color": "red"}}, [], [[1], [2]]], "é": "ü", "z": 1e-7}`,
	}
	for _, r := range rows {
		v, err := jsonvalue.ParseString(r)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := makeTemplate(v)
		a, b := tmpl.build(), tmpl.build()
		want := toStar(v)
		for _, got := range []starlark.Value{a, b} {
			eq, err := starlark.Equal(got, want)
			if err != nil || !eq || got.String() != want.String() {
				t.Fatalf("%s: template built %s, toStar %s (%v)", r, got, want, err)
			}
		}
		// Each build is the handler's own: changing one changes neither the other nor the next.
		d := a.(*starlark.Dict)
		if err := d.SetKey(starlark.String("new"), starlark.MakeInt(1)); err != nil {
			t.Fatalf("%s: a built row is not mutable: %v", r, err)
		}
		if items, ok, _ := b.(*starlark.Dict).Get(starlark.String("items")); ok {
			if l, isList := items.(*starlark.List); isList {
				if err := l.Append(starlark.None); err != nil {
					t.Fatalf("%s: a built list is not mutable: %v", r, err)
				}
			}
		}
		if c := tmpl.build(); c.String() != want.String() {
			t.Fatalf("%s: a change to one build reached the next: %s", r, c)
		}
	}
}

// styledStringByByte is the escaping rule spelled one byte or rune at a time, the oracle for writeStyledString's
// runs of plain bytes.
func styledStringByByte(s string, st Style) string {
	var b strings.Builder
	u4 := func(r rune) { fmt.Fprintf(&b, `\u%04x`, r) }
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (r == 0x7f && st.ASCII):
			u4(r)
		case st.HTML && (r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029'):
			u4(r)
		case st.ASCII && r >= 0x10000:
			u4(0xD800 + ((r-0x10000)>>10)&0x3FF)
			u4(0xDC00 + (r-0x10000)&0x3FF)
		case st.ASCII && r >= 0x80:
			u4(r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func TestStyledStringRuns(t *testing.T) {
	alphabet := []string{"a", "Z", "0", " ", "\"", "\\", "\n", "\t", "\x01", "\x7f", "<", ">", "&", "é", "中", "😀", "\u2028", "/", "'"}
	rng := rand.New(rand.NewPCG(21, 3))
	cases := []string{"", "plain text only", strings.Repeat("x", 100)}
	for range 2000 {
		var sb strings.Builder
		for range rng.IntN(24) {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		cases = append(cases, sb.String())
	}
	for _, st := range Styles() {
		for _, c := range cases {
			var b strings.Builder
			writeStyledString(&b, c, st)
			if want := styledStringByByte(c, st); b.String() != want {
				t.Fatalf("style %s, %q: wrote %s, want %s", st.Name, c, b.String(), want)
			}
		}
	}
}

// deepcopy answers what converting to the model and back did, error and all.
func TestDeepCopyMatchesRoundTrip(t *testing.T) {
	exprs := []string{
		`None`, `True`, `-7`, `123456789012345678901234567890`, `1200.0`, `0.1 + 0.2`, `1e-05`, `-0.0`,
		`float("inf")`, `"é 😀"`, `[]`, `()`, `[1, ("a", (2,)), {"k": set([3, 1])}]`,
		`{"b": 1, "a": [1, 2.5], "c": {"z": None}}`, `{1: "int key", "1": "string key", (1, "x"): 2, None: 0}`,
		`set()`, `[len]`, `{"ok": 1, "bad": (1, len)}`,
	}
	for _, e := range exprs {
		v := evalStar(t, e)
		var want starlark.Value
		var wantErr string
		if m, err := fromStar(v, StylePython); err != nil {
			wantErr = err.Error()
		} else {
			want = toStar(m)
		}
		got, err := deepCopyStar(v, 0)
		if wantErr != "" || err != nil {
			if err == nil || err.Error() != wantErr {
				t.Errorf("%s: deepCopyStar error %v, want %q", e, err, wantErr)
			}
			continue
		}
		if got.String() != want.String() || got.Type() != want.Type() {
			t.Errorf("%s: deepCopyStar %s (%s), want %s (%s)", e, got, got.Type(), want, want.Type())
		}
		if d, ok := got.(*starlark.Dict); ok && v.(*starlark.Dict).Len() > 0 {
			if err := d.SetKey(starlark.String("new"), starlark.None); err != nil {
				t.Fatal(err)
			}
			if _, found, _ := v.(*starlark.Dict).Get(starlark.String("new")); found {
				t.Errorf("%s: the copy shares its dict with the original", e)
			}
		}
	}
	nan := starlark.Float(math.NaN())
	if got, err := deepCopyStar(nan, 0); err != nil || got.String() != toStar(mustFromStar(t, nan)).String() {
		t.Errorf("NaN: deepCopyStar %v, %v", got, err)
	}
}

func mustFromStar(t *testing.T, v starlark.Value) any {
	t.Helper()
	m, err := fromStar(v, StylePython)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Rows read through their templates stay private to each read: a handler that changes the row it read (its
// balance, its nested history list) and stores it changes neither the base row nor the stored row's next read.
func TestRowTemplatesKeepReadsPrivate(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	ctx := context.Background()
	a := open(t, rt, SessionSpec{})
	for i := 1; i <= 3; i++ {
		res, err := a.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf(`"balance": %d,`, 100+i); !strings.Contains(res.Content, want) ||
			strings.Count(res.Content, `"kind": "deposit"`) != i {
			t.Fatalf("deposit %d answered %s, want %s and %d history entries", i, res.Content, want, i)
		}
		if i == 3 {
			if row, _ := a.Row("accounts", "acc_01"); !strings.Contains(string(row), `"balance":103`) {
				t.Fatalf("stored row %s, want balance 103", row)
			}
		}
	}
	b := open(t, rt, SessionSpec{})
	got, err := b.Call(ctx, "get_account", json.RawMessage(`{"id": "acc_01"}`))
	if err != nil || !strings.Contains(got.Content, `"balance": 100,`) || strings.Contains(got.Content, "deposit") {
		t.Fatalf("another session read %s (%v), want the base row", got.Content, err)
	}
	if b.StateHash() != rt.BaseHash() {
		t.Fatal("a read changed another session's world")
	}
}
