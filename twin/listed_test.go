package twin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// seatsBundle is ticketBundle with two traces that search Tuesday's buses before and after a purchase on bus
// B40: its standard seats drop by the riders bought for (9 → 7 for 2 riders, 7 → 4 for 3).
func seatsBundle() *Bundle {
	b := ticketBundle()
	bus := func(id string, seats int) string {
		return `{"bus": "` + id + `", "from": "AAA", "to": "BBB", "seats": {"std": ` + itoa(seats) + `, "first": 0}, "fares": {"std": 7, "first": 90}}`
	}
	buy := func(riders int) string {
		rs := make([]string, riders)
		for i := range rs {
			rs[i] = `{"name":"r` + itoa(i) + `"}`
		}
		return `{"buses":[{"bus":"B40","day":"tue"}],"class":"std","payments":[{"amount":` + itoa(7*riders) + `,"card":"card_1234"}],"riders":[` + strings.Join(rs, ",") + `]}`
	}
	n := len(b.Answers)
	b.Answers = append(b.Answers, "["+bus("B40", 9)+"]", "["+bus("B40", 7)+"]", "["+bus("B40", 4)+"]", `{"ticket": "T6", "total": 14}`, `{"ticket": "T7", "total": 21}`)
	search := `{"day":"tue","from":"AAA","to":"BBB"}`
	b.Recordings = append(b.Recordings,
		Recording{Tool: "find_buses", Args: search, Answer: n, Trace: "t6"},
		Recording{Tool: "buy_tickets", Args: buy(2), Answer: n + 3, Trace: "t6", Call: 1},
		Recording{Tool: "find_buses", Args: search, Answer: n + 1, Trace: "t6", Call: 2},
		Recording{Tool: "find_buses", Args: search, Answer: n + 1, Trace: "t7"},
		Recording{Tool: "buy_tickets", Args: buy(3), Answer: n + 4, Trace: "t7", Call: 1},
		Recording{Tool: "find_buses", Args: search, Answer: n + 2, Trace: "t7", Call: 2},
	)
	return b
}

func TestWriteEffectLearnedFromSightings(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(b *Bundle)
		want   bool // an effect on seats, counted by riders, downwards
	}{
		{"seats drop by the riders", func(*Bundle) {}, true},
		{"one sighting only", func(b *Bundle) { b.Recordings = b.Recordings[:len(b.Recordings)-3] }, false},
		{"seats that did not move", func(b *Bundle) { b.Recordings[len(b.Recordings)-1].Answer = b.Recordings[len(b.Recordings)-3].Answer }, false},
		{"no search after the purchase", func(b *Bundle) {
			b.Recordings = append(b.Recordings[:len(b.Recordings)-4:len(b.Recordings)-4], b.Recordings[len(b.Recordings)-3:len(b.Recordings)-1]...)
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := seatsBundle()
			tt.change(b)
			rt := rowsRuntime(t, b)
			efs := rt.tools["buy_tickets"].effects
			got := len(efs) == 1 && efs[0].p.field == "seats" && efs[0].p.count == "riders" && efs[0].sign == -1
			if got != tt.want || (!tt.want && len(efs) > 0) {
				for _, ef := range efs {
					t.Logf("effect %+v sign %v", *ef.p, ef.sign)
				}
				t.Errorf("learned %d effects, want seats −riders: %v", len(efs), tt.want)
			}
		})
	}
}

// A purchase takes seats from the session's row: the search lists the fewer seats (its recorded answer for the
// very arguments is stale now), the next purchase is judged on them, the state hash covers the row, and other
// sessions, forks and rebuilds see what they should.
func TestListedRowsLiveInTheSessionsWorld(t *testing.T) {
	rt := rowsRuntime(t, seatsBundle())
	ctx := context.Background()
	s := open(t, rt, SessionSpec{})
	call := func(s *Session, tool, args string) Result {
		t.Helper()
		r, err := s.Call(ctx, tool, json.RawMessage(args))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const search = `{"day":"tue","from":"AAA","to":"BBB"}`
	seatsB40 := func(s *Session) string {
		t.Helper()
		r := call(s, "find_buses", search)
		i := strings.Index(r.Content, `"bus": "B40"`)
		if i < 0 {
			t.Fatalf("search lists no B40: %s", r.Content)
		}
		j := strings.Index(r.Content[i:], `"std": `)
		return strings.SplitN(r.Content[i+j+len(`"std": `):], ",", 2)[0]
	}
	base, before := s.StateHash(), seatsB40(s)
	buy := `{"buses":[{"bus":"B40","day":"tue"}],"class":"std","payments":[{"amount":14,"card":"card_9999"}],"riders":[{"name":"a"},{"name":"b"}]}`
	if r := call(s, "buy_tickets", buy); r.Error || !r.Changed {
		t.Fatalf("purchase: %+v, want a success that changed the world", r)
	}
	if s.StateHash() == base {
		t.Error("state hash unchanged by a purchase that took seats")
	}
	if got := seatsB40(s); got != "2" {
		t.Errorf("B40 lists %s standard seats after 2 were bought from 4, want 2", got)
	}
	three := `{"buses":[{"bus":"B40","day":"tue"}],"class":"std","payments":[{"amount":35,"card":"card_9999"}],"riders":[{"name":"a"},{"name":"b"},{"name":"c"}]}`
	if r := call(s, "buy_tickets", three); !r.Error || !strings.Contains(r.Content, "B40") {
		t.Errorf("3 riders on 2 seats: %q (error %v), want the seats refusal naming B40", r.Content, r.Error)
	}
	if other := open(t, rt, SessionSpec{}); seatsB40(other) != before || other.StateHash() != base {
		t.Error("another session sees this one's purchase")
	}
	f, err := s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	if f.StateHash() != s.StateHash() || seatsB40(f) != "2" {
		t.Errorf("fork: hash %s seats %s, want the parent's %s and 2", f.StateHash(), seatsB40(f), s.StateHash())
	}
	rb, _, err := rt.Rebuild(ctx, SessionSpec{}, []JournalEntry{{Tool: "buy_tickets", Args: json.RawMessage(buy)}})
	if err != nil {
		t.Fatal(err)
	}
	if rb.StateHash() != s.StateHash() {
		t.Errorf("rebuilt hash %s, want %s", rb.StateHash(), s.StateHash())
	}
}
