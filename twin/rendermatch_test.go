package twin

import (
	"math/rand/v2"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// randomValue makes a JSON value whose strings draw on every character the styles treat apart.
func randomValue(r *rand.Rand, depth int) any {
	pieces := []string{"a", "Z", " ", "\"", "\\", "\n", "\r", "\t", "\b", "\f", "\x01", "\x1f", "\x7f", "<", ">", "&",
		"é", "\u2028", "\u2029", "日本", "😀", "\xff", "\xe2\x82", "1.0", ":", ", "}
	kind := r.IntN(8)
	if depth > 3 {
		kind = r.IntN(5)
	}
	switch kind {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return jsonvalue.Number([]string{"0", "-1", "1200.0", "1e-05", "3.14"}[r.IntN(5)])
	case 3, 4:
		s := ""
		for range r.IntN(6) {
			s += pieces[r.IntN(len(pieces))]
		}
		return s
	case 5:
		return []any{}
	case 6:
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = randomValue(r, depth+1)
		}
		return l
	default:
		o := jsonvalue.NewObject(3)
		for range r.IntN(4) {
			o.Set(pieces[r.IntN(len(pieces))]+pieces[r.IntN(len(pieces))], randomValue(r, depth+1))
		}
		return o
	}
}

// RendersAs(v, st, text) is exactly Render(v, st) == text: on every style's rendering of thousands
// of values, on those renderings cut short or run on, and on odd Go values.
func TestRendersAsMatchesRender(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 3))
	values := []any{nil, true, "", []any{}, jsonvalue.NewObject(0), struct{}{}, jsonvalue.Number("7")}
	for range 5000 {
		values = append(values, randomValue(r, 0))
	}
	for _, v := range values {
		for _, from := range Styles() {
			text := Render(v, from)
			texts := []string{text, text + " ", text[:len(text)-1], "", " " + text}
			for _, st := range Styles() {
				for _, tx := range texts {
					if got, want := RendersAs(v, st, tx), Render(v, st) == tx; got != want {
						t.Fatalf("RendersAs(%#v, %s, %q) = %v, Render gives %q", v, st.Name, tx, got, Render(v, st))
					}
				}
			}
		}
	}
}
