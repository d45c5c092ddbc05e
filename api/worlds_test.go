package api_test

import (
	"context"
	"net/url"

	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/trace"
)

var updateFaults = flag.Bool("update-faults", false, "rewrite testdata/faults.golden")

// retailRuns are the retail dev traces' calls, the ones with at least min calls, at most n of them.
func retailRuns(t *testing.T, traces []trace.Trace, minCalls, n int) [][]trace.Call {
	var out [][]trace.Call
	for _, tr := range traces {
		if cs := trace.Calls(tr); len(cs) >= minCalls {
			out = append(out, cs)
			if len(out) == n {
				break
			}
		}
	}
	if len(out) < n {
		t.Fatalf("only %d traces with %d calls", len(out), minCalls)
	}
	return out
}

// run makes one call of a trace and answers its content and state hash.
func (p *plane) run(s session, c trace.Call) (string, string, map[string]any) {
	p.t.Helper()
	code, out := p.call(s, c.Tool, json.RawMessage(c.RawArgs))
	if code != http.StatusOK {
		p.t.Fatalf("%s %s: %d %v", c.Tool, c.RawArgs, code, out)
	}
	return str(out["content"]), p.stateHash(s), out
}

func (p *plane) stateHash(s session) string {
	p.t.Helper()
	code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
	if code != http.StatusOK {
		p.t.Fatalf("read %s: %d %v", s.ID, code, v)
	}
	return str(v["state_hash"])
}

func (p *plane) fork(s session, token string, body any) session {
	p.t.Helper()
	code, out := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", token, body)
	if code != http.StatusCreated {
		p.t.Fatalf("fork %s: %d %v", s.ID, code, out)
	}
	return session{ID: str(out["sessionId"]), Token: str(out["token"]), Open: out}
}

// TestForkContinuesLikeParent: on real tau-retail traces, a fork taken at call N — of a live session, or of a
// finished one at an earlier call — answers calls N+1… exactly as the uninterrupted session did, state hash for
// state hash; the fork has its own token and transcript, names its parent, and leaves the parent untouched. A fork
// whose twin restarted is rebuilt from the parent's journal prefix plus its own calls.
func TestForkContinuesLikeParent(t *testing.T) {
	bundle, traces := retailBundle(t)
	eachDriver(t, func(t *testing.T, driver string) {
		eachTransport(t, func(t *testing.T, local bool) {
			p := newPlane(t, driver, bundle, planeOptions{local: local})
			for ti, calls := range retailRuns(t, traces, 6, 4) {
				n := len(calls) / 2
				// With a fault plan too: a fork draws the same faults for calls N+1… as the parent does.
				parent := p.open(map[string]any{"seed": 100 + ti, "recordOutputs": true, "faults": map[string]any{
					"get_order_details": map[string]any{"error_rate": 0.3}, "get_product_details": map[string]any{"timeout_rate": 0.3, "timeout_ms": 1}}})
				for _, c := range calls[:n] {
					p.run(parent, c)
				}
				atFork := p.stateHash(parent)
				live := p.fork(parent, parent.Token, nil)
				if live.Token == parent.Token || !strings.HasPrefix(live.Token, "ms_") || live.Open["state_hash"] != atFork ||
					live.Open["forkedFrom"].(map[string]any)["atCall"] != float64(n) {
					t.Fatalf("fork answer: %v (parent state %s)", live.Open, atFork)
				}
				if ti == 0 {
					// The fork's twin restarts: its next call rebuilds it from the parent's first n calls.
					p.stopTwin()
					p.startTwin()
				}
				var want []string
				for _, c := range calls[n:] {
					content, hash, out := p.run(parent, c)
					want = append(want, content, hash, fmt.Sprint(out["fault"]))
				}
				for i, c := range calls[n:] {
					content, hash, out := p.run(live, c)
					if content != want[3*i] || hash != want[3*i+1] || fmt.Sprint(out["fault"]) != want[3*i+2] {
						t.Fatalf("trace %d call %d (%s): fork answered %.80q %s %v, parent %.80q %s %s", ti, n+i+1, c.Tool,
							content, hash, out["fault"], want[3*i], want[3*i+1], want[3*i+2])
					}
				}
				// A fork of the finished parent at an earlier call, by the workspace key, replays to the same end.
				k := n / 2
				early := p.fork(parent, p.key, map[string]any{"at_call": k})
				code, tr := p.do(http.MethodGet, "/v1/sessions/"+parent.ID+"/transcript", parent.Token, nil)
				if code != http.StatusOK {
					t.Fatal(code, tr)
				}
				entries := tr["calls"].([]any)
				for i, c := range calls[k:] {
					content, hash, _ := p.run(early, c)
					e := entries[k+i].(map[string]any)
					if content != e["result"] || hash != e["stateHash"] {
						t.Fatalf("trace %d: fork at %d, call %d differs from the parent's transcript", ti, k, k+i+1)
					}
				}
				code, tr = p.do(http.MethodGet, "/v1/sessions/"+early.ID+"/transcript", early.Token, nil)
				ff, _ := tr["forkedFrom"].(map[string]any)
				first, _ := tr["calls"].([]any)[0].(map[string]any)
				if code != http.StatusOK || ff["sessionId"] != parent.ID || ff["atCall"] != float64(k) || first["seq"] != float64(k+1) {
					t.Fatalf("fork transcript: %d forkedFrom %v first %v", code, ff, first)
				}
				code, v := p.do(http.MethodGet, "/v1/sessions/"+early.ID, early.Token, nil)
				if code != http.StatusOK || v["forked_from"].(map[string]any)["session_id"] != parent.ID || v["state_hash"] != p.stateHash(parent) {
					t.Fatalf("fork read: %d %v", code, v)
				}
			}
			p.checkTransport(t, local)
		})
	})
}

// TestSixtyFourForksBranch: 64 forks of one retail session, made and called concurrently, each take a different
// write; none reaches the parent or another fork.
func TestSixtyFourForksBranch(t *testing.T) {
	bundle, traces := retailBundle(t)
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, bundle, planeOptions{})
		parent := p.open(map[string]any{"seed": 64})
		start := p.stateHash(parent)
		// 64 writes that each move this world somewhere else, learned one by one on throwaway sessions.
		var writes []trace.Call
		seen := map[string]bool{start: true}
		for _, tr := range traces {
			for _, c := range trace.Calls(tr) {
				if len(writes) == 64 || !strings.HasPrefix(c.Tool, "cancel") && !strings.HasPrefix(c.Tool, "modify") &&
					!strings.HasPrefix(c.Tool, "return") && !strings.HasPrefix(c.Tool, "exchange") {
					continue
				}
				probe := p.fork(parent, parent.Token, nil)
				if _, hash, _ := p.run(probe, c); !seen[hash] {
					seen[hash] = true
					writes = append(writes, c)
				}
				p.do(http.MethodDelete, "/v1/sessions/"+probe.ID, probe.Token, nil)
			}
		}
		if len(writes) < 64 {
			t.Fatalf("only %d distinct writes", len(writes))
		}
		forks := make([]session, 64)
		hashes := make([]string, 64)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range forks {
			wg.Go(func() {
				f := p.fork(parent, parent.Token, nil)
				_, h, _ := p.run(f, writes[i])
				mu.Lock()
				forks[i], hashes[i] = f, h
				mu.Unlock()
			})
		}
		wg.Wait()
		if p.stateHash(parent) != start {
			t.Fatal("the forks' writes reached the parent")
		}
		distinct := map[string]bool{}
		for i, f := range forks {
			if h := p.stateHash(f); h != hashes[i] {
				t.Errorf("fork %d: state %s, was %s after its own write", i, h, hashes[i])
			}
			distinct[hashes[i]] = true
			code, d := p.do(http.MethodGet, "/v1/sessions/"+f.ID+"/diff?against="+parent.ID, f.Token, nil)
			if cs, _ := d["changes"].([]any); code != http.StatusOK || len(cs) == 0 {
				t.Errorf("fork %d diff against its parent: %d %v", i, code, d)
			}
		}
		if len(distinct) != 64 {
			t.Fatalf("%d distinct end states over 64 branches", len(distinct))
		}
	})
}

// TestDiffAndAssertAsGrader: a reference run's diff gives expectations that pass on a second run of the same trace
// and fail on a run that skips its last write; the session read carries the state hash to compare runs by; bad
// expectations are 422s naming the field; another workspace's session is a 404.
func TestDiffAndAssertAsGrader(t *testing.T) {
	bundle, traces := retailBundle(t)
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, bundle, planeOptions{})
		graded := 0
		for ti, calls := range retailRuns(t, traces, 4, 12) {
			ref := p.open(map[string]any{"seed": 9})
			last := -1
			prev := p.stateHash(ref)
			for i, c := range calls {
				if _, h, _ := p.run(ref, c); h != prev {
					last, prev = i, h
				}
			}
			if last < 0 {
				continue
			}
			graded++
			code, d := p.do(http.MethodGet, "/v1/sessions/"+ref.ID+"/diff", ref.Token, nil)
			if code != http.StatusOK || len(d["changes"].([]any)) == 0 {
				t.Fatalf("diff: %d %v", code, d)
			}
			exps := d["expectations"].([]any)
			// The reference run ends; the grader still reads it (rebuilt from its journal) with the key.
			p.do(http.MethodDelete, "/v1/sessions/"+ref.ID, ref.Token, nil)
			code, d2 := p.do(http.MethodGet, "/v1/sessions/"+ref.ID+"/diff", p.key, nil)
			if code != http.StatusOK || fmt.Sprint(d2["changes"]) != fmt.Sprint(d["changes"]) {
				t.Fatalf("diff of the closed run: %d %v", code, d2)
			}
			again, skip := p.open(map[string]any{"seed": 9}), p.open(map[string]any{"seed": 9})
			for i, c := range calls {
				p.run(again, c)
				if i != last {
					p.run(skip, c)
				}
			}
			code, ok := p.do(http.MethodPost, "/v1/sessions/"+again.ID+"/assert", again.Token, map[string]any{"expect": exps})
			if code != http.StatusOK || ok["pass"] != true || ok["stateHash"] != d["stateHash"] {
				t.Fatalf("trace %d: second run: %d %v", ti, code, ok)
			}
			code, bad := p.do(http.MethodPost, "/v1/sessions/"+skip.ID+"/assert", skip.Token, map[string]any{"expect": exps})
			if code != http.StatusOK || bad["pass"] != false || bad["failed"].(float64) < 1 {
				t.Fatalf("trace %d: run without call %d: %d %v", ti, last+1, code, bad)
			}
			if p.stateHash(skip) == d["stateHash"] {
				t.Fatalf("trace %d: skipping the last write left the same state hash", ti)
			}
		}
		if graded == 0 {
			t.Fatal("no trace graded")
		}
		s := p.open(map[string]any{"seed": 1})
		for _, tc := range []struct {
			body  string
			field string
		}{
			{`{"expect":[{"entity":"nope","unchanged":true}]}`, "body.expect[0].entity"},
			{`{"expect":[{"entity":"orders","key":"#W1"}]}`, "body.expect[0].equals"},
			{`{"expect":[{"entity":"orders","key":"#W1","equals":1,"exists":true}]}`, "body.expect[0].equals"},
			{`{"expect":[]}`, "body.expect"},
		} {
			code, out := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/assert", s.Token, json.RawMessage(tc.body))
			if code != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(out), tc.field) {
				t.Errorf("%s: %d %v, want a 422 naming %s", tc.body, code, out, tc.field)
			}
		}
		theirs, other := p.openOther()
		code, out := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/diff?against="+theirs, p.key, nil)
		if code != http.StatusNotFound {
			t.Fatalf("diff against another workspace's session: %d %v", code, out)
		}
		code, out = p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", other, nil)
		if code != http.StatusNotFound && code != http.StatusUnauthorized {
			t.Fatalf("fork with another workspace's key: %d %v", code, out)
		}
		code, out = p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", s.Token, map[string]any{"at_call": 5})
		if code != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(out), "body.at_call") {
			t.Fatalf("fork past the last call: %d %v", code, out)
		}
	})
}

// openOther opens a session in the other workspace and answers its id and that workspace's key.
func (p *plane) openOther() (string, string) {
	p.t.Helper()
	code, out := p.do(http.MethodPost, "/v1/envs/"+p.otherEnv.Slug+"/sessions", p.otherKey, map[string]any{"seed": 1})
	if code != http.StatusCreated {
		p.t.Fatalf("open in the other workspace: %d %v", code, out)
	}
	return str(out["sessionId"]), p.otherKey
}

// TestFaultsSameSeedSameFailures: a retail run with a fault plan fails the same calls, with the same recorded
// error answers and latencies, on every run of the same seed (pinned in testdata/faults.golden); an injected error
// leaves the world unchanged and is labelled in the answer and the transcript; a rebuilt session passes over its
// injected calls; a bad plan is a 422 naming its field.
func TestFaultsSameSeedSameFailures(t *testing.T) {
	bundle, traces := retailBundle(t)
	plan := map[string]any{
		"get_order_details":     map[string]any{"error_rate": 0.3, "latency": map[string]any{"dist": "fixed", "ms": 1}},
		"get_user_details":      map[string]any{"timeout_rate": 0.5, "timeout_ms": 2},
		"*":                     map[string]any{"latency": map[string]any{"dist": "uniform", "min_ms": 0, "max_ms": 2}},
		"find_user_id_by_email": map[string]any{"error_rate": 0.25},
	}
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, bundle, planeOptions{})
		var runs []string
		var lastOf []session
		for run := 0; run < 2; run++ {
			var b strings.Builder
			for ti, calls := range retailRuns(t, traces, 5, 6) {
				s := p.open(map[string]any{"seed": 2024 + ti, "faults": plan, "recordOutputs": true})
				prev := p.stateHash(s)
				for i, c := range calls {
					content, hash, out := p.run(s, c)
					f, _ := out["fault"].(map[string]any)
					if f == nil {
						prev = hash
						continue
					}
					fmt.Fprintf(&b, "trace=%d call=%d tool=%s fault=%s latency_ms=%v error=%v content=%.60q\n", ti, i+1, c.Tool, f["kind"], f["latency_ms"], out["error"], content)
					if f["kind"] != "latency" && (hash != prev || out["error"] != true) {
						t.Fatalf("an injected %s changed the world or was not an error: %v", f["kind"], out)
					}
					prev = hash
				}
				lastOf = append(lastOf, s)
				code, tr := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/transcript", s.Token, nil)
				labelled := 0
				for _, e := range tr["calls"].([]any) {
					if e.(map[string]any)["fault"] != nil {
						labelled++
					}
				}
				if code != http.StatusOK || labelled != strings.Count(b.String(), fmt.Sprintf("trace=%d ", ti)) {
					t.Fatalf("transcript labels %d faults: %d", labelled, code)
				}
			}
			runs = append(runs, b.String())
			// The twin restarts: sessions with injected calls rebuild from their journals, passing over those calls.
			p.stopTwin()
			p.startTwin()
			for _, s := range lastOf {
				code, out := p.call(s, "list_all_product_types", map[string]any{})
				if code != http.StatusOK {
					t.Fatalf("after a restart, session %s: %d %v", s.ID, code, out)
				}
			}
			lastOf = nil
		}
		if runs[0] != runs[1] {
			t.Fatalf("two runs of the same seeds drew different faults:\n%s\n---\n%s", runs[0], runs[1])
		}
		if strings.Count(runs[0], "fault=error") == 0 || strings.Count(runs[0], "fault=timeout") == 0 {
			t.Fatalf("the plan injected no error or no timeout:\n%s", runs[0])
		}
		golden := filepath.Join("testdata", "faults.golden")
		if *updateFaults {
			if err := os.WriteFile(golden, []byte(runs[0]), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run with -update-faults)", err)
		}
		if runs[0] != string(want) {
			t.Fatalf("faults differ from %s:\n%s", golden, runs[0])
		}
		for _, tc := range []struct {
			plan  string
			field string
		}{
			{`{"get_order_details":{"error_rate":0.6,"timeout_rate":0.6}}`, "body.faults.get_order_details.error_rate"},
			{`{"no_such_tool":{"error_rate":0.1}}`, "body.faults.no_such_tool"},
			{`{"*":{"latency":{"dist":"pareto"}}}`, "body.faults.*.latency.dist"},
			{`{"get_order_details":{"error_rate":2}}`, "body.faults.get_order_details.error_rate"},
		} {
			code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key,
				map[string]any{"seed": 1, "faults": json.RawMessage(tc.plan)})
			if code != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(out), tc.field) {
				t.Errorf("%s: %d %v, want a 422 naming %s", tc.plan, code, out, tc.field)
			}
		}
	})
}

// TestMCPEnvironmentFaults: an environment's MCP address takes a fault plan in its query; injected faults are
// labelled in each call result's _meta and are the tool's errors; a bad plan is refused naming query.faults….
func TestMCPEnvironmentFaults(t *testing.T) {
	bundle, _ := retailBundle(t)
	p := newMCPPlane(t, "sqlite", bundle)
	plan := url.QueryEscape(`{"get_order_details":{"error_rate":0.5}}`)
	cs := p.connect(t, "/mcp/envs/"+p.env.Slug+"?seed=5&faults="+plan, p.key)
	faulted := 0
	for i := 0; i < 40; i++ {
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_order_details",
			Arguments: map[string]any{"order_id": "#W6231698"}})
		if err != nil {
			t.Fatal(err)
		}
		m := metaOf(t, r.Meta, api.MetaCall)
		if f, ok := m["fault"].(map[string]any); ok {
			faulted++
			if f["kind"] != "error" || !r.IsError || !strings.HasPrefix(textOf(t, r), "Error:") {
				t.Fatalf("injected fault: %v %v %q", f, r.IsError, textOf(t, r))
			}
		} else if r.IsError {
			t.Fatalf("call %d failed without a fault: %q", i, textOf(t, r))
		}
	}
	if faulted < 10 || faulted > 30 {
		t.Fatalf("%d of 40 calls faulted at error_rate 0.5", faulted)
	}
	bad := url.QueryEscape(`{"get_order_details":{"error_rate":0.9,"timeout_rate":0.9}}`)
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.srv.URL + "/mcp/envs/" + p.env.Slug + "?faults=" + bad,
		HTTPClient: &http.Client{Transport: withBearer{p.key, http.DefaultTransport}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "query.faults.get_order_details.error_rate") {
		t.Fatalf("bad plan: %v, want an error naming query.faults.get_order_details.error_rate", err)
	}
}
