package twin_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
)

// tableSeeder stands in for the model behind twin.Seeder (the model side is tested in package llm against a
// local server speaking the chat-completions protocol): it answers fixed rows and counts its calls.
type tableSeeder struct {
	rows  []twin.SeedRow
	note  string
	err   error
	calls int
	last  twin.SeedRequest
}

func (s *tableSeeder) SeedRows(_ context.Context, req twin.SeedRequest) ([]twin.SeedRow, string, error) {
	s.calls++
	s.last = req
	return s.rows, s.note, s.err
}

func bankRuntime(t *testing.T, seeder twin.Seeder) *twin.Runtime {
	t.Helper()
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	b, err := twin.UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{Seeder: seeder})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestModelSeeding(t *testing.T) {
	const instr = "a rich customer called Zed with a vault account"
	seeder := &tableSeeder{rows: []twin.SeedRow{{Table: "accounts", Key: "zed", Row: json.RawMessage(`{"id": "zed", "balance": 1000000}`)}}}
	rt := bankRuntime(t, seeder)

	s, rc, err := rt.Open(twin.SessionSpec{Seed: 5, SeedInstructions: instr})
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Seeded || rc.Note != nil || len(rc.SeedRows) != 1 || strings.Join(rc.Pinned["accounts"], ",") != "zed" {
		t.Fatalf("receipts = %+v (note %v)", rc, rc.Note)
	}
	if seeder.calls != 1 || seeder.last.Instructions != instr || seeder.last.Seed != 5 || len(seeder.last.Tables) != 1 ||
		seeder.last.Tables[0].Key != "id" || len(seeder.last.Tables[0].Examples) != 2 {
		t.Fatalf("seeder asked %d times with %+v", seeder.calls, seeder.last)
	}
	res, err := s.Call(context.Background(), "get_account", json.RawMessage(`{"id": "zed"}`))
	if err != nil || res.Error || !strings.Contains(res.Content, "1000000") {
		t.Fatalf("seeded row not in the world: %+v, %v", res, err)
	}
	if rc.WorldHash == rt.BaseHash() {
		t.Error("a seeded world has the base world's hash")
	}

	// Rebuilding from the receipts' rows gives the same world without asking again.
	_, again, err := rt.Open(twin.SessionSpec{Seed: 5, SeedInstructions: instr, SeedRows: rc.SeedRows})
	if err != nil {
		t.Fatal(err)
	}
	if again.WorldHash != rc.WorldHash || seeder.calls != 1 {
		t.Errorf("rebuild: hash %s vs %s, seeder called %d times", again.WorldHash, rc.WorldHash, seeder.calls)
	}

	// Instructions the built-in parser reads never reach the seeder.
	if _, rc, err := rt.Open(twin.SessionSpec{Seed: 5, SeedInstructions: "account a9 with balance 3"}); err != nil || !rc.Seeded {
		t.Fatalf("parser seeding: %+v %v", rc, err)
	}
	if seeder.calls != 1 {
		t.Errorf("the parser's instructions reached the seeder")
	}
}

func TestModelSeedingFailures(t *testing.T) {
	tests := []struct {
		name   string
		seeder *tableSeeder
		want   string
	}{
		{"model error", &tableSeeder{err: errors.New("model unavailable")}, "model unavailable"},
		{"no rows", &tableSeeder{note: "no such thing as a vault"}, "no such thing as a vault"},
		{"unknown table", &tableSeeder{rows: []twin.SeedRow{{Table: "vaults", Key: "v", Row: json.RawMessage(`{}`)}}}, `no table "vaults"`},
		{"key mismatch", &tableSeeder{rows: []twin.SeedRow{{Table: "accounts", Key: "x", Row: json.RawMessage(`{"id": "y"}`)}}}, "does not match"},
		{"not an object", &tableSeeder{rows: []twin.SeedRow{{Table: "accounts", Key: "x", Row: json.RawMessage(`[1]`)}}}, "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := bankRuntime(t, tt.seeder)
			_, rc, err := rt.Open(twin.SessionSpec{Seed: 1, SeedInstructions: "a vault full of gold"})
			if err != nil {
				t.Fatal(err)
			}
			if rc.Seeded || rc.Note == nil || !strings.Contains(*rc.Note, tt.want) || rc.WorldHash != rt.BaseHash() || len(rc.SeedRows) != 0 {
				t.Errorf("receipts = %+v note %v; want unseeded on the base world with a note naming %q", rc, rc.Note, tt.want)
			}
		})
	}
	// Rows given back in a spec that do not fit are the caller's mistake.
	rt := bankRuntime(t, nil)
	if _, _, err := rt.Open(twin.SessionSpec{SeedRows: []twin.SeedRow{{Table: "nope", Key: "k", Row: json.RawMessage(`{}`)}}}); !errors.Is(err, twin.ErrBadSpec) {
		t.Errorf("bad seed rows in the spec: err = %v, want ErrBadSpec", err)
	}
}
