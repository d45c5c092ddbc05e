package twin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

type domainData struct {
	rt    *twin.Runtime
	calls [][]trace.Call
	err   error
}

var (
	domainsMu sync.Mutex
	domains   = map[string]*domainData{}
)

// domain builds a tau domain's runtime (retail, airline) from its dev traces, once per test binary.
func domain(t testing.TB, name string) (*twin.Runtime, [][]trace.Call) {
	t.Helper()
	domainsMu.Lock()
	defer domainsMu.Unlock()
	d := domains[name]
	if d == nil {
		d = &domainData{}
		domains[name] = d
		d.err = func() error {
			traces, err := sampledata.Traces(name)
			if err != nil {
				return err
			}
			b, _, err := infer.Build(traces, infer.Options{})
			if err != nil {
				return err
			}
			if d.rt, err = twin.NewRuntime(b, twin.RuntimeOptions{}); err != nil {
				return err
			}
			for _, tr := range traces {
				d.calls = append(d.calls, trace.Calls(tr))
			}
			return nil
		}()
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	return d.rt, d.calls
}

func call(t testing.TB, s *twin.Session, c trace.Call) twin.Result {
	t.Helper()
	res, err := s.Call(context.Background(), c.Tool, json.RawMessage(c.RawArgs))
	if err != nil {
		t.Fatalf("%s %s: %v", c.Tool, c.RawArgs, err)
	}
	return res
}

// TestForkContinuesLikeParent: for every retail trace and a fork point in its middle, a fork replaying the rest of
// the trace answers exactly what the uninterrupted parent answers, state hash for state hash; the parent is not
// touched by the fork's calls, nor the fork by the parent's.
func TestForkContinuesLikeParent(t *testing.T) {
	rt, traces := domain(t, "retail")
	checked := 0
	for ti, calls := range traces {
		if len(calls) < 2 {
			continue
		}
		n := len(calls) / 2
		parent, _, err := rt.Open(twin.SessionSpec{Seed: int64(ti)})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range calls[:n] {
			call(t, parent, c)
		}
		atFork := parent.StateHash()
		fork, err := parent.Fork()
		if err != nil {
			t.Fatal(err)
		}
		if fork.StateHash() != atFork {
			t.Fatalf("trace %d: fork hash %s, parent %s", ti, fork.StateHash(), atFork)
		}
		// The fork runs first: the parent must still be at the fork point afterwards.
		var forkRes []twin.Result
		for _, c := range calls[n:] {
			forkRes = append(forkRes, call(t, fork, c))
		}
		if parent.StateHash() != atFork {
			t.Fatalf("trace %d: the fork's calls moved the parent", ti)
		}
		for i, c := range calls[n:] {
			p := call(t, parent, c)
			if p != forkRes[i] {
				t.Fatalf("trace %d call %d (%s): parent %+v, fork %+v", ti, n+i+1, c.Tool, p, forkRes[i])
			}
		}
		checked++
	}
	t.Logf("%d retail traces forked mid-way and continued identically", checked)
	if checked == 0 {
		t.Fatal("no trace checked")
	}
}

// TestSixtyFourForks: 64 forks of one retail session each take a different branch (a different write) without
// touching the parent or each other.
func TestSixtyFourForks(t *testing.T) {
	rt, traces := domain(t, "retail")
	parent, _, err := rt.Open(twin.SessionSpec{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Branches: every distinct writing call the traces hold, each run in a fresh session first to learn what it does
	// alone from this state.
	type branch struct {
		c    trace.Call
		hash string
	}
	var branches []branch
	seen := map[string]bool{parent.StateHash(): true} // a write that leaves the world as it was is no branch
	for _, calls := range traces {
		for _, c := range calls {
			if len(branches) == 64 {
				break
			}
			solo, _, _ := rt.Open(twin.SessionSpec{Seed: 1})
			res := call(t, solo, c)
			if !res.Changed || seen[res.StateHash] {
				continue
			}
			seen[res.StateHash] = true
			branches = append(branches, branch{c, res.StateHash})
		}
	}
	if len(branches) < 64 {
		t.Fatalf("only %d distinct writing branches", len(branches))
	}
	start := parent.StateHash()
	forks := make([]*twin.Session, len(branches))
	for i := range forks {
		if forks[i], err = parent.Fork(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, b := range branches {
		wg.Go(func() {
			res, err := forks[i].Call(context.Background(), b.c.Tool, json.RawMessage(b.c.RawArgs))
			if err != nil || res.StateHash != b.hash {
				t.Errorf("fork %d (%s): %+v %v, want state %s", i, b.c.Tool, res, err, b.hash)
			}
		})
	}
	wg.Wait()
	if parent.StateHash() != start {
		t.Fatal("forks moved the parent")
	}
	for i, f := range forks {
		if f.StateHash() != branches[i].hash {
			t.Errorf("fork %d now %s, want %s: another fork's write reached it", i, f.StateHash(), branches[i].hash)
		}
		d, err := f.Diff(parent)
		if err != nil || len(d) == 0 {
			t.Errorf("fork %d: diff against parent %v %v", i, d, err)
		}
	}
}

// TestGraderFromDiff: for every dev trace with a writing call (tau-retail and tau-airline), expectations derived
// from the diff of a full replay pass on a second full replay and fail on a replay that skips one writing call. A
// writing call is one that moved the state hash; the call skipped is the last one whose absence leaves another end
// state (a trace whose every write is later redone identically has none, and is counted apart).
func TestGraderFromDiff(t *testing.T) {
	for _, name := range []string{"retail", "airline"} {
		t.Run(name, func(t *testing.T) {
			rt, traces := domain(t, name)
			graded, caught, redone := 0, 0, 0
			replay := func(calls []trace.Call, skip int) *twin.Session {
				s, _, _ := rt.Open(twin.SessionSpec{Seed: 5})
				for i, c := range calls {
					if i != skip {
						call(t, s, c)
					}
				}
				return s
			}
			for ti, calls := range traces {
				ref, _, _ := rt.Open(twin.SessionSpec{Seed: 5})
				var writes []int
				for i, c := range calls {
					before := ref.StateHash()
					if call(t, ref, c).StateHash != before {
						writes = append(writes, i)
					}
				}
				if len(writes) == 0 {
					continue
				}
				graded++
				d, err := ref.Diff(nil)
				if err != nil || len(d) == 0 {
					t.Fatalf("trace %d: diff %v %v", ti, d, err)
				}
				exps := rt.ExpectationsFrom(d)
				out, err := replay(calls, -1).Assert(exps, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range out {
					if !o.Pass {
						t.Errorf("trace %d: second replay fails expectation %d %+v: %s", ti, i, exps[i], o.Detail)
					}
				}
				var skipped *twin.Session
				skip := -1
				for j := len(writes) - 1; j >= 0 && skipped == nil; j-- {
					if s := replay(calls, writes[j]); s.StateHash() != ref.StateHash() {
						skipped, skip = s, writes[j]
					}
				}
				if skipped == nil {
					redone++
					continue
				}
				out, err = skipped.Assert(exps, nil)
				if err != nil {
					t.Fatal(err)
				}
				failed := 0
				for _, o := range out {
					if !o.Pass {
						failed++
					}
				}
				if failed == 0 {
					t.Errorf("trace %d: skipping call %d (%s) passes every expectation", ti, skip+1, calls[skip].Tool)
				} else {
					caught++
				}
			}
			t.Logf("%s: %d traces with a writing call: every second replay passed; skipping one write failed the grader in %d of %d (%d traces reach the same end state without any one of their writes)",
				name, graded, caught, graded-redone, redone)
			if graded == 0 {
				t.Fatal("no trace graded")
			}
		})
	}
}

func TestAssertLanguage(t *testing.T) {
	rt, _ := domain(t, "retail")
	s, _, _ := rt.Open(twin.SessionSpec{Seed: 3})
	res, err := s.Call(context.Background(), "cancel_pending_order", json.RawMessage(`{"order_id": "#W3295833", "reason": "no longer needed"}`))
	if err != nil || !res.Changed {
		t.Fatalf("cancel: %+v %v", res, err)
	}
	key, user := "#W3295833", "ivan_santos_6635"
	var exps []twin.Expectation
	if err := json.Unmarshal([]byte(fmt.Sprintf(`[
		{"entity":"orders","key":%q,"field":"status","equals":"cancelled"},
		{"entity":"orders","key":%q,"field":"status","equals":"pending"},
		{"entity":"orders","unchanged":true,"except":[%q]},
		{"entity":"orders","unchanged":true},
		{"entity":"orders","key":%q,"changed":true},
		{"entity":"users","key":%q,"field":"payment_methods","unchanged":true},
		{"entity":"orders","key":"#W0000000","exists":false},
		{"state_hash":%q}
	]`, key, key, key, key, user, res.StateHash)), &exps); err != nil {
		t.Fatal(err)
	}
	out, err := s.Assert(exps, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, false, true, false, true, true, true, true}
	for i, o := range out {
		if o.Pass != want[i] {
			t.Errorf("expectation %d %s: pass %v, want %v (%s)", i, exps[i].Field, o.Pass, want[i], o.Detail)
		}
	}
	if string(out[1].Observed) != `"cancelled"` || string(out[3].Observed) != `["#W3295833"]` {
		t.Errorf("observed: %s, %s", out[1].Observed, out[3].Observed)
	}
	for _, bad := range []struct {
		e     string
		field string
	}{
		{`{"entity":"orders","key":"x"}`, "equals"},
		{`{"entity":"nope","unchanged":true}`, "entity"},
		{`{"entity":"orders","equals":1}`, "key"},
		{`{"entity":"orders","key":"x","except":["y"],"unchanged":true}`, "except"},
	} {
		var e twin.Expectation
		_ = json.Unmarshal([]byte(bad.e), &e)
		err := rt.Check([]twin.Expectation{e})
		ee, ok := err.(*twin.ExpectError)
		if !ok || ee.Field != bad.field {
			t.Errorf("%s: %v, want a problem at %s", bad.e, err, bad.field)
		}
	}
}

// TestRebuildPassesOverInjectedCalls: a journaled write that an injected fault answered never reached the world, so
// a rebuild does not run it; run, it would move the state away from the journal's.
func TestRebuildPassesOverInjectedCalls(t *testing.T) {
	rt, _ := domain(t, "retail")
	s, _, _ := rt.Open(twin.SessionSpec{Seed: 8})
	cancel := json.RawMessage(`{"order_id": "#W3295833", "reason": "no longer needed"}`)
	journal := []twin.JournalEntry{{Tool: "cancel_pending_order", Args: cancel, Content: "Error: injected", StateHash: s.StateHash(), Injected: true}}
	r, _, err := rt.Rebuild(context.Background(), twin.SessionSpec{Seed: 8}, journal)
	if err != nil || r.StateHash() != s.StateHash() {
		t.Fatalf("rebuild with an injected write: %v", err)
	}
	journal[0].Injected = false
	if _, _, err := rt.Rebuild(context.Background(), twin.SessionSpec{Seed: 8}, journal); !errors.Is(err, twin.ErrDiverged) {
		t.Fatalf("the same write run: %v, want a divergence (the write would change the world)", err)
	}
}
