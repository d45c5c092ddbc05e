package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/humatest"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// mcpPlane is a plane whose API also serves the MCP server, behind a real HTTP server.
type mcpPlane struct {
	*plane
	srv *httptest.Server
}

func newMCPPlane(t testing.TB, driver string, bundle []byte) *mcpPlane {
	t.Helper()
	return newMCPPlaneKeyCache(t, driver, bundle, 0)
}

// newMCPPlaneKeyCache is newMCPPlane with workspace keys and MCP tokens cached for keyTTL (0: not cached).
func newMCPPlaneKeyCache(t testing.TB, driver string, bundle []byte, keyTTL time.Duration) *mcpPlane {
	t.Helper()
	return newMCPPlaneWith(t, driver, bundle, planeOptions{}, keyTTL, nil)
}

// newMCPPlaneWith is an MCP plane over a plane made with o, its keys cached for keyTTL, its MCP routes set up by
// mcp (nil: the defaults) after their plane and public URL (the test server's) are set.
func newMCPPlaneWith(t testing.TB, driver string, bundle []byte, o planeOptions, keyTTL time.Duration, mcp func(*api.MCPRoutes)) *mcpPlane {
	t.Helper()
	p := newPlane(t, driver, bundle, o)
	srv := httptest.NewUnstartedServer(nil)
	routes := &api.MCPRoutes{Plane: p.tp, PublicURL: "http://" + srv.Listener.Addr().String()}
	p.routes.MCPBase = routes.PublicURL
	if mcp != nil {
		mcp(routes)
	}
	h, humaAPI := api.New(api.Options{DB: p.db, KeyCacheTTL: keyTTL, Routes: []func(huma.API, *api.Deps){
		p.routes.Register, routes.Register,
	}})
	p.h, p.api = h, humatest.Wrap(t, humaAPI)
	srv.Config.Handler = h
	srv.Start()
	t.Cleanup(srv.Close)
	return &mcpPlane{plane: p, srv: srv}
}

// withBearer adds a credential to every request.
type withBearer struct {
	token string
	rt    http.RoundTripper
}

func (b withBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// connect opens an MCP session on path with token, through the official SDK's client.
func (p *mcpPlane) connect(t testing.TB, path, token string, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "doppel-test", Version: "1"}, nil)
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.srv.URL + path,
		HTTPClient: &http.Client{Transport: withBearer{token, http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", path, err)
	}
	t.Cleanup(func() { _ = cs.Close() }) // before the server closes: it waits for the session's stream
	return cs
}

// roundTrip renders v as generic JSON, for comparing values of different Go types.
func roundTrip(t testing.TB, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func jsonEqual(t testing.TB, a, b any) bool {
	t.Helper()
	x, _ := json.Marshal(roundTrip(t, a))
	y, _ := json.Marshal(roundTrip(t, b))
	return bytes.Equal(x, y)
}

func textOf(t testing.TB, r *mcp.CallToolResult) string {
	t.Helper()
	if len(r.Content) != 1 {
		t.Fatalf("result has %d contents, want 1: %+v", len(r.Content), r)
	}
	tc, ok := r.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, want text", r.Content[0])
	}
	return tc.Text
}

// metaOf reads one doppel entry of a _meta object.
func metaOf(t testing.TB, m mcp.Meta, key string) map[string]any {
	t.Helper()
	v, _ := roundTrip(t, m[key]).(map[string]any)
	if v == nil {
		t.Fatalf("_meta lacks %s: %v", key, m)
	}
	return v
}

const pending2 = "2 orders with status pending"

// The environment face: an MCP session is a seeded doppel session whose tools, answers, world and state are the
// REST API's.
func TestMCPEnvironmentFace(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		p := newMCPPlane(t, driver, shopBundle(t))
		rest := p.open(map[string]any{"seed": 42, "seed_instructions": pending2})
		order := rest.Open["pinned"].(map[string]any)["orders"].([]any)[0].(string)

		cs := p.connect(t, "/mcp/envs/"+p.env.Slug+"?seed=42&seed_instructions="+url.QueryEscape(pending2), p.key)
		if err := cs.Ping(ctx, nil); err != nil {
			t.Fatalf("ping: %v", err)
		}
		if cs.ID() == "" {
			t.Fatal("no Mcp-Session-Id")
		}
		init := metaOf(t, cs.InitializeResult().Meta, api.MetaSession)
		id := str(init["sessionId"])
		if !strings.HasPrefix(id, "ses_") || init["worldHash"] != rest.Open["world_hash"] || init["seed"] != float64(42) ||
			init["seeded"] != true || init["seedInstructions"] != pending2 || init["clock"] == "" {
			t.Fatalf("initialize _meta = %v, want the REST session's world %v", init, rest.Open["world_hash"])
		}

		// tools/list is the REST listing.
		tools, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools?format=anthropic", "Authorization: Bearer "+p.key)
		var listing []api.AnthropicTool
		if res.Code != 200 || json.Unmarshal(res.Body.Bytes(), &listing) != nil {
			t.Fatalf("REST listing: %d %s", res.Code, res.Body)
		}
		if len(tools.Tools) != len(listing) || len(listing) == 0 {
			t.Fatalf("tools/list has %d tools, REST %d", len(tools.Tools), len(listing))
		}
		for i, tl := range tools.Tools {
			if tl.Name != listing[i].Name || tl.Description != listing[i].Description || !jsonEqual(t, tl.InputSchema, listing[i].InputSchema) {
				t.Errorf("tool %d: MCP %s %q %v, REST %s %q %s", i, tl.Name, tl.Description, roundTrip(t, tl.InputSchema),
					listing[i].Name, listing[i].Description, listing[i].InputSchema)
			}
		}

		// tools/call answers as the REST call does in a REST session of the same seed.
		got, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_order_details", Arguments: map[string]any{"order_id": order}})
		if err != nil {
			t.Fatal(err)
		}
		_, want := p.call(rest, "get_order_details", map[string]any{"order_id": order})
		call := metaOf(t, got.Meta, api.MetaCall)
		if textOf(t, got) != want["content"] || got.IsError || call["fidelity"] != want["fidelity"] || call["rung"] != want["rung"] ||
			call["sessionId"] != id || !strings.HasPrefix(str(call["callId"]), "call_") {
			t.Fatalf("MCP call = %q %v, REST = %v", textOf(t, got), call, want)
		}
		// A tool's own error is isError.
		miss, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_order_details", Arguments: map[string]any{"order_id": "#W404"}})
		if err != nil || !miss.IsError || textOf(t, miss) != "Error: order not found" {
			t.Fatalf("tool error: %+v, %v", miss, err)
		}
		// A tool the environment does not have is a protocol error.
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "drop_tables", Arguments: map[string]any{}}); err == nil {
			t.Fatal("an unknown tool answered")
		}

		// A write changes the state hash the REST session read reports, and the receipts resource follows it.
		code, before := p.do(http.MethodGet, "/v1/sessions/"+id, p.key, nil)
		if code != 200 || before["world_hash"] != rest.Open["world_hash"] || before["n_calls"] != float64(2) {
			t.Fatalf("REST read of the MCP session: %d %v", code, before)
		}
		w, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cancel_pending_order", Arguments: map[string]any{"order_id": order}})
		if err != nil || w.IsError {
			t.Fatalf("cancel: %+v %v", w, err)
		}
		_, after := p.do(http.MethodGet, "/v1/sessions/"+id, p.key, nil)
		if after["state_hash"] == before["state_hash"] || after["n_calls"] != float64(3) {
			t.Fatalf("state hash %v → %v after a write", before["state_hash"], after["state_hash"])
		}
		rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: api.ReceiptsURI})
		if err != nil || len(rr.Contents) != 1 {
			t.Fatalf("receipts: %+v %v", rr, err)
		}
		var rc api.MCPReceipts
		if err := json.Unmarshal([]byte(rr.Contents[0].Text), &rc); err != nil {
			t.Fatal(err)
		}
		if rc.SessionID != id || rc.Seed != 42 || rc.WorldHash != str(rest.Open["world_hash"]) || rc.StateHash != after["state_hash"] || rc.NCalls != 3 {
			t.Fatalf("receipts = %+v", rc)
		}
		code, tr := p.do(http.MethodGet, "/v1/sessions/"+id+"/transcript", p.key, nil)
		if calls, _ := tr["calls"].([]any); code != 200 || len(calls) != 3 || calls[0].(map[string]any)["requestor"] != "assistant" {
			t.Fatalf("transcript: %d %v", code, tr)
		}

		// Ending the MCP session closes the doppel session.
		if err := cs.Close(); err != nil {
			t.Fatal(err)
		}
		_, closed := p.do(http.MethodGet, "/v1/sessions/"+id, p.key, nil)
		if closed["status"] != schema.SessionClosed {
			t.Fatalf("after the MCP session ended the doppel session is %v", closed["status"])
		}

		// Seeding in initialize's _meta gives the same world.
		cs2 := p.connect(t, "/mcp/envs/"+p.env.Slug, p.key, func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if ip, ok := req.GetParams().(*mcp.InitializeParams); ok {
					ip.Meta = mcp.Meta{"seed": 42, "seedInstructions": pending2}
				}
				return next(ctx, method, req)
			}
		})
		defer cs2.Close()
		if m := metaOf(t, cs2.InitializeResult().Meta, api.MetaSession); m["worldHash"] != rest.Open["world_hash"] || m["sessionId"] == id {
			t.Fatalf("_meta-seeded session = %v", m)
		}
	})
}

// postInitialize sends an initialize request by hand, for the answers the SDK's client does not show.
func (p *mcpPlane) postInitialize(t testing.TB, path, token string) (*http.Response, map[string]any) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return resp, out
}

// Bad addresses answer the envelope before any MCP session exists.
func TestMCPEnvironmentFaceRefusals(t *testing.T) {
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	for _, c := range []struct {
		path, token string
		status      int
		field       string
	}{
		{"/mcp/envs/" + p.env.Slug, "", http.StatusUnauthorized, ""},
		{"/mcp/envs/" + p.env.Slug + "?seed=-1", p.key, http.StatusUnprocessableEntity, "query.seed"},
		{"/mcp/envs/" + p.env.Slug + "?seed=x", p.key, http.StatusUnprocessableEntity, "query.seed"},
		{"/mcp/envs/" + p.env.Slug + "?colour=red", p.key, http.StatusUnprocessableEntity, "query.colour"},
		{"/mcp/envs/nope", p.key, http.StatusNotFound, ""},
		{"/mcp/envs/" + p.otherEnv.Slug, p.key, http.StatusNotFound, ""},
	} {
		resp, out := p.postInitialize(t, c.path, c.token)
		if resp.StatusCode != c.status || out["requestId"] == "" || out["code"] == nil || !strings.Contains(str(out["detail"]), c.field) {
			t.Errorf("%s: %d %v, want %d naming %q", c.path, resp.StatusCode, out, c.status, c.field)
		}
		if c.status == http.StatusUnauthorized {
			if h := resp.Header.Get("WWW-Authenticate"); h != `Bearer resource_metadata="`+p.srv.URL+`/.well-known/oauth-protected-resource/mcp/envs/`+p.env.Slug+`"` {
				t.Errorf("WWW-Authenticate = %q", h)
			}
		}
	}
	// A bad _meta seed or a bad clock is an initialize error naming where it was given.
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.srv.URL + "/mcp/envs/" + p.env.Slug + "?clock=soon",
		HTTPClient: &http.Client{Transport: withBearer{p.key, http.DefaultTransport}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "query.clock") {
		t.Fatalf("bad clock: %v, want an error naming query.clock", err)
	}
}
