package twin

import (
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

func TestValueFormat(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"james.kim1995@example.com", "a.a9@a.a"},
		{"silva7872@example.com", "a9@a.a"},
		{"78750", "9"},
		{"Mia", "a"},
		{"#W2417020", "#a9"},
		{"", ""},
	} {
		if got := valueFormat(tt.in); got != tt.want {
			t.Errorf("valueFormat(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestKnownFormat(t *testing.T) {
	bt := &baseTable{rows: map[string]*jsonvalue.Object{}}
	for i, e := range []string{"a.b1@x.com", "c.d22@x.com", "e.f333@y.org"} {
		o := jsonvalue.NewObject(1)
		o.Set("email", e)
		k := string(rune('a' + i))
		bt.rows[k] = o
		bt.keys = append(bt.keys, k)
	}
	for _, tt := range []struct {
		path, v string
		want    bool
	}{
		{"email", "new.user9@z.net", true},
		{"email", "newuser9@z.net", false},
		{"email", "", false},
		{"zip", "anything", true}, // no values: the format is unknown, nothing is ruled out
	} {
		if got := bt.knownFormat(tt.path, tt.v); got != tt.want {
			t.Errorf("knownFormat(%q, %q) = %v, want %v", tt.path, tt.v, got, tt.want)
		}
	}
}

func TestSpellKeyWords(t *testing.T) {
	def := &Table{
		KeyParts: []KeyPart{{Index: 0, Path: "name.first_name", Title: true}, {Index: 1, Path: "name.last_name", Title: true}},
		KeyWords: []string{"email", "handle"},
	}
	for _, tt := range []struct{ name, key, field, in, want string }{
		{"email spells the id's names", "fatima_taylor_3452", "email", "ethan.garcia8085@example.com", "fatima.taylor8085@example.com"},
		{"title case kept", "fatima_taylor_3452", "handle", "Ethan-Garcia@Home", "Fatima-Taylor@Home"},
		{"a value of too few words stays", "fatima_taylor_3452", "email", "ethan8085", "ethan8085"},
		{"a key part that is no word spells nothing", "fatima_7x_3452", "email", "ethan.garcia8085@example.com", "ethan.garcia8085@example.com"},
		{"a field not in KeyWords stays", "fatima_taylor_3452", "note", "ethan.garcia was here", "ethan.garcia was here"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			row := jsonvalue.NewObject(1)
			row.Set(tt.field, tt.in)
			spellKeyWords(row, def, tt.key)
			if got, _ := row.Get(tt.field); got != tt.want {
				t.Errorf("%s = %v, want %q", tt.field, got, tt.want)
			}
		})
	}
}
