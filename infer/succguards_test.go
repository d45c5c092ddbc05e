package infer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// ticketTraces: 20 tickets read once each (10 open, 6 closed, 4 held), and closes of the first
// `closes` open ones, each answering the ticket closed; refused adds a recorded refusal of a held ticket.
func ticketTraces(closes int, refused bool) []trace.Trace {
	row := func(i int, state string) string {
		return fmt.Sprintf(`{"ticket_id": "T%02d", "state": "%s", "title": "ticket number %d"}`, i, state, i)
	}
	var out []trace.Trace
	for i := 0; i < 20; i++ {
		state := "open"
		switch {
		case i >= 16:
			state = "held"
		case i >= 10:
			state = "closed"
		}
		args := fmt.Sprintf(`{"ticket_id": "T%02d"}`, i)
		calls := [][3]string{{"get_ticket", args, row(i, state)}}
		if state == "open" && i < closes {
			calls = append(calls, [3]string{"close_ticket", args, row(i, "closed")})
		}
		if state == "held" && i == 16 && refused {
			calls = append(calls, [3]string{"close_ticket", args, "Error: Held ticket cannot be closed"})
		}
		out = append(out, fakeTrace(fmt.Sprintf("t%02d", i), calls...))
	}
	out = append(out, fakeTrace("tx", [3]string{"get_ticket", `{"ticket_id": "T99"}`, "Error: Ticket not found"}))
	return out
}

// A write whose every recorded success found the row in one state, where the table's rows show other states
// often enough that this is no luck, is refused in the other states (text in the recorded errors' format);
// too few successes, or a state a recorded refusal already tests, add no such precondition.
func TestSuccessGuards(t *testing.T) {
	for _, tt := range []struct {
		name    string
		closes  int
		refused bool
		// want is the refusal of a held ticket ("" when none).
		want string
	}{
		{"eight successes on open tickets, half the rows in other states", 8, false, "Error: state must be open"},
		{"five successes could be luck ((1/2)^5 > 1%)", 5, false, ""},
		{"a recorded refusal already tests the state: its text, no second guard", 8, true, "Error: Held ticket cannot be closed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, _, err := Build(ticketTraces(tt.closes, tt.refused), Options{})
			if err != nil {
				t.Fatal(err)
			}
			def, ok := b.ToolByName("close_ticket")
			if !ok || def.Source == "" {
				t.Fatalf("close_ticket not synthesized: %+v", def)
			}
			const guard = `if pre["state"] != "open":`
			if n := strings.Count(def.Source, guard); n != min(len(tt.want), 1) {
				t.Fatalf("source has %q %d times, want %d\n%s", guard, n, min(len(tt.want), 1), def.Source)
			}
			if strings.Contains(def.Source, `pre["title"]`) {
				t.Errorf("a guard on title (a value per ticket, not a state):\n%s", def.Source)
			}
			rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s, _, err := rt.Open(twin.SessionSpec{})
			if err != nil {
				t.Fatal(err)
			}
			held, err := s.Call(context.Background(), "close_ticket", []byte(`{"ticket_id": "T17"}`))
			if err != nil {
				t.Fatal(err)
			}
			if refusedNow := held.Error || twin.IsErrorAnswer(held.Content); refusedNow != (tt.want != "") || tt.want != "" && held.Content != tt.want {
				t.Errorf("close of a held ticket: %s (error %v), want refusal %q", held.Content, held.Error, tt.want)
			}
			open, err := s.Call(context.Background(), "close_ticket", []byte(`{"ticket_id": "T09"}`))
			if err != nil {
				t.Fatal(err)
			}
			if open.Error || !strings.Contains(open.Content, `"closed"`) {
				t.Errorf("close of an open ticket: %s, want it closed", open.Content)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	errCall := func(text string) *call {
		c := &call{text: text, isErr: true, answer: true}
		if v, err := jsonvalue.ParseString(text); err == nil && jsonvalue.LooksJSON(text) {
			c.val, c.isJSON = v, true
		}
		return c
	}
	for _, tt := range []struct {
		name   string
		errors []string
		want   string
	}{
		{"text errors sharing a prefix", []string{"Error: Order not found", "Error: Non-pending order cannot be cancelled"}, "Error: state must be open"},
		{"another prefix", []string{"ERR: no such ticket", "ERR: ticket is held"}, "ERR: state must be open"},
		{"JSON errors of one key", []string{`{"error": "not found"}`, `{"error": "held"}`}, `{"error":"state must be open"}`},
		{"mixed formats", []string{`{"error": "not found"}`, "Error: held"}, "Error: state must be open"},
		{"no recorded error", nil, "Error: state must be open"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pt := &ptrace{id: "t"}
			for _, e := range tt.errors {
				pt.calls = append(pt.calls, errCall(e))
			}
			m := &model{traces: []*ptrace{pt}}
			if got := m.errorText("state must be open"); got != tt.want {
				t.Errorf("errorText = %q, want %q", got, tt.want)
			}
		})
	}
}
