package twin

import (
	"math"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
)

func TestRenderKeepsOrderAndSpelling(t *testing.T) {
	in := `{"b": 1, "a": [1.0, 2e3, -0, "x\u00e9\ud83d\ude00"], "c": {"z": null, "y": true}}`
	v, err := jsonvalue.ParseString(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Render(v, StylePython), `{"b": 1, "a": [1.0, 2e3, -0, "x\u00e9\ud83d\ude00"], "c": {"z": null, "y": true}}`; got != want {
		t.Fatalf("python render:\n got %s\nwant %s", got, want)
	}
	if got, want := Render(v, StyleCompact), `{"b":1,"a":[1.0,2e3,-0,"xé😀"],"c":{"z":null,"y":true}}`; got != want {
		t.Fatalf("compact render:\n got %s\nwant %s", got, want)
	}
}

func TestAnswersAgree(t *testing.T) {
	tests := []struct {
		a, b  string
		agree bool
	}{
		{`{"a": 1, "b": 2}`, `{"b": 2, "a": 1}`, true},
		{`1200.0`, `1200`, true},
		{`{"a": [1, 2]}`, `{"a": [2, 1]}`, false},
		{`liam_1`, `liam_1`, true},
		{`Error: x`, `Error: y`, false},
		{`"x"`, `x`, false},
		{`68.92000000000004`, `68.92`, false},
	}
	for _, tt := range tests {
		if got := AnswersAgree(tt.a, tt.b); got != tt.agree {
			t.Errorf("AnswersAgree(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.agree)
		}
	}
}

func TestShapesAgree(t *testing.T) {
	tests := []struct {
		a, b  string
		agree bool
	}{
		{`{"a": 1, "b": "x"}`, `{"b": "y", "a": 2.5}`, true},
		{`{"a": 1}`, `{"a": "1"}`, false},
		{`{"a": 1}`, `{"a": 1, "b": 2}`, false},
		{`{"a": [{"k": 1}, {"k": 2}]}`, `{"a": [{"k": 3}]}`, true},
		{`{"a": [{"k": 1}]}`, `{"a": [{"j": 1}]}`, false},
		{`{"a": []}`, `{"a": ["x"]}`, true},
		{`{"a": [1, "x"]}`, `{"a": [2]}`, false},
		{`{"a": null}`, `{"a": 1}`, false},
		{`Error: x`, `Error: y`, true},
		{`Error: x`, `liam_1`, false},
		{`{"error": "x"}`, `Error: x`, false},
		{`liam_1`, `noah_2`, true},
		{`"x"`, `x`, false},
	}
	for _, tt := range tests {
		if got := ShapesAgree(tt.a, tt.b); got != tt.agree {
			t.Errorf("ShapesAgree(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.agree)
		}
	}
	for _, s := range []string{`Error: no user`, `error`, `{"error": "x"}`, `{"Error": 1}`} {
		if !IsErrorAnswer(s) {
			t.Errorf("IsErrorAnswer(%s) = false", s)
		}
	}
	for _, s := range []string{`{"error": "x", "code": 1}`, `liam_1`, `"Error"`} {
		if IsErrorAnswer(s) {
			t.Errorf("IsErrorAnswer(%s) = true", s)
		}
	}
}

// f64 keeps arithmetic at run time (Go folds constant expressions exactly).
var f64 = func(x float64) float64 { return x }

func TestPyFloat(t *testing.T) {
	tests := []struct {
		f    float64
		want string
	}{
		{1200, "1200.0"},
		{f64(0.1) + f64(0.2), "0.30000000000000004"},
		{f64(47.01) + f64(21.91), "68.92"},
		{(f64(499.29) - f64(452.28)) + (f64(217.06) - f64(195.15)), "68.92000000000004"},
		{1e-5, "1e-05"},
		{0.0001, "0.0001"},
		{1e16, "1e+16"},
		{1234567890123456.0, "1234567890123456.0"},
		{math.Copysign(0, -1), "-0.0"},
		{0, "0.0"},
		{1.5e300, "1.5e+300"},
		{math.Inf(1), "Infinity"},
	}
	for _, tt := range tests {
		if got := PyFloat(tt.f); got != tt.want {
			t.Errorf("PyFloat(%v) = %s, want %s", tt.f, got, tt.want)
		}
	}
}

func TestJSFloat(t *testing.T) {
	tests := []struct {
		f    float64
		want string
	}{
		{1200, "1200"},
		{f64(0.1) + f64(0.2), "0.30000000000000004"},
		{1e21, "1e+21"},
		{1e20, "100000000000000000000"},
		{1e-7, "1e-7"},
		{1e-6, "0.000001"},
	}
	for _, tt := range tests {
		if got := JSFloat(tt.f); got != tt.want {
			t.Errorf("JSFloat(%v) = %s, want %s", tt.f, got, tt.want)
		}
	}
}

func TestPyRound(t *testing.T) {
	tests := []struct {
		f    float64
		n    int
		want string
	}{
		{2.675, 2, "2.67"}, // 2.675 is 2.67499999... in binary
		{0.125, 2, "0.12"}, // an exact tie rounds to even
		{0.375, 2, "0.38"},
		{-9.889999999999986, 2, "-9.89"},
		{24.239999999999995, 2, "24.24"},
		{255, 2, "255.0"},
	}
	for _, tt := range tests {
		if got := PyFloat(PyRound(tt.f, tt.n)); got != tt.want {
			t.Errorf("round(%v, %d) = %s, want %s", tt.f, tt.n, got, tt.want)
		}
	}
}

func TestCalc(t *testing.T) {
	tests := []struct {
		expr string
		want string
	}{
		{"152 + 103", "255"},
		{"(158 + 141) + 30", "329"},
		{"500 - (158 + 141)", "201"},
		{"10 / 4", "2.5"},
		{"2 * -3", "-6"},
		{"7 // 2", "3"},
		{"2 ** 10", "1024"},
		{"1.5 * 2", "3.0"},
		{"100 * 0.1", "10.0"},
	}
	for _, tt := range tests {
		v, err := Calc(tt.expr)
		if err != nil {
			t.Errorf("Calc(%q): %v", tt.expr, err)
			continue
		}
		if got := pyStr(v); got != tt.want {
			t.Errorf("Calc(%q) = %s, want %s", tt.expr, got, tt.want)
		}
	}
	for _, bad := range []string{"", "1 +", "(1", "1 / 0", "import os", "1 2"} {
		if _, err := Calc(bad); err == nil {
			t.Errorf("Calc(%q) succeeded, want an error", bad)
		}
	}
}

func TestStarlarkRoundTrip(t *testing.T) {
	v, _ := jsonvalue.ParseString(`{"b": [1, 2.5, 1200.0, "x", null, true], "a": {"n": 12345678901234567890}}`)
	back, err := fromStar(toStar(v), StylePython)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonvalue.Identical(v, back) {
		t.Fatalf("round trip changed the value: %s", Render(back, StylePython))
	}
	if _, err := fromStar(starlark.NewBuiltin("f", nil), StylePython); err == nil {
		t.Fatal("a function converted to a value, want an error")
	}
}
