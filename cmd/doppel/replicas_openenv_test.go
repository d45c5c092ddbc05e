package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/doppel-dev/doppel/trace"
)

// The OpenEnv face scaled out (issue 35): an episode runs over one replica's WebSocket, and its session — whose id
// the observation's metadata names — is read and graded over REST through another replica, which must grade it as
// the episode did.

// replicaEpisodeTraces are the corpus's conversations of 4 to 8 answered calls (with object arguments), in order.
func replicaEpisodeTraces(t *testing.T, corpus []map[string]json.RawMessage) []trace.Trace {
	t.Helper()
	var out []trace.Trace
	for _, raw := range corpus {
		data, _ := json.Marshal(raw)
		var tr trace.Trace
		if err := json.Unmarshal(data, &tr); err != nil {
			t.Fatal(err)
		}
		if n := len(replicaAnswered(tr)); n >= 4 && n <= 8 {
			out = append(out, tr)
		}
	}
	return out
}

// replicaAnswered is a conversation's answered calls with object arguments.
func replicaAnswered(tr trace.Trace) []trace.Call {
	var calls []trace.Call
	for _, c := range trace.Calls(tr) {
		if c.Answered && c.Args != nil {
			calls = append(calls, c)
		}
	}
	return calls
}

// replicaOpenEnv: a reference run over REST on replica b (the conversation's world, all its calls) gives the grader
// (its diff's expectations); an OpenEnv WebSocket episode on replica a resets to the same world with that task, steps
// the conversation's calls before its last write (max_steps ends it there), reads its state and closes; then b reads the
// session the observation's metadata names (sessions.get, the transcript) and grades it (sessions.assert), and the
// share of expectations passed, the verdicts, the step count and the state hash equal what the episode answered on a.
func replicaOpenEnv(t *testing.T, a, b *faultStack, slug string, corpus []map[string]json.RawMessage) {
	began := time.Now()
	do := func(s *faultStack, method, path, token string, body any, want int, out any) {
		t.Helper()
		st, data, err := s.do(method, path, token, body, out)
		if err != nil || st != want {
			t.Fatalf("%s %s: %d %s (%v), want %d", method, path, st, data, err, want)
		}
	}
	// The grader: a reference run over REST on b of a conversation's calls on the world it saw; its diff's
	// expectations hold exactly for the end state the calls reach. The episode steps the calls before the last one
	// that changed the world (its transcript's state hashes say which), so its end state is another: some
	// expectations pass (the entities no call wrote), some fail (that last write's fields).
	var (
		traceID string
		steps   []trace.Call
		expect  []json.RawMessage
	)
	for _, tr := range replicaEpisodeTraces(t, corpus) {
		calls := replicaAnswered(tr)
		var ref struct {
			SessionID string `json:"sessionId"`
			Token     string `json:"token"`
		}
		do(b, http.MethodPost, "/v1/envs/"+slug+"/sessions", b.key, map[string]any{"seed": 35, "trace": tr.ID}, http.StatusCreated, &ref)
		var opened struct {
			StateHash string `json:"state_hash"`
		}
		do(b, http.MethodGet, "/v1/sessions/"+ref.SessionID, b.key, nil, http.StatusOK, &opened)
		for _, c := range calls {
			do(b, http.MethodPost, "/v1/sessions/"+ref.SessionID+"/call", ref.Token,
				map[string]any{"name": c.Tool, "arguments": json.RawMessage(c.RawArgs), "requestor": "assistant"}, http.StatusOK, nil)
		}
		var rt struct {
			Calls []struct {
				StateHash string `json:"stateHash"`
			} `json:"calls"`
		}
		do(b, http.MethodGet, "/v1/sessions/"+ref.SessionID+"/transcript", b.key, nil, http.StatusOK, &rt)
		var diff struct {
			Expectations []json.RawMessage `json:"expectations"`
		}
		do(b, http.MethodGet, "/v1/sessions/"+ref.SessionID+"/diff", b.key, nil, http.StatusOK, &diff)
		if st, data, err := b.do(http.MethodDelete, "/v1/sessions/"+ref.SessionID, b.key, nil, nil); err != nil || st/100 != 2 {
			t.Fatalf("close the reference run: %d %s %v", st, data, err)
		}
		if len(rt.Calls) != len(calls) {
			t.Fatalf("reference run of %s: %d calls in the transcript, %d made", tr.ID, len(rt.Calls), len(calls))
		}
		lastWrite, prev := -1, opened.StateHash
		for i, c := range rt.Calls {
			if c.StateHash != prev {
				lastWrite = i
			}
			prev = c.StateHash
		}
		if lastWrite >= 3 { // at least three steps before it
			traceID, steps, expect = tr.ID, calls[:lastWrite], diff.Expectations
			break
		}
	}
	if traceID == "" {
		t.Fatal("no conversation of 4 to 8 calls in the corpus writes after its third call")
	}

	// The episode, on a.
	u := "ws://" + a.apiAddr + "/openenv/envs/" + slug + "/ws"
	conn, res, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + a.key}})
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", u, err, res)
	}
	defer conn.Close()
	type answer struct {
		Type string `json:"type"`
		Data struct {
			Observation struct {
				Result   json.RawMessage `json:"result"`
				Error    json.RawMessage `json:"error"`
				Metadata struct {
					SessionID  string            `json:"session_id"`
					Steps      int               `json:"steps"`
					Fidelity   string            `json:"fidelity"`
					DoneReason string            `json:"done_reason"`
					Verdicts   []json.RawMessage `json:"verdicts"`
				} `json:"metadata"`
			} `json:"observation"`
			Reward    *float64 `json:"reward"`
			Done      bool     `json:"done"`
			EpisodeID string   `json:"episode_id"`
			StepCount int      `json:"step_count"`
			StateHash string   `json:"state_hash"`
			Code      string   `json:"code"`
			Message   string   `json:"message"`
		} `json:"data"`
	}
	send := func(msg map[string]any, want string) answer {
		t.Helper()
		if err := conn.WriteJSON(msg); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("read the answer to %v: %v", msg, err)
		}
		var ans answer
		if err := json.Unmarshal(data, &ans); err != nil || ans.Type != want {
			t.Fatalf("answer to %v: %s (%v), want a %s", msg, data, err, want)
		}
		return ans
	}
	ans := send(map[string]any{"type": "reset", "data": map[string]any{"seed": 35, "options": map[string]any{
		"trace": traceID, "expect": expect, "max_steps": len(steps), "reward": "fraction"}}}, "observation")
	sid := ans.Data.Observation.Metadata.SessionID
	if sid == "" || ans.Data.Done || ans.Data.Reward != nil {
		t.Fatalf("reset: session %q, done %t, reward %v", sid, ans.Data.Done, ans.Data.Reward)
	}
	var fidelities []string
	for i, c := range steps {
		ans = send(map[string]any{"type": "step", "data": map[string]any{"type": "call_tool", "tool_name": c.Tool,
			"arguments": json.RawMessage(c.RawArgs)}}, "observation")
		meta := ans.Data.Observation.Metadata
		if meta.SessionID != sid || meta.Steps != i+1 || ans.Data.Done != (i == len(steps)-1) || len(ans.Data.Observation.Result) == 0 {
			t.Fatalf("step %d (%s): session %s, steps %d, done %t, result %s error %s", i+1, c.Tool, meta.SessionID,
				meta.Steps, ans.Data.Done, ans.Data.Observation.Result, ans.Data.Observation.Error)
		}
		fidelities = append(fidelities, c.Tool+" "+meta.Fidelity)
	}
	end := ans.Data
	if end.Reward == nil || end.Observation.Metadata.DoneReason != "max_steps" || len(end.Observation.Metadata.Verdicts) != len(expect) {
		t.Fatalf("the last step: reward %v, done_reason %q, %d verdicts for %d expectations", end.Reward,
			end.Observation.Metadata.DoneReason, len(end.Observation.Metadata.Verdicts), len(expect))
	}
	// The grader is the whole conversation's end state and the episode stops before its last write: some
	// expectations pass (every entity but the written rows unchanged), some fail (the last write's fields).
	if *end.Reward <= 0 || *end.Reward >= 1 {
		t.Fatalf("reward %v: want a share strictly between 0 and 1 for a run that stops before the last write (verdicts %s)",
			*end.Reward, end.Observation.Metadata.Verdicts)
	}
	state := send(map[string]any{"type": "state"}, "state")
	if state.Data.EpisodeID != sid || state.Data.StepCount != len(steps) || !strings.HasPrefix(state.Data.StateHash, "sha256:") {
		t.Fatalf("state: episode %s, %d steps, state %q", state.Data.EpisodeID, state.Data.StepCount, state.Data.StateHash)
	}
	if err := conn.WriteJSON(map[string]any{"type": "close"}); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, _, err := conn.ReadMessage(); err == nil {
		t.Fatal("replica a kept the connection open after close")
	}

	// Through b: the session is closed, holds the episode's calls and end state, and grades to the episode's reward.
	var got struct {
		NCalls    int    `json:"n_calls"`
		StateHash string `json:"state_hash"`
		Status    string `json:"status"`
	}
	e2ePoll(t, 30*time.Second, 50*time.Millisecond, "the episode's session closed, read through replica b", func() (bool, string) {
		do(b, http.MethodGet, "/v1/sessions/"+sid, b.key, nil, http.StatusOK, &got)
		return got.Status == "closed", got.Status
	})
	if got.NCalls != len(steps) || got.StateHash != state.Data.StateHash {
		t.Fatalf("sessions.get through b: %d calls, state %s; the episode on a: %d steps, state %s",
			got.NCalls, got.StateHash, len(steps), state.Data.StateHash)
	}
	var tr struct {
		Calls []struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			StateHash string          `json:"stateHash"`
		} `json:"calls"`
	}
	do(b, http.MethodGet, "/v1/sessions/"+sid+"/transcript", b.key, nil, http.StatusOK, &tr)
	if len(tr.Calls) != len(steps) || tr.Calls[len(tr.Calls)-1].StateHash != state.Data.StateHash {
		t.Fatalf("transcript through b: %d calls, want %d ending in state %s: %+v", len(tr.Calls), len(steps), state.Data.StateHash, tr.Calls)
	}
	for i, c := range steps {
		if tr.Calls[i].Name != c.Tool || !jsonEqual(tr.Calls[i].Arguments, json.RawMessage(c.RawArgs)) {
			t.Fatalf("transcript call %d: %s %s, the episode stepped %s %s", i+1, tr.Calls[i].Name, tr.Calls[i].Arguments, c.Tool, c.RawArgs)
		}
	}
	var graded struct {
		Passed    int               `json:"passed"`
		Failed    int               `json:"failed"`
		StateHash string            `json:"stateHash"`
		Results   []json.RawMessage `json:"results"`
	}
	do(b, http.MethodPost, "/v1/sessions/"+sid+"/assert", b.key, map[string]any{"expect": expect}, http.StatusOK, &graded)
	share := float64(graded.Passed) / float64(len(expect))
	if graded.Passed+graded.Failed != len(expect) || share != *end.Reward || graded.StateHash != state.Data.StateHash {
		t.Fatalf("sessions.assert through b: %d passed, %d failed (%v) of state %s; the episode on a answered reward %v of state %s",
			graded.Passed, graded.Failed, share, graded.StateHash, *end.Reward, state.Data.StateHash)
	}
	for i, v := range end.Observation.Metadata.Verdicts {
		var ev, gv struct {
			Pass     bool            `json:"pass"`
			Observed json.RawMessage `json:"observed"`
		}
		if json.Unmarshal(v, &ev) != nil || json.Unmarshal(graded.Results[i], &gv) != nil ||
			ev.Pass != gv.Pass || !jsonEqual(ev.Observed, gv.Observed) {
			t.Errorf("expectation %d: the episode's verdict %s, sessions.assert through b %s", i, v, graded.Results[i])
		}
	}
	t.Logf("trace %s: episode of %d steps on replica a (%s), reward %v (%d of %d expectations); the same through replica b; %s",
		traceID, len(steps), strings.Join(fidelities, ", "), *end.Reward, graded.Passed, len(expect),
		time.Since(began).Round(time.Millisecond))
}

// jsonEqual: two JSON texts hold the same value (key order and spacing aside).
func jsonEqual(x, y json.RawMessage) bool {
	var a, b any
	if json.Unmarshal(x, &a) != nil || json.Unmarshal(y, &b) != nil {
		return bytes.Equal(x, y)
	}
	ax, _ := json.Marshal(a)
	bx, _ := json.Marshal(b)
	return bytes.Equal(ax, bx)
}
