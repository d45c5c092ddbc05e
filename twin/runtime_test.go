package twin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
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

func TestLadder(t *testing.T) {
	rt := newBank(t, RuntimeOptions{MaxSteps: 10_000})
	tests := []struct {
		name, tool, args string
		content          string
		isErr            bool
		rung             string
		downgraded       bool
	}{
		{"twin read", "get_account", `{"id": "acc_01"}`, `{"id": "acc_01", "owner": "Ann", "status": "open", "balance": 100, "history": []}`, false, RungTwin, false},
		{"tool error is a result", "get_account", `{"id": "nope"}`, `Error: account nope not found`, true, RungTwin, false},
		{"lookup folds case", "find_owner", `{"owner": "ann"}`, `acc_01`, false, RungTwin, false},
		{"replay", "rates", `{"cur": "USD"}`, `{"cur": "USD", "rate": 1.0}`, false, RungReplay, false},
		{"infer substitutes", "rates", `{"cur": "GBP"}`, `{"cur": "GBP", "rate": 1.1}`, false, RungInfer, true},
		{"provided", "echo", `{"x": 3}`, `echo 3`, false, RungProvided, false},
		{"provided fails, twin answers", "broken", `{}`, `synthesized`, false, RungTwin, true},
		{"step limit, replay answers", "spin", `{}`, `spun`, false, RungReplay, true},
		{"twin declines, infer answers", "deposit", `{"id": "zzz", "amount": 1}`, "", false, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, rt, SessionSpec{})
			res, err := s.Call(context.Background(), tt.tool, json.RawMessage(tt.args))
			if tt.rung == "" {
				if !errors.Is(err, ErrNoAnswer) {
					t.Fatalf("Call = %+v, %v; want ErrNoAnswer (deposit has no recordings)", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Content != tt.content || res.Error != tt.isErr || res.Rung != tt.rung || res.Downgraded != tt.downgraded {
				t.Fatalf("Call = %+v\nwant content %q error %v rung %s downgraded %v", res, tt.content, tt.isErr, tt.rung, tt.downgraded)
			}
			if res.Fidelity != FidelityOf(tt.rung) {
				t.Fatalf("fidelity %s for rung %s", res.Fidelity, res.Rung)
			}
		})
	}
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

func TestCallErrors(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	if _, err := s.Call(ctx, "no_such_tool", json.RawMessage(`{}`)); !errors.Is(err, ErrUnknownTool) || !strings.Contains(err.Error(), "no_such_tool") {
		t.Fatalf("unknown tool: %v", err)
	}
	for _, bad := range []string{`[1]`, `"x"`, `null`, `{`, ``} {
		if _, err := s.Call(ctx, "get_account", json.RawMessage(bad)); !errors.Is(err, ErrBadArguments) {
			t.Errorf("args %q: %v, want ErrBadArguments", bad, err)
		}
	}
	if _, err := s.Call(ctx, "nowhere", json.RawMessage(`{}`)); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("no simulator: %v, want ErrNoAnswer", err)
	}
	s.Close()
	if _, err := s.Call(ctx, "get_account", json.RawMessage(`{"id": "acc_01"}`)); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed session: %v", err)
	}
}

// fakeModel stands in for the model endpoint (an outside paid service): it answers
// from the request, and counts calls.
type fakeModel struct {
	mu    sync.Mutex
	calls int
	reply string
}

func (f *fakeModel) Simulate(_ context.Context, req SimRequest) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.reply, nil
}

func TestSimulate(t *testing.T) {
	sim := &fakeModel{reply: `{"ok": true}`}
	rt := newBank(t, RuntimeOptions{Simulator: sim})
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		res, err := s.Call(ctx, "nowhere", json.RawMessage(`{"q": 1}`))
		if err != nil || res.Rung != RungSimulate || res.Fidelity != FidelitySimulated || res.Content != `{"ok": true}` {
			t.Fatalf("simulate = %+v, %v", res, err)
		}
	}
	if sim.calls != 1 {
		t.Fatalf("simulator called %d times for the same state and arguments, want 1 (cached)", sim.calls)
	}
	// A write nothing else can answer is simulated, downgraded and changes nothing.
	h := s.StateHash()
	res, err := s.Call(ctx, "deposit", json.RawMessage(`{"id": "ghost", "amount": 1}`))
	if err != nil || res.Rung != RungSimulate || !res.Downgraded || res.Changed || s.StateHash() != h {
		t.Fatalf("simulated write = %+v, %v", res, err)
	}
	// A write bound to the model starts at simulate, and is still marked.
	res, err = s.Call(ctx, "wire_money", json.RawMessage(`{"to": "x"}`))
	if err != nil || !res.Downgraded || res.Changed {
		t.Fatalf("write bound to simulate = %+v, %v", res, err)
	}
	// An answer of the wrong type is rejected.
	sim.reply = `[1, 2]`
	if _, err := s.Call(ctx, "nowhere", json.RawMessage(`{"q": 2}`)); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("invalid simulated answer: %v, want ErrNoAnswer", err)
	}
}

func TestCallBudget(t *testing.T) {
	rt := newBank(t, RuntimeOptions{MaxSteps: 1 << 40, CallBudget: 20 * time.Millisecond})
	s := open(t, rt, SessionSpec{})
	start := time.Now()
	res, err := s.Call(context.Background(), "spin", json.RawMessage(`{}`))
	if err != nil || res.Rung != RungReplay || !strings.Contains(res.Note, "time budget") {
		t.Fatalf("spin = %+v, %v", res, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("budget of 20ms took %v", d)
	}
}

func TestSeeding(t *testing.T) {
	rt := newBank(t, RuntimeOptions{})
	spec := SessionSpec{Seed: 7, SeedInstructions: "3 accounts for user Ann with status frozen; user Cy with tier silver"}
	s, rc, err := rt.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Seeded || rc.Note != nil || len(rc.Pinned["accounts"]) != 3 || len(rc.Pinned["users"]) != 2 {
		t.Fatalf("receipts = %+v", rc)
	}
	ctx := context.Background()
	for _, k := range rc.Pinned["accounts"] {
		res, err := s.Call(ctx, "get_account", json.RawMessage(`{"id": "`+k+`"}`))
		if err != nil || res.Error || !strings.Contains(res.Content, `"status": "frozen"`) || !strings.Contains(res.Content, `"owner": "Ann"`) {
			t.Fatalf("seeded account %s = %+v, %v", k, res, err)
		}
		if !strings.HasPrefix(k, "acc_") || len(k) != 6 {
			t.Fatalf("key %q not in the table's key shape acc_99", k)
		}
	}
	ann, _ := s.Row("users", "Ann")
	for _, k := range rc.Pinned["accounts"] {
		if !strings.Contains(string(ann), k) {
			t.Fatalf("user Ann's accounts %s lack seeded %s", ann, k)
		}
	}
	if cy, ok := s.Row("users", "Cy"); !ok || !strings.Contains(string(cy), `"tier":"silver"`) {
		t.Fatalf("user Cy = %s", cy)
	}
	// Same inputs, another runtime from the re-read bundle: the same world.
	data, _ := bankBundle().Marshal()
	b2, err := UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	rt2, _ := NewRuntime(b2, RuntimeOptions{})
	_, rc2, _ := rt2.Open(spec)
	if rc2.WorldHash != rc.WorldHash || strings.Join(rc2.Pinned["accounts"], ",") != strings.Join(rc.Pinned["accounts"], ",") {
		t.Fatalf("same seed, different worlds: %s vs %s", rc.WorldHash, rc2.WorldHash)
	}
	// Another seed draws other keys.
	_, rc3, _ := rt.Open(SessionSpec{Seed: 8, SeedInstructions: spec.SeedInstructions})
	if rc3.WorldHash == rc.WorldHash {
		t.Fatal("seeds 7 and 8 made the same world")
	}
	// Words that cannot become rows: unseeded world and a note.
	_, rc4, err := rt.Open(SessionSpec{Seed: 1, SeedInstructions: "2 spaceships with warp drive"})
	if err != nil || rc4.Seeded || rc4.Note == nil || rc4.WorldHash != rt.BaseHash() {
		t.Fatalf("bad instructions: %+v, %v", rc4, err)
	}
	// "for <key>" names the one table an account refers to.
	_, rc6, err := rt.Open(SessionSpec{Seed: 2, SeedInstructions: "an account for Ann with balance 3"})
	if err != nil || !rc6.Seeded || len(rc6.Pinned["accounts"]) != 1 || rc6.Pinned["users"][0] != "Ann" {
		t.Fatalf("for <key>: %+v, %v", rc6, err)
	}
	// A scenario is named instructions.
	s5, rc5, err := rt.Open(SessionSpec{Scenario: "rich"})
	if err != nil || !rc5.Seeded || rc5.Scenario == nil || *rc5.Scenario != "rich" || rc5.SeedInstructions != "account acc_01 with balance 1000000" {
		t.Fatalf("scenario: %+v, %v", rc5, err)
	}
	if r, _ := s5.Row("accounts", "acc_01"); !strings.Contains(string(r), `"balance":1000000`) {
		t.Fatalf("scenario row = %s", r)
	}
	if _, _, err := rt.Open(SessionSpec{Scenario: "rich", SeedInstructions: "user Cy"}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("scenario with instructions: %v", err)
	}
	if _, _, err := rt.Open(SessionSpec{Scenario: "poor"}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("unknown scenario: %v", err)
	}
	if _, _, err := rt.Open(SessionSpec{Clock: "yesterday"}); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("bad clock: %v", err)
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

func TestPreferRecorded(t *testing.T) {
	b := bankBundle()
	row, _ := ParseJSONString(b.Tables[0].Rows[0].JSON)
	b.Answers = append(b.Answers, `Error: deposits paused`)
	b.Recordings = append(b.Recordings, Recording{Tool: "deposit", Args: `{"amount":1,"id":"acc_01"}`, Answer: len(b.Answers) - 1,
		Error: true, State: Fingerprint(row.(*Object)), Trace: "t3"})
	b.Tools[1].PreferRecorded = true
	rt, err := NewRuntime(b, RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, rt, SessionSpec{})
	ctx := context.Background()
	res, err := s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`))
	if err != nil || res.Rung != RungReplay || res.Content != "Error: deposits paused" || !res.Error || res.Downgraded {
		t.Fatalf("recorded answer from the same state: %+v, %v", res, err)
	}
	// Other arguments (or another state) go to the handler.
	res, err = s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 2}`))
	if err != nil || res.Rung != RungTwin || !res.Changed {
		t.Fatalf("deposit of 2: %+v, %v", res, err)
	}
	res, err = s.Call(ctx, "deposit", json.RawMessage(`{"id": "acc_01", "amount": 1}`))
	if err != nil || res.Rung != RungTwin {
		t.Fatalf("deposit of 1 from a changed state: %+v, %v", res, err)
	}
}
