package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/trace"
)

// alternating sends each request to the next of hosts in turn, with a bearer token, counting what each received.
type alternating struct {
	hosts []string
	token string
	next  atomic.Int64
	sent  []atomic.Int64
}

func (a *alternating) RoundTrip(r *http.Request) (*http.Response, error) {
	i := int(a.next.Add(1)-1) % len(a.hosts)
	a.sent[i].Add(1)
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = a.hosts[i], a.hosts[i]
	r.Header.Set("Authorization", "Bearer "+a.token)
	return http.DefaultTransport.RoundTrip(r)
}

// replicaMCP drives a session at its own MCP address at the stateless revision with the SDK's client, each request
// to the other replica than the last, and checks it answers as REST does through one replica in a session of the
// same seed: each call's answer, error and fidelity, then the state hash both sessions end with.
func replicaMCP(t *testing.T, a, b *faultStack, slug string, calls []trace.Call) {
	type opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
		MCPURL    string `json:"mcp_url"`
	}
	open := map[string]any{"seed": 36, "seedInstructions": "2 orders with status pending"}
	var viaMCP, viaREST opened
	a.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", a.key, open, http.StatusCreated, &viaMCP)
	a.must(http.MethodPost, "/v1/envs/"+slug+"/sessions", a.key, open, http.StatusCreated, &viaREST)
	u, err := url.Parse(viaMCP.MCPURL)
	if err != nil || u.Path != api.SessionMCPPath(slug, viaMCP.SessionID) {
		t.Fatalf("open answered mcp_url %q", viaMCP.MCPURL)
	}
	rt := &alternating{hosts: []string{a.apiAddr, b.apiAddr}, token: viaMCP.Token, sent: make([]atomic.Int64, 2)}
	c := mcp.NewClient(&mcp.Implementation{Name: "replicas", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: viaMCP.MCPURL,
		HTTPClient: &http.Client{Transport: rt}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != api.MCPStatelessVersion {
		t.Fatalf("negotiated %s at the session's address, want %s", v, api.MCPStatelessVersion)
	}
	for _, call := range calls {
		var args map[string]any
		if err := json.Unmarshal([]byte(call.RawArgs), &args); err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: call.Tool, Arguments: args})
		if err != nil {
			t.Fatalf("MCP call %s: %v", call.Tool, err)
		}
		var want struct {
			Content, Fidelity string
			Error             bool
		}
		a.must(http.MethodPost, "/v1/sessions/"+viaREST.SessionID+"/call", viaREST.Token,
			map[string]any{"name": call.Tool, "arguments": json.RawMessage(call.RawArgs), "requestor": "assistant"}, http.StatusOK, &want)
		text := ""
		if len(res.Content) == 1 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				text = tc.Text
			}
		}
		meta, _ := res.Meta[api.MetaCall].(map[string]any)
		if text != want.Content || res.IsError != want.Error || meta["fidelity"] != want.Fidelity {
			t.Errorf("%s over MCP through both replicas: %q error=%t %v; over REST through one: %q error=%t %s",
				call.Tool, text, res.IsError, meta["fidelity"], want.Content, want.Error, want.Fidelity)
		}
	}
	var got, want struct {
		NCalls    int    `json:"n_calls"`
		StateHash string `json:"state_hash"`
	}
	b.must(http.MethodGet, "/v1/sessions/"+viaMCP.SessionID, b.key, nil, http.StatusOK, &got)
	a.must(http.MethodGet, "/v1/sessions/"+viaREST.SessionID, a.key, nil, http.StatusOK, &want)
	if got.NCalls != len(calls) || got.StateHash != want.StateHash {
		t.Fatalf("the MCP session: %d calls, state %s; the REST one: %d calls, state %s", got.NCalls, got.StateHash, want.NCalls, want.StateHash)
	}
	if rt.sent[0].Load() == 0 || rt.sent[1].Load() == 0 {
		t.Fatalf("requests per replica: %d, %d", rt.sent[0].Load(), rt.sent[1].Load())
	}
	t.Logf("%d calls at MCP %s through two replicas (%d and %d requests) answered as REST through one; state %s",
		len(calls), api.MCPStatelessVersion, rt.sent[0].Load(), rt.sent[1].Load(), got.StateHash)
}
