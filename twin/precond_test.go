package twin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// ticketBundle: a bus search whose rows hold seats and fares per class, and a ticket purchase recorded
// succeeding, refused for seats and refused for an amount short of the fares (short only when the fares count
// every rider: that is the relation learned, not fares per bus).
func ticketBundle() *Bundle {
	bus := func(id string, seats, fare int) string {
		return `{"bus": "` + id + `", "from": "AAA", "to": "BBB", "seats": {"std": ` + itoa(seats) + `, "first": 0}, "fares": {"std": ` + itoa(fare) + `, "first": 90}}`
	}
	buy := func(busID, day string, riders, paid int) string {
		rs := ""
		for i := 0; i < riders; i++ {
			if i > 0 {
				rs += ","
			}
			rs += `{"name":"r` + itoa(i) + `"}`
		}
		return `{"buses":[{"bus":"` + busID + `","day":"` + day + `"}],"class":"std","payments":[{"amount":` + itoa(paid) + `,"card":"card_1234"}],"riders":[` + rs + `]}`
	}
	return &Bundle{
		Format: FormatVersion, Name: "tickets", SchemaSource: "traces", Style: StylePython,
		Tools: []Tool{
			{Name: "find_buses", Binding: BindingSimulated, Rung: RungReplay, Kind: KindQuery},
			{Name: "buy_tickets", Binding: BindingSimulated, Rung: RungReplay, Kind: KindWrite},
		},
		Recordings: []Recording{
			{Tool: "find_buses", Args: `{"day":"mon","from":"AAA","to":"BBB"}`, Answer: 0, Trace: "t1"},
			{Tool: "find_buses", Args: `{"day":"tue","from":"AAA","to":"BBB"}`, Answer: 1, Trace: "t1", Call: 1},
			{Tool: "buy_tickets", Args: buy("B10", "mon", 2, 20), Answer: 2, Trace: "t2"},
			{Tool: "buy_tickets", Args: buy("B20", "mon", 1, 12), Answer: 3, Trace: "t3"},
			{Tool: "buy_tickets", Args: buy("B30", "tue", 3, 99), Answer: 4, Trace: "t4", Error: true},
			{Tool: "buy_tickets", Args: buy("B20", "mon", 2, 20), Answer: 5, Trace: "t5", Error: true},
		},
		Answers: []string{
			"[" + bus("B10", 5, 10) + ", " + bus("B20", 2, 12) + "]",
			"[" + bus("B30", 1, 40) + ", " + bus("B40", 9, 7) + "]",
			`{"ticket": "T1", "total": 20}`,
			`{"ticket": "T2", "total": 12}`,
			"Error: not enough seats on bus B30",
			"Error: fares are 24, paid 20",
		},
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestPrecondsOnListedRows(t *testing.T) {
	rt := rowsRuntime(t, ticketBundle())
	ps := rt.tools["buy_tickets"].preconds
	if len(ps) != 2 || ps[0].field != "seats" || ps[0].count != "riders" || ps[1].field != "fares" || ps[1].count != "riders" || ps[1].paid != "payments" || ps[1].paidField != "amount" {
		for _, p := range ps {
			t.Logf("%+v", *p)
		}
		t.Fatalf("learned %d relations, want seats ≥ riders and payments ≥ fares × riders", len(ps))
	}
	s := open(t, rt, SessionSpec{})
	for _, tt := range []struct {
		name, args string
		want       string // the refusal, or "" for an answer that is not one
	}{
		{"seats short on another bus", `{"buses":[{"bus":"B20","day":"mon"}],"class":"std","payments":[{"amount":36,"card":"card_1234"}],"riders":[{"name":"a"},{"name":"b"},{"name":"c"}]}`,
			"Error: not enough seats on bus B20"},
		{"paid short of the fares", `{"buses":[{"bus":"B40","day":"tue"}],"class":"std","payments":[{"amount":10,"card":"card_1234"}],"riders":[{"name":"a"},{"name":"b"}]}`,
			"Error: fares are 14, paid 10"},
		{"enough seats, fares paid", `{"buses":[{"bus":"B40","day":"tue"}],"class":"std","payments":[{"amount":14,"card":"card_1234"}],"riders":[{"name":"a"},{"name":"b"}]}`, ""},
		{"a row no search listed is not judged", `{"buses":[{"bus":"B99","day":"tue"}],"class":"std","payments":[{"amount":1,"card":"card_1234"}],"riders":[{"name":"a"},{"name":"b"},{"name":"c"}]}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.Call(context.Background(), "buy_tickets", json.RawMessage(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != "" && (!res.Error || res.Content != tt.want || res.Rung != RungInfer) {
				t.Errorf("answer %q (error %v, rung %s), want refusal %q", res.Content, res.Error, res.Rung, tt.want)
			}
			args, _ := mustArgs(t, tt.args).(*jsonvalue.Object)
			if got, refused := rt.tools["buy_tickets"].precondRefusal(args, StylePython, nil); refused != (tt.want != "") || got != tt.want {
				t.Errorf("relations refuse %v with %q, want %q", refused, got, tt.want)
			}
		})
	}
}

func TestPrecondsNeedAgreeingRecordings(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(b *Bundle)
		want   int // relations learned
	}{
		{"as recorded", func(*Bundle) {}, 2},
		{"a success with fewer seats than riders", func(b *Bundle) {
			b.Recordings[2].Args = `{"buses":[{"bus":"B20","day":"mon"}],"class":"std","payments":[{"amount":36,"card":"card_1234"}],"riders":[{"name":"a"},{"name":"b"},{"name":"c"}]}`
		}, 1},
		{"one judged success only", func(b *Bundle) { b.Recordings = append(b.Recordings[:3:3], b.Recordings[4:]...) }, 0},
		{"refusals that do not name what they are about", func(b *Bundle) {
			b.Answers[4], b.Answers[5] = "Error: no", "Error: no"
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := ticketBundle()
			tt.change(b)
			rt := rowsRuntime(t, b)
			if got := len(rt.tools["buy_tickets"].preconds); got != tt.want {
				t.Errorf("%d relations learned, want %d", got, tt.want)
			}
		})
	}
}
