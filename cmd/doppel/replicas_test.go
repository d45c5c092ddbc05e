package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/trace"
)

// The production shape scaled out (issue 35): two `doppel serve` and two `doppel worker` processes on one
// PostgreSQL, MinIO and Temporal (task queue), process twins. Whatever replica a request reaches, it must answer as
// a single replica would: the session state is in the database, the twins are found through Temporal.

// replicaSet is the replicas of one deployment: each serve has its own address, all share the configuration.
type replicaSet struct {
	serves []*faultStack
}

// via is the replica that takes step i of a scenario: always the first for the single-replica reference, else
// the replicas in turn, starting from offset.
func (r *replicaSet) via(single bool, offset, i int) *faultStack {
	if single {
		return r.serves[0]
	}
	return r.serves[(offset+i)%len(r.serves)]
}

// startReplicas migrates, then starts n serve and n worker processes of bin on env; they share dir (the process
// twins' state), each with its own API and metrics address.
func startReplicas(t *testing.T, bin, dir, key string, env []string, n int) *replicaSet {
	t.Helper()
	migrate := exec.Command(bin, "migrate")
	migrate.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("doppel migrate: %v\n%s", err, out)
	}
	r := &replicaSet{}
	for i := range n {
		// runs numbers each replica's log files apart (serve-1.log, serve-11.log, …) in the shared dir.
		s := &faultStack{t: t, bin: bin, dir: dir, key: key, apiAddr: e2eFreeAddr(t), runs: 10 * i,
			env: append(append([]string(nil), env...), "DOPPEL_METRICS_WORKER_ADDR="+e2eFreeAddr(t))}
		s.api = s.start("serve")
		s.worker = s.start("worker")
		r.serves = append(r.serves, s)
	}
	return r
}

// TestReplicas: sessions opened through one serve replica are called, forked, read and closed through the other,
// alternating, and every answer and state hash equals those of the same scenario on a single replica; an OpenEnv
// WebSocket episode run on one replica is read and graded over REST on the other as the episode graded it.
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("replicas: builds the binary and runs two serve and two worker processes")
	}
	began := time.Now()
	temporalAddr := testenv.Temporal(t)
	be := realBackend(t, nil, nil)
	dir := t.TempDir()
	bin := crashBuild(t, dir)
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	env := append([]string{
		"DOPPEL_BOOTSTRAP_KEY=" + m.Plaintext,
		"DOPPEL_TEMPORAL_ADDRESS=" + temporalAddr,
		"DOPPEL_TEMPORAL_TASK_QUEUE=replicas-" + suffix,
		"DOPPEL_TWIN_DRIVER=process", "DOPPEL_TWIN_OWNER=replicas-" + suffix,
		"DOPPEL_COLLECT_REBUILD_DEBOUNCE=1s",
	}, be.env...)
	t.Cleanup(func() { reapProcessTwins(t, dir) })
	r := startReplicas(t, bin, dir, m.Plaintext, env, 2)
	a, b := r.serves[0], r.serves[1]
	t.Logf("two serve and two worker processes up %s after the start (binary built)", time.Since(began).Round(time.Millisecond))

	corpus := crashTraces(t)[:30]
	slug := hookCollect(t, a, "replicas-retail", corpus)
	e2ePoll(t, 5*time.Minute, 300*time.Millisecond, "the build (read through the other replica)", func() (bool, string) {
		bs := b.builds(slug)
		if len(bs) > 0 && bs[0].Status == "failed" {
			t.Fatalf("build failed: %s", bs[0].Error)
		}
		return len(bs) > 0 && bs[0].Status == "succeeded", fmt.Sprintf("%+v", bs)
	})
	calls := replicaCalls(t, corpus, 6)

	t.Run("rest", func(t *testing.T) {
		var ended [][2]string
		want := replicaScenario(t, r, slug, calls, true, 0, &ended)
		for offset := range len(r.serves) {
			got := replicaScenario(t, r, slug, calls, false, offset, &ended)
			if len(got) != len(want) {
				t.Fatalf("alternating from replica %d: %d steps, single replica %d", offset, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("alternating from replica %d, step %d:\n  got  %s\n  want %s", offset, i, got[i], want[i])
				}
			}
		}
		t.Logf("%d steps of each scenario, the same through one replica and through both alternating", len(want))
		// Past the session-token cache's window every replica refuses every closed session's token alike.
		time.Sleep(toolplane.DefaultTokenTTL + 500*time.Millisecond)
		for _, e := range ended {
			for i, s := range r.serves {
				if st, data, err := s.do(http.MethodPost, "/v1/sessions/"+e[0]+"/call", e[1],
					map[string]any{"name": calls[0].Tool, "arguments": json.RawMessage(calls[0].RawArgs)}, nil); err != nil || st != http.StatusUnauthorized {
					t.Errorf("replica %d, a closed session's token after the cache window: %d %s %v, want 401", i, st, data, err)
				}
			}
		}
	})
	t.Run("openenv", func(t *testing.T) { replicaOpenEnv(t, a, b, slug, corpus) })
	t.Run("mcp", func(t *testing.T) { replicaMCP(t, a, b, slug, calls) })
	for _, s := range r.serves {
		s.api.term(t)
		s.worker.term(t)
	}
	t.Logf("TestReplicas took %s", time.Since(began).Round(time.Millisecond))
}

// replicaCalls are the first n answered calls with object arguments of the corpus's traces, in order.
func replicaCalls(t *testing.T, corpus []map[string]json.RawMessage, n int) []trace.Call {
	t.Helper()
	var calls []trace.Call
	for _, raw := range corpus {
		data, _ := json.Marshal(raw)
		var tr trace.Trace
		if err := json.Unmarshal(data, &tr); err != nil {
			t.Fatal(err)
		}
		for _, c := range trace.Calls(tr) {
			if c.Answered && c.Args != nil && len(calls) < n {
				calls = append(calls, c)
			}
		}
	}
	if len(calls) < n {
		t.Fatalf("%d calls in the corpus, want %d", len(calls), n)
	}
	return calls
}

// replicaScenario opens a seeded session, calls it, forks it halfway, calls both, reads both and closes both, each
// step through the replica r.via names, and answers one line per step with what must not depend on the replica:
// the receipts' world hash, each call's answer, fidelity and rung, each state hash and call count, each status. The
// closed sessions' tokens are added to ended.
func replicaScenario(t *testing.T, r *replicaSet, slug string, calls []trace.Call, single bool, offset int, ended *[][2]string) []string {
	t.Helper()
	var steps []string
	step := 0
	via := func() *faultStack { s := r.via(single, offset, step); step++; return s }
	type opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
		Receipts  struct {
			Seeded    bool   `json:"seeded"`
			WorldHash string `json:"worldHash"`
		} `json:"receipts"`
		StateHash string `json:"state_hash"`
	}
	var parent opened
	s := via()
	s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key,
		map[string]any{"seed": 35, "seedInstructions": "2 orders with status pending"}, http.StatusCreated, &parent)
	steps = append(steps, fmt.Sprintf("open: seeded %t world %s", parent.Receipts.Seeded, parent.Receipts.WorldHash))
	call := func(who string, o opened, c trace.Call) {
		var res struct {
			Content, Fidelity, Rung string
			Error                   bool
		}
		s := via()
		s.must(http.MethodPost, "/v1/sessions/"+o.SessionID+"/call", o.Token,
			map[string]any{"name": c.Tool, "arguments": json.RawMessage(c.RawArgs), "requestor": "assistant"}, http.StatusOK, &res)
		steps = append(steps, fmt.Sprintf("%s call %s: %s %s error=%t %s", who, c.Tool, res.Fidelity, res.Rung, res.Error, res.Content))
	}
	read := func(who string, o opened) {
		var got struct {
			NCalls    int    `json:"n_calls"`
			StateHash string `json:"state_hash"`
			Status    string `json:"status"`
		}
		s := via()
		s.must(http.MethodGet, "/v1/sessions/"+o.SessionID, s.key, nil, http.StatusOK, &got)
		steps = append(steps, fmt.Sprintf("%s read: %s, %d calls, state %s", who, got.Status, got.NCalls, got.StateHash))
	}
	half := len(calls) / 2
	for _, c := range calls[:half] {
		call("parent", parent, c)
	}
	var fork opened
	s = via()
	s.must(http.MethodPost, "/v1/sessions/"+parent.SessionID+"/fork", s.key, map[string]any{}, http.StatusCreated, &fork)
	steps = append(steps, fmt.Sprintf("fork: world %s state %s", fork.Receipts.WorldHash, fork.StateHash))
	read("parent", parent)
	read("fork", fork)
	for i, c := range calls[half:] {
		call("parent", parent, c)
		call("fork", fork, calls[(half+len(calls)-1-i)%len(calls)])
	}
	read("parent", parent)
	read("fork", fork)
	for _, o := range []struct {
		who string
		o   opened
	}{{"parent", parent}, {"fork", fork}} {
		s := via()
		closed, data, err := s.do(http.MethodDelete, "/v1/sessions/"+o.o.SessionID, s.key, nil, nil)
		if err != nil || closed/100 != 2 {
			t.Fatalf("close %s: %d %s %v", o.who, closed, data, err)
		}
		s = via()
		st, _, err := s.do(http.MethodPost, "/v1/sessions/"+o.o.SessionID+"/call", o.o.Token,
			map[string]any{"name": calls[0].Tool, "arguments": json.RawMessage(calls[0].RawArgs)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The replica that closed it refuses the token at once (401); another one may still hold it in its token
		// cache for toolplane's TokenTTL and answers that the session is gone (404) until then (docs/credentials.md):
		// refused either way, and nothing changes. TestReplicas checks every replica answers 401 once that window
		// has passed.
		steps = append(steps, fmt.Sprintf("%s closed (%d); a call after the close is refused: %t", o.who, closed,
			st == http.StatusUnauthorized || st == http.StatusNotFound))
		*ended = append(*ended, [2]string{o.o.SessionID, o.o.Token})
	}
	if !strings.Contains(strings.Join(steps, "\n"), "sha256:") {
		t.Fatalf("no state hash in the scenario's steps:\n%s", strings.Join(steps, "\n"))
	}
	return steps
}
