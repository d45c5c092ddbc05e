package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin/rpc"
)

func TestSessionOpenAnswersBothVariants(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{})
		// Variant A body.
		res := p.api.Post("/v1/envs/"+p.env.Slug+"/sessions", "Authorization: Bearer "+p.key,
			map[string]any{"seed_instructions": "2 orders with status pending", "seed": 42})
		if res.Code != http.StatusCreated {
			t.Fatalf("open A: %d %s", res.Code, res.Body)
		}
		var a map[string]any
		if err := json.Unmarshal(res.Body.Bytes(), &a); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"session_token", "session_id", "seed", "world_hash", "sessionId", "token", "receipts", "expiresAt", "pinned"} {
			if _, ok := a[k]; !ok {
				t.Errorf("open answer lacks %q: %v", k, a)
			}
		}
		rc := a["receipts"].(map[string]any)
		if a["session_token"] != a["token"] || !strings.HasPrefix(str(a["token"]), "ms_") || a["session_id"] != a["sessionId"] ||
			a["world_hash"] != rc["worldHash"] || a["seed"] != float64(42) || rc["seed"] != float64(42) ||
			rc["seeded"] != true || rc["note"] != nil || rc["scenario"] != nil {
			t.Fatalf("variants disagree: %v", a)
		}
		if orders, _ := a["pinned"].(map[string]any)["orders"].([]any); len(orders) != 2 {
			t.Fatalf("pinned = %v, want 2 orders", a["pinned"])
		}
		if exp, err := time.Parse(time.RFC3339, str(a["expiresAt"])); err != nil || exp.Before(time.Now().Add(50*time.Minute)) {
			t.Fatalf("expiresAt = %v (%v), want about an hour from now", a["expiresAt"], err)
		}

		// Variant B body, same seed and instructions: the same world.
		b := p.open(map[string]any{"seedInstructions": "2 orders with status pending", "seed": 42, "recordOutputs": true})
		if b.Open["world_hash"] != a["world_hash"] {
			t.Fatalf("same seed and instructions, world %v then %v", a["world_hash"], b.Open["world_hash"])
		}
		// Another seed: other generated values, another world.
		c := p.open(map[string]any{"seedInstructions": "2 orders with status pending", "seed": 43})
		if c.Open["world_hash"] == a["world_hash"] {
			t.Fatal("seeds 42 and 43 gave the same world")
		}
		// No body: the build's world, a drawn seed.
		d := p.open(nil)
		if d.Open["receipts"].(map[string]any)["seeded"] != false || d.Open["world_hash"] == a["world_hash"] {
			t.Fatalf("unseeded open = %v", d.Open)
		}
		if _, ok := d.Open["seed"].(float64); !ok {
			t.Fatalf("drawn seed not returned: %v", d.Open)
		}
		// A scenario from the build config, and a clock.
		e := p.open(map[string]any{"scenario": "busy", "seed": 42, "clock": "2025-03-01T09:00:00+01:00"})
		erc := e.Open["receipts"].(map[string]any)
		if erc["scenario"] != "busy" || erc["seeded"] != true || erc["clock"] != "2025-03-01T08:00:00Z" {
			t.Fatalf("scenario open = %v, want the clock in its receipts (issue 13: it was missing)", e.Open)
		}
		code, got := p.do(http.MethodGet, "/v1/sessions/"+e.ID, e.Token, nil)
		if code != 200 || got["receipts"].(map[string]any)["clock"] != "2025-03-01T08:00:00Z" {
			t.Fatalf("session read: %d %v, want clock 2025-03-01T08:00:00Z", code, got)
		}
		// The world policy: the build's (open by default), or the session's own, in the receipts and on read.
		if erc["world"] != "open" {
			t.Fatalf("default world policy = %v, want open", erc["world"])
		}
		cw := p.open(map[string]any{"seed": 42, "world": "closed"})
		if cw.Open["receipts"].(map[string]any)["world"] != "closed" {
			t.Fatalf("closed open = %v, want world closed in its receipts", cw.Open)
		}
		if code, got := p.do(http.MethodGet, "/v1/sessions/"+cw.ID, cw.Token, nil); code != 200 || got["receipts"].(map[string]any)["world"] != "closed" {
			t.Fatalf("session read: %d %v, want world closed", code, got)
		}
		// Words that cannot become rows: 201, seeded false, a note, the unseeded world.
		f := p.open(map[string]any{"seedInstructions": "a thunderstorm over the warehouse", "seed": 42})
		frc := f.Open["receipts"].(map[string]any)
		if frc["seeded"] != false || str(frc["note"]) == "" || f.Open["world_hash"] != p.unseededHash(42) {
			t.Fatalf("unseedable open = %v", f.Open)
		}
		// The token is shown only at open: no read answers it.
		for _, path := range []string{"/v1/sessions/" + b.ID, "/v1/sessions/" + b.ID + "/transcript"} {
			res := p.api.Get(path, "Authorization: Bearer "+p.key)
			if res.Code != 200 || strings.Contains(res.Body.String(), b.Token) {
				t.Fatalf("GET %s: %d, carries the token: %v", path, res.Code, strings.Contains(res.Body.String(), b.Token))
			}
		}
	})
}

// unseededHash is the world hash of a session opened with no instructions.
func (p *plane) unseededHash(seed int64) string {
	s := p.open(map[string]any{"seed": seed})
	return str(s.Open["world_hash"])
}

func TestSessionOpenBadInput(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	before := countSessions(t, p.db)
	tests := []struct {
		name  string
		body  string
		field string
	}{
		{"variants differ", `{"seed_instructions":"2 orders","seedInstructions":"3 orders"}`, "body.seedInstructions"},
		{"scenario with instructions", `{"scenario":"busy","seedInstructions":"2 orders"}`, "body.scenario"},
		{"seed not an integer", `{"seed":"forty-two"}`, "body.seed"},
		{"seed fractional", `{"seed":4.5}`, "body.seed"},
		{"clock not a time", `{"clock":"tomorrow"}`, "body.clock"},
		{"clock wrong type", `{"clock":1700000000}`, "body.clock"},
		{"unknown scenario", `{"scenario":"nope"}`, "body.scenario"},
		{"record outputs variants differ", `{"recordOutputs":true,"record_outputs":false}`, "body.recordOutputs"},
		{"world not a policy", `{"world":"ajar"}`, "body.world"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := p.api.Post("/v1/envs/"+p.env.Slug+"/sessions", "Authorization: Bearer "+p.key,
				"Content-Type: application/json", strings.NewReader(tt.body))
			if res.Code != http.StatusUnprocessableEntity {
				t.Fatalf("%d %s, want 422", res.Code, res.Body)
			}
			var e map[string]any
			_ = json.Unmarshal(res.Body.Bytes(), &e)
			if e["code"] != "invalid" || !strings.Contains(str(e["detail"]), tt.field) {
				t.Fatalf("envelope %v does not name %s", e, tt.field)
			}
		})
	}
	if got := countSessions(t, p.db); got != before {
		t.Fatalf("%d sessions after rejected opens, want %d", got, before)
	}
}

func countSessions(t testing.TB, db bun.IDB) int {
	t.Helper()
	n, err := db.NewSelect().Model((*schema.Session)(nil)).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestCallAnswersAndJournals(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		eachTransport(t, func(t *testing.T, local bool) {
			p := newPlane(t, driver, shopBundle(t), planeOptions{local: local})
			s := p.open(map[string]any{"seed": 7, "recordOutputs": true})
			res := p.api.Post("/v1/sessions/"+s.ID+"/call", "Authorization: Bearer "+s.Token,
				map[string]any{"name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}, "requestor": "assistant"})
			if res.Code != 200 {
				t.Fatalf("call: %d %s", res.Code, res.Body)
			}
			var r map[string]any
			_ = json.Unmarshal(res.Body.Bytes(), &r)
			if r["content"] != `{"order_id": "#W0000001", "user_id": "user_0001", "status": "delivered", "total": 12.5}` ||
				r["error"] != false || r["fidelity"] != "A_executed" || r["rung"] != "provided" || r["downgraded"] != false ||
				!strings.HasPrefix(str(r["callId"]), "call_") {
				t.Fatalf("answer = %v", r)
			}
			if _, ok := r["ms"].(float64); !ok {
				t.Fatalf("ms missing: %v", r)
			}
			if st := res.Header().Get("Server-Timing"); !regexp.MustCompile(`^auth;dur=[0-9.]+, twin;dur=[0-9.]+, journal;dur=[0-9.]+, total;dur=[0-9.]+$`).MatchString(st) {
				t.Fatalf("Server-Timing = %q, want auth, twin, journal and total durations", st)
			}
			// A tool's own error is a 200 with error: true.
			code, r2 := p.call(s, "cancel_pending_order", map[string]any{"order_id": "#W0000001"})
			if code != 200 || r2["error"] != true || r2["content"] != "Error: non-pending order cannot be cancelled" {
				t.Fatalf("tool error: %d %v", code, r2)
			}
			// The opening key may call too; requestor user is recorded.
			code, r3 := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/call", p.key,
				map[string]any{"name": "get_order_details", "arguments": map[string]any{"order_id": "#W404"}, "requestor": "user"})
			if code != 200 || r3["error"] != true {
				t.Fatalf("call with the opening key: %d %v", code, r3)
			}
			if n := p.journaled(s.ID); n != 3 {
				t.Fatalf("%d calls journaled, want 3", n)
			}
			code, tr := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/transcript", s.Token, nil)
			calls, _ := tr["calls"].([]any)
			if code != 200 || len(calls) != 3 {
				t.Fatalf("transcript: %d %v", code, tr)
			}
			for i, want := range []struct{ name, requestor, result string }{
				{"get_order_details", "assistant", str(r["content"])},
				{"cancel_pending_order", "", "Error: non-pending order cannot be cancelled"},
				{"get_order_details", "user", "Error: order not found"},
			} {
				e := calls[i].(map[string]any)
				if e["seq"] != float64(i+1) || e["name"] != want.name || str(e["requestor"]) != want.requestor || e["result"] != want.result ||
					e["fidelity"] != "A_executed" || e["arguments"] == nil {
					t.Errorf("transcript[%d] = %v", i, e)
				}
			}
			if calls[0].(map[string]any)["callId"] != r["callId"] {
				t.Fatal("transcript call id differs from the answer's")
			}
			// Session read: counts, mix, state hash.
			code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
			if code != 200 || v["n_calls"] != float64(3) || v["n_errors"] != float64(2) || v["status"] != "open" ||
				v["fidelity"].(map[string]any)["A_executed"] != float64(3) || v["state_hash"] != v["world_hash"] {
				t.Fatalf("session read = %d %v", code, v)
			}
		})
	})
}

func TestCallChangesStateAndTranscriptHidesOutputs(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seedInstructions": "1 order with status pending", "seed": 3})
	id := s.Open["pinned"].(map[string]any)["orders"].([]any)[0].(string)
	code, r := p.call(s, "cancel_pending_order", map[string]any{"order_id": id})
	if code != 200 || r["error"] != false || !strings.Contains(str(r["content"]), `"cancelled"`) {
		t.Fatalf("cancel: %d %v", code, r)
	}
	_, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
	if v["state_hash"] == v["world_hash"] {
		t.Fatal("state_hash did not change after a write")
	}
	_, tr := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/transcript", s.Token, nil)
	e := tr["calls"].([]any)[0].(map[string]any)
	if _, has := e["result"]; has || tr["recordOutputs"] != false || e["stateHash"] != v["state_hash"] {
		t.Fatalf("transcript without recordOutputs = %v", tr)
	}
	var content string
	if err := p.db.NewSelect().Model((*schema.Call)(nil)).Column("content").Where("session_id = ?", s.ID).Scan(context.Background(), &content); err != nil {
		t.Fatal(err)
	}
	if content != "" {
		t.Fatalf("output kept in the journal of a session without recordOutputs: %q", content)
	}
}

// TestWrongTypedArgumentsAreToolErrors: arguments that are an object but break the tool's input schema are the
// tool's own error — 200 with error: true, answered by the twin and journaled — not an HTTP 422 (issue 13 defect 3,
// spec §4.8). The world does not change, and a rebuild from the journal reaches the same state.
func TestWrongTypedArgumentsAreToolErrors(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seed": 1})
	_, before := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
	code, r := p.call(s, "get_order_details", map[string]any{"order_id": 12})
	if code != http.StatusOK || r["error"] != true || r["fidelity"] != "B_twin" || r["rung"] != "twin" ||
		!strings.Contains(str(r["content"]), "order_id") {
		t.Fatalf("wrong-typed argument: %d %v, want 200 error naming order_id", code, r)
	}
	_, after := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)
	if after["n_calls"] != float64(1) || after["n_errors"] != float64(1) || after["state_hash"] != before["state_hash"] {
		t.Fatalf("after the call: %v (before %v)", after, before)
	}
	// The twin loses the session: the next call rebuilds it from the journal, the refused call included.
	p.stopTwin()
	p.startTwin()
	for i := 0; ; i++ {
		code, r = p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"})
		if code != http.StatusConflict || i > 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusOK || r["error"] != false {
		t.Fatalf("call after the rebuild: %d %v", code, r)
	}
}

func TestCallBadInputJournalsNothing(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seed": 1})
	tests := []struct {
		name   string
		body   string
		status int
		names  string
	}{
		{"arguments an array", `{"name":"get_order_details","arguments":["#W0000001"]}`, 422, "body.arguments"},
		{"arguments a string", `{"name":"get_order_details","arguments":"{\"order_id\":\"#W0000001\"}"}`, 422, "body.arguments"},
		{"arguments missing", `{"name":"get_order_details"}`, 422, "arguments"},
		{"no name", `{"arguments":{}}`, 422, "name"},
		{"bad requestor", `{"name":"get_order_details","arguments":{"order_id":"#W0000001"},"requestor":"robot"}`, 422, "body.requestor"},
		{"unknown tool", `{"name":"launch_rocket","arguments":{}}`, 404, "launch_rocket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := p.api.Post("/v1/sessions/"+s.ID+"/call", "Authorization: Bearer "+s.Token,
				"Content-Type: application/json", strings.NewReader(tt.body))
			if res.Code != tt.status || !strings.Contains(res.Body.String(), tt.names) {
				t.Fatalf("%d %s, want %d naming %s", res.Code, res.Body, tt.status, tt.names)
			}
		})
	}
	if n := p.journaled(s.ID); n != 0 {
		t.Fatalf("%d calls journaled after rejected calls, want 0", n)
	}
	// The session is unharmed: a good call is call 1.
	if code, r := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != 200 || r["error"] != false {
		t.Fatalf("good call after bad ones: %d %v", code, r)
	}
	if _, tr := p.do(http.MethodGet, "/v1/sessions/"+s.ID+"/transcript", s.Token, nil); tr["calls"].([]any)[0].(map[string]any)["seq"] != float64(1) {
		t.Fatalf("transcript = %v", tr)
	}
}

func TestSessionSecurity(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	a := p.open(map[string]any{"seed": 1})
	b := p.open(map[string]any{"seed": 2})
	get := map[string]any{"name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}}
	// A's token cannot touch B: 404 on every session route.
	for _, r := range []struct{ method, path string }{
		{http.MethodPost, "/v1/sessions/" + b.ID + "/call"},
		{http.MethodGet, "/v1/sessions/" + b.ID},
		{http.MethodGet, "/v1/sessions/" + b.ID + "/transcript"},
		{http.MethodDelete, "/v1/sessions/" + b.ID},
	} {
		var body any
		if r.method == http.MethodPost {
			body = get
		}
		if code, e := p.do(r.method, r.path, a.Token, body); code != http.StatusNotFound || e["code"] != "notFound" {
			t.Fatalf("A's token on %s %s: %d %v, want 404", r.method, r.path, code, e)
		}
	}
	// Another workspace's key sees neither the session nor the environment.
	if code, _ := p.do(http.MethodGet, "/v1/sessions/"+a.ID, p.otherKey, nil); code != http.StatusNotFound {
		t.Fatalf("other workspace reading A: %d, want 404", code)
	}
	if code, _ := p.do(http.MethodPost, "/v1/envs/"+p.otherEnv.Slug+"/sessions", p.key, map[string]any{}); code != http.StatusNotFound {
		t.Fatalf("workspace X opening on Y's environment: %d, want 404", code)
	}
	if code, _ := p.do(http.MethodGet, "/v1/envs/"+p.otherEnv.Slug+"/tools", p.key, nil); code != http.StatusNotFound {
		t.Fatalf("workspace X listing Y's tools: %d, want 404", code)
	}
	// No credential, a garbage one, a session token on an environment route: 401.
	for _, tok := range []string{"", "ms_nope", "mk_live_nope"} {
		if code, _ := p.do(http.MethodPost, "/v1/sessions/"+a.ID+"/call", tok, get); code != http.StatusUnauthorized {
			t.Fatalf("credential %q: %d, want 401", tok, code)
		}
	}
	if code, _ := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", a.Token, map[string]any{}); code != http.StatusUnauthorized {
		t.Fatalf("session token opening a session: %d, want 401", code)
	}
	// A closed session's token is refused (401) at once, on every route.
	if code, out := p.do(http.MethodDelete, "/v1/sessions/"+a.ID, a.Token, nil); code != 200 || out["existed"] != true {
		t.Fatalf("close: %d %v", code, out)
	}
	if code, _ := p.call(a, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusUnauthorized {
		t.Fatalf("closed session's token: %d, want 401", code)
	}
	if code, _ := p.do(http.MethodGet, "/v1/sessions/"+a.ID, a.Token, nil); code != http.StatusUnauthorized {
		t.Fatalf("closed session's token reading: %d, want 401", code)
	}
	// B is untouched.
	if code, _ := p.call(b, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != 200 {
		t.Fatalf("B after A closed: %d", code)
	}
}

func TestSessionCloseDropsWorld(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seed": 1})
	tc := rpc.NewClient(p.twinAddr(), nil)
	if _, err := tc.Session(context.Background(), s.ID); err != nil {
		t.Fatalf("twin does not hold the open session: %v", err)
	}
	code, out := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, p.key, nil)
	if code != 200 || out["existed"] != true {
		t.Fatalf("close: %d %v", code, out)
	}
	if _, err := tc.Session(context.Background(), s.ID); err == nil {
		t.Fatal("the twin still holds a closed session's world")
	}
	// Closing again: it no longer exists as an open session.
	if code, out := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, p.key, nil); code != 200 || out["existed"] != false {
		t.Fatalf("second close: %d %v", code, out)
	}
	// The opening key can read the ended session; calls to it are 404.
	if code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil); code != 200 || v["status"] != "closed" {
		t.Fatalf("read closed session: %d %v", code, v)
	}
	if code, _ := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/call", p.key,
		map[string]any{"name": "get_order_details", "arguments": map[string]any{}}); code != http.StatusNotFound {
		t.Fatalf("call to a closed session with the opening key: %d, want 404", code)
	}
	// Any key of the workspace may read its sessions (spec §5; issue 13 defect 11: this was a 403).
	if code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key2, nil); code != http.StatusOK || v["id"] != s.ID {
		t.Fatalf("another key of the workspace: %d, want 200", code)
	}
}

func TestTwinRestartRebuildsSessionFromJournal(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		eachTransport(t, func(t *testing.T, local bool) {
			p := newPlane(t, driver, shopBundle(t), planeOptions{local: local})
			s := p.open(map[string]any{"seedInstructions": "2 orders with status pending", "seed": 11})
			ids := s.Open["pinned"].(map[string]any)["orders"].([]any)
			if code, r := p.call(s, "cancel_pending_order", map[string]any{"order_id": ids[0]}); code != 200 || r["error"] != false {
				t.Fatalf("cancel: %d %v", code, r)
			}
			_, before := p.do(http.MethodGet, "/v1/sessions/"+s.ID, s.Token, nil)

			// The twin dies and comes back (a new process, a new address): it holds no sessions.
			p.stopTwin()
			code, e := p.call(s, "get_order_details", map[string]any{"order_id": ids[1]})
			if code != http.StatusConflict || e["code"] != "notReady" {
				t.Fatalf("call while the twin is down: %d %v, want 409 notReady", code, e)
			}
			if p.twins.wakeCount() == 0 {
				t.Fatal("a call to a stopped twin did not wake it")
			}
			p.startTwin()

			// The next call rebuilds the session from seed, instructions, clock and journal: the world is the
			// pre-crash world (the cancelled order stays cancelled).
			code, r := p.call(s, "cancel_pending_order", map[string]any{"order_id": ids[0]})
			if code != 200 || r["content"] != "Error: non-pending order cannot be cancelled" {
				t.Fatalf("call after restart: %d %v", code, r)
			}
			st, err := rpc.NewClient(p.twinAddr(), nil).Session(context.Background(), s.ID)
			if err != nil {
				t.Fatalf("rebuilt session not on the new twin: %v", err)
			}
			if st.StateHash != before["state_hash"] || st.Calls != 2 {
				t.Fatalf("rebuilt state %s after %d calls, want %v after 2", st.StateHash, st.Calls, before["state_hash"])
			}
			if n := p.journaled(s.ID); n != 2 {
				t.Fatalf("%d calls journaled, want 2 (the 409 journals nothing)", n)
			}
		})
	})
}

func TestDivergedRebuildMarksSessionBroken(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(map[string]any{"seedInstructions": "1 order with status pending", "seed": 5})
	id := s.Open["pinned"].(map[string]any)["orders"].([]any)[0]
	if code, _ := p.call(s, "cancel_pending_order", map[string]any{"order_id": id}); code != 200 {
		t.Fatal(code)
	}
	// The journal disagrees with what replaying it gives (as if the world model had changed underneath).
	if _, err := p.db.NewUpdate().Model((*schema.Call)(nil)).Set("state_hash = ?", "sha256:tampered").
		Where("session_id = ?", s.ID).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.stopTwin()
	p.startTwin()
	code, e := p.call(s, "get_order_details", map[string]any{"order_id": id})
	if code != http.StatusConflict || !strings.Contains(str(e["detail"]), "broken") {
		t.Fatalf("call on a diverged session: %d %v, want 409 naming it broken", code, e)
	}
	if _, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil); v["status"] != "broken" {
		t.Fatalf("session status = %v, want broken", v["status"])
	}
	if code, _ := p.call(s, "get_order_details", map[string]any{"order_id": id}); code != http.StatusUnauthorized {
		t.Fatalf("a broken session's token: %d, want 401", code)
	}
}

func TestIdleSessionExpires(t *testing.T) {
	t.Run("on its next call", func(t *testing.T) {
		p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{idle: time.Millisecond})
		s := p.open(map[string]any{"seed": 1})
		time.Sleep(5 * time.Millisecond) // idle past the (tiny) limit
		code, e := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"})
		if code != http.StatusNotFound || !strings.Contains(str(e["detail"]), "expired") {
			t.Fatalf("call to an idle session: %d %v, want 404 expired", code, e)
		}
		if _, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil); v["status"] != "expired" {
			t.Fatalf("status = %v, want expired", v["status"])
		}
		if code, _ := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusNotFound {
			t.Fatalf("expired session's token: %d, want 404", code)
		}
		if _, err := rpc.NewClient(p.twinAddr(), nil).Session(context.Background(), s.ID); err == nil {
			t.Fatal("the twin still holds an expired session's world")
		}
	})
	// A read says expired the moment the idle deadline passes, as a call would (not when the reaper comes by).
	t.Run("on a read", func(t *testing.T) {
		p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{idle: time.Millisecond})
		s, listed, byToken := p.open(map[string]any{"seed": 1}), p.open(map[string]any{"seed": 2}), p.open(map[string]any{"seed": 3})
		time.Sleep(5 * time.Millisecond) // idle past the (tiny) limit
		if code, v := p.do(http.MethodGet, "/v1/sessions/"+s.ID, p.key, nil); code != http.StatusOK || v["status"] != "expired" || v["closed_at"] == nil {
			t.Fatalf("read of an idle session with its key: %d %v, want status expired", code, v)
		}
		if code, e := p.do(http.MethodGet, "/v1/sessions/"+byToken.ID, byToken.Token, nil); code != http.StatusNotFound || !strings.Contains(str(e["detail"]), "expired") {
			t.Fatalf("read of an idle session with its token: %d %v, want 404 expired", code, e)
		}
		list := func(query string) []map[string]any {
			t.Helper()
			r := httptest.NewRequest(http.MethodGet, "/v1/envs/"+p.env.Slug+"/sessions"+query, nil)
			r.Header.Set("Authorization", "Bearer "+p.key)
			w := httptest.NewRecorder()
			p.h.ServeHTTP(w, r)
			var rows []map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &rows); err != nil || w.Code != http.StatusOK {
				t.Fatalf("list%s: %d %s", query, w.Code, w.Body)
			}
			return rows
		}
		if rows := list("?status=open"); len(rows) != 0 {
			t.Errorf("status=open lists %d idle sessions, want none", len(rows))
		}
		rows := list("")
		for _, row := range rows {
			if row["status"] != "expired" {
				t.Errorf("listed %v as %v, want expired", row["id"], row["status"])
			}
		}
		if len(rows) != 3 {
			t.Errorf("listed %d sessions, want 3 (%s among them)", len(rows), listed.ID)
		}
		for _, id := range []string{s.ID, listed.ID, byToken.ID} {
			if _, err := rpc.NewClient(p.twinAddr(), nil).Session(context.Background(), id); err == nil {
				t.Errorf("the twin still holds expired session %s's world", id)
			}
		}
	})
	t.Run("by the reaper", func(t *testing.T) {
		p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
		idle, busy := p.open(map[string]any{"seed": 1}), p.open(map[string]any{"seed": 2})
		a := &activities.Sessions{DB: p.db, Twins: p.twins, Reaper: p.tp}
		ctx := context.Background()
		// An hour and a half later busy was used (its call is journaled then), idle was not.
		later := time.Now().Add(90 * time.Minute)
		if _, err := p.db.NewInsert().Model(&schema.Call{ID: schema.NewID(schema.PrefixCall), SessionID: busy.ID, Seq: 1,
			Tool: "get_order_details", Arguments: json.RawMessage(`{"order_id":"#W0000001"}`), Fidelity: schema.FidelityAExecuted,
			Rung: "provided", StateHash: "sha256:x", CreatedAt: later.UTC()}).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := a.ReapIdleSessions(ctx, activities.ReapInput{Now: later.Add(time.Minute), Idle: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Expired) != 1 || res.Expired[0] != idle.ID || res.Extended != 1 {
			t.Fatalf("reap = %+v, want %s expired and one extended", res, idle.ID)
		}
		if code, _ := p.call(idle, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusNotFound {
			t.Fatalf("reaped session: %d, want 404", code)
		}
		if _, err := rpc.NewClient(p.twinAddr(), nil).Session(ctx, idle.ID); err == nil {
			t.Fatal("the twin still holds a reaped session's world")
		}
		// Reaping again at the same time changes nothing.
		res, err = a.ReapIdleSessions(ctx, activities.ReapInput{Now: later.Add(time.Minute), Idle: time.Hour})
		if err != nil || len(res.Expired) != 0 || res.Extended != 0 {
			t.Fatalf("second reap = %+v, %v", res, err)
		}
	})
}
