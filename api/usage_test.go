package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/usage"
)

const testAdminKey = "admin-0123456789abcdef0123456789abcdef"

// trpcEnvelope is the envelope and HTTP status of a tRPC error answer.
func trpcEnvelope(t *testing.T, out map[string]any) (map[string]any, float64) {
	t.Helper()
	e, _ := out["error"].(map[string]any)
	data, _ := e["data"].(map[string]any)
	env, _ := data["envelope"].(map[string]any)
	if env == nil {
		t.Fatalf("not a tRPC error: %v", out)
	}
	st, _ := data["httpStatus"].(float64)
	return env, st
}

// wantMeter checks a 402 envelope: code, meter {name, used, limit} and cardWouldLift.
func wantMeter(t *testing.T, env map[string]any, name string, used, limit float64, card bool) {
	t.Helper()
	m, _ := env["meter"].(map[string]any)
	if env["code"] != api.CodePaymentRequired || m == nil || m["name"] != name || m["used"] != used || m["limit"] != limit ||
		env["cardWouldLift"] != card || env["detail"] == "" || env["requestId"] == "" {
		t.Fatalf("402 envelope = %v, want meter %s %g/%g, cardWouldLift %v", env, name, used, limit, card)
	}
}

func countOpen(t *testing.T, p *plane) int {
	t.Helper()
	n, err := p.db.NewSelect().Model((*schema.Session)(nil)).Where("workspace_id = ? AND status = 'open'", p.ws.ID).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestQuota402OverRESTAndTRPC(t *testing.T) {
	plans := &usage.Plans{Default: "small", ByName: map[string]usage.Plan{
		"small": {OpenSessions: 2, ToolCalls: 3, CardLifts: true},
	}}
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{plans: plans, adminKey: testAdminKey})
		// The sandbox quota: two open sessions, the third refused over REST and over tRPC, nothing written.
		s1 := p.open(nil)
		p.open(nil)
		code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, nil)
		if code != http.StatusPaymentRequired {
			t.Fatalf("third open: %d %v", code, out)
		}
		wantMeter(t, out, usage.MeterOpenSessions, 2, 2, false)
		code, out = p.do(http.MethodPost, "/trpc/sessions.open", p.key, map[string]any{"slug": p.env.Slug})
		env, st := trpcEnvelope(t, out)
		if code != http.StatusPaymentRequired || st != http.StatusPaymentRequired {
			t.Fatalf("tRPC third open: %d/%v %v", code, st, out)
		}
		wantMeter(t, env, usage.MeterOpenSessions, 2, 2, false)
		if n := countOpen(t, p); n != 2 {
			t.Fatalf("%d sessions open after refused opens, want 2", n)
		}
		// Closing one frees its place at once.
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+s1.ID, s1.Token, nil); code != http.StatusOK || out["existed"] != true {
			t.Fatalf("close: %d %v", code, out)
		}
		if n := countOpen(t, p); n != 1 {
			t.Fatalf("%d sessions open after a close, want 1", n)
		}
		s3 := p.open(nil)

		// Tool calls: three answered, the fourth refused and not journaled, over REST and tRPC.
		args := map[string]any{"order_id": "#W0000001"}
		for i := 0; i < 3; i++ {
			if code, out := p.call(s3, "get_order_details", args); code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, out)
			}
		}
		code, out = p.call(s3, "get_order_details", args)
		if code != http.StatusPaymentRequired {
			t.Fatalf("fourth call: %d %v", code, out)
		}
		wantMeter(t, out, usage.MeterToolCalls, 3, 3, true)
		code, out = p.do(http.MethodPost, "/trpc/sessions.call", s3.Token, map[string]any{"session_id": s3.ID, "name": "get_order_details", "arguments": args})
		env, st = trpcEnvelope(t, out)
		if code != http.StatusPaymentRequired || st != http.StatusPaymentRequired {
			t.Fatalf("tRPC fourth call: %d/%v %v", code, st, out)
		}
		wantMeter(t, env, usage.MeterToolCalls, 3, 3, true)
		if n := p.journaled(s3.ID); n != 3 {
			t.Fatalf("%d calls journaled, want 3: a refused call journals nothing", n)
		}
		// A card on file lifts it (the plan says so): the admin records one, and the call runs.
		code, out = p.do(http.MethodPatch, "/v1/admin/workspaces/"+p.ws.ID, testAdminKey, map[string]any{"cardOnFile": true})
		if code != http.StatusOK || out["cardOnFile"] != true {
			t.Fatalf("admin update: %d %v", code, out)
		}
		if code, out := p.call(s3, "get_order_details", args); code != http.StatusOK {
			t.Fatalf("call with a card on file: %d %v", code, out)
		}
		// The card never lifts the sandbox quota (s2 and s3 are open).
		if code, out := p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, nil); code != http.StatusPaymentRequired {
			t.Fatalf("open past the sandbox quota with a card: %d %v", code, out)
		}
	})
}

func TestTaskMinutes402WithAFakeClock(t *testing.T) {
	clock := &fakeClock{t: schema.Now()}
	plans := &usage.Plans{Default: "trial", ByName: map[string]usage.Plan{"trial": {TaskMinutes: 2}}}
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{plans: plans, now: clock.now})
	s := p.open(nil)
	args := map[string]any{"order_id": "#W0000001"}
	if code, out := p.call(s, "get_order_details", args); code != http.StatusOK {
		t.Fatalf("call: %d %v", code, out)
	}
	// Two minutes and a second later by the meters' clock the session has used its plan: the call is refused,
	// and so is a new open, over REST and tRPC; usage says so exactly.
	clock.add(2*time.Minute + time.Second)
	p.gate.Forget(p.ws.ID)
	code, out := p.call(s, "get_order_details", args)
	if code != http.StatusPaymentRequired {
		t.Fatalf("call past the allowance: %d %v", code, out)
	}
	if m := out["meter"].(map[string]any); m["name"] != usage.MeterTaskMinutes || m["limit"] != 2.0 || m["used"].(float64) < 2 || out["cardWouldLift"] != false {
		t.Fatalf("402 = %v", out)
	}
	code, out = p.do(http.MethodPost, "/trpc/sessions.open", p.key, map[string]any{"slug": p.env.Slug})
	if env, st := trpcEnvelope(t, out); code != http.StatusPaymentRequired || st != 402 || env["meter"].(map[string]any)["name"] != usage.MeterTaskMinutes {
		t.Fatalf("tRPC open past the allowance: %d %v", code, out)
	}
	if n := p.journaled(s.ID); n != 1 {
		t.Fatalf("%d calls journaled, want 1", n)
	}
	code, out = p.do(http.MethodGet, "/v1/usage", p.key, nil)
	if code != http.StatusOK {
		t.Fatalf("usage: %d %v", code, out)
	}
	tm := out["taskMinutes"].(map[string]any)
	// The session opened a moment before the clock was read; it is billed whole seconds up to the fake now.
	if secs := tm["seconds"].(float64); secs < 121 || secs > 122 || tm["limit"] != 2.0 || tm["used"] != secs/60 {
		t.Fatalf("taskMinutes = %v, want 121 or 122 seconds against 2", tm)
	}
}

func TestAccess403OverRESTAndTRPC(t *testing.T) {
	plans := &usage.Plans{ByName: map[string]usage.Plan{}}
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{plans: plans, adminKey: testAdminKey,
			routes: []func(huma.API, *api.Deps){}})
		for _, access := range []string{schema.AccessPending, schema.AccessDenied} {
			code, out := p.do(http.MethodPatch, "/v1/admin/workspaces/"+p.ws.ID, testAdminKey, map[string]any{"access": access})
			if code != http.StatusOK || out["access"] != access {
				t.Fatalf("admin: %d %v", code, out)
			}
			code, out = p.do(http.MethodPost, "/v1/envs/"+p.env.Slug+"/sessions", p.key, nil)
			if code != http.StatusForbidden || out["access"] != access || out["code"] != api.CodeForbidden {
				t.Fatalf("REST open with access %s: %d %v", access, code, out)
			}
			code, out = p.do(http.MethodPost, "/trpc/sessions.open", p.key, map[string]any{"slug": p.env.Slug})
			env, st := trpcEnvelope(t, out)
			if code != http.StatusForbidden || st != 403 || env["access"] != access {
				t.Fatalf("tRPC open with access %s: %d %v", access, code, out)
			}
		}
		if n := countOpen(t, p); n != 0 {
			t.Fatalf("%d sessions opened by refused opens", n)
		}
		// Admin verbs refuse a workspace key with 403 (REST and tRPC), and ask for a credential with 401.
		code, out := p.do(http.MethodPost, "/v1/admin/workspaces", p.otherKey, map[string]any{"name": "x"})
		if code != http.StatusForbidden || out["access"] != api.AccessDenied {
			t.Fatalf("admin verb with a workspace key: %d %v", code, out)
		}
		code, out = p.do(http.MethodPost, "/trpc/admin.workspaces.create", p.otherKey, map[string]any{"name": "x"})
		if env, st := trpcEnvelope(t, out); code != http.StatusForbidden || st != 403 || env["access"] != api.AccessDenied {
			t.Fatalf("tRPC admin verb with a workspace key: %d %v", code, out)
		}
		if code, out := p.do(http.MethodGet, "/v1/admin/workspaces", "", nil); code != http.StatusUnauthorized {
			t.Fatalf("admin verb without a credential: %d %v", code, out)
		}
	})
}

func TestMCPEntitlement403(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	h, _ := api.New(api.Options{DB: p.db, Routes: []func(huma.API, *api.Deps){p.routes.Register, (&api.MCPRoutes{Plane: p.tp, PublicURL: "http://doppel.test"}).Register}})
	p.h = h
	initialize := map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
		"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "1"}}}
	if _, err := store.UpdateWorkspace(context.Background(), p.db, p.ws.ID, store.WorkspaceChange{Entitlements: []string{"query"}}); err != nil {
		t.Fatal(err)
	}
	code, out := p.do(http.MethodPost, "/mcp", p.key, initialize)
	if code != http.StatusForbidden || out["access"] != api.AccessDenied || out["code"] != api.CodeForbidden {
		t.Fatalf("/mcp without the mcp entitlement: %d %v", code, out)
	}
	code, out = p.do(http.MethodPost, "/mcp/envs/"+p.env.Slug, p.key, initialize)
	if code != http.StatusForbidden || out["access"] != api.AccessDenied {
		t.Fatalf("/mcp/envs without the mcp entitlement: %d %v", code, out)
	}
}

func TestAdminCreatesAWorkspaceAndUsageReadsIt(t *testing.T) {
	plans := &usage.Plans{Default: "free", ByName: map[string]usage.Plan{
		"free": {TaskMinutes: 600, OpenSessions: 5, CardLifts: true, Entitlements: []string{"query"}},
		"team": {TaskMinutes: 60000},
	}}
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{plans: plans, adminKey: testAdminKey})
	code, out := p.do(http.MethodPost, "/v1/admin/workspaces", testAdminKey, map[string]any{"name": "initech", "plan": "nope"})
	if code != http.StatusUnprocessableEntity || out["detail"] == nil {
		t.Fatalf("unknown plan: %d %v", code, out)
	}
	code, out = p.do(http.MethodPost, "/v1/admin/workspaces", testAdminKey, map[string]any{"name": "initech", "plan": "free"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, out)
	}
	ws := out["workspace"].(map[string]any)
	key := out["key"].(map[string]any)["key"].(string)
	if ws["plan"] != "free" || ws["access"] != "granted" || len(ws["entitlements"].([]any)) != 1 {
		t.Fatalf("workspace = %v, want plan free, granted, the plan's entitlements", ws)
	}
	code, out = p.do(http.MethodGet, "/v1/usage", key, nil)
	if code != http.StatusOK {
		t.Fatalf("usage with the new key: %d %v", code, out)
	}
	start, _ := time.Parse(time.RFC3339, out["periodStart"].(string))
	end, _ := time.Parse(time.RFC3339, out["periodEnd"].(string))
	if start.Day() != 1 || end != start.AddDate(0, 1, 0) || out["plan"] != "free" {
		t.Fatalf("period %v – %v plan %v", start, end, out["plan"])
	}
	byName := map[string]map[string]any{}
	for _, m := range out["meters"].([]any) {
		mm := m.(map[string]any)
		byName[mm["name"].(string)] = mm
	}
	for name, limit := range map[string]any{"task_minutes": 600.0, "tool_calls": nil, "queries": nil, "open_sessions": 5.0, "sessions": nil} {
		m := byName[name]
		if m == nil || m["used"] != 0.0 || m["limit"] != limit || m["unit"] == "" {
			t.Errorf("meter %s = %v, want used 0 limit %v", name, m, limit)
		}
	}
	// tRPC answers the same reading.
	code, raw := p.do(http.MethodGet, "/trpc/usage.get", key, nil)
	if code != http.StatusOK {
		t.Fatalf("tRPC usage.get: %d %v", code, raw)
	}
	b, _ := json.Marshal(raw)
	if len(b) < 10 {
		t.Fatalf("tRPC usage.get = %s", b)
	}
}

// TestTooLargeOverRESTAndTRPC: a body over a verb's cap is a 413 with the envelope over REST, and over tRPC the
// same envelope at error.data.envelope with httpStatus 413 (collect's own 413 and 429 are TestCollectEnvByteCap's
// and TestCollectRateLimit's).
func TestTooLargeOverRESTAndTRPC(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	s := p.open(nil)
	big := map[string]any{"name": "get_order_details", "arguments": map[string]any{"order_id": strings.Repeat("x", 2<<20)}}
	code, out := p.do(http.MethodPost, "/v1/sessions/"+s.ID+"/call", s.Token, big)
	if code != http.StatusRequestEntityTooLarge || out["code"] != api.CodeTooLarge || out["detail"] == "" || out["requestId"] == "" {
		t.Fatalf("REST: %d %v", code, out)
	}
	big["session_id"] = s.ID
	code, out = p.do(http.MethodPost, "/trpc/sessions.call", s.Token, big)
	env, st := trpcEnvelope(t, out)
	if code != http.StatusRequestEntityTooLarge || st != http.StatusRequestEntityTooLarge || env["code"] != api.CodeTooLarge || env["requestId"] == "" {
		t.Fatalf("tRPC: %d %v", code, out)
	}
	if n := p.journaled(s.ID); n != 0 {
		t.Fatalf("%d calls journaled by refused bodies", n)
	}
}
