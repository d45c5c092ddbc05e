package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// trpcClient speaks tRPC's HTTP wire format as @trpc/client's httpLink and httpBatchLink do, with no transformer.
type trpcClient struct {
	t     *testing.T
	h     http.Handler
	token string
}

// jsonRequest is a test request with body (none when nil) sent as JSON.
func jsonRequest(method, target string, body []byte) *http.Request {
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	return r
}

func (c trpcClient) send(method, target string, body []byte) (int, json.RawMessage) {
	c.t.Helper()
	r := jsonRequest(method, target, body)
	if c.token != "" {
		r.Header.Set("Authorization", "Bearer "+c.token)
	}
	w := httptest.NewRecorder()
	c.h.ServeHTTP(w, r)
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		c.t.Fatalf("%s %s: content type %q", method, target, ct)
	}
	return w.Code, json.RawMessage(w.Body.Bytes())
}

// query is httpLink's GET: /trpc/<name>?input=<url-encoded JSON>, input omitted when undefined.
func (c trpcClient) query(name string, input any) (int, json.RawMessage) {
	target := "/trpc/" + name
	if input != nil {
		b, _ := json.Marshal(input)
		target += "?input=" + url.QueryEscape(string(b))
	}
	return c.send(http.MethodGet, target, nil)
}

// mutation is httpLink's POST with the input as the JSON body.
func (c trpcClient) mutation(name string, input any) (int, json.RawMessage) {
	var b []byte
	if input != nil {
		b, _ = json.Marshal(input)
	}
	return c.send(http.MethodPost, "/trpc/"+name, b)
}

// batch is httpBatchLink: names joined by commas, ?batch=1, inputs keyed "0", "1", ….
func (c trpcClient) batch(method string, names []string, inputs []any) (int, []json.RawMessage) {
	keyed := map[string]any{}
	for i, in := range inputs {
		if in != nil {
			keyed[string(rune('0'+i))] = in
		}
	}
	b, _ := json.Marshal(keyed)
	target := "/trpc/" + strings.Join(names, ",") + "?batch=1"
	var code int
	var raw json.RawMessage
	if method == http.MethodGet {
		code, raw = c.send(method, target+"&input="+url.QueryEscape(string(b)), nil)
	} else {
		code, raw = c.send(method, target, b)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		c.t.Fatalf("batch answer is not an array: %s", raw)
	}
	return code, items
}

type trpcAnswer struct {
	Result *struct {
		Data json.RawMessage `json:"data"`
	} `json:"result"`
	Error *struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
		Data    struct {
			Code       string         `json:"code"`
			HTTPStatus int            `json:"httpStatus"`
			Path       string         `json:"path"`
			Envelope   map[string]any `json:"envelope"`
		} `json:"data"`
	} `json:"error"`
}

func decodeTRPC(t *testing.T, raw json.RawMessage) trpcAnswer {
	t.Helper()
	var a trpcAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("tRPC answer %s: %v", raw, err)
	}
	if (a.Result == nil) == (a.Error == nil) {
		t.Fatalf("tRPC answer carries neither or both of result and error: %s", raw)
	}
	return a
}

// wantTRPCError checks an error item: its JSON-RPC code, tRPC code name, HTTP status, path and the envelope.
func wantTRPCError(t *testing.T, raw json.RawMessage, status int, name string, code int, path, envCode string) {
	t.Helper()
	a := decodeTRPC(t, raw)
	if a.Error == nil {
		t.Fatalf("want a %s error, got %s", name, raw)
	}
	e := a.Error
	if e.Code != code || e.Data.Code != name || e.Data.HTTPStatus != status || e.Data.Path != path {
		t.Fatalf("error = code %d %s status %d path %q, want %d %s %d %q (%s)", e.Code, e.Data.Code, e.Data.HTTPStatus, e.Data.Path, code, name, status, path, raw)
	}
	env := e.Data.Envelope
	if env["code"] != envCode || env["detail"] != e.Message || !strings.HasPrefix(env["requestId"].(string), "req_") {
		t.Fatalf("envelope = %v, want code %s and the message as detail", env, envCode)
	}
}

func TestTRPC(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	c := trpcClient{t: t, h: p.h, token: p.key}

	// A query with no input, then with one.
	code, raw := c.query("envs.list", nil)
	a := decodeTRPC(t, raw)
	if code != http.StatusOK || a.Result == nil || !bytes.Contains(a.Result.Data, []byte(p.env.Slug)) {
		t.Fatalf("envs.list = %d %s", code, raw)
	}
	code, raw = c.query("envs.get", map[string]any{"slug": p.env.Slug})
	if a := decodeTRPC(t, raw); code != http.StatusOK || !bytes.Contains(a.Result.Data, []byte(`"active_build"`)) {
		t.Fatalf("envs.get = %d %s", code, raw)
	}
	// Failing: another workspace's slug, an unknown procedure, a mutation sent as GET, bad input, no credential.
	code, raw = c.query("envs.get", map[string]any{"slug": p.otherEnv.Slug})
	if code != http.StatusNotFound {
		t.Fatalf("envs.get of another workspace = %d", code)
	}
	wantTRPCError(t, raw, 404, "NOT_FOUND", -32004, "envs.get", "notFound")
	code, raw = c.query("envs.nope", nil)
	wantTRPCError(t, raw, 404, "NOT_FOUND", -32004, "envs.nope", "notFound")
	code, raw = c.query("sessions.open", map[string]any{"slug": p.env.Slug})
	if code != http.StatusMethodNotAllowed {
		t.Fatalf("mutation as GET = %d", code)
	}
	wantTRPCError(t, raw, 405, "METHOD_NOT_SUPPORTED", -32005, "sessions.open", "methodNotAllowed")
	code, raw = c.mutation("sessions.open", map[string]any{"slug": p.env.Slug, "seed": "x"})
	if code != http.StatusUnprocessableEntity {
		t.Fatalf("bad seed = %d %s", code, raw)
	}
	wantTRPCError(t, raw, 422, "UNPROCESSABLE_CONTENT", -32022, "sessions.open", "invalid")
	code, raw = c.mutation("sessions.open", map[string]any{"slug": p.env.Slug, "colour": "red"})
	wantTRPCError(t, raw, 422, "UNPROCESSABLE_CONTENT", -32022, "sessions.open", "invalid")
	code, raw = trpcClient{t: t, h: p.h}.query("envs.list", nil)
	if code != http.StatusUnauthorized {
		t.Fatalf("no credential = %d", code)
	}
	wantTRPCError(t, raw, 401, "UNAUTHORIZED", -32001, "envs.list", "unauthorized")

	// Mutations: open a seeded session, call a tool with its token, read and close it.
	code, raw = c.mutation("sessions.open", map[string]any{"slug": p.env.Slug, "seed": 42})
	a = decodeTRPC(t, raw)
	if code != http.StatusOK || a.Result == nil {
		t.Fatalf("sessions.open = %d %s", code, raw)
	}
	var opened struct {
		SessionID string `json:"sessionId"`
		Token     string `json:"token"`
		WorldHash string `json:"world_hash"`
	}
	if err := json.Unmarshal(a.Result.Data, &opened); err != nil || opened.Token == "" {
		t.Fatalf("open data %s: %v", a.Result.Data, err)
	}
	rest := p.open(map[string]any{"seed": 42})
	if opened.WorldHash != rest.Open["world_hash"] {
		t.Fatalf("tRPC world hash %s, REST %v with the same seed", opened.WorldHash, rest.Open["world_hash"])
	}
	sc := trpcClient{t: t, h: p.h, token: opened.Token}
	code, raw = sc.mutation("sessions.call", map[string]any{"session_id": opened.SessionID, "name": "get_order_details",
		"arguments": map[string]any{"order_id": "#W0000001"}})
	a = decodeTRPC(t, raw)
	if code != http.StatusOK || a.Result == nil || !bytes.Contains(a.Result.Data, []byte(`"fidelity"`)) {
		t.Fatalf("sessions.call = %d %s", code, raw)
	}
	_, restCall := p.call(rest, "get_order_details", map[string]any{"order_id": "#W0000001"})
	var viaTRPC map[string]any
	_ = json.Unmarshal(a.Result.Data, &viaTRPC)
	if viaTRPC["content"] != restCall["content"] || viaTRPC["fidelity"] != restCall["fidelity"] {
		t.Fatalf("tRPC call %v, REST call %v", viaTRPC, restCall)
	}
	code, raw = sc.mutation("sessions.call", map[string]any{"session_id": opened.SessionID, "name": "no_such_tool", "arguments": map[string]any{}})
	wantTRPCError(t, raw, 404, "NOT_FOUND", -32004, "sessions.call", "notFound")

	// A batch of queries, all succeeding: 200, answers in order.
	code, items := sc.batch(http.MethodGet, []string{"sessions.get", "sessions.transcript"},
		[]any{map[string]any{"session_id": opened.SessionID}, map[string]any{"session_id": opened.SessionID}})
	if code != http.StatusOK || len(items) != 2 {
		t.Fatalf("batch = %d %d items", code, len(items))
	}
	if a := decodeTRPC(t, items[0]); !bytes.Contains(a.Result.Data, []byte(`"n_calls":1`)) {
		t.Fatalf("batch[0] = %s", items[0])
	}
	if a := decodeTRPC(t, items[1]); !bytes.Contains(a.Result.Data, []byte(`"calls":[`)) {
		t.Fatalf("batch[1] = %s", items[1])
	}
	// A mixed batch: 207, each item its own result or error.
	code, items = c.batch(http.MethodGet, []string{"envs.get", "envs.get", "envs.list"},
		[]any{map[string]any{"slug": p.env.Slug}, map[string]any{"slug": "nope"}, nil})
	if code != http.StatusMultiStatus || len(items) != 3 {
		t.Fatalf("mixed batch = %d %d items", code, len(items))
	}
	if a := decodeTRPC(t, items[0]); a.Result == nil {
		t.Fatalf("batch[0] = %s", items[0])
	}
	wantTRPCError(t, items[1], 404, "NOT_FOUND", -32004, "envs.get", "notFound")
	if a := decodeTRPC(t, items[2]); a.Result == nil {
		t.Fatalf("batch[2] = %s", items[2])
	}
	// A batch of mutations over POST: close the session twice.
	code, items = sc.batch(http.MethodPost, []string{"sessions.close"}, []any{map[string]any{"session_id": opened.SessionID}})
	if a := decodeTRPC(t, items[0]); code != http.StatusOK || !bytes.Contains(a.Result.Data, []byte(`"existed":true`)) {
		t.Fatalf("close = %d %s", code, items[0])
	}
}

// TestTRPCEveryVerb calls every registry verb over tRPC with an empty input: each answers a well-formed tRPC
// result or error, never a transport failure, and a verb's kind decides its method.
func TestTRPCEveryVerb(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	c := trpcClient{t: t, h: p.h, token: p.key}
	_, reg := p.do(http.MethodGet, "/api/registry", "", nil)
	verbs, _ := reg["verbs"].([]any)
	if len(verbs) < 10 {
		t.Fatalf("registry has %d verbs", len(verbs))
	}
	for _, v := range verbs {
		v := v.(map[string]any)
		name, kind := v["name"].(string), v["kind"].(string)
		var code int
		var raw json.RawMessage
		if kind == "query" {
			code, raw = c.query(name, nil)
		} else {
			code, raw = c.mutation(name, nil)
		}
		a := decodeTRPC(t, raw)
		if a.Error != nil && (a.Error.Data.Path != name || a.Error.Data.HTTPStatus != code || a.Error.Data.Envelope["code"] == nil) {
			t.Errorf("%s: %d %s", name, code, raw)
		}
		if code >= 500 {
			t.Errorf("%s: %d %s", name, code, raw)
		}
		// The other method is refused.
		if kind == "query" {
			code, raw = c.mutation(name, nil)
		} else {
			code, raw = c.query(name, nil)
		}
		if code != http.StatusMethodNotAllowed {
			t.Errorf("%s sent with the wrong method: %d %s", name, code, raw)
		}
	}
}

var _ = api.TRPCError{}
