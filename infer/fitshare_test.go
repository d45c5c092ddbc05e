package infer

import (
	"reflect"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/twin"
)

// TestFitSharesTheRowsTheBundleRenders checks what fit's probe runtime relies on when it takes the build's
// parsed base rows instead of parsing the bundle's: each row's JSON parses to exactly the tree the build
// holds, so the runtime sees the same world either way (and its base hash agrees).
func TestFitSharesTheRowsTheBundleRenders(t *testing.T) {
	for _, name := range []string{"tau-retail-dev.json", "tau-airline-dev.json"} {
		t.Run(name, func(t *testing.T) {
			var p Prepared
			p.Add(loadTraces(t, name))
			opts := Options{}
			pts, w, err := p.finish()
			if err != nil {
				t.Fatal(err)
			}
			m := newModel(pts, &opts, w, false)
			b := m.learn()
			m.renderRows(b)
			rows := 0
			for _, tb := range b.Tables {
				for _, r := range tb.Rows {
					v, err := jsonvalue.ParseString(r.JSON)
					if err != nil {
						t.Fatalf("%s[%s]: %v", tb.Name, r.Key, err)
					}
					if got := m.base[tb.Name][r.Key]; !reflect.DeepEqual(v, got) {
						t.Fatalf("%s[%s]: the bundle's row parses to\n%s\nthe build holds\n%s", tb.Name, r.Key,
							jsonvalue.Canonical(v), jsonvalue.Canonical(got))
					}
					rows++
				}
			}
			if rows == 0 {
				t.Fatal("no base rows")
			}
			probe := fitProbe(b)
			parsed, err := twin.NewRuntime(&probe, twin.RuntimeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			shared, err := twin.NewRuntime(&probe, twin.RuntimeOptions{Parsed: m.base})
			if err != nil {
				t.Fatal(err)
			}
			if parsed.BaseHash() != shared.BaseHash() {
				t.Fatalf("base hash %s with the build's rows, %s parsed", shared.BaseHash(), parsed.BaseHash())
			}
		})
	}
}
