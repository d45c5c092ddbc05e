package twin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

const getAccount = `
def get_account(args):
    row = world.get("accounts", args.get("id"))
    if row == None:
        return error("Error: account " + pystr(args.get("id")) + " not found")
    return row
`

const deposit = `
def deposit(args):
    key = args.get("id")
    row = world.get("accounts", key)
    if row == None:
        return decline("no such account")
    if row["status"] != "open":
        return error("Error: account is not open")
    row["balance"] = row["balance"] + args.get("amount")
    row["history"].append({"kind": "deposit", "amount": args.get("amount")})
    world.put("accounts", key, row)
    return row
`

const findOwner = `
def find_owner(args):
    keys = world.find("accounts", {"owner": args.get("owner")}, ignore_case=["owner"])
    if not keys:
        return error("Error: no account")
    return keys[0]
`

// bankBundle is a small hand-written bundle exercising every rung.
func bankBundle() *Bundle {
	schema := json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}}}`)
	return &Bundle{
		Format:       FormatVersion,
		Name:         "bank",
		SchemaSource: "traces",
		Style:        StylePython,
		Tools: []Tool{
			{Name: "get_account", InputSchema: schema, Binding: BindingSynthesized, Rung: RungTwin, Kind: KindRead, Source: getAccount, Table: "accounts", KeyArg: "id"},
			{Name: "deposit", InputSchema: schema, Binding: BindingSynthesized, Rung: RungTwin, Kind: KindWrite, Source: deposit, Table: "accounts", KeyArg: "id"},
			{Name: "find_owner", InputSchema: schema, Binding: BindingSynthesized, Rung: RungTwin, Kind: KindLookup, Source: findOwner, Table: "accounts"},
			{Name: "rates", InputSchema: schema, Binding: BindingSimulated, Rung: RungReplay, Kind: KindQuery},
			{Name: "echo", InputSchema: schema, Binding: BindingProvided, Rung: RungProvided, Kind: KindPure,
				Provided: "def handle(args):\n    return \"echo \" + pystr(args.get(\"x\"))\n"},
			{Name: "broken", InputSchema: schema, Binding: BindingProvided, Rung: RungProvided, Kind: KindPure,
				Provided: "def broken(args):\n    return 1 // 0\n", Source: "def broken(args):\n    return \"synthesized\"\n"},
			{Name: "spin", InputSchema: schema, Binding: BindingProvided, Rung: RungProvided, Kind: KindPure,
				Provided: "def spin(args):\n    n = 0\n    while True:\n        n += 1\n"},
			{Name: "close_account", InputSchema: schema, Binding: BindingSimulated, Rung: RungReplay, Kind: KindWrite, Table: "accounts", KeyArg: "id"},
			{Name: "nowhere", InputSchema: schema, Binding: BindingSimulated, Rung: RungSimulate, Kind: KindUnknown,
				OutputSchema: json.RawMessage(`{"type":"object"}`)},
			{Name: "wire_money", InputSchema: schema, Binding: BindingSimulated, Rung: RungSimulate, Kind: KindWrite},
		},
		Tables: []Table{
			{Name: "accounts", Key: "id", KeyInRow: true, KeyShape: `\a\c\c_99`, Rows: []Row{
				{Key: "acc_01", JSON: `{"id": "acc_01", "owner": "Ann", "status": "open", "balance": 100, "history": []}`},
				{Key: "acc_02", JSON: `{"id": "acc_02", "owner": "bob", "status": "frozen", "balance": 5.5, "history": []}`},
			}, Indexes: []Index{{Path: "owner", Fold: true}}, Refs: []Ref{{Field: "owner", Table: "users"}}},
			{Name: "users", Key: "name", KeyInRow: true, KeyShape: "aaaa", Rows: []Row{
				{Key: "Ann", JSON: `{"name": "Ann", "accounts": ["acc_01"], "tier": "gold"}`},
			}, Refs: []Ref{{Field: "accounts", Table: "accounts", Many: true}}},
		},
		Recordings: []Recording{
			{Tool: "rates", Args: `{"cur":"EUR"}`, Answer: 0, Trace: "t1", Call: 0},
			{Tool: "rates", Args: `{"cur":"USD"}`, Answer: 1, Trace: "t1", Call: 1},
			{Tool: "spin", Args: `{}`, Answer: 2, Trace: "t1", Call: 2},
			{Tool: "close_account", Args: `{"id":"acc_01"}`, Answer: 3, Trace: "t2", Call: 0, State: "-"},
		},
		Answers: []string{`{"cur": "EUR", "rate": 1.1}`, `{"cur": "USD", "rate": 1.0}`, `spun`,
			`{"id": "acc_01", "owner": "Ann", "status": "closed", "balance": 0, "history": []}`},
		Scenarios: map[string]string{"rich": "account acc_01 with balance 1000000"},
	}
}

func newBank(t testing.TB, opts RuntimeOptions) *Runtime {
	t.Helper()
	rt, err := NewRuntime(bankBundle(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func open(t testing.TB, rt *Runtime, spec SessionSpec) *Session {
	t.Helper()
	s, _, err := rt.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestWritesAndIsolation(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	ctx := context.Background()
	a, b := open(t, rt, SessionSpec{}), open(t, rt, SessionSpec{})
	h0 := a.StateHash()
	if h0 != rt.BaseHash() || b.StateHash() != h0 {
		t.Fatalf("fresh sessions hash %s and %s, base %s", h0, b.StateHash(), rt.BaseHash())
	}
	res, err := a.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 2.5}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id": "acc_01", "owner": "Ann", "status": "open", "balance": 102.5, "history": [{"kind": "deposit", "amount": 2.5}]}`
	if res.Content != want || !res.Changed || res.StateHash == h0 {
		t.Fatalf("deposit = %+v, want %s and a new state", res, want)
	}
	got, _ := a.Call(ctx, "get_account", json.RawMessage(`{"id": "acc_01"}`))
	if got.Content != want {
		t.Fatalf("read after write = %s", got.Content)
	}
	if other, _ := b.Call(ctx, "get_account", json.RawMessage(`{"id": "acc_01"}`)); strings.Contains(other.Content, "102.5") {
		t.Fatal("session B sees session A's write")
	}
	if b.StateHash() != h0 {
		t.Fatal("session B's state changed")
	}
	// A refused write changes nothing.
	res, err = a.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_02", "amount": 1}`))
	if err != nil || !res.Error || res.Changed || res.StateHash != a.StateHash() {
		t.Fatalf("refused deposit = %+v, %v", res, err)
	}
	// A replayed write from the recorded state applies the recorded row.
	res, err = b.Call(ctx, "close_account", json.RawMessage(`{"id": "acc_01"}`))
	if err != nil || res.Rung != RungReplay {
		t.Fatalf("close_account = %+v, %v", res, err)
	}
	if res.Changed {
		t.Fatal("replay applied a row recorded from a different state")
	}
}

// TestGoldenWorldHash pins the world hash of a fixed bundle, seed and
// instructions: any machine, any process must agree.
func TestGoldenWorldHash(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	_, rc, err := rt.Open(SessionSpec{Seed: 42, SeedInstructions: "2 accounts for user Ann with status open", Clock: "2024-05-01T00:00:00Z"})
	if err != nil {
		t.Fatal(err)
	}
	const golden = "sha256:98ce091f13c980a7ca904f650d8dac094fb60c289587c11c267e30f7f238365c"
	if rc.WorldHash != golden {
		t.Fatalf("world hash = %s, want %s", rc.WorldHash, golden)
	}
}

func TestBundleMarshal(t *testing.T) {
	b := bankBundle()
	d1, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b2, err := UnmarshalBundle(d1)
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := b2.Marshal()
	if string(d1) != string(d2) || b.Hash() != b2.Hash() || !strings.HasPrefix(b.Hash(), "sha256:") {
		t.Fatal("marshal → unmarshal → marshal changed the bytes")
	}
	// Tool order in memory does not matter.
	b3 := bankBundle()
	b3.Tools[0], b3.Tools[1] = b3.Tools[1], b3.Tools[0]
	if b3.Hash() != b.Hash() {
		t.Fatal("tool order changed the hash")
	}
	bad := []struct {
		mutate func(*Bundle)
		field  string
	}{
		{func(b *Bundle) { b.Tools[1].Binding = "magic" }, "tools[1].binding"},
		{func(b *Bundle) { b.Tools[0].Rung = "top" }, "tools[0].rung"},
		{func(b *Bundle) { b.Tools[0].Table = "ghosts" }, "tools[0].table"},
		{func(b *Bundle) { b.Recordings[0].Answer = 99 }, "recordings[0].answer"},
		{func(b *Bundle) { b.Tools[2].Name = b.Tools[1].Name }, "tools[2].name"},
	}
	for _, tt := range bad {
		b := bankBundle()
		tt.mutate(b)
		data, _ := json.Marshal(b)
		if _, err := UnmarshalBundle(data); !errors.Is(err, ErrBadBundle) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: %v", tt.field, err)
		}
	}
	if _, err := UnmarshalBundle([]byte(`{"format": 999}`)); !errors.Is(err, ErrBadBundle) {
		t.Fatalf("future format: %v", err)
	}
	b4 := bankBundle()
	b4.Tools[0].Source = "def get_account(args):\n    return (\n"
	if _, err := NewRuntime(b4, RuntimeOptions{}); !errors.Is(err, ErrBadBundle) || !strings.Contains(err.Error(), "get_account") {
		t.Fatalf("bad source: %v", err)
	}
}

func TestConcurrentSessions(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	var wg sync.WaitGroup
	hashes := make([]string, 8)
	for i := range hashes {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, _, err := rt.Open(SessionSpec{Seed: 5, SeedInstructions: "2 accounts for user Ann"})
			if err != nil {
				t.Error(err)
				return
			}
			for j := 0; j < 20; j++ {
				if _, err := s.Call(context.Background(), "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`)); err != nil {
					t.Error(err)
				}
				_, _ = s.Call(context.Background(), "find_owner", json.RawMessage(`{"owner": "bob"}`))
			}
			hashes[i] = s.StateHash()
		}(i)
	}
	wg.Wait()
	for _, h := range hashes[1:] {
		if h != hashes[0] {
			t.Fatalf("same calls in parallel sessions gave different states: %v", hashes)
		}
	}
}

// TestParsedRowsAreSharedReadOnly: a runtime given parsed base rows serves them as they are (acc_02's tree
// here differs from its JSON, to show which one is used), its sessions' writes leave them unchanged, and
// rows it was not given are parsed from the bundle.
func TestParsedRowsAreSharedReadOnly(t *testing.T) {
	parsed := map[string]*jsonvalue.Object{}
	for _, r := range bankBundle().Tables[0].Rows {
		v, err := jsonvalue.ParseString(r.JSON)
		if err != nil {
			t.Fatal(err)
		}
		parsed[r.Key] = v.(*jsonvalue.Object)
	}
	parsed["acc_02"].Set("owner", "Bea")
	before := map[string]string{}
	for k, o := range parsed {
		before[k] = string(jsonvalue.Canonical(o))
	}
	rt := newBank(t, RuntimeOptions{Parsed: map[string]map[string]*jsonvalue.Object{"accounts": parsed}})
	if rt.BaseHash() == newBank(t, RuntimeOptions{}).BaseHash() {
		t.Fatal("the base hash ignores the parsed rows")
	}
	ctx := context.Background()
	s := open(t, rt, SessionSpec{})
	for _, c := range []struct{ tool, args, want string }{
		{"deposit", `{"id": "acc_01", "amount": 2.5}`, `"balance": 102.5`},
		{"get_account", `{"id": "acc_02"}`, `"owner": "Bea"`},
		{"find_owner", `{"owner": "bea"}`, `acc_02`},
	} {
		res, err := s.Call(ctx, c.tool, json.RawMessage(c.args))
		if err != nil || !strings.Contains(res.Content, c.want) {
			t.Fatalf("%s %s = %+v, %v; want %s", c.tool, c.args, res, err, c.want)
		}
	}
	if row, ok := s.Row("users", "Ann"); !ok || !strings.Contains(string(row), "gold") {
		t.Fatalf("users[Ann] = %s, %v: a table without parsed rows is parsed from the bundle", row, ok)
	}
	for k, o := range parsed {
		if got := string(jsonvalue.Canonical(o)); got != before[k] {
			t.Fatalf("session changed the shared row %s: %s, was %s", k, got, before[k])
		}
	}
}
