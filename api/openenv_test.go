package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/gorilla/websocket"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/toolplane"
)

// openEnvServer serves the plane's sessions and the OpenEnv routes over HTTP.
func openEnvServer(t testing.TB, p *plane, tp *toolplane.Plane, maxConcurrent int) *httptest.Server {
	t.Helper()
	h, _ := api.New(api.Options{DB: p.db, Routes: []func(huma.API, *api.Deps){
		(&api.SessionRoutes{Plane: tp}).Register,
		(&api.OpenEnvRoutes{Plane: tp, MaxConcurrent: maxConcurrent}).Register,
	}})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// oeDo sends one HTTP request and decodes the JSON answer.
func oeDo(t *testing.T, method, url, key string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(res.Body)
	if len(raw) > 0 && json.Unmarshal(raw, &out) != nil {
		t.Fatalf("%s %s: %d %s", method, url, res.StatusCode, raw)
	}
	return res.StatusCode, out
}

// keysOf are a JSON object's keys, sorted.
func keysOf(m map[string]any) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// The HTTP routes answer with OpenEnv's shapes (ResetResponse, StepResponse, State, SchemaResponse,
// EnvironmentMetadata, HealthResponse), statelessly: each reset or step is its own short episode, a doppel session
// opened and closed again, its id in the observation's metadata.
func TestOpenEnvHTTPConformance(t *testing.T) {
	p := newPlane(t, "sqlite", shopBundle(t), planeOptions{})
	srv := openEnvServer(t, p, p.tp, 0)
	base := srv.URL + "/openenv/envs/" + p.env.Slug

	if code, out := oeDo(t, http.MethodGet, base+"/health", "", nil); code != 200 || keysOf(out) != "status" || out["status"] != "healthy" {
		t.Fatalf("health: %d %v", code, out)
	}
	for _, path := range []string{"/metadata", "/schema", "/state", "/reset"} {
		method := http.MethodGet
		if path == "/reset" {
			method = http.MethodPost
		}
		if code, out := oeDo(t, method, base+path, "", nil); code != http.StatusUnauthorized || out["code"] == nil {
			t.Fatalf("%s without a key: %d %v, want the 401 envelope", path, code, out)
		}
	}
	if code, out := oeDo(t, http.MethodGet, base+"/metadata", p.key, nil); code != 200 ||
		keysOf(out) != "author,description,documentation_url,name,readme_content,version" || out["version"] != p.build.ID {
		t.Fatalf("metadata: %d %v", code, out)
	}
	code, sch := oeDo(t, http.MethodGet, base+"/schema", p.key, nil)
	if code != 200 || keysOf(sch) != "action,observation,state" {
		t.Fatalf("schema: %d %v", code, sch)
	}
	if code, out := oeDo(t, http.MethodGet, base+"/state", p.key, nil); code != 200 || keysOf(out) != "episode_id,step_count" || out["episode_id"] != nil {
		t.Fatalf("state: %d %v", code, out)
	}

	// reset: ResetRequest {seed, episode_id}; ResetResponse {observation, reward, done}.
	code, out := oeDo(t, http.MethodPost, base+"/reset", p.key, map[string]any{"seed": 42, "episode_id": "episode-001"})
	obs, _ := out["observation"].(map[string]any)
	meta, _ := obs["metadata"].(map[string]any)
	if code != 200 || keysOf(out) != "done,observation,reward" || out["done"] != false || out["reward"] != nil || meta["seed"] != float64(42) {
		t.Fatalf("reset: %d %v", code, out)
	}
	sid := str(meta["session_id"])
	if code, s := p.do(http.MethodGet, "/v1/sessions/"+sid, p.key, nil); code != 200 || s["status"] != "closed" {
		t.Fatalf("the reset's session after the reset: %d %v, want closed", code, s)
	}
	single := p.open(map[string]any{"seed": 42})
	if meta["world_hash"] != single.Open["world_hash"] {
		t.Fatalf("reset seed 42 world %v, sessions.open seed 42 %v", meta["world_hash"], single.Open["world_hash"])
	}

	// step: StepRequest {action, timeout_s, request_id}; ListToolsAction → ListToolsObservation.
	code, out = oeDo(t, http.MethodPost, base+"/step", p.key, map[string]any{"action": map[string]any{"type": "list_tools"}, "timeout_s": 30.0})
	obs, _ = out["observation"].(map[string]any)
	tools, _ := obs["tools"].([]any)
	if code != 200 || keysOf(out) != "done,observation,reward" || len(tools) != 2 {
		t.Fatalf("list_tools: %d %v", code, out)
	}
	if tl := tools[0].(map[string]any); keysOf(tl) != "description,input_schema,name" {
		t.Fatalf("tool %v: want OpenEnv's Tool {name, description, input_schema}", tl)
	}
	// CallToolAction → CallToolObservation {tool_name, result, error}, in a short episode seeded by the request.
	code, out = oeDo(t, http.MethodPost, base+"/step", p.key, map[string]any{"seed": 42, "request_id": "r1",
		"action": map[string]any{"type": "call_tool", "tool_name": "get_order_details", "arguments": map[string]any{"order_id": "#W0000001"}}})
	obs, _ = out["observation"].(map[string]any)
	res, _ := obs["result"].(map[string]any)
	meta, _ = obs["metadata"].(map[string]any)
	content, _ := res["content"].([]any)
	if code != 200 || obs["tool_name"] != "get_order_details" || obs["error"] != nil || len(content) != 1 ||
		!strings.Contains(str(content[0].(map[string]any)["text"]), "delivered") || res["is_error"] != false ||
		meta["fidelity"] == nil || meta["world_hash"] != single.Open["world_hash"] {
		t.Fatalf("call_tool: %d %v", code, out)
	}
	if n := p.journaled(str(meta["session_id"])); n != 1 {
		t.Fatalf("the step's session journaled %d calls, want 1", n)
	}
	// A tool the twin does not route is CallToolObservation.error tool_not_found, as OpenEnv's MCP environment says.
	code, out = oeDo(t, http.MethodPost, base+"/step", p.key, map[string]any{"action": map[string]any{"type": "call_tool", "tool_name": "launch_rocket"}})
	obs, _ = out["observation"].(map[string]any)
	if e, _ := obs["error"].(map[string]any); code != 200 || e["error_type"] != "tool_not_found" {
		t.Fatalf("unknown tool: %d %v", code, out)
	}
	// Actions that are not OpenEnv's are refused naming the field (Action forbids extra fields).
	for _, c := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{}, "body.action"},
		{map[string]any{"action": map[string]any{"type": "dance"}}, "body.action.type"},
		{map[string]any{"action": map[string]any{"type": "call_tool"}}, "body.action.tool_name"},
		{map[string]any{"action": map[string]any{"type": "list_tools", "colour": "red"}}, "body.action.colour"},
		{map[string]any{"action": map[string]any{"type": "call_tool", "tool_name": "get_order_details"}, "seed": "x"}, "body.seed"},
	} {
		if code, out := oeDo(t, http.MethodPost, base+"/step", p.key, c.body); code != http.StatusUnprocessableEntity || !namesField(out, c.field) {
			t.Errorf("step %v: %d %v, want 422 naming %s", c.body, code, out, c.field)
		}
	}
	// The manifest.
	r, _ := http.NewRequest(http.MethodGet, base+"/openenv.yaml", nil)
	r.Header.Set("Authorization", "Bearer "+p.key)
	mres, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	manifest, _ := io.ReadAll(mres.Body)
	mres.Body.Close()
	for _, want := range []string{"spec_version: 1\n", "name: tau2_retail_env\n", "type: space\n", "max_concurrent_envs: 4096\n", "supports_concurrent_sessions: true\n"} {
		if !strings.Contains(string(manifest), want) {
			t.Fatalf("openenv.yaml lacks %q:\n%s", want, manifest)
		}
	}
}

// wsClient speaks OpenEnv's WebSocket protocol (WSResetMessage, WSStepMessage, WSStateMessage, WSCloseMessage).
type wsClient struct {
	t *testing.T
	c *websocket.Conn
}

func dialOpenEnv(t *testing.T, srv *httptest.Server, slug, key string) *wsClient {
	t.Helper()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/openenv/envs/" + slug + "/ws"
	c, res, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + key}})
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", u, err, res)
	}
	t.Cleanup(func() { c.Close() })
	return &wsClient{t: t, c: c}
}

// send sends a message and reads the answer (its type and data).
func (w *wsClient) send(msg any) (string, map[string]any) {
	w.t.Helper()
	var err error
	if s, ok := msg.(string); ok {
		err = w.c.WriteMessage(websocket.TextMessage, []byte(s))
	} else {
		err = w.c.WriteJSON(msg)
	}
	if err != nil {
		w.t.Fatal(err)
	}
	_ = w.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var out map[string]any
	if err := w.c.ReadJSON(&out); err != nil {
		w.t.Fatalf("read the answer to %v: %v", msg, err)
	}
	if keysOf(out) != "data,type" {
		w.t.Fatalf("answer %v: OpenEnv's WS responses are {type, data}", out)
	}
	data, _ := out["data"].(map[string]any)
	return str(out["type"]), data
}

// The WebSocket is the episode channel: one connection, one doppel session per episode (journaled, seeded, graded
// with the task given at reset, its id in the metadata), closed with the connection; errors are OpenEnv's
// WSErrorResponse codes. The episode is then read and graded over REST through another process.
func TestOpenEnvWebSocketEpisode(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{})
		srv := openEnvServer(t, p, p.tp, 0)
		ws := dialOpenEnv(t, srv, p.env.Slug, p.key)

		expect := []map[string]any{{"entity": "orders", "key": "#W0000001", "field": "status", "equals": "delivered"}}
		typ, data := ws.send(map[string]any{"type": "reset", "data": map[string]any{"seed": 7,
			"options": map[string]any{"seed_instructions": "2 orders with status pending", "expect": expect, "max_steps": 2, "reward": "all"}}})
		obs, _ := data["observation"].(map[string]any)
		meta, _ := obs["metadata"].(map[string]any)
		if typ != "observation" || keysOf(data) != "done,observation,reward" || data["done"] != false || meta["session_id"] == nil {
			t.Fatalf("reset: %s %v", typ, data)
		}
		sid, token := str(meta["session_id"]), str(meta["session_token"])
		rest := p.open(map[string]any{"seed": 7, "seed_instructions": "2 orders with status pending"})
		if meta["world_hash"] != rest.Open["world_hash"] {
			t.Fatalf("reset world %v, sessions.open of the same spec %v", meta["world_hash"], rest.Open["world_hash"])
		}
		pending := pinnedOrders(t, rest.Open)

		typ, data = ws.send(map[string]any{"type": "step", "data": map[string]any{"type": "list_tools"}})
		if tools, _ := data["observation"].(map[string]any)["tools"].([]any); typ != "observation" || len(tools) != 2 {
			t.Fatalf("list_tools: %s %v", typ, data)
		}
		typ, data = ws.send(map[string]any{"type": "step", "data": map[string]any{"type": "call_tool", "tool_name": "cancel_pending_order",
			"arguments": map[string]any{"order_id": pending[0]}}})
		if typ != "observation" || data["done"] != false || data["reward"] != nil {
			t.Fatalf("step 1: %s %v", typ, data)
		}
		typ, data = ws.send(map[string]any{"type": "step", "data": map[string]any{"type": "call_tool", "tool_name": "get_order_details",
			"arguments": map[string]any{"order_id": "#W0000001"}}})
		obs, _ = data["observation"].(map[string]any)
		meta, _ = obs["metadata"].(map[string]any)
		if typ != "observation" || data["done"] != true || data["reward"] != float64(1) || meta["done_reason"] != "max_steps" || meta["verdicts"] == nil {
			t.Fatalf("step 2 (the limit): %s %v", typ, data)
		}
		typ, data = ws.send(map[string]any{"type": "state"})
		if typ != "state" || data["episode_id"] != sid || data["step_count"] != float64(2) {
			t.Fatalf("state: %s %v", typ, data)
		}
		// After done, a step is an error and changes nothing.
		typ, data = ws.send(map[string]any{"type": "step", "data": map[string]any{"type": "call_tool", "tool_name": "get_order_details",
			"arguments": map[string]any{"order_id": "#W0000001"}}})
		if typ != "error" || data["code"] != "EXECUTION_ERROR" || data["status"] != float64(409) {
			t.Fatalf("step after done: %s %v", typ, data)
		}
		for _, c := range []struct {
			msg  any
			code string
		}{
			{"{not json", "INVALID_JSON"},
			{map[string]any{"type": "dance"}, "UNKNOWN_TYPE"},
			{map[string]any{"type": "step", "data": map[string]any{"type": "fly"}}, "VALIDATION_ERROR"},
			{map[string]any{"type": "state", "data": map[string]any{}}, "VALIDATION_ERROR"},
		} {
			if typ, data := ws.send(c.msg); typ != "error" || data["code"] != c.code {
				t.Errorf("%v: %s %v, want error %s", c.msg, typ, data, c.code)
			}
		}
		if n := p.journaled(sid); n != 2 {
			t.Fatalf("journaled %d calls, want 2", n)
		}
		// The session is doppel's: its token continues it over REST while the episode's connection is open.
		if code, out := p.do(http.MethodGet, "/v1/sessions/"+sid, token, nil); code != 200 || out["status"] != "open" {
			t.Fatalf("read with the metadata's token: %d %v", code, out)
		}
		// close ends the episode's session.
		if err := ws.c.WriteJSON(map[string]any{"type": "close"}); err != nil {
			t.Fatal(err)
		}
		_ = ws.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, _, err := ws.c.ReadMessage(); err == nil {
			t.Fatal("the server kept the connection open after close")
		}
		waitClosed(t, p, sid)

		// Another process over the same database and twins reads and grades it with the key.
		tpB := toolplane.New(toolplane.Options{DB: p.db, Opener: p.opener, Twins: p.twins, Journal: p.journal,
			Bundles: &toolplane.Bundles{Blob: p.blobs}})
		srvB := openEnvServer(t, p, tpB, 0)
		code, out := oeDo(t, http.MethodPost, srvB.URL+"/v1/sessions/"+sid+"/assert", p.key, map[string]any{"expect": expect})
		if code != 200 || out["pass"] != true {
			t.Fatalf("graded through another process: %d %v", code, out)
		}
	})
}

// waitClosed waits for the session the server closes after the connection ends.
func waitClosed(t *testing.T, p *plane, sid string) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if _, s := p.do(http.MethodGet, "/v1/sessions/"+sid, p.key, nil); s["status"] == "closed" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("session %s still open after its connection closed", sid)
}

// Past the most concurrent episodes, a connection gets OpenEnv's CAPACITY_REACHED error and is closed; a
// connection that ends frees its place.
func TestOpenEnvCapacity(t *testing.T) {
	p := newPlane(t, "sqlite", shopBundle(t), planeOptions{})
	srv := openEnvServer(t, p, p.tp, 1)
	first := dialOpenEnv(t, srv, p.env.Slug, p.key)
	if typ, _ := first.send(map[string]any{"type": "state"}); typ != "state" {
		t.Fatalf("first connection: %s", typ)
	}
	second := dialOpenEnv(t, srv, p.env.Slug, p.key)
	_ = second.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out map[string]any
	if err := second.c.ReadJSON(&out); err != nil {
		t.Fatal(err)
	}
	data, _ := out["data"].(map[string]any)
	if out["type"] != "error" || data["code"] != "CAPACITY_REACHED" || data["max_sessions"] != float64(1) || data["active_sessions"] != float64(1) {
		t.Fatalf("second connection: %v", out)
	}
	first.c.Close()
	for i := 0; ; i++ {
		third := dialOpenEnv(t, srv, p.env.Slug, p.key)
		if err := third.c.WriteJSON(map[string]any{"type": "state"}); err != nil {
			t.Fatal(err)
		}
		_ = third.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := third.c.ReadJSON(&out); err != nil {
			t.Fatal(err)
		}
		if out["type"] == "state" {
			break
		}
		if i > 100 {
			t.Fatalf("the closed connection's place was not freed: %v", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
