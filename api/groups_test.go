package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/usage"
)

// doList is do for an answer that may be a JSON array.
func (p *plane) doList(method, path, token string, body any) (int, []map[string]any, map[string]any) {
	p.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		p.t.Fatal(err)
	}
	r := httptest.NewRequest(method, path, bytes.NewReader(b))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	if bytes.HasPrefix(w.Body.Bytes(), []byte("[")) {
		var list []map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
			p.t.Fatal(err)
		}
		return w.Code, list, nil
	}
	var one map[string]any
	if w.Body.Len() > 0 {
		if err := json.Unmarshal(w.Body.Bytes(), &one); err != nil {
			p.t.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body)
		}
	}
	return w.Code, nil, one
}

func asSessions(t *testing.T, list []map[string]any) []session {
	t.Helper()
	out := make([]session, len(list))
	ids, tokens := map[string]bool{}, map[string]bool{}
	for i, o := range list {
		out[i] = session{ID: str(o["sessionId"]), Token: str(o["token"]), Open: o}
		if out[i].ID == "" || out[i].Token == "" || ids[out[i].ID] || tokens[out[i].Token] {
			t.Fatalf("answer %d: id %q token %q: each must be its own (%v)", i, out[i].ID, out[i].Token, list)
		}
		ids[out[i].ID], tokens[out[i].Token] = true, true
	}
	return out
}

// A group open answers n sessions of one world (one seed, one world hash), each its own id and token, whose worlds
// are then independent; a group fork answers n forks of the parent's world as it is, independent of each other and
// of the parent.
func TestGroupOpenAndFork(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		eachTransport(t, func(t *testing.T, local bool) {
			p := newPlane(t, driver, shopBundle(t), planeOptions{local: local})
			code, list, one := p.doList(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key,
				map[string]any{"seed_instructions": "2 orders with status pending", "seed": 11, "n": 4})
			if code != http.StatusCreated || len(list) != 4 {
				t.Fatalf("group open: %d %v %v", code, list, one)
			}
			ss := asSessions(t, list)
			single := p.open(map[string]any{"seed_instructions": "2 orders with status pending", "seed": 11})
			for i, s := range ss {
				if s.Open["world_hash"] != single.Open["world_hash"] || s.Open["seed"] != float64(11) {
					t.Fatalf("group session %d: world %v seed %v, a single open of the same spec: %v", i, s.Open["world_hash"], s.Open["seed"], single.Open["world_hash"])
				}
			}
			pending := pinnedOrders(t, ss[0].Open)
			// A write in one world leaves the others as they were.
			if code, out := p.call(ss[0], "cancel_pending_order", map[string]any{"order_id": pending[0]}); code != http.StatusOK || out["error"] == true {
				t.Fatalf("cancel in session 0: %d %v", code, out)
			}
			for i, s := range ss[1:] {
				_, out := p.call(s, "get_order_details", map[string]any{"order_id": pending[0]})
				if !bytes.Contains([]byte(str(out["content"])), []byte(`"pending"`)) {
					t.Fatalf("session %d sees session 0's write: %v", i+1, out)
				}
			}

			// A group fork of session 0 after its cancel: three copies of its world now.
			code, list, one = p.doList(http.MethodPost, "/v1/sessions/"+ss[0].ID+"/fork", ss[0].Token, map[string]any{"n": 3})
			if code != http.StatusCreated || len(list) != 3 {
				t.Fatalf("group fork: %d %v %v", code, list, one)
			}
			forks := asSessions(t, list)
			_, parent := p.do(http.MethodGet, "/v1/sessions/"+ss[0].ID, ss[0].Token, nil)
			for i, f := range forks {
				from, _ := f.Open["forkedFrom"].(map[string]any)
				if f.Open["state_hash"] != parent["state_hash"] || from["sessionId"] != ss[0].ID || from["atCall"] != float64(1) {
					t.Fatalf("fork %d: state %v from %v, parent state %v", i, f.Open["state_hash"], from, parent["state_hash"])
				}
			}
			if code, out := p.call(forks[0], "cancel_pending_order", map[string]any{"order_id": pending[1]}); code != http.StatusOK || out["error"] == true {
				t.Fatalf("cancel in fork 0: %d %v", code, out)
			}
			for i, s := range []session{forks[1], forks[2], ss[0]} {
				_, out := p.call(s, "get_order_details", map[string]any{"order_id": pending[1]})
				if !bytes.Contains([]byte(str(out["content"])), []byte(`"pending"`)) {
					t.Fatalf("session %d sees fork 0's write: %v", i, out)
				}
			}
			// Without n, the answers are single objects as before.
			if code, list, one := p.doList(http.MethodPost, "/v1/sessions/"+ss[1].ID+"/fork", ss[1].Token, map[string]any{}); code != http.StatusCreated || list != nil || one["sessionId"] == nil {
				t.Fatalf("single fork: %d %v %v", code, list, one)
			}
			// Over tRPC the same verb answers the same array.
			code, out := p.do(http.MethodPost, "/trpc/sessions.fork", p.key, map[string]any{"session_id": ss[2].ID, "n": 2})
			data, _ := out["result"].(map[string]any)
			if arr, _ := data["data"].([]any); code != http.StatusOK || len(arr) != 2 {
				t.Fatalf("tRPC group fork: %d %v", code, out)
			}
		})
	})
}

// pinnedOrders are the orders an open's seed instructions pinned.
func pinnedOrders(t *testing.T, open map[string]any) []string {
	t.Helper()
	pinned, _ := open["pinned"].(map[string]any)
	ids, _ := pinned["orders"].([]any)
	if len(ids) < 2 {
		t.Fatalf("the open pinned %v, want 2 orders", open["pinned"])
	}
	return []string{str(ids[0]), str(ids[1])}
}

// A group size outside 1…max is refused naming body.n, over REST and tRPC, and opens nothing.
func TestGroupSizeRefused(t *testing.T) {
	p := newPlane(t, "sqlite", shopBundle(t), planeOptions{})
	s := p.open(nil)
	for _, n := range []any{0, -1, 257, 1000} {
		for _, path := range []string{"/v1/envs/" + p.env.Slug + "/sessions", "/v1/sessions/" + s.ID + "/fork"} {
			code, _, out := p.doList(http.MethodPost, path, p.key, map[string]any{"n": n})
			if code != http.StatusUnprocessableEntity || !namesField(out, "body.n") {
				t.Fatalf("%s n=%v: %d %v, want a 422 naming body.n", path, n, code, out)
			}
		}
	}
	if got := countOpen(t, p); got != 1 {
		t.Fatalf("%d sessions open after refused groups, want 1", got)
	}
}

// namesField says whether an error envelope names field.
func namesField(env map[string]any, field string) bool {
	b, _ := json.Marshal(env)
	return bytes.Contains(b, []byte(`"`+field+`"`))
}

// The plan admits a whole group or none of it: past the open-sessions quota, a group open or fork is a 402 and
// opens nothing; a group that fits opens every session, each counted and metered.
func TestGroupIsHeldToTheOpenQuotaAllOrNone(t *testing.T) {
	plans := &usage.Plans{Default: "small", ByName: map[string]usage.Plan{"small": {OpenSessions: 5, CardLifts: true}}}
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{plans: plans, adminKey: testAdminKey})
		s := p.open(nil)
		code, _, out := p.doList(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, map[string]any{"n": 5})
		if code != http.StatusPaymentRequired {
			t.Fatalf("group open of 5 with 1 of 5 open: %d %v", code, out)
		}
		wantMeter(t, out, usage.MeterOpenSessions, 1, 5, false)
		code, _, out = p.doList(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", s.Token, map[string]any{"n": 5})
		if code != http.StatusPaymentRequired {
			t.Fatalf("group fork of 5 with 1 of 5 open: %d %v", code, out)
		}
		if got := countOpen(t, p); got != 1 {
			t.Fatalf("%d sessions open after refused groups, want 1", got)
		}
		code, list, _ := p.doList(http.MethodPost, "/v1/sessions/"+s.ID+"/fork", p.key, map[string]any{"n": 4})
		if code != http.StatusCreated || len(list) != 4 {
			t.Fatalf("group fork of 4 with 1 of 5 open: %d %v", code, list)
		}
		if got := countOpen(t, p); got != 5 {
			t.Fatalf("%d sessions open after a group of 4, want 5", got)
		}
		var u map[string]any
		if code, u = p.do(http.MethodGet, "/v1/usage", p.key, nil); code != http.StatusOK {
			t.Fatalf("usage: %d %v", code, u)
		}
		wantUsageMeter(t, u, usage.MeterOpenSessions, 5)
		// Forks made with the key are the key's: closing the parent leaves them open.
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+s.ID, s.Token, nil); code != http.StatusOK {
			t.Fatalf("close parent: %d %v", code, out)
		}
		if got := countOpen(t, p); got != 4 {
			t.Fatalf("%d sessions open after the parent closed, want the 4 key forks", got)
		}
	})
}

// The MCP workspace face's sessions.open and sessions.fork tools take n as REST does, and answer the array.
func TestGroupOverMCP(t *testing.T) {
	p := newMCPPlane(t, "sqlite", shopBundle(t))
	cs := p.connect(t, "/mcp", p.key)
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions.open", Arguments: map[string]any{"slug": p.env.Slug, "seed": 5, "n": 3}})
	if err != nil || res.IsError {
		t.Fatalf("MCP sessions.open n=3: %+v %v", res, err)
	}
	var opened []map[string]any
	if err := json.Unmarshal([]byte(textOf(t, res)), &opened); err != nil || len(opened) != 3 {
		t.Fatalf("MCP sessions.open n=3 answered %s (%v)", textOf(t, res), err)
	}
	ss := asSessions(t, opened)
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions.fork", Arguments: map[string]any{"session_id": ss[0].ID, "n": 2}})
	var forks []map[string]any
	if err != nil || res.IsError || json.Unmarshal([]byte(textOf(t, res)), &forks) != nil || len(forks) != 2 {
		t.Fatalf("MCP sessions.fork n=2: %+v %v", res, err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions.fork", Arguments: map[string]any{"session_id": ss[0].ID, "n": 0}})
	if err != nil || !res.IsError || !strings.Contains(textOf(t, res), "body.n") {
		t.Fatalf("MCP sessions.fork n=0: %+v %v, want an error naming body.n", res, err)
	}
}
