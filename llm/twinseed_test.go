package llm

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
)

// TestTwinSeeder: a twin whose parser cannot read the instructions asks the model (a local server speaking the
// chat-completions protocol), applies its rows, and returns them in the receipts; reopening with those rows gives
// the same world without another model call.
func TestTwinSeeder(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) {
		return 200, `{"rows":{"accounts":[{"id":"zed","balance":1000000}]},"note":""}`
	})
	data, err := rpctest.BankBundle()
	if err != nil {
		t.Fatal(err)
	}
	b, err := twin.UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{Seeder: TwinSeeder{S: NewSeeder(f.client(t), nil)}})
	if err != nil {
		t.Fatal(err)
	}
	const instr = "a millionaire named Zed"
	s, rc, err := rt.Open(twin.SessionSpec{Seed: 9, SeedInstructions: instr})
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Seeded || len(rc.SeedRows) != 1 || rc.SeedRows[0].Key != "zed" || rc.Pinned["accounts"][0] != "zed" {
		t.Fatalf("receipts = %+v", rc)
	}
	res, err := s.Call(context.Background(), "get_account", json.RawMessage(`{"id":"zed"}`))
	if err != nil || !strings.Contains(res.Content, "1000000") {
		t.Fatalf("call: %+v %v", res, err)
	}
	req := f.requests()[0]
	if !strings.Contains(req.Messages[0].Content, `example row: {"id":"a1","balance":10}`) || !strings.Contains(req.Messages[1].Content, instr) {
		t.Errorf("prompt lacks the table's example rows or the instructions:\n%s\n%s", req.Messages[0].Content, req.Messages[1].Content)
	}
	_, again, err := rt.Open(twin.SessionSpec{Seed: 9, SeedInstructions: instr, SeedRows: rc.SeedRows})
	if err != nil || again.WorldHash != rc.WorldHash || len(f.requests()) != 1 {
		t.Fatalf("rebuild: %v, hash %s vs %s, %d model calls", err, again.WorldHash, rc.WorldHash, len(f.requests()))
	}
}
