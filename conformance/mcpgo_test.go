package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/oauth2"
)

// TestMCPGo runs mark3labs/mcp-go's Streamable HTTP client against both MCP faces of a real doppel: first with the
// client's default settings (it probes server/discover and falls back to initialize as it sees fit), then pinned
// to each protocol version the server advertises. On /mcp: tools/list, envs_list (a read), sessions_open,
// sessions_call and sessions_close. On an environment: tools/list, get_order_details (a read),
// cancel_pending_order (a write), the read again, and the receipts resource; the doppel session ends with the
// client (legacy versions, whose MCP session is the doppel session) or is closed over REST (2026-07-28, where the
// environment is reached at the session's own address).
func TestMCPGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts doppel")
	}
	d := startDoppel(t)
	slug := d.buildShop(t, http.DefaultClient)
	versions := advertisedVersions(t, d)
	t.Run("default", func(t *testing.T) {
		t.Run("workspace", func(t *testing.T) {
			// Left to itself, the client settles on the newest version both sides speak.
			if got, want := workspaceFlow(t, d, slug, ""), mcp.NegotiateMutuallySupportedVersion(versions); got != want {
				t.Errorf("mcp-go's default client used protocol version %s on /mcp, want %s", got, want)
			}
		})
		t.Run("env", func(t *testing.T) { envFaceFlow(t, d, slug, "") })
	})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Run("workspace", func(t *testing.T) { workspaceFlow(t, d, slug, v) })
			t.Run("env", func(t *testing.T) { envFaceFlow(t, d, slug, v) })
		})
	}
}

// advertisedVersions are the protocol versions /mcp advertises: the supportedVersions of its server/discover
// answer, asked by mcp-go's default client. A server that does not answer server/discover fails the test; the
// versions are then every one mcp-go knows, so that each still gets its subtest.
func advertisedVersions(t *testing.T, d *doppel) []string {
	t.Helper()
	c, _, err := dialMCPGo(t, d.url+"/mcp", d.key, "")
	if err != nil {
		t.Fatalf("mcp-go's default client on /mcp: %v", err)
	}
	defer c.Close()
	if v := c.ProtocolVersion(); !mcp.IsModernProtocol(v) {
		t.Errorf("/mcp does not answer server/discover: mcp-go's default client fell back to initialize at %s", v)
		return mcp.ValidProtocolVersions
	}
	res, err := c.Discover(context.Background(), mcp.DiscoverRequest{})
	if err != nil || len(res.SupportedVersions) == 0 {
		t.Fatalf("server/discover on /mcp: %+v %v", res, err)
	}
	t.Logf("/mcp advertises %v", res.SupportedVersions)
	versions := slices.Clone(res.SupportedVersions)
	for _, v := range versions {
		if !mcp.IsValidProtocolVersion(v) {
			t.Errorf("/mcp advertises %s, which mcp-go does not know", v)
		}
	}
	if !slices.Contains(versions, mcp.LATEST_PROTOCOL_VERSION) {
		// Run its subtests anyway: they show what a client speaking it meets.
		t.Errorf("/mcp does not advertise %s, mcp-go's newest protocol version", mcp.LATEST_PROTOCOL_VERSION)
		versions = append([]string{mcp.LATEST_PROTOCOL_VERSION}, versions...)
	}
	return versions
}

// dialMCPGo connects mcp-go's Streamable HTTP client to url with bearer as its credential, with its default
// settings or pinned to version when version is not "", and initializes it (the client probes server/discover
// first unless pinned to a legacy version). Its HTTP exchanges are shown if the test fails; it closes with the
// test.
//
// The credential is set by the HTTP client's transport (x/oauth2's, with a static token), not with mcp-go's
// WithHTTPHeaders: mcp-go v1.2.1 sends the DELETE that ends an MCP session (Client.Close) without the headers it
// was configured with, so the server rightly answers it 401 (MCP authorization: every HTTP request carries the
// credential) and the session stays open until it idles out.
func dialMCPGo(t *testing.T, url, bearer, version string) (*client.Client, *mcp.InitializeResult, error) {
	t.Helper()
	hc := &http.Client{Transport: &oauth2.Transport{Source: oauth2.StaticTokenSource(&oauth2.Token{AccessToken: bearer}), Base: newWire(t)}}
	tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPBasicClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	var opts []client.ClientOption
	if version != "" {
		opts = append(opts, client.WithProtocolVersion(version))
	}
	c := client.NewClient(tr, opts...)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return nil, nil, err
	}
	init, err := c.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{
		ClientInfo: mcp.Implementation{Name: "doppel conformance (mcp-go)", Version: "1"}}})
	return c, init, err
}

// mcpgo is dialMCPGo that fails the test when the client cannot connect, or connects at another version than the
// pinned one.
func mcpgo(t *testing.T, url, bearer, version string) (*client.Client, *mcp.InitializeResult) {
	t.Helper()
	c, init, err := dialMCPGo(t, url, bearer, version)
	if err != nil {
		t.Fatalf("mcp-go connecting to %s: %v", url, err)
	}
	if version != "" && (c.ProtocolVersion() != version || init.ProtocolVersion != version) {
		t.Fatalf("mcp-go pinned to %s connected at %s (server answered %s)", version, c.ProtocolVersion(), init.ProtocolVersion)
	}
	t.Logf("connected to %s at protocol version %s (server %s)", url, c.ProtocolVersion(), init.ServerInfo.Name)
	return c, init
}

// workspaceFlow is /mcp through mcp-go: tools/list, envs_list, sessions_open, sessions_call, sessions_close. It
// answers the protocol version the client used.
func workspaceFlow(t *testing.T, d *doppel, slug, version string) string {
	c, _ := mcpgo(t, d.url+"/mcp", d.key, version)
	requireTools(t, c, "envs_list", "sessions_open", "sessions_call", "sessions_close")
	var envs []struct{ Slug string }
	callJSON(t, c, "envs_list", nil, &envs)
	if len(envs) != 1 || envs[0].Slug != slug {
		t.Fatalf("envs_list: %+v, want %s", envs, slug)
	}
	var open struct {
		SessionID string `json:"session_id"`
		Seed      int64
		MCPURL    string `json:"mcp_url"`
		MCPURLB   string `json:"mcpUrl"`
	}
	callJSON(t, c, "sessions_open", map[string]any{"slug": slug, "seed": 7}, &open)
	want := d.url + "/mcp/envs/" + slug + "/sessions/" + open.SessionID
	if !strings.HasPrefix(open.SessionID, "ses_") || open.Seed != 7 || open.MCPURL != want || open.MCPURLB != want {
		t.Fatalf("sessions_open: %+v, want seed 7 and mcp_url and mcpUrl %s", open, want)
	}
	var called struct {
		Content  string
		Error    bool
		Fidelity string
	}
	callJSON(t, c, "sessions_call", map[string]any{"session_id": open.SessionID, "name": "get_order_details",
		"arguments": map[string]any{"order_id": "#W0000001"}}, &called)
	if called.Error || !strings.Contains(called.Content, "#W0000001") || called.Fidelity == "" {
		t.Fatalf("sessions_call: %+v", called)
	}
	var closed struct{ Existed bool }
	callJSON(t, c, "sessions_close", map[string]any{"session_id": open.SessionID}, &closed)
	if !closed.Existed {
		t.Fatalf("sessions_close: %+v", closed)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return c.ProtocolVersion()
}

// envFaceFlow is an environment's MCP face through mcp-go, seeded with seed 7. At the legacy versions (and with
// the default settings) the client connects to /mcp/envs/{slug}?seed=7, its initialize opens the doppel session
// and closing the client ends it. At 2026-07-28, which has no initialize and no MCP session, the doppel session is
// opened over REST and the client connects to the address the open answers, with the session token.
func envFaceFlow(t *testing.T, d *doppel, slug, version string) {
	if !mcp.IsModernProtocol(version) {
		c, init := mcpgo(t, d.url+"/mcp/envs/"+slug+"?seed=7", d.key, version)
		var opened struct{ SessionID string }
		if err := remarshal(metaField(init.Meta, "doppel.dev/session"), &opened); err != nil || opened.SessionID == "" {
			t.Fatalf("initialize _meta[doppel.dev/session]: %+v %v", init.Meta, err)
		}
		envFlow(t, c, opened.SessionID)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if st := d.sessionStatus(t, opened.SessionID); st != "closed" {
			t.Fatalf("closing the MCP session left doppel session %s %s, want closed", opened.SessionID, st)
		}
		return
	}
	var open struct {
		SessionID string `json:"session_id"`
		Token     string `json:"session_token"`
		MCPURL    string `json:"mcp_url"`
		MCPURLB   string `json:"mcpUrl"`
	}
	if st := d.rest(t, http.DefaultClient, http.MethodPost, "/v1/envs/"+slug+"/sessions", d.key, []byte(`{"seed":7}`), &open); st != http.StatusCreated {
		t.Fatalf("sessions.open: %d %+v", st, open)
	}
	if want := d.url + "/mcp/envs/" + slug + "/sessions/" + open.SessionID; open.MCPURL != want || open.MCPURLB != want {
		t.Fatalf("sessions.open answered mcp_url %q and mcpUrl %q, want %s", open.MCPURL, open.MCPURLB, want)
	}
	c, _ := mcpgo(t, open.MCPURL, open.Token, version)
	envFlow(t, c, open.SessionID)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var closed struct{ Existed bool }
	if st := d.rest(t, http.DefaultClient, http.MethodDelete, "/v1/sessions/"+open.SessionID, open.Token, nil, &closed); st != http.StatusOK || !closed.Existed {
		t.Fatalf("sessions.close: %d %+v", st, closed)
	}
	if _, _, err := dialMCPGo(t, open.MCPURL, open.Token, version); err == nil {
		t.Fatalf("mcp-go connected to the address of closed session %s", open.SessionID)
	}
}

// envFlow is one doppel session of the shop through c: the tools, a read, a write, the read again (which sees the
// write), and the receipts, which name session and seed and count the three calls.
func envFlow(t *testing.T, c *client.Client, session string) {
	requireTools(t, c, "cancel_pending_order", "get_order_details")
	const order = "#W0000002" // pending in the recordings
	read := callTool(t, c, "get_order_details", map[string]any{"order_id": order})
	if !strings.Contains(read, order) || !strings.Contains(read, "pending") {
		t.Fatalf("get_order_details %s: %s", order, read)
	}
	if w := callTool(t, c, "cancel_pending_order", map[string]any{"order_id": order, "reason": "no longer needed"}); !strings.Contains(w, "cancelled") {
		t.Fatalf("cancel_pending_order %s: %s", order, w)
	}
	if again := callTool(t, c, "get_order_details", map[string]any{"order_id": order}); !strings.Contains(again, "cancelled") {
		t.Fatalf("get_order_details after the cancel: %s", again)
	}
	res, err := c.ReadResource(context.Background(), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "doppel://session/receipts"}})
	if err != nil || len(res.Contents) != 1 {
		t.Fatalf("resources/read doppel://session/receipts: %+v %v", res, err)
	}
	text, ok := mcp.AsTextResourceContents(res.Contents[0])
	var rc struct {
		SessionID string
		Seed      int64
		NCalls    int64
		WorldHash string
	}
	if !ok || json.Unmarshal([]byte(text.Text), &rc) != nil || rc.SessionID != session || rc.Seed != 7 || rc.NCalls != 3 || rc.WorldHash == "" {
		t.Fatalf("receipts: %+v (want session %s, seed 7, 3 calls)", res.Contents[0], session)
	}
}

// requireTools fails the test unless tools/list names every one of names.
func requireTools(t *testing.T, c *client.Client, names ...string) {
	t.Helper()
	res, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var have []string
	for _, tool := range res.Tools {
		have = append(have, tool.Name)
	}
	for _, n := range names {
		if !slices.Contains(have, n) {
			t.Fatalf("tools/list: %v, want %s among them", have, n)
		}
	}
}

// callTool calls an environment tool and answers its text; the call must succeed and carry its fidelity in
// _meta["doppel.dev/call"].
func callTool(t *testing.T, c *client.Client, name string, args map[string]any) string {
	t.Helper()
	res := callOK(t, c, name, args)
	var meta struct{ Fidelity, CallID string }
	if err := remarshal(metaField(res.Meta, "doppel.dev/call"), &meta); err != nil || meta.Fidelity == "" || meta.CallID == "" {
		t.Fatalf("tools/call %s: _meta[doppel.dev/call] %+v %v", name, res.Meta, err)
	}
	return resultText(res)
}

// callJSON calls a workspace-face tool and decodes its text (the verb's JSON answer) into out.
func callJSON(t *testing.T, c *client.Client, name string, args map[string]any, out any) {
	t.Helper()
	res := callOK(t, c, name, args)
	if err := json.Unmarshal([]byte(resultText(res)), out); err != nil {
		t.Fatalf("tools/call %s: %v: %s", name, err, resultText(res))
	}
}

func callOK(t *testing.T, c *client.Client, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := c.CallTool(context.Background(), mcp.CallToolRequest{Params: mcp.CallToolParams{Name: name, Arguments: args}})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("tools/call %s: isError: %s", name, resultText(res))
	}
	return res
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := mcp.AsTextContent(c); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// metaField is one entry of a result's _meta.
func metaField(m *mcp.Meta, key string) any {
	if m == nil {
		return nil
	}
	return m.AdditionalFields[key]
}

// remarshal decodes a value decoded into any (a _meta entry) into out.
func remarshal(v any, out any) error {
	if v == nil {
		return errors.New("absent")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// sessionStatus is a doppel session's status (open, closed, …), read over REST with the workspace key.
func (d *doppel) sessionStatus(t *testing.T, id string) string {
	t.Helper()
	var s struct{ Status string }
	if st := d.rest(t, http.DefaultClient, http.MethodGet, "/v1/sessions/"+id, d.key, nil, &s); st != http.StatusOK {
		t.Fatalf("sessions.get %s: %d", id, st)
	}
	return s.Status
}
