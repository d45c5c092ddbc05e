package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// connectAt connects the official SDK's client, with its defaults (it discovers first), to an absolute MCP URL with
// token; version, when set, is the version it asks for.
func connectAt(t testing.TB, endpoint, token, version string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "doppel-test", Version: "1"}, nil)
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: withBearer{token, http.DefaultTransport}}}, opts)
	if err != nil {
		t.Fatalf("connect %s at %q: %v", endpoint, version, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// rpc posts one JSON-RPC request by hand at a protocol version (its header and _meta; "" for neither) and answers
// the HTTP status and the JSON-RPC answer (read from a JSON body or the first event of a stream), or the envelope.
func (p *mcpPlane) rpc(t testing.TB, path, token, version, method string, params map[string]any) (int, map[string]any) {
	t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	if version != "" {
		params["_meta"] = map[string]any{mcp.MetaKeyProtocolVersion: version,
			mcp.MetaKeyClientInfo: map[string]any{"name": "t", "version": "1"}, mcp.MetaKeyClientCapabilities: map[string]any{}}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+path, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
		req.Header.Set("Mcp-Method", method)
		if name, ok := params["name"].(string); ok {
			req.Header.Set("Mcp-Name", name)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(strings.NewReader(string(raw)))
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				raw = []byte(d)
				break
			}
		}
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// readReceipts reads the session's receipts resource.
func readReceipts(t testing.TB, cs *mcp.ClientSession) api.MCPReceipts {
	t.Helper()
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: api.ReceiptsURI})
	if err != nil || len(rr.Contents) != 1 {
		t.Fatalf("receipts: %+v %v", rr, err)
	}
	var rc api.MCPReceipts
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// strings2 is a JSON array of strings as a slice.
func strings2(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// A session's own MCP address serves the stateless revision (2026-07-28) and every session-based version, in the
// session sessions.open answered (issue 34 item 4).
func TestMCPSessionAddress(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := context.Background()
		p := newMCPPlane(t, driver, shopBundle(t))
		rest := p.open(map[string]any{"seed": 42, "seed_instructions": pending2})
		twin := p.open(map[string]any{"seed": 42, "seed_instructions": pending2})
		order := rest.Open["pinned"].(map[string]any)["orders"].([]any)[0].(string)
		addr := str(rest.Open["mcp_url"])
		if addr != p.srv.URL+"/mcp/envs/"+p.env.Slug+"/sessions/"+rest.ID || rest.Open["mcpUrl"] != addr {
			t.Fatalf("open answered mcp_url %q, mcpUrl %v", addr, rest.Open["mcpUrl"])
		}

		// The SDK's client discovers the stateless revision there, with the session token, and keeps no MCP session.
		cs := connectAt(t, addr, rest.Token, "")
		if v := cs.InitializeResult().ProtocolVersion; v != api.MCPStatelessVersion || cs.ID() != "" {
			t.Fatalf("negotiated %q with MCP session %q, want %s and none", v, cs.ID(), api.MCPStatelessVersion)
		}
		tools, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools?format=anthropic", "Authorization: Bearer "+p.key)
		var listing []api.AnthropicTool
		if res.Code != 200 || json.Unmarshal(res.Body.Bytes(), &listing) != nil || len(listing) == 0 || len(tools.Tools) != len(listing) {
			t.Fatalf("tools/list has %d tools, REST %s", len(tools.Tools), res.Body)
		}
		for i, tl := range tools.Tools {
			if tl.Name != listing[i].Name || !jsonEqual(t, tl.InputSchema, listing[i].InputSchema) {
				t.Errorf("tool %d: MCP %s, REST %s", i, tl.Name, listing[i].Name)
			}
		}
		got, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_order_details", Arguments: map[string]any{"order_id": order}})
		if err != nil {
			t.Fatal(err)
		}
		_, want := p.call(twin, "get_order_details", map[string]any{"order_id": order})
		call := metaOf(t, got.Meta, api.MetaCall)
		if textOf(t, got) != want["content"] || got.IsError || call["fidelity"] != want["fidelity"] || call["sessionId"] != rest.ID {
			t.Fatalf("MCP call = %q %v, REST call in a world of the same seed = %v", textOf(t, got), call, want)
		}
		_, before := p.do(http.MethodGet, "/v1/sessions/"+rest.ID, p.key, nil)
		w, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cancel_pending_order", Arguments: map[string]any{"order_id": order}})
		if err != nil || w.IsError {
			t.Fatalf("cancel: %+v %v", w, err)
		}
		_, after := p.do(http.MethodGet, "/v1/sessions/"+rest.ID, p.key, nil)
		if after["state_hash"] == before["state_hash"] || after["n_calls"] != float64(2) {
			t.Fatalf("after a write: state hash %v → %v, n_calls %v", before["state_hash"], after["state_hash"], after["n_calls"])
		}
		rc := readReceipts(t, cs)
		if rc.SessionID != rest.ID || rc.Env != p.env.Slug || rc.Seed != 42 || rc.WorldHash != str(rest.Open["world_hash"]) ||
			rc.StateHash != after["state_hash"] || rc.NCalls != 2 || rc.SeedInstructions != pending2 {
			t.Fatalf("receipts = %+v", rc)
		}

		// Every session-based version is served at the same address, each request standing alone.
		for _, v := range api.MCPSessionVersions() {
			cs := connectAt(t, addr, rest.Token, v)
			if got := cs.InitializeResult().ProtocolVersion; got != v {
				t.Fatalf("asked %s, negotiated %s", v, got)
			}
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_order_details", Arguments: map[string]any{"order_id": order}})
			if err != nil || r.IsError || metaOf(t, r.Meta, api.MetaCall)["sessionId"] != rest.ID {
				t.Fatalf("at %s: %+v %v", v, r, err)
			}
		}
		_, tr := p.do(http.MethodGet, "/v1/sessions/"+rest.ID+"/transcript", p.key, nil)
		if calls, _ := tr["calls"].([]any); len(calls) != 2+len(api.MCPSessionVersions()) {
			t.Fatalf("transcript holds %d calls, want %d", len(calls), 2+len(api.MCPSessionVersions()))
		}

		// A workspace key of the session's workspace is a credential there; another session's token is not, and the
		// address names its environment.
		if _, err := connectAt(t, addr, p.key, "").ListTools(ctx, nil); err != nil {
			t.Fatalf("with the workspace key: %v", err)
		}
		path := strings.TrimPrefix(addr, p.srv.URL)
		if code, e := p.rpc(t, path, twin.Token, api.MCPStatelessVersion, "tools/list", nil); code != http.StatusNotFound {
			t.Fatalf("another session's token: %d %v", code, e)
		}
		other := "/mcp/envs/other/sessions/" + rest.ID
		if code, e := p.rpc(t, other, rest.Token, api.MCPStatelessVersion, "tools/list", nil); code != http.StatusNotFound ||
			!strings.Contains(str(e["detail"]), path) {
			t.Fatalf("another environment's address: %d %v", code, e)
		}

		// A fork answers its own address, where its world (the parent's after its calls) answers.
		code, fork := p.do(http.MethodPost, "/v1/sessions/"+rest.ID+"/fork", rest.Token, map[string]any{})
		forkAddr := p.srv.URL + "/mcp/envs/" + p.env.Slug + "/sessions/" + str(fork["sessionId"])
		if code != http.StatusCreated || fork["mcp_url"] != forkAddr || fork["mcpUrl"] != forkAddr {
			t.Fatalf("fork: %d %v, want mcp_url %s", code, fork, forkAddr)
		}
		if rc := readReceipts(t, connectAt(t, forkAddr, str(fork["token"]), "")); rc.SessionID != str(fork["sessionId"]) ||
			rc.StateHash != str(fork["state_hash"]) {
			t.Fatalf("the fork's receipts at its address: %+v, fork %v", rc, fork)
		}

		// A closed session's token is refused there, as on REST.
		if code, out := p.do(http.MethodDelete, "/v1/sessions/"+rest.ID, rest.Token, nil); code >= 300 {
			t.Fatalf("close: %d %v", code, out)
		}
		if code, e := p.rpc(t, path, rest.Token, api.MCPStatelessVersion, "tools/list", nil); code != http.StatusUnauthorized {
			t.Fatalf("after close: %d %v", code, e)
		}
	})
}

// The environment's own address speaks the session-based versions, says so in server/discover, and answers a
// stateless request with how to open a session; the workspace face speaks every version.
func TestMCPVersionNegotiation(t *testing.T) {
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	ctx := context.Background()
	envPath := "/mcp/envs/" + p.env.Slug
	legacy := api.MCPSessionVersions()
	if len(legacy) < 4 || slices.Contains(legacy, api.MCPStatelessVersion) {
		t.Fatalf("session versions %v", legacy)
	}

	// Discovery at the stateless revision is refused with the versions spoken there (SEP-2575's answer to a version
	// a server does not serve), so a client falls back to initialize.
	code, out := p.rpc(t, envPath, p.key, api.MCPStatelessVersion, "server/discover", nil)
	e, _ := out["error"].(map[string]any)
	data, _ := e["data"].(map[string]any)
	if code != http.StatusBadRequest || e["code"] != float64(mcp.CodeUnsupportedProtocolVersion) || out["id"] != float64(7) ||
		!slices.Equal(strings2(data["supported"]), legacy) || !strings.Contains(str(e["message"]), "sessions_open") {
		t.Fatalf("discover at the environment address: %d %v", code, out)
	}
	cs := p.connect(t, envPath+"?seed=3", p.key)
	if v := cs.InitializeResult().ProtocolVersion; v != legacy[0] || cs.ID() == "" {
		t.Fatalf("the SDK's client negotiated %q (MCP session %q) at the environment address", v, cs.ID())
	}
	code, out = p.rpc(t, envPath, p.key, api.MCPStatelessVersion, "tools/list", nil)
	e, _ = out["error"].(map[string]any)
	data, _ = e["data"].(map[string]any)
	if code != http.StatusBadRequest || e == nil || e["code"] != float64(mcp.CodeUnsupportedProtocolVersion) || out["id"] != float64(7) ||
		!slices.Equal(strings2(data["supported"]), legacy) || data["requested"] != api.MCPStatelessVersion ||
		!strings.Contains(str(e["message"]), "sessions_open") || !strings.Contains(str(e["message"]), "/sessions/{session_id}") {
		t.Fatalf("a stateless request at the environment address: %d %v", code, out)
	}
	if env, _ := data["envelope"].(map[string]any); env["code"] == nil || env["detail"] != e["message"] {
		t.Fatalf("the refusal's envelope: %v", data)
	}

	code, out = p.rpc(t, "/mcp", p.key, api.MCPStatelessVersion, "server/discover", nil)
	result, _ := out["result"].(map[string]any)
	if code != http.StatusOK || result == nil || !slices.Equal(strings2(result["supportedVersions"]), append([]string{api.MCPStatelessVersion}, legacy...)) {
		t.Fatalf("discover at /mcp: %d %v", code, out)
	}
	for _, v := range append([]string{""}, legacy...) {
		cs := connectAt(t, p.srv.URL+"/mcp", p.key, v)
		want := v
		if v == "" {
			want = api.MCPStatelessVersion
		}
		if got := cs.InitializeResult().ProtocolVersion; got != want || (cs.ID() == "") != (want == api.MCPStatelessVersion) {
			t.Fatalf("asked %q at /mcp: negotiated %s, MCP session %q", v, got, cs.ID())
		}
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions_open", Arguments: map[string]any{"slug": p.env.Slug, "seed": 5}})
		if err != nil || r.IsError {
			t.Fatalf("sessions_open at %q: %+v %v", v, r, err)
		}
		var opened map[string]any
		if err := json.Unmarshal([]byte(textOf(t, r)), &opened); err != nil ||
			opened["mcp_url"] != p.srv.URL+"/mcp/envs/"+p.env.Slug+"/sessions/"+str(opened["sessionId"]) {
			t.Fatalf("sessions_open at %q answered %s", v, textOf(t, r))
		}
	}
}
