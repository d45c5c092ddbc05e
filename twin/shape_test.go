package twin

import (
	"reflect"
	"sort"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

func TestLearnMapPaths(t *testing.T) {
	answers := []string{
		`{"id": "u1", "payment_methods": {"card_1": {"id": "card_1", "brand": "visa"}}, "items": [{"id": "i1", "options": {"color": "red"}}]}`,
		`{"id": "u2", "payment_methods": {"card_2": {"id": "card_2", "brand": "amex"}, "gift_9": {"id": "gift_9", "balance": 5}}, "items": [{"id": "i2", "options": {"size": "M", "color": "blue"}}]}`,
		`{"id": "u3", "address": {"city": "x"}, "payment_methods": {"paypal_3": {"id": "paypal_3"}}, "items": [{"id": "i3", "options": {"capacity": "1L"}}]}`,
		`{"id": "u4", "address": {"city": "y", "zip": "1"}, "payment_methods": {}, "items": []}`,
		`{"id": "u5", "address": {"city": "z"}, "variants": {"v1": {"options": {"a": "1"}}, "v2": {"options": {"b": "2"}}}}`,
		`{"id": "u6", "variants": {"v3": {"options": {"c": "3"}}}}`,
		`{"id": "u7", "variants": {"v4": {"options": {"a": "4"}}, "v5": {"options": {"d": "5"}}}}`,
	}
	var vals []any
	for _, a := range answers {
		v, err := jsonvalue.ParseString(a)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	got := []string{}
	for p := range LearnMapPaths(vals) {
		got = append(got, p)
	}
	sort.Strings(got)
	// The answers themselves and addresses share keys (records); payment methods, options and variants do not.
	want := []string{".items[].options", ".payment_methods", ".variants", ".variants*.options"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("LearnMapPaths = %v, want %v", got, want)
	}
}

func TestShapesAgreeMaps(t *testing.T) {
	maps := MapPaths{".pm": true, ".items[].options": true}
	tests := []struct {
		a, b  string
		agree bool
	}{
		{`{"pm": {"card_1": {"id": "card_1"}}}`, `{"pm": {"card_9": {"id": "card_9"}}}`, true},
		{`{"pm": {"card_1": {"id": "card_1"}}}`, `{"pm": {"card_9": {"id": "card_9", "brand": "x"}}}`, false},
		{`{"pm": {}}`, `{"pm": {"card_9": {"id": "card_9"}}}`, true},
		{`{"pm": {"a": 1}}`, `{"pm": ["a"]}`, false},
		{`{"items": [{"options": {"color": "red"}}]}`, `{"items": [{"options": {"size": "M", "ram": "8"}}]}`, true},
		{`{"items": [{"options": {"color": "red"}}]}`, `{"items": [{"options": {"size": 8}}]}`, false},
		// Not a map path: keys are shape.
		{`{"other": {"card_1": 1}}`, `{"other": {"card_9": 1}}`, false},
	}
	for _, tt := range tests {
		if got := ShapesAgreeMaps(tt.a, tt.b, maps); got != tt.agree {
			t.Errorf("ShapesAgreeMaps(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.agree)
		}
	}
}
