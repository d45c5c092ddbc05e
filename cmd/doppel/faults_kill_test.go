package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/converter"

	"github.com/doppel-dev/doppel/activities"
)

// faultWorkerKill collects one more batch (a rebuild), kills the worker -9 while the build self-checks, restarts
// it at once, and measures how soon the build resumes from its checkpoint and when it succeeds.
func faultWorkerKill(t *testing.T, s *faultStack, slug string, corpus []map[string]json.RawMessage) {
	before := len(s.builds(slug))
	more := make([]map[string]json.RawMessage, 0, len(corpus))
	for i, src := range corpus {
		tr := make(map[string]json.RawMessage, len(src))
		for f, v := range src {
			tr[f] = v
		}
		tr["id"], _ = json.Marshal(fmt.Sprintf("faults-rebuild-%d", i))
		more = append(more, tr)
	}
	var accepted map[string]any
	s.must(http.MethodPost, "/api/collect", s.key, map[string]any{"project": "faults-retail", "traces": more}, http.StatusAccepted, &accepted)
	var b faultBuild
	e2ePoll(t, 5*time.Minute, 100*time.Millisecond, "the rebuild self-checking", func() (bool, string) {
		bs := s.builds(slug)
		if len(bs) > before {
			b = bs[0]
		}
		if b.Status == "succeeded" || b.Status == "failed" {
			t.Fatalf("the rebuild finished (%s) before the worker could be killed in it", b.Status)
		}
		return b.Stage == "self-checking", fmt.Sprintf("%+v", b)
	})
	// Kill it once the server holds a checkpoint (SelfCheck heartbeats the parts it stored, every 2s).
	tc := e2eTemporalClient(t, s.temporal)
	var parts int
	e2ePoll(t, 2*time.Minute, 50*time.Millisecond, "a self-check checkpoint in the activity's heartbeat", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err := tc.DescribeWorkflowExecution(ctx, "build/"+b.ID, "")
		if err != nil {
			return false, err.Error()
		}
		for _, pa := range d.GetPendingActivities() {
			var cp activities.SelfCheckpoint
			if pa.GetActivityType().GetName() == "SelfCheck" && pa.GetHeartbeatDetails() != nil &&
				converter.GetDefaultDataConverter().FromPayloads(pa.GetHeartbeatDetails(), &cp) == nil && len(cp.Parts) > 0 {
				parts = len(cp.Parts)
				return true, ""
			}
		}
		if bs := s.builds(slug); len(bs) > 0 && bs[0].ID == b.ID && bs[0].Status != "running" {
			t.Fatalf("the rebuild finished (%s) before a checkpoint was seen", bs[0].Status)
		}
		return false, fmt.Sprintf("%d pending activities", len(d.GetPendingActivities()))
	})
	s.worker.kill(t)
	killed := time.Now()
	s.worker = s.start("worker")
	restarted := time.Now()
	figure(t, "worker kill -9 during self-check of build %s, its heartbeat holding %d checkpoint parts; restarted (polling) %s after the kill",
		b.ID, parts, restarted.Sub(killed).Round(time.Millisecond))

	resumed := regexp.MustCompile(`build resumes self-check.*folds_done=(\d+)`)
	var folds string
	e2ePoll(t, 2*time.Minute, 100*time.Millisecond, "the build resuming on the new worker", func() (bool, string) {
		data, _ := os.ReadFile(s.worker.logPath)
		if m := resumed.FindSubmatch(data); m != nil {
			folds = string(m[1])
			return true, ""
		}
		return false, s.worker.logTail()
	})
	resumedAt := time.Now()
	if folds == "0" {
		t.Errorf("the build resumed with no folds checkpointed")
	}
	e2ePoll(t, 10*time.Minute, 200*time.Millisecond, "the resumed build", func() (bool, string) {
		for _, x := range s.builds(slug) {
			if x.ID == b.ID {
				if x.Status == "failed" {
					t.Fatalf("the resumed build failed: %s", x.Error)
				}
				return x.Status == "succeeded", fmt.Sprintf("%+v", x)
			}
		}
		return false, "build gone"
	})
	figure(t, "build resumed %s after the worker restart (%s after the kill) from a checkpoint of %s folds; succeeded %s after the restart",
		resumedAt.Sub(restarted).Round(100*time.Millisecond), resumedAt.Sub(killed).Round(100*time.Millisecond), folds,
		time.Since(restarted).Round(100*time.Millisecond))
}

// faultAPIKill streams session calls (reads and writes) from several sessions on a Docker twin, kills the API -9
// mid-stream, restarts it, and checks every acknowledged call is in its session's transcript and that each
// session's world, read back, equals a fresh session's with the same seed replaying the transcript.
func faultAPIKill(t *testing.T, s *faultStack, slug string) {
	var wake map[string]any
	e2ePoll(t, 3*time.Minute, 200*time.Millisecond, "twin ready", func() (bool, string) {
		st, data, err := s.do(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, &wake)
		return err == nil && st == http.StatusOK, fmt.Sprintf("%d %s %v", st, data, err)
	})
	type opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
	}
	const sessions = 4
	open := func(seed int) opened {
		var o opened
		s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key, map[string]any{"seed": seed, "recordOutputs": true}, http.StatusCreated, &o)
		return o
	}
	calls := []struct {
		name string
		args map[string]any
	}{
		{"find_user_id_by_name_zip", map[string]any{"first_name": "Daiki", "last_name": "Johnson", "zip": "80273"}},
		{"get_user_details", map[string]any{"user_id": "daiki_johnson_9523"}},
		{"modify_user_address", map[string]any{"user_id": "daiki_johnson_9523", "address1": "1 Fault St", "address2": "",
			"city": "Crashville", "state": "CA", "country": "USA", "zip": "90001"}},
		{"get_order_details", map[string]any{"order_id": "#W9502127"}},
	}
	var acked [sessions][]string
	var sent, ok atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	ses := make([]opened, sessions)
	for i := range ses {
		ses[i] = open(100 + i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				c := calls[k%len(calls)]
				var out struct {
					CallID string `json:"callId"`
				}
				sent.Add(1)
				st, _, err := s.do(http.MethodPost, "/v1/sessions/"+ses[i].SessionID+"/call", ses[i].Token,
					map[string]any{"name": c.name, "arguments": c.args}, &out)
				if err != nil || st != http.StatusOK {
					return // the API is gone: this worker's last call is in flight
				}
				acked[i] = append(acked[i], out.CallID)
				ok.Add(1)
			}
		}()
	}
	e2ePoll(t, 2*time.Minute, 5*time.Millisecond, "200 acknowledged calls", func() (bool, string) {
		return ok.Load() >= 200, fmt.Sprint(ok.Load())
	})
	s.api.kill(t)
	stop.Store(true)
	wg.Wait()
	killed := time.Now()
	s.api = s.start("serve")
	figure(t, "API kill -9 after %d acknowledged calls (%d sent) in %d sessions; back (readyz 200) %s after the kill",
		ok.Load(), sent.Load(), sessions, time.Since(killed).Round(time.Millisecond))

	type entry struct {
		CallID    string          `json:"callId"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	var lost, extra int
	firstCall := time.Now()
	for i, o := range ses {
		var tr struct {
			Calls []entry `json:"calls"`
		}
		s.must(http.MethodGet, "/v1/sessions/"+o.SessionID+"/transcript", s.key, nil, http.StatusOK, &tr)
		have := map[string]bool{}
		for _, e := range tr.Calls {
			have[e.CallID] = true
		}
		for _, id := range acked[i] {
			if !have[id] {
				lost++
			}
		}
		extra += len(tr.Calls) - len(acked[i])
		// The world after restart is the journal's: a fresh session with the same seed replaying it agrees.
		var got, want struct {
			StateHash string `json:"state_hash"`
		}
		s.must(http.MethodGet, "/v1/sessions/"+o.SessionID, s.key, nil, http.StatusOK, &got)
		if i == 0 {
			figure(t, "first session read after the API restart answered %s after it came back", time.Since(firstCall).Round(time.Millisecond))
		}
		replay := open(100 + i)
		for _, e := range tr.Calls {
			var args map[string]any
			_ = json.Unmarshal(e.Arguments, &args)
			s.must(http.MethodPost, "/v1/sessions/"+replay.SessionID+"/call", replay.Token, map[string]any{"name": e.Name, "arguments": args}, http.StatusOK, nil)
		}
		s.must(http.MethodGet, "/v1/sessions/"+replay.SessionID, s.key, nil, http.StatusOK, &want)
		if got.StateHash == "" || got.StateHash != want.StateHash {
			t.Errorf("session %s: state %s after the restart, %s replaying its %d journaled calls", o.SessionID, got.StateHash, want.StateHash, len(tr.Calls))
		}
		// And it still takes calls.
		s.must(http.MethodPost, "/v1/sessions/"+o.SessionID+"/call", o.Token, map[string]any{"name": calls[1].name, "arguments": calls[1].args}, http.StatusOK, nil)
	}
	if lost != 0 {
		t.Errorf("%d acknowledged calls missing from the transcripts after the API kill", lost)
	}
	if extra < 0 || extra > sessions {
		t.Errorf("transcripts hold %d calls beyond the acknowledged ones; at most one in flight per session (%d)", extra, sessions)
	}
	figure(t, "after the API kill: %d acknowledged calls lost, %d unacknowledged (in flight) journaled; every session's state equals its journal's replay",
		lost, extra)
}

// faultEngineDown cuts doppel off from the Docker engine. A running twin needs no engine: its sessions keep
// answering. Then the twin's container stops (the suite stops it directly): calls answer 503 with the envelope
// until the engine is back, and then the twin comes back and its sessions go on from their journals, without a
// restart of doppel.
func faultEngineDown(t *testing.T, s *faultStack, slug string, engine *crashProxy, owner string) {
	type opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
	}
	var o opened
	s.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", s.key, map[string]any{"seed": 7}, http.StatusCreated, &o)
	call := func() (int, []byte) {
		st, data, err := s.do(http.MethodPost, "/v1/sessions/"+o.SessionID+"/call", o.Token,
			map[string]any{"name": "get_user_details", "arguments": map[string]any{"user_id": "daiki_johnson_9523"}}, nil)
		if err != nil {
			return 0, []byte(err.Error())
		}
		return st, data
	}
	s.must(http.MethodPost, "/v1/sessions/"+o.SessionID+"/call", o.Token,
		map[string]any{"name": "modify_user_address", "arguments": map[string]any{"user_id": "daiki_johnson_9523", "address1": "2 Engine Rd",
			"address2": "", "city": "Dockerton", "state": "CA", "country": "USA", "zip": "90002"}}, http.StatusOK, nil)
	var before struct {
		StateHash string `json:"state_hash"`
	}
	s.must(http.MethodGet, "/v1/sessions/"+o.SessionID, s.key, nil, http.StatusOK, &before)

	engine.Cut()
	cut := time.Now()
	okDuring := 0
	for range 50 {
		if st, data := call(); st != http.StatusOK {
			t.Fatalf("a call to a running twin with the engine cut answered %d %s", st, data)
		}
		okDuring++
	}
	figure(t, "engine cut: %d of %d calls to the running twin answered 200 (a running twin needs no engine)", okDuring, 50)

	// The twin's container goes away while the engine is out of doppel's reach.
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label=dev.doppel.owner=faults-"+owner).Output()
	if err != nil || len(strings.Fields(string(out))) == 0 {
		t.Fatalf("find the twin container: %v %q", err, out)
	}
	if out, err := exec.Command("docker", append([]string{"rm", "-f"}, strings.Fields(string(out))...)...).CombinedOutput(); err != nil {
		t.Fatalf("remove the twin container: %v %s", err, out)
	}
	var statuses []string
	var first503 string
	e2ePoll(t, 2*time.Minute, 200*time.Millisecond, "a 503 while the twin is gone and the engine cut", func() (bool, string) {
		st, data := call()
		statuses = append(statuses, strconv.Itoa(st))
		if st == http.StatusServiceUnavailable {
			first503 = string(data)
			return true, ""
		}
		if st >= 500 || st == 0 {
			t.Fatalf("the call answered %d %s, want a 503 envelope", st, data)
		}
		return false, fmt.Sprintf("%d %s", st, data)
	})
	var env struct {
		Detail, Code, RequestID string
	}
	if json.Unmarshal([]byte(first503), &env) != nil || env.Code != "unavailable" || env.RequestID == "" || env.Detail == "" {
		t.Errorf("503 without the envelope: %s", first503)
	}
	figure(t, "twin container removed with the engine cut: calls answered %s, then 503 %q", strings.Join(statuses[:len(statuses)-1], ","), env.Detail)
	// The outage lasts a few seconds under calls: each answers the same 503.
	n503 := 0
	for until := time.Now().Add(3 * time.Second); time.Now().Before(until); n503++ {
		if st, data := call(); st != http.StatusServiceUnavailable {
			t.Fatalf("with the twin gone and the engine cut, a call answered %d %s", st, data)
		}
		time.Sleep(20 * time.Millisecond)
	}
	figure(t, "then %d calls in 3s, each 503", n503)
	// A wake in the outage does not answer a stale 200 for the gone twin (issue 21): 503, the engine named.
	if st, data, err := s.do(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, nil); err != nil || st != http.StatusServiceUnavailable {
		t.Errorf("wake with the twin gone and the engine cut: %d %s %v, want 503", st, data, err)
	}

	engine.Restore()
	restored := time.Now()
	e2ePoll(t, 3*time.Minute, 250*time.Millisecond, "calls answering again after the engine is back", func() (bool, string) {
		if st, data := call(); st != http.StatusOK {
			return false, fmt.Sprintf("%d %s", st, data)
		}
		return true, ""
	})
	back := time.Since(restored)
	var after struct {
		StateHash string `json:"state_hash"`
	}
	s.must(http.MethodGet, "/v1/sessions/"+o.SessionID, s.key, nil, http.StatusOK, &after)
	if after.StateHash != before.StateHash {
		t.Errorf("state after the twin came back %s, before the outage %s: the journal's write was not replayed", after.StateHash, before.StateHash)
	}
	figure(t, "engine restored %s after the cut: the session answered 200 again %s later on a new twin, its world rebuilt from the journal (state hash unchanged)",
		restored.Sub(cut).Round(100*time.Millisecond), back.Round(100*time.Millisecond))
}

// faultIngestKill streams batches of real traces to the API from two clients and kills the API -9 mid-stream,
// twice; after each restart every acknowledged batch is stored whole, an unacknowledged one whole or not at all,
// and its resend is counted once (checkStored, as for doppel dev in TestCrash). The API runs with the rebuild
// debounced for an hour meanwhile, so no build of the streamed environment competes for the two cores.
func faultIngestKill(t *testing.T, s *faultStack, be crashBackend, corpus []map[string]json.RawMessage) {
	s.env = append(s.env, "DOPPEL_COLLECT_REBUILD_DEBOUNCE=1h") // the last value of a variable wins
	s.api.kill(t)
	s.api = s.start("serve")
	cs := &crashStreamer{t: t, url: s.url(), key: s.key, project: "faults-ingest", size: 50, traces: corpus,
		http: &http.Client{Timeout: 2 * time.Minute}}
	const rounds, killAfter = 2, 8
	for round := 1; round <= rounds; round++ {
		cs.stop.Store(false)
		start := cs.acked.Load()
		wg := cs.run(2, 10000)
		e2ePoll(t, 3*time.Minute, 5*time.Millisecond, fmt.Sprintf("round %d: %d acknowledged batches", round, killAfter), func() (bool, string) {
			return cs.acked.Load()-start >= killAfter, fmt.Sprintf("%d acknowledged; %d refused", cs.acked.Load()-start, cs.count(batchRejected))
		})
		s.api.kill(t)
		killed := time.Now()
		cs.stop.Store(true)
		wg.Wait()
		if n := cs.count(batchRejected); n != 0 {
			t.Fatalf("round %d: %d batches refused while the API was up (first: %s)", round, n, firstAnswer(cs, batchRejected))
		}
		inFlight := cs.count(batchInFlight)
		s.api = s.start("serve")
		back := time.Since(killed)
		present := checkStored(t, be, cs, s.url(), s.key)
		figure(t, "round %d: API kill -9 with %d batches acknowledged in all, %d in flight (%d of them stored whole, none in part); every acknowledged batch stored; API back %s after the kill",
			round, cs.acked.Load(), inFlight, countTrue(present), back.Round(time.Millisecond))
		resendInFlight(t, cs, present)
		if t.Failed() {
			return
		}
	}
	checkStored(t, be, cs, s.url(), s.key)
}

// faultWakeContainerRemoved removes the ready twin's container (docker rm -f): the next wake answers 202 booting,
// not the stale 200 ready, and a later one 200 with a new container (issue 21).
func faultWakeContainerRemoved(t *testing.T, s *faultStack, slug, owner string) {
	e2ePoll(t, 3*time.Minute, 200*time.Millisecond, "twin ready", func() (bool, string) {
		st, data, err := s.do(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, nil)
		return err == nil && st == http.StatusOK, fmt.Sprintf("%d %s %v", st, data, err)
	})
	running := func() []string {
		out, err := exec.Command("docker", "ps", "-q", "--no-trunc", "--filter", "label=dev.doppel.owner=faults-"+owner).Output()
		if err != nil {
			t.Fatalf("docker ps: %v", err)
		}
		return strings.Fields(string(out))
	}
	before := running()
	if len(before) == 0 {
		t.Fatal("no twin container runs")
	}
	if out, err := exec.Command("docker", append([]string{"rm", "-f"}, before...)...).CombinedOutput(); err != nil {
		t.Fatalf("remove the twin containers: %v %s", err, out)
	}
	removed := time.Now()
	if st, data, err := s.do(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, nil); err != nil ||
		st != http.StatusAccepted || !strings.Contains(string(data), `"booting"`) {
		t.Errorf("wake after docker rm -f: %d %s %v, want 202 booting", st, data, err)
	}
	e2ePoll(t, 3*time.Minute, 200*time.Millisecond, "wake 200 after the restart", func() (bool, string) {
		st, data, err := s.do(http.MethodPost, "/v1/envs/"+slug+"/wake", s.key, nil, nil)
		return err == nil && st == http.StatusOK, fmt.Sprintf("%d %s %v", st, data, err)
	})
	after := running()
	if len(after) == 0 || slices.ContainsFunc(after, func(id string) bool { return slices.Contains(before, id) }) {
		t.Errorf("containers after the restart %v, before %v: want a new one", after, before)
	}
	figure(t, "twin container removed: wake answered 202, then 200 with a new container %s later",
		time.Since(removed).Round(10*time.Millisecond))
}
