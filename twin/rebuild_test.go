package twin

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

func TestRebuild(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	spec := SessionSpec{Seed: 3, SeedInstructions: "account acc_05 for user Ann"}
	s := open(t, rt, spec)
	ctx := context.Background()
	var journal []JournalEntry
	for _, c := range []struct{ tool, args string }{
		{"deposit", `{"id": "acc_01", "amount": 10}`},
		{"get_account", `{"id": "acc_05"}`},
		{"deposit", `{"id": "acc_05", "amount": 1.25}`},
		{"rates", `{"cur": "EUR"}`},
	} {
		res, err := s.Call(ctx, c.tool, json.RawMessage(c.args))
		if err != nil {
			t.Fatal(err)
		}
		journal = append(journal, JournalEntry{Tool: c.tool, Args: json.RawMessage(c.args), Content: res.Content, Rung: res.Rung, StateHash: res.StateHash})
	}
	r, _, err := rt.Rebuild(ctx, spec, journal)
	if err != nil {
		t.Fatal(err)
	}
	if r.StateHash() != s.StateHash() {
		t.Fatalf("rebuilt %s, original %s", r.StateHash(), s.StateHash())
	}
	journal[2].Args = json.RawMessage(`{"id": "acc_05", "amount": 2}`)
	if _, _, err := rt.Rebuild(ctx, spec, journal); !errors.Is(err, ErrDiverged) {
		t.Fatalf("tampered journal: %v, want ErrDiverged", err)
	}
}
