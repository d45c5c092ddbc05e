package twin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// walletBundle: members holding a map of wallets (a gift wallet with an amount, a card without), and orders paid
// from them: recorded succeeding within the amounts (one only per the member as its own trace read it before),
// and refused once for paying a gift wallet beyond its amount.
func walletBundle() *Bundle {
	order := func(member string, pays ...string) string {
		ps := ""
		for i := 0; i < len(pays); i += 2 {
			if i > 0 {
				ps += ","
			}
			ps += `{"amount":` + pays[i+1] + `,"id":"` + pays[i] + `"}`
		}
		return `{"item":"lamp","member":"` + member + `","pays":[` + ps + `]}`
	}
	return &Bundle{
		Format: FormatVersion, Name: "wallets", SchemaSource: "traces", Style: StylePython,
		Tools: []Tool{
			{Name: "get_member", Binding: BindingSimulated, Rung: RungReplay, Kind: KindRead, Table: "members", KeyArg: "member"},
			{Name: "order", Binding: BindingSimulated, Rung: RungReplay, Kind: KindWrite},
		},
		Tables: []Table{
			{Name: "members", Key: "id", KeyInRow: true, KeyShape: "a9", Rows: []Row{
				{Key: "u1", JSON: `{"id": "u1", "wallets": {"card_1": {"kind": "card"}, "gift_1": {"kind": "gift", "amount": 50}}}`},
				{Key: "u2", JSON: `{"id": "u2", "wallets": {"card_2": {"kind": "card"}, "gift_2": {"kind": "gift", "amount": 10}}}`},
			}},
		},
		Recordings: []Recording{
			{Tool: "order", Args: order("u1", "gift_1", "30"), Answer: 0, Trace: "t1"},
			{Tool: "order", Args: order("u1", "card_1", "500"), Answer: 0, Trace: "t2"},
			{Tool: "order", Args: order("u2", "gift_2", "5", "card_2", "20"), Answer: 0, Trace: "t3"},
			{Tool: "order", Args: order("u2", "gift_2", "12"), Answer: 1, Trace: "t4", Error: true},
			{Tool: "get_member", Args: `{"member":"u2"}`, Answer: 2, Trace: "t5"},
			{Tool: "order", Args: order("u2", "gift_2", "80"), Answer: 0, Trace: "t5", Call: 1},
		},
		Answers: []string{
			`{"order": "O1"}`,
			"Error: not enough balance in gift_2: 12 asked, 10 left",
			`{"id": "u2", "wallets": {"card_2": {"kind": "card"}, "gift_2": {"kind": "gift", "amount": 100}}}`,
		},
	}
}

func TestBalanceLearned(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(b *Bundle)
		want   int // relations learned
	}{
		{"as recorded", func(*Bundle) {}, 1},
		{"a success paying beyond the amount", func(b *Bundle) {
			b.Recordings[0].Args = `{"item":"lamp","member":"u1","pays":[{"amount":60,"id":"gift_1"}]}`
		}, 0},
		{"successes only", func(b *Bundle) { b.Recordings = append(b.Recordings[:3:3], b.Recordings[4:]...) }, 0},
		{"a refusal that does not name the wallet", func(b *Bundle) { b.Answers[1] = "Error: no" }, 0},
		{"the trace's own read unknown: the base row breaks its success", func(b *Bundle) {
			b.Recordings = append(b.Recordings[:4:4], b.Recordings[5])
		}, 0},
		{"one judged success only", func(b *Bundle) {
			b.Recordings = b.Recordings[1:4]
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := walletBundle()
			tt.change(b)
			rt := rowsRuntime(t, b)
			bs := rt.tools["order"].balances
			if len(bs) != tt.want {
				t.Fatalf("%d relations learned, want %d", len(bs), tt.want)
			}
			if tt.want == 1 {
				if g := *bs[0]; g.table != "members" || g.ent != "member" || g.field != "wallets" || g.list != "pays" || g.idm != "id" || g.amt != "amount" || g.bal != "amount" {
					t.Errorf("learned %+v, want members[member].wallets[pays[].id].amount ≥ pays[].amount", g)
				}
			}
		})
	}
}

func TestBalanceRefusal(t *testing.T) {
	rt := rowsRuntime(t, walletBundle())
	s := open(t, rt, SessionSpec{})
	for _, tt := range []struct {
		name, args string
		want       string // the refusal, or "" for an answer that is not one
	}{
		{"beyond another member's gift amount", `{"item":"desk","member":"u1","pays":[{"amount":70,"id":"gift_1"}]}`,
			"Error: not enough balance in gift_1: 70 asked, 50 left"},
		{"the second payment beyond", `{"item":"desk","member":"u1","pays":[{"amount":7,"id":"card_1"},{"amount":51,"id":"gift_1"}]}`,
			"Error: not enough balance in gift_1: 51 asked, 50 left"},
		{"within the amount", `{"item":"desk","member":"u1","pays":[{"amount":50,"id":"gift_1"}]}`, ""},
		{"a wallet with no amount is not judged", `{"item":"desk","member":"u1","pays":[{"amount":9999,"id":"card_1"}]}`, ""},
		{"a wallet the member does not hold is not judged", `{"item":"desk","member":"u1","pays":[{"amount":9999,"id":"gift_9"}]}`, ""},
		{"a member the world does not hold is not judged", `{"item":"desk","member":"u9","pays":[{"amount":9999,"id":"gift_1"}]}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.Call(context.Background(), "order", json.RawMessage(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != "" && (!res.Error || res.Content != tt.want || res.Rung != RungInfer) {
				t.Errorf("answer %q (error %v, rung %s), want refusal %q", res.Content, res.Error, res.Rung, tt.want)
			}
			args, _ := mustArgs(t, tt.args).(*jsonvalue.Object)
			if got, refused := rt.tools["order"].balanceRefusal(args, s.row); refused != (tt.want != "") || got != tt.want {
				t.Errorf("relations refuse %v with %q, want %q", refused, got, tt.want)
			}
		})
	}
}
