package query_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/query"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// readTraces reads the tau-retail dev traces (gzip-compressed under the repository's testdata/).
func readTraces(t testing.TB) []trace.Trace {
	t.Helper()
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	return traces
}

var (
	bundleOnce sync.Once
	bundle     *twin.Bundle
	bundleErr  error
)

func retail(t testing.TB) *twin.Bundle {
	t.Helper()
	bundleOnce.Do(func() { bundle, _, bundleErr = infer.Build(readTraces(t), infer.Options{}) })
	if bundleErr != nil {
		t.Fatal(bundleErr)
	}
	return bundle
}

// task is a tau2 trace id's task (tau2/<model>/task-100/trial-0 → task-100).
func task(id string) string {
	parts := strings.Split(id, "/")
	if len(parts) < 3 {
		return id
	}
	return parts[2]
}

// TestReplayRanking queries the index with the first user message of 50 dev traces: the chosen run should be
// that trace (or one of the same task). Leave-one-out (the trace itself taken out of the index) measures the
// harder case, a request the agent has not seen: is the closest run one of the same task?
func TestReplayRanking(t *testing.T) {
	ag := retail(t).Agent
	if ag == nil || len(ag.Runs) < 50 {
		t.Fatalf("profile runs: %+v", ag)
	}
	traces := readTraces(t)[:50]
	ix := query.NewIndex(ag.Runs)
	self, sameTask := 0, 0
	looSame, looHas := 0, 0
	for _, tr := range traces {
		req := ""
		for _, m := range tr.Messages {
			if m.Role == trace.RoleUser && m.Content != nil {
				req = *m.Content
				break
			}
		}
		m, ok := ix.Best(req)
		if !ok {
			t.Fatalf("%s: no run matched its own request", tr.ID)
		}
		got := ag.Runs[m.Run].TraceID
		if got == tr.ID {
			self++
		}
		if task(got) == task(tr.ID) {
			sameTask++
		}
		// Leave one out.
		var rest []twin.AgentRun
		hasTask := false
		for _, r := range ag.Runs {
			if r.TraceID != tr.ID {
				rest = append(rest, r)
				hasTask = hasTask || task(r.TraceID) == task(tr.ID)
			}
		}
		if !hasTask {
			continue
		}
		looHas++
		lix := query.NewIndex(rest)
		if lm, ok := lix.Best(req); ok && task(rest[lm.Run].TraceID) == task(tr.ID) {
			looSame++
		}
	}
	t.Logf("replay ranking over %d dev traces: chosen = that trace %d/%d, same task %d/%d; leave-one-out (other trials of the task indexed): same task %d/%d",
		len(traces), self, len(traces), sameTask, len(traces), looSame, looHas)
	if sameTask < len(traces)*9/10 {
		t.Errorf("same task chosen for only %d of %d requests", sameTask, len(traces))
	}
	if looHas > 0 && looSame*2 < looHas {
		t.Errorf("leave-one-out: same task for only %d of %d", looSame, looHas)
	}
}

func TestRankDeterministicAndEmpty(t *testing.T) {
	runs := []twin.AgentRun{
		{TraceID: "b", Request: "cancel my order please"},
		{TraceID: "a", Request: "cancel my order please"},
		{TraceID: "c", Request: "exchange a keyboard for a different color"},
	}
	ix := query.NewIndex(runs)
	r := ix.Rank("I want to cancel an order")
	if len(r) != 2 || runs[r[0].Run].TraceID != "a" || runs[r[1].Run].TraceID != "b" {
		t.Fatalf("tie order by trace id: %+v", r)
	}
	if m, _ := ix.Best("exchange keyboard"); runs[m.Run].TraceID != "c" {
		t.Errorf("best for exchange = %s", runs[m.Run].TraceID)
	}
	if _, ok := ix.Best("zzz qqq"); ok {
		t.Error("a request sharing no word matched")
	}
	if _, ok := query.NewIndex(nil).Best("cancel"); ok {
		t.Error("an empty index matched")
	}
}

func TestDeriveSeed(t *testing.T) {
	b := retail(t)
	var order, user, email string
	for _, tb := range b.Tables {
		if len(tb.Rows) == 0 {
			continue
		}
		switch tb.Name {
		case "orders":
			order = tb.Rows[0].Key
		case "users":
			user = tb.Rows[0].Key
			var row map[string]any
			if err := json.Unmarshal([]byte(tb.Rows[0].JSON), &row); err != nil {
				t.Fatal(err)
			}
			email, _ = row["email"].(string)
		}
	}
	if order == "" || user == "" || email == "" {
		t.Fatalf("retail world lacks orders or users with e-mail: order %q user %q email %q", order, user, email)
	}
	cases := []struct{ in, want string }{
		{"Please cancel order " + order + ", it was a mistake.", "order " + order},
		{"My email is " + email + " and I need help", "user " + user},
		{"I am " + user + "; where is " + order + "?", "user " + user + "; order " + order},
		{"Write to new.person@example.com about order #W0000000.", "user with email new.person@example.com; order #W0000000"},
		{"Hello, I need help with a return from 2024", ""},
	}
	for _, c := range cases {
		if got := query.DeriveSeed(c.in, b.Tables); got != c.want {
			t.Errorf("DeriveSeed(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// The derived instructions are what the twin's seed parser reads: a session seeded with them is seeded.
	rt, err := twin.NewRuntime(b, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err := rt.Open(twin.SessionSpec{Seed: 1, SeedInstructions: query.DeriveSeed(cases[3].in, b.Tables)})
	if err != nil || !rc.Seeded {
		t.Fatalf("derived instructions did not seed: %+v %v", rc, err)
	}
	if len(rc.Pinned["orders"]) != 1 || len(rc.Pinned["users"]) != 1 {
		t.Errorf("pinned = %v", rc.Pinned)
	}
}

func TestLearnAgent(t *testing.T) {
	ag := retail(t).Agent
	if !ag.HasAgent() || !strings.HasPrefix(ag.SystemPrompt, "# Retail agent policy") {
		t.Fatalf("system prompt: %.60q", ag.SystemPrompt)
	}
	if len(ag.Models) != 3 || ag.Models[0].Name != "toolorchestra" || ag.Models[0].Traces != 82 {
		t.Errorf("models = %+v", ag.Models)
	}
	if len(ag.Tools) < 10 || ag.Framework != "" {
		t.Errorf("tools %v, framework %q", ag.Tools, ag.Framework)
	}
	withAnswer := 0
	for _, r := range ag.Runs {
		if r.Answer != "" {
			withAnswer++
		}
	}
	if len(ag.Runs) != 126 || withAnswer < 120 {
		t.Errorf("runs %d, with an answer %d", len(ag.Runs), withAnswer)
	}
	cfg := infer.LearnAgent(readTraces(t)[:3], infer.Config{Framework: "tau2", Language: "python"})
	if cfg.Framework != "tau2" || cfg.FrameworkFrom != "config" || cfg.Language != "python" {
		t.Errorf("config framework/language: %+v", cfg)
	}
}
