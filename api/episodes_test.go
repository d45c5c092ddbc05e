package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// withTerminalTools is a bundle whose build config names terminal tools.
func withTerminalTools(t testing.TB, bundle []byte, tools ...string) []byte {
	t.Helper()
	b, err := twin.UnmarshalBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	b.TerminalTools = tools
	out, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An episode: each call answers done (with its steps); the call that reaches max_steps or calls a terminal tool
// answers the reward with the verdicts; a call after done is a 409 that changes nothing. The reward mode is the
// open's; the spec is kept with the session (a fork inherits it and counts its parent's steps).
func TestEpisodeDoneRewardAndRefusal(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, withTerminalTools(t, shopBundle(t), "get_order_details"), planeOptions{})
		expect := []map[string]any{
			{"entity": "orders", "key": "#W0000001", "field": "status", "equals": "delivered"},
			{"entity": "users", "key": "user_0001", "field": "name", "equals": "Bob"},
		}
		open := func(reward string, maxSteps int) session {
			task := map[string]any{"expect": expect, "max_steps": maxSteps}
			if reward != "" {
				task["reward"] = reward
			}
			return p.open(map[string]any{"seed": 3, "seed_instructions": "1 order with status pending", "task": task})
		}
		// max_steps ends it: two cancels of an unknown order (tool errors are steps too).
		s := open("", 2)
		code, out := p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		if code != http.StatusOK || out["done"] != false || out["steps"] != float64(1) || out["reward"] != nil {
			t.Fatalf("step 1: %d %v", code, out)
		}
		code, out = p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		if code != http.StatusOK || out["done"] != true || out["done_reason"] != "max_steps" || out["reward"] != 0.5 {
			t.Fatalf("step 2 (the limit): %d %v, want done with reward 0.5", code, out)
		}
		vs, _ := out["verdicts"].([]any)
		if len(vs) != 2 || vs[0].(map[string]any)["pass"] != true || vs[1].(map[string]any)["pass"] != false {
			t.Fatalf("verdicts %v", out["verdicts"])
		}
		_, before := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
		code, out = p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		if code != http.StatusConflict || out["code"] != "conflict" {
			t.Fatalf("call after done: %d %v, want a 409 envelope", code, out)
		}
		_, after := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
		if after["n_calls"] != before["n_calls"] || after["state_hash"] != before["state_hash"] || p.journaled(s.ID) != 2 {
			t.Fatalf("a refused call changed the session: %v → %v", before, after)
		}
		// The spec is kept with the session.
		var row schema.Session
		if err := p.db.NewSelect().Model(&row).Where("id = ?", s.ID).Scan(context.Background()); err != nil {
			t.Fatal(err)
		}
		var kept map[string]any
		if err := json.Unmarshal(row.Episode, &kept); err != nil || kept["max_steps"] != float64(2) || kept["reward"] != "fraction" ||
			fmt.Sprint(kept["terminal_tools"]) != "[get_order_details]" {
			t.Fatalf("kept episode %s (%v)", row.Episode, err)
		}

		// The session read shows the task.
		_, read := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil)
		if epv, _ := read["episode"].(map[string]any); epv["max_steps"] != float64(2) || len(epv["expect"].([]any)) != 2 {
			t.Fatalf("session read's episode: %v", read["episode"])
		}

		// A terminal tool ends it at once; reward all is 0 unless every expectation passes.
		s = open("all", 0)
		code, out = p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"})
		if code != http.StatusOK || out["done"] != true || out["done_reason"] != "terminal_tool" || out["reward"] != float64(0) {
			t.Fatalf("terminal call: %d %v, want done with reward 0", code, out)
		}

		// A fork at call 1 of a finished episode is not done: it counts the parent's step, and its limit is the
		// parent's.
		s = open("", 2)
		p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		code, list, _ := p.doList(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", p.key, map[string]any{"at_call": 1, "n": 2})
		if code != http.StatusCreated || len(list) != 2 {
			t.Fatalf("fork: %d %v", code, list)
		}
		f := asSessions(t, list)[1]
		code, out = p.call(f, "cancel_pending_order", map[string]any{"order_id": "#W9999998"})
		if code != http.StatusOK || out["done"] != true || out["steps"] != float64(2) || out["reward"] != 0.5 {
			t.Fatalf("fork's step 2: %d %v", code, out)
		}
		// A fork of a finished episode as it is now is done already.
		code, _, one := p.doList(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", s.Token, map[string]any{})
		if code != http.StatusCreated {
			t.Fatalf("fork now: %d %v", code, one)
		}
		if code, out := p.call(session{ID: str(one["sessionId"]), Token: str(one["token"])}, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusConflict {
			t.Fatalf("call in a fork of a done episode: %d %v, want 409", code, out)
		}

		// A group open of an episode: every session is the episode, each with its own steps.
		code, list, _ = p.doList(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, map[string]any{"seed": 3, "n": 2,
			"seed_instructions": "1 order with status pending", "task": map[string]any{"expect": expect, "max_steps": 1}})
		if code != http.StatusCreated || len(list) != 2 {
			t.Fatalf("group open of an episode: %d %v", code, list)
		}
		for i, g := range asSessions(t, list) {
			if code, out := p.call(g, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK || out["done"] != true || out["reward"] != 0.5 {
				t.Fatalf("group episode %d, step 1 of 1: %d %v", i, code, out)
			}
		}

		// A bad task is refused naming its field, and opens nothing.
		n := countOpen(t, p)
		for _, c := range []struct {
			task  map[string]any
			field string
		}{
			{map[string]any{"expect": []any{}}, "body.task.expect"},
			{map[string]any{"expect": []any{map[string]any{"entity": "planets", "key": "x", "exists": true}}}, "body.task.expect[0].entity"},
			{map[string]any{"expect": expect, "reward": "most"}, "body.task.reward"},
			{map[string]any{"expect": expect, "max_steps": -1}, "body.task.max_steps"},
		} {
			code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, map[string]any{"task": c.task})
			if code != http.StatusUnprocessableEntity || !namesField(out, c.field) {
				t.Errorf("task %v: %d %v, want 422 naming %s", c.task, code, out, c.field)
			}
		}
		if got := countOpen(t, p); got != n {
			t.Fatalf("refused tasks opened %d sessions", got-n)
		}
	})
}

var (
	grpoOnce   sync.Once
	grpoBundle []byte
)

// TestGRPOGroup is a GRPO-shaped run: for each task (a recorded tau-retail conversation), one seeded episode opens
// on the world the conversation saw, graded on the end state the recorded calls reach (its diff's expectations);
// 8 forks of it run 8 different recorded call sequences (prefixes of the task's calls, and other conversations'
// calls) and end with the terminal tool; each reward equals what sessions.assert says of that fork's world, the
// sequences' rewards differ, and running a sequence again gives the same reward.
func TestGRPOGroup(t *testing.T) {
	base, traces := retailBundle(t)
	grpoOnce.Do(func() { grpoBundle = withTerminalTools(t, base, "transfer_to_human_agents") })
	p := newPlane(t, schema.DriverSQLite, grpoBundle, planeOptions{local: true})
	tasks := 0
	for ti, tr := range traces {
		if tasks == 2 {
			break
		}
		calls := trace.Calls(tr)
		if len(calls) < 3 {
			continue
		}
		// The reference run: the task's own calls on the world it saw; its diff is the grader.
		ref := p.open(map[string]any{"seed": 1, "trace": tr})
		for _, c := range calls {
			p.call(ref, c.Tool, json.RawMessage(c.RawArgs))
		}
		code, diff := p.do(http.MethodGet, "/v1/sessions/"+ref.ID+"/diff", ref.Token, nil)
		exps, _ := diff["expectations"].([]any)
		if code != http.StatusOK {
			t.Fatalf("diff: %d %v", code, diff)
		}
		if len(exps) == 0 {
			continue // a conversation that writes nothing grades nothing
		}
		tasks++
		task := map[string]any{"expect": exps, "reward": "fraction"}
		ep := p.open(map[string]any{"seed": 1, "trace": tr, "task": task})
		code, list, _ := p.doList(http.MethodPost, "/v1/sessions/"+ep.ID+"/fork", p.key, map[string]any{"n": 8})
		if code != http.StatusCreated || len(list) != 8 {
			t.Fatalf("task %s: fork 8: %d %v", tr.ID, code, list)
		}
		forks := asSessions(t, list)
		seqs := grpoSequences(calls, traces, ti)
		rewards := map[float64]bool{}
		for k, f := range forks {
			r := runEpisode(t, p, f, seqs[k])
			// sessions.assert on the same fork, with the task's expectations, says the same.
			code, as := p.do(http.MethodPost, "/v1/sessions/"+f.ID+"/assert", f.Token, map[string]any{"expect": exps})
			if code != http.StatusOK {
				t.Fatalf("assert: %d %v", code, as)
			}
			want := as["passed"].(float64) / float64(len(exps))
			if r.reward != want {
				t.Fatalf("task %s sequence %d: reward %v, sessions.assert passes %v of %d", tr.ID, k, r.reward, as["passed"], len(exps))
			}
			results, _ := as["results"].([]any)
			for i, v := range r.verdicts {
				if v.(map[string]any)["pass"] != results[i].(map[string]any)["pass"] {
					t.Fatalf("task %s sequence %d: verdict %d %v, sessions.assert %v", tr.ID, k, i, v, results[i])
				}
			}
			rewards[r.reward] = true
			t.Logf("task %s sequence %d (%d calls): reward %.3f", tr.ID, k, len(seqs[k]), r.reward)
		}
		if !rewards[1] || len(rewards) < 2 {
			t.Fatalf("task %s: rewards %v: want the full sequence's 1 and lower ones", tr.ID, rewards)
		}
		// Same seed, same calls, same reward: a new episode of the task runs sequence 3 again.
		again := p.open(map[string]any{"seed": 1, "trace": tr, "task": task})
		if again.Open["world_hash"] != ep.Open["world_hash"] {
			t.Fatalf("same task, worlds %v and %v", ep.Open["world_hash"], again.Open["world_hash"])
		}
		r1 := runEpisode(t, p, again, seqs[3])
		code, list, _ = p.doList(http.MethodPost, "/v1/sessions/"+ep.ID+"/fork", p.key, map[string]any{"n": 1})
		if code != http.StatusCreated {
			t.Fatalf("fork: %d", code)
		}
		if r2 := runEpisode(t, p, asSessions(t, list)[0], seqs[3]); r1.reward != r2.reward {
			t.Fatalf("sequence 3 twice: rewards %v and %v", r1.reward, r2.reward)
		}
	}
	if tasks < 2 {
		t.Fatalf("%d tasks with writes among %d traces", tasks, len(traces))
	}
}

type episodeEnd struct {
	reward   float64
	verdicts []any
}

// runEpisode makes the calls in the session, then the terminal call, and answers the reward it ended with.
func runEpisode(t *testing.T, p *plane, s session, calls []trace.Call) episodeEnd {
	t.Helper()
	for i, c := range calls {
		code, out := p.call(s, c.Tool, json.RawMessage(c.RawArgs))
		if code != http.StatusOK || out["done"] != false {
			t.Fatalf("call %d %s: %d %v", i, c.Tool, code, out)
		}
	}
	code, out := p.call(s, "transfer_to_human_agents", map[string]any{"summary": "the episode ends"})
	r, ok := out["reward"].(float64)
	if code != http.StatusOK || out["done"] != true || !ok {
		t.Fatalf("terminal call: %d %v", code, out)
	}
	vs, _ := out["verdicts"].([]any)
	return episodeEnd{reward: r, verdicts: vs}
}

// grpoSequences are 8 different recorded call sequences for a task: its calls in full, its prefixes, and then
// other conversations' calls, each up to its first terminal call (runEpisode makes that call).
func grpoSequences(calls []trace.Call, traces []trace.Trace, task int) [][]trace.Call {
	calls = beforeTerminal(calls)
	seqs := [][]trace.Call{calls}
	for n := len(calls) - 1; n >= 0 && len(seqs) < 5; n -= max(1, len(calls)/4) {
		seqs = append(seqs, calls[:n])
	}
	for i := 1; len(seqs) < 8; i++ {
		other := beforeTerminal(trace.Calls(traces[(task+i)%len(traces)]))
		seqs = append(seqs, other[:min(len(other), 6)])
	}
	return seqs
}

// beforeTerminal is a call sequence up to its first call of the terminal tool.
func beforeTerminal(calls []trace.Call) []trace.Call {
	for i, c := range calls {
		if c.Tool == "transfer_to_human_agents" {
			return calls[:i]
		}
	}
	return calls
}
