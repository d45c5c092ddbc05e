package twin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// busTrip is one recorded or asked bus ticket purchase: a bus on a day, riders, checked bags, insurance, the sum paid.
type busTrip struct {
	bus, day     string
	riders, bags int
	insured      string
	paid         int
	answer       string // recorded answer ("" for a success)
}

func (b busTrip) args() string {
	rs := ""
	for i := 0; i < b.riders; i++ {
		if i > 0 {
			rs += ","
		}
		rs += `{"name":"r` + itoa(i) + `"}`
	}
	return `{"bags":` + itoa(b.bags) + `,"buses":[{"bus":"` + b.bus + `","day":"` + b.day + `"}],"class":"std","insured":"` + b.insured +
		`","payments":[{"amount":` + itoa(b.paid) + `,"card":"card_1234"}],"riders":[` + rs + `]}`
}

// feeBuses: the bus search of ticketBundle (std fares: B10 10, B20 12 on Monday; B30 40, B40 7 on Tuesday) and
// purchases paying the fares for every rider, 7 per checked bag and 3 per rider when insured; two refused, one short
// of the fees only, one short of the fares.
func feeBuses() []busTrip {
	return []busTrip{
		{bus: "B10", day: "mon", riders: 2, insured: "no", paid: 20},
		{bus: "B20", day: "mon", riders: 1, bags: 1, insured: "no", paid: 19},
		{bus: "B40", day: "tue", riders: 2, insured: "yes", paid: 20},
		{bus: "B10", day: "mon", riders: 1, bags: 2, insured: "yes", paid: 27},
		{bus: "B40", day: "tue", riders: 1, bags: 1, insured: "no", paid: 14},
		{bus: "B20", day: "mon", riders: 2, bags: 1, insured: "no", paid: 24, answer: "Error: total is 31, paid 24"},
		{bus: "B10", day: "mon", riders: 2, insured: "no", paid: 15, answer: "Error: total is 20, paid 15"},
	}
}

func feeBundle(trips []busTrip) *Bundle {
	b := ticketBundle()
	b.Recordings, b.Answers = b.Recordings[:2], b.Answers[:2]
	for i, tr := range trips {
		ans := tr.answer
		if ans == "" {
			ans = `{"ticket": "T` + itoa(i) + `"}`
		}
		b.Answers = append(b.Answers, ans)
		b.Recordings = append(b.Recordings, Recording{Tool: "buy_tickets", Args: tr.args(), Answer: len(b.Answers) - 1,
			Trace: "t" + itoa(i+2), Error: tr.answer != ""})
	}
	return b
}

// total answers the buy_tickets total relation, or nil.
func totalRelation(rt *Runtime) *precond {
	for _, p := range rt.tools["buy_tickets"].preconds {
		if p.kind == precondTotal {
			return p
		}
	}
	return nil
}

func TestFeesFittedOnSuccesses(t *testing.T) {
	// First, a refusal that shows a total other than the one computed: it witnesses the relation, but the refusals
	// are rendered from the first that shows the computed total.
	odd := busTrip{bus: "B10", day: "mon", riders: 2, bags: 1, insured: "no", paid: 20, answer: "Error: total is 99, paid 20"}
	rt := rowsRuntime(t, feeBundle(append([]busTrip{odd}, feeBuses()...)))
	p := totalRelation(rt)
	want := []fee{{feature{arg: "bags"}, 7}, {feature{arg: "insured", val: "yes", list: "riders"}, 3}}
	if p == nil || !p.exact || len(p.fees) != len(want) || p.fees[0] != want[0] || p.fees[1] != want[1] {
		if p != nil {
			t.Logf("%+v", *p)
		}
		t.Fatalf("learned %v, want fees %v on top of the fares, paid exactly", p, want)
	}
	s := open(t, rt, SessionSpec{})
	for _, tt := range []struct {
		name string
		trip busTrip
		want string // the refusal, or "" for an answer that is not one
	}{
		{"fares, bags and insurance paid", busTrip{bus: "B40", day: "tue", riders: 2, bags: 2, insured: "yes", paid: 34}, ""},
		{"short of the fees", busTrip{bus: "B40", day: "tue", riders: 2, bags: 2, insured: "yes", paid: 30}, "Error: total is 34, paid 30"},
		{"paid beyond the total", busTrip{bus: "B40", day: "tue", riders: 2, bags: 2, insured: "yes", paid: 40}, "Error: total is 34, paid 40"},
		{"no fees", busTrip{bus: "B10", day: "mon", riders: 1, insured: "no", paid: 10}, ""},
		{"a row no search listed is not judged", busTrip{bus: "B99", day: "tue", riders: 1, insured: "no", paid: 1}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.Call(context.Background(), "buy_tickets", json.RawMessage(tt.trip.args()))
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != "" && (!res.Error || res.Content != tt.want) {
				t.Errorf("answer %q (error %v), want refusal %q", res.Content, res.Error, tt.want)
			}
			args, _ := mustArgs(t, tt.trip.args()).(*jsonvalue.Object)
			if got, refused := rt.tools["buy_tickets"].precondRefusal(args, StylePython, nil); refused != (tt.want != "") || got != tt.want {
				t.Errorf("relations refuse %v with %q, want %q", refused, got, tt.want)
			}
		})
	}
}

func TestFeesNeedExactSuccesses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func([]busTrip) []busTrip
		fees   int  // fees learned
		exact  bool // the total an equality
	}{
		{"as recorded", func(b []busTrip) []busTrip { return b }, 2, true},
		{"successes paying the fares only", func(b []busTrip) []busTrip {
			return []busTrip{b[0], {bus: "B40", day: "tue", riders: 3, bags: 1, insured: "yes", paid: 21}, b[5], b[6]}
		}, 0, true},
		{"a success no fee explains", func(b []busTrip) []busTrip {
			b[4].paid++
			return b
		}, 0, false},
		{"too few successes for two fees", func(b []busTrip) []busTrip { return append(b[:3:3], b[5], b[6]) }, 0, false},
		{"an overpaying success", func(b []busTrip) []busTrip {
			return []busTrip{b[0], {bus: "B40", day: "tue", riders: 1, insured: "no", paid: 9}, b[5], b[6]}
		}, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt := rowsRuntime(t, feeBundle(tt.change(feeBuses())))
			p := totalRelation(rt)
			if p == nil {
				t.Fatal("no total relation learned")
			}
			if len(p.fees) != tt.fees || p.exact != tt.exact {
				t.Errorf("fees %v exact %v, want %d fees, exact %v", p.fees, p.exact, tt.fees, tt.exact)
			}
		})
	}
}

func TestFeeFeatures(t *testing.T) {
	recs := []*rec{
		{args: mustArgsNoT(`{"n": 1, "kind": "a", "l": [], "m": [1], "id": "x1"}`)},
		{args: mustArgsNoT(`{"n": 2, "kind": "b", "l": [], "id": "x2"}`)},
		{args: mustArgsNoT(`{"n": "3", "kind": "b", "id": "x3", "k": 4}`)},
	}
	got := feeFeatures(recs)
	want := []feature{{arg: "k"}, {arg: "id", val: "x1", list: "l"}, {arg: "id", val: "x1", list: "m"}, {arg: "id", val: "x2", list: "l"},
		{arg: "id", val: "x2", list: "m"}, {arg: "id", val: "x3", list: "l"}, {arg: "id", val: "x3", list: "m"},
		{arg: "kind", val: "a", list: "l"}, {arg: "kind", val: "a", list: "m"}, {arg: "kind", val: "b", list: "l"}, {arg: "kind", val: "b", list: "m"}}
	if len(got) != len(want) {
		t.Fatalf("features %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("features %v, want %v", got, want)
		}
	}
}

func mustArgsNoT(s string) any {
	v, err := jsonvalue.ParseString(s)
	if err != nil {
		panic(err)
	}
	return v
}

// A feature every judged success had zero (no success checked a bag) has no known cost: a call with it is judged
// by the fares it must at least pay, one without it by the exact total.
func TestFeesUnseenFeature(t *testing.T) {
	b := feeBuses()
	rt := rowsRuntime(t, feeBundle([]busTrip{b[0], {bus: "B40", day: "tue", riders: 1, insured: "no", paid: 7}, b[5], b[6]}))
	p := totalRelation(rt)
	if p == nil || !p.exact || len(p.fees) != 0 || len(p.unseen) == 0 || p.unseen[0] != (feature{arg: "bags"}) {
		t.Fatalf("learned %+v, want an exact total without fees, bags unseen", p)
	}
	for _, tt := range []struct {
		name string
		trip busTrip
		want string
	}{
		{"bags paid for beyond the fares", busTrip{bus: "B40", day: "tue", riders: 2, bags: 2, insured: "no", paid: 30}, ""},
		{"bags, short of the fares", busTrip{bus: "B40", day: "tue", riders: 2, bags: 2, insured: "no", paid: 10}, "Error: total is 14, paid 10"},
		{"no bags, paid beyond the fares", busTrip{bus: "B40", day: "tue", riders: 2, insured: "no", paid: 30}, "Error: total is 14, paid 30"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args, _ := mustArgs(t, tt.trip.args()).(*jsonvalue.Object)
			if got, refused := rt.tools["buy_tickets"].precondRefusal(args, StylePython, nil); refused != (tt.want != "") || got != tt.want {
				t.Errorf("relations refuse %v with %q, want %q", refused, got, tt.want)
			}
		})
	}
}
