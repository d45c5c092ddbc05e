package infer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

func shapeOf(t *testing.T, docs []string) string {
	t.Helper()
	s := newShape()
	for _, d := range docs {
		v, err := jsonvalue.ParseString(d)
		if err != nil {
			t.Fatal(err)
		}
		s.add(v)
	}
	return string(jsonvalue.Canonical(s.schema()))
}

// An object position whose keys are ids (more than maxProps distinct ones) becomes a map: its schema says
// additionalProperties with the members' merged shape instead of one property per id, whatever the order
// the objects came in; a record with a few fields keeps its properties.
func TestShapeIDKeyedObjectsAreMaps(t *testing.T) {
	var docs []string
	for i := range maxProps + 40 {
		status := "open"
		if i%3 == 0 {
			status = "closed"
		}
		extra := ""
		if i%2 == 0 {
			extra = fmt.Sprintf(`, "note": "n%d"`, i)
		}
		docs = append(docs, fmt.Sprintf(`{"user": "u%d", "orders": {"#W%d": {"status": %q, "total": %d.5%s}}}`, i, i, status, i, extra))
	}
	got := shapeOf(t, docs)
	if strings.Contains(got, `"#W1"`) || !strings.Contains(got, `"additionalProperties"`) {
		t.Fatalf("id-keyed orders are not a map:\n%s", got)
	}
	for _, want := range []string{`"status":{"enum":["closed","open"],"type":"string"}`, `"total":{"type":"number"}`, `"note":{"type":"string"}`, `"required":["user","orders"]`} {
		if !strings.Contains(got, want) {
			t.Errorf("schema lacks %s:\n%s", want, got)
		}
	}
	rev := make([]string, len(docs))
	for i, d := range docs {
		rev[len(docs)-1-i] = d
	}
	// The members' shape does not depend on when the position turned into a map.
	if r := shapeOf(t, rev); r != got {
		t.Errorf("order changes the schema:\n%s\n%s", got, r)
	}
	few := shapeOf(t, docs[:maxProps])
	if !strings.Contains(few, `"#W1"`) || strings.Contains(few, "additionalProperties") {
		t.Errorf("%d distinct keys should stay properties:\n%.300s", maxProps, few)
	}
}
