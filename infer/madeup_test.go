package infer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// A small made-up domain, generated here (unlike tau and BFCL): a phone with a wallet, notes, a little file tree and
// contacts. Its "production" is phoneWorld below; every trace starts from a world of its own (the data switch,
// airplane mode, battery, balance and notes drawn per trace), so what a twin knows of a held-out trace's world is
// what the trace showed. Nothing in doppel knows this domain: each capability the test checks is learned from
// these traces and the definitions below.

// phoneWorld is one trace's production backend.
type phoneWorld struct {
	data, airplane string // "ON" / "OFF"
	battery        int
	balance        float64
	notes          int
	cwd            string
	user           string
	dirs           map[string][]string
	contacts       map[string][2]string
}

func newPhoneWorld(rng *rand.Rand) *phoneWorld {
	w := &phoneWorld{data: "ON", airplane: "OFF", battery: 20 + rng.IntN(81), balance: float64(50+rng.IntN(450)) + 0.5,
		notes: rng.IntN(6), cwd: "home", user: []string{"ann", "bob", "cy"}[rng.IntN(3)],
		dirs: map[string][]string{"home": {"docs", "music", "notes.txt"}, "docs": {"cv.pdf", "plan.md"}, "music": {"song.mp3"}},
		contacts: map[string][2]string{"ct_1001": {"Ada Byron", "+44 1000"}, "ct_1002": {"Alan Turing", "+44 1002"},
			"ct_1003": {"Grace Hopper", "+1 1003"}}}
	if rng.IntN(10) < 3 {
		w.data = "OFF"
	}
	if rng.IntN(10) < 2 {
		w.airplane = "ON"
	}
	return w
}

func flipOnOff(s string) string {
	if s == "ON" {
		return "OFF"
	}
	return "ON"
}

func pyFloat(f float64) string { return twin.StylePython.FormatFloat(f) }

// answer runs one call as production does: the answer's text.
func (w *phoneWorld) answer(tool string, args map[string]any) string {
	num := func(k string) float64 { f, _ := args[k].(float64); return f }
	switch tool {
	case "get_status":
		return fmt.Sprintf("Mobile Data: %s\nAirplane Mode: %s\nBattery: %d%%", w.data, w.airplane, w.battery)
	case "toggle_data":
		w.data = flipOnOff(w.data)
		return "Mobile Data is now " + w.data + "."
	case "toggle_airplane":
		w.airplane = flipOnOff(w.airplane)
		return "Airplane Mode is now " + w.airplane + "."
	case "get_balance":
		return fmt.Sprintf(`{"balance": %s, "currency": "EUR"}`, pyFloat(w.balance))
	case "deposit":
		w.balance += num("amount")
		return fmt.Sprintf(`{"balance": %s}`, pyFloat(w.balance))
	case "withdraw":
		w.balance -= num("amount")
		return fmt.Sprintf(`{"balance": %s}`, pyFloat(w.balance))
	case "sign_in":
		w.user = args["user"].(string)
		return `{"signed_in": true}`
	case "whoami":
		return fmt.Sprintf(`{"user": %q}`, w.user)
	case "count_notes":
		return fmt.Sprintf(`{"count": %d}`, w.notes)
	case "create_note":
		w.notes++
		b, _ := json.Marshal(args["text"])
		return fmt.Sprintf(`{"id": %d, "text": %s}`, w.notes, b)
	case "cd":
		w.cwd = args["dir"].(string)
		return fmt.Sprintf(`{"cwd": %q}`, w.cwd)
	case "ls":
		b, _ := json.Marshal(w.dirs[w.cwd])
		return strings.ReplaceAll(fmt.Sprintf(`{"entries": %s}`, b), `","`, `", "`)
	case "get_contact":
		c := w.contacts[args["contact_id"].(string)]
		return fmt.Sprintf(`{"contact_id": %q, "name": %q, "phone": %q}`, args["contact_id"], c[0], c[1])
	case "km_to_miles":
		return fmt.Sprintf(`{"miles": %s}`, pyFloat(num("km")*0.621371))
	}
	return "Error: unknown tool"
}

// phoneDefs are the tool definitions the agent was given. deposit's says currency is required, but production takes
// calls without it (every recorded deposit omits it): the build must not apply that rule. get_signal is defined and
// never called.
const phoneDefs = `[
 {"name": "get_status", "description": "The phone's status line.", "parameters": {"type": "object", "properties": {}}},
 {"name": "toggle_data", "description": "Turn mobile data on or off.", "parameters": {"type": "object", "properties": {}}},
 {"name": "toggle_airplane", "description": "Turn airplane mode on or off.", "parameters": {"type": "object", "properties": {}}},
 {"name": "get_balance", "description": "The wallet's balance.", "parameters": {"type": "object", "properties": {}}},
 {"name": "deposit", "description": "Add money.", "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}}, "required": ["amount", "currency"]}},
 {"name": "withdraw", "description": "Take money out.", "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}},
 {"name": "sign_in", "description": "Sign in as a user.", "parameters": {"type": "object", "properties": {"user": {"type": "string"}}, "required": ["user"]}},
 {"name": "whoami", "description": "Who is signed in.", "parameters": {"type": "object", "properties": {}}},
 {"name": "count_notes", "description": "How many notes there are.", "parameters": {"type": "object", "properties": {}}},
 {"name": "create_note", "description": "Write a note.", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
 {"name": "cd", "description": "Change directory.", "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}, "required": ["dir"]}},
 {"name": "ls", "description": "List the current directory.", "parameters": {"type": "object", "properties": {}}},
 {"name": "get_contact", "description": "A contact by id.", "parameters": {"type": "object", "properties": {"contact_id": {"type": "string"}}, "required": ["contact_id"]}},
 {"name": "km_to_miles", "description": "Convert.", "parameters": {"type": "object", "properties": {"km": {"type": "number"}}, "required": ["km"]}},
 {"name": "get_signal", "description": "The phone's signal strength.", "parameters": {"type": "object", "properties": {}}}
]`

// phoneTraces generates n traces of the domain (task i: "madeup/task-i/trial-0"), each from a world of its own.
func phoneTraces(n int) []trace.Trace {
	rng := rand.New(rand.NewPCG(36, 2024))
	type step struct {
		tool string
		args map[string]any
	}
	var out []trace.Trace
	for i := range n {
		w := newPhoneWorld(rng)
		// Reads first, so each trace shows its world before writing it (as an agent checks before it acts).
		steps := []step{{"get_status", map[string]any{}}, {"get_balance", map[string]any{}}, {"count_notes", map[string]any{}}}
		for len(steps) < 6+rng.IntN(6) {
			switch rng.IntN(12) {
			case 11:
				steps = append(steps, step{"sign_in", map[string]any{"user": []string{"dee", "eve", "fay", "gus"}[rng.IntN(4)]}},
					step{"whoami", map[string]any{}})
			case 0:
				steps = append(steps, step{"get_status", map[string]any{}})
			case 1:
				steps = append(steps, step{"toggle_data", map[string]any{}})
			case 2:
				steps = append(steps, step{"toggle_airplane", map[string]any{}})
			case 3:
				steps = append(steps, step{"get_balance", map[string]any{}})
			case 4:
				steps = append(steps, step{"deposit", map[string]any{"amount": float64(5 * (1 + rng.IntN(20)))}})
			case 5:
				steps = append(steps, step{"withdraw", map[string]any{"amount": float64(1 + rng.IntN(40))}})
			case 6:
				steps = append(steps, step{"create_note", map[string]any{"text": fmt.Sprintf("note %d of task %d", len(steps), i)}})
			case 7:
				dir := []string{"home", "docs", "music"}[rng.IntN(3)]
				steps = append(steps, step{"cd", map[string]any{"dir": dir}}, step{"ls", map[string]any{}})
			case 8:
				steps = append(steps, step{"ls", map[string]any{}})
			case 9:
				steps = append(steps, step{"get_contact", map[string]any{"contact_id": fmt.Sprintf("ct_100%d", 1+rng.IntN(3))}})
			case 10:
				steps = append(steps, step{"km_to_miles", map[string]any{"km": float64(1 + rng.IntN(200))}})
			}
		}
		t := trace.Trace{ID: fmt.Sprintf("madeup/task-%d/trial-0", i), Model: "scripted",
			Messages: []trace.Message{{Role: trace.RoleSystem, Content: ptrTo("You run the user's phone.")},
				{Role: trace.RoleUser, Content: ptrTo("Please help with my phone.")}}}
		for j, s := range steps {
			args, _ := json.Marshal(s.args)
			id := fmt.Sprintf("call_%d", j)
			t.Messages = append(t.Messages,
				trace.Message{Role: trace.RoleAssistant, ToolCalls: []trace.ToolCall{{ID: id, Type: "function",
					Function: trace.Function{Name: s.tool, Arguments: string(args)}}}},
				trace.Message{Role: trace.RoleTool, ToolCallID: id, Content: ptrTo(w.answer(s.tool, s.args))})
		}
		t.Messages = append(t.Messages, trace.Message{Role: trace.RoleAssistant, Content: ptrTo("Done.")})
		out = append(out, t)
	}
	return out
}

func ptrTo(s string) *string { return &s }

// phoneCall calls a tool in s and answers the result, failing the test on a transport error.
func phoneCall(t *testing.T, s *twin.Session, tool, args string) twin.Result {
	t.Helper()
	res, err := s.Call(context.Background(), tool, json.RawMessage(args))
	if err != nil {
		t.Fatalf("%s(%s): %v", tool, args, err)
	}
	return res
}

// TestMadeUpDomain builds a twin from the made-up domain's traces and shows each capability of issue 36 there.
func TestMadeUpDomain(t *testing.T) {
	traces := phoneTraces(80)
	defs, err := ParseToolDefs([]byte(phoneDefs))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Tools: defs}
	b, rep, err := Build(traces, opts)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tool := func(name string) *twin.Tool {
		tl, ok := b.ToolByName(name)
		if !ok {
			t.Fatalf("no tool %s", name)
		}
		return tl
	}

	// State beyond rows is learned: a state table, the status line a text template of variables, the switches and
	// the wallet writes, the directory listing keyed by the current directory.
	if b.StateTable == "" {
		t.Fatalf("no state table; tools: %+v", rep.Tools)
	}
	for name, kind := range map[string]string{"get_status": twin.KindState, "count_notes": twin.KindState, "toggle_data": twin.KindWrite, "toggle_airplane": twin.KindWrite,
		"get_balance": twin.KindState, "deposit": twin.KindWrite, "withdraw": twin.KindWrite, "create_note": twin.KindWrite,
		"cd": twin.KindWrite, "ls": twin.KindState, "sign_in": twin.KindWrite, "whoami": twin.KindState, "get_contact": twin.KindRead, "km_to_miles": twin.KindPure} {
		if tl := tool(name); tl.Kind != kind || tl.Binding != twin.BindingSynthesized {
			t.Errorf("%s: kind %s binding %s, want %s synthesized (attention %v)\n%s", name, tl.Kind, tl.Binding, kind, tl.Attention, tl.Source)
		}
	}
	if st := tool("get_status").State; st == nil || len(st.Text) != 4 {
		t.Errorf("get_status state %+v, want a text template with 3 holes", st)
	}
	if src := tool("ls").Source; !strings.Contains(src, `"entries[" + pystr(`) {
		t.Errorf("ls does not read its entries keyed by a variable:\n%s", src)
	}

	// A text answer composed from state changes after the write that flips it; a counter counts; an amount adds.
	s, rc, err := rt.Open(twin.SessionSpec{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	before := phoneCall(t, s, "get_status", `{}`).Content
	data := strings.TrimPrefix(strings.SplitN(before, "\n", 2)[0], "Mobile Data: ")
	if data != "ON" && data != "OFF" {
		t.Fatalf("status line %q", before)
	}
	flipped := phoneCall(t, s, "toggle_data", `{}`)
	if flipped.Content != "Mobile Data is now "+flipOnOff(data)+"." || flipped.StateHash == rc.WorldHash {
		t.Errorf("toggle_data = %+v after %q", flipped, before)
	}
	after := phoneCall(t, s, "get_status", `{}`).Content
	if want := strings.Replace(before, "Mobile Data: "+data, "Mobile Data: "+flipOnOff(data), 1); after != want {
		t.Errorf("status after the flip = %q, want %q", after, want)
	}
	n1 := phoneCall(t, s, "create_note", `{"text": "a"}`).Content
	n2 := phoneCall(t, s, "create_note", `{"text": "b"}`).Content
	var v1, v2 struct{ ID int }
	if json.Unmarshal([]byte(n1), &v1) != nil || json.Unmarshal([]byte(n2), &v2) != nil || v2.ID != v1.ID+1 {
		t.Errorf("two notes: %s then %s, want consecutive ids", n1, n2)
	}
	bal := phoneCall(t, s, "get_balance", `{}`).Content
	var b0 struct{ Balance float64 }
	_ = json.Unmarshal([]byte(bal), &b0)
	dep := phoneCall(t, s, "deposit", `{"amount": 25}`).Content
	if want := fmt.Sprintf(`{"balance": %s}`, pyFloat(b0.Balance+25)); dep != want {
		t.Errorf("deposit 25 on %s = %s, want %s", bal, dep, want)
	}
	if got := phoneCall(t, s, "get_balance", `{}`).Content; !strings.Contains(got, pyFloat(b0.Balance+25)) {
		t.Errorf("balance after the deposit = %s", got)
	}
	// The current directory keys the listing.
	phoneCall(t, s, "cd", `{"dir": "docs"}`)
	if got := phoneCall(t, s, "ls", `{}`).Content; got != `{"entries": ["cv.pdf", "plan.md"]}` {
		t.Errorf("ls in docs = %s", got)
	}
	phoneCall(t, s, "cd", `{"dir": "music"}`)
	if got := phoneCall(t, s, "ls", `{}`).Content; got != `{"entries": ["song.mp3"]}` {
		t.Errorf("ls in music = %s", got)
	}
	if got := phoneCall(t, s, "km_to_miles", `{"km": 10}`).Content; got != `{"miles": `+pyFloat(10*0.621371)+`}` {
		t.Errorf("km_to_miles = %s", got)
	}
	// A write whose answer does not show what it sets: later reads taught it.
	if eff := tool("sign_in").State; eff == nil || len(eff.Effects) != 1 || eff.Effects[0].Var != "user" || eff.Effects[0].From != "user" {
		t.Errorf("sign_in's effects %+v, want it to set the variable user from its argument", eff)
	}
	phoneCall(t, s, "sign_in", `{"user": "zoe"}`)
	if got := phoneCall(t, s, "whoami", `{}`).Content; got != `{"user": "zoe"}` {
		t.Errorf("whoami after sign_in zoe = %s", got)
	}

	// State is part of the world: the diff names it and an expectation grades it.
	changes, err := s.Diff(nil)
	if err != nil {
		t.Fatal(err)
	}
	var sawData bool
	for _, c := range changes {
		if c.Entity == b.StateTable && c.Key == "mobile data" {
			sawData = true
		}
	}
	if !sawData {
		t.Errorf("diff %+v does not name the mobile data variable", changes)
	}
	key := "mobile data"
	out, err := s.Assert([]twin.Expectation{{Entity: b.StateTable, Key: &key, Field: "value", Equals: json.RawMessage(`"` + flipOnOff(data) + `"`)}}, nil)
	if err != nil || len(out) != 1 || !out[0].Pass {
		t.Errorf("assert mobile data = %s: %+v %v", flipOnOff(data), out, err)
	}

	// Arguments: the definitions' rules refuse, except the one recorded successes break.
	deposit := tool("deposit").Args
	if deposit == nil || len(deposit.Dropped) == 0 || !strings.Contains(strings.Join(deposit.Dropped, " "), "required currency") {
		t.Errorf("deposit's rules %+v: the required currency (no recorded deposit gives one) must be dropped", deposit)
	}
	s2, rc2, err := rt.Open(twin.SessionSpec{Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, args, why string }{
		{"deposit", `{}`, "missing required argument amount"},
		{"withdraw", `{"amount": 5, "note": "x"}`, "unexpected argument note"},
		{"cd", `{"dir": 7}`, "dir: want string"},
	} {
		res := phoneCall(t, s2, c.tool, c.args)
		// No recorded error shows this backend's style, and its answers are JSON objects: {"error": …}.
		if !res.Error || !strings.Contains(res.Content, c.why) || !strings.HasPrefix(res.Content, `{"error": `) || res.StateHash != rc2.WorldHash {
			t.Errorf("%s(%s) = %+v, want the tool's error about %q, nothing changed", c.tool, c.args, res, c.why)
		}
	}
	if res := phoneCall(t, s2, "deposit", `{"amount": 5}`); res.Error {
		t.Errorf("deposit without the currency production never needed: %+v", res)
	}
	// A defined tool no trace called answers, inferred and downgraded, changing nothing.
	h := s2.StateHash()
	if res := phoneCall(t, s2, "get_signal", `{}`); res.Fidelity != twin.FidelityInferred || !res.Downgraded || res.StateHash != h {
		t.Errorf("get_signal = %+v", res)
	}

	// A session opened from a trace's prefix holds the world that trace showed: here a world whose data switch is
	// the base world's other value.
	base, _, err := rt.Open(twin.SessionSpec{})
	if err != nil {
		t.Fatal(err)
	}
	baseData := strings.TrimPrefix(strings.SplitN(phoneCall(t, base, "get_status", `{}`).Content, "\n", 2)[0], "Mobile Data: ")
	var picked *trace.Trace
	for i := range traces {
		cs := trace.Calls(traces[i])
		if len(cs) > 1 && cs[0].Tool == "get_status" && strings.HasPrefix(cs[0].Result, "Mobile Data: "+flipOnOff(baseData)) {
			picked = &traces[i]
			break
		}
	}
	if picked == nil {
		t.Fatal("no trace opens on a status line other than the base world's")
	}
	prefix := *picked
	prefix.Messages = prefix.Messages[:4] // system, user, the get_status call and its answer
	ts, trc, err := rt.Open(twin.SessionSpec{Trace: &twin.TraceSpec{ID: picked.ID, Calls: twin.TraceCallsOf(prefix)}})
	if err != nil {
		t.Fatal(err)
	}
	if trc.Trace == nil || trc.Trace.Used != 1 || trc.WorldHash == rt.BaseHash() {
		t.Errorf("receipts of the prefix %+v", trc)
	}
	if got := phoneCall(t, ts, "toggle_data", `{}`).Content; got != "Mobile Data is now "+baseData+"." {
		t.Errorf("toggle in the trace's world = %q, want it turned to %s", got, baseData)
	}

	// The self-check measures reproduction on this domain, and no recorded success is refused.
	sc, err := SelfCheck(traces, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + formatCheck(sc) + formatRepro(sc))
	for _, tc := range sc.Reproduction.Tools {
		for _, m := range tc.Misses {
			t.Logf("reproduction miss %s %s #%d: want %s got %s", tc.Name, m.Trace, m.Call, m.Want, m.Got)
		}
	}
	rp := sc.Reproduction
	if rp == nil || rp.Calls == 0 || rp.StateChanging == 0 {
		t.Fatalf("no reproduction measured: %+v", rp)
	}
	if sc.ArgsRefused != 0 {
		t.Errorf("the argument rules refused %d recorded successes", sc.ArgsRefused)
	}
	if rp.AgreementPct < 99 || rp.StateChangingAgreePct < 99 {
		t.Errorf("reproduction %.2f%% exact, state-changing calls %.2f%%: want at least 99%% on a domain whose traces show what they act on", rp.AgreementPct, rp.StateChangingAgreePct)
	}
}
