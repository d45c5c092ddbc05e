package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// testRegistry is a registry as GET /api/registry answers it, with a test-only verb test.echo.
const testRegistry = `{"verbs":[
 {"name":"envs.get","kind":"query","method":"GET","path":"/v1/envs/{slug}","summary":"Show an environment","credentials":["workspaceKey"],
  "input":{"type":"object","required":["slug"],"properties":{"slug":{"type":"string","x-in":"path","description":"Environment slug."}}}},
 {"name":"envs.list","kind":"query","method":"GET","path":"/v1/envs","summary":"List environments","credentials":["workspaceKey"],
  "input":{"type":"object","required":[],"properties":{}}},
 {"name":"sessions.open","kind":"mutation","method":"POST","path":"/v1/envs/{slug}/sessions","summary":"Open a session","credentials":["workspaceKey"],
  "input":{"type":"object","required":["slug"],"properties":{
   "slug":{"type":"string","x-in":"path"},
   "seed":{"type":"integer","x-in":"body","description":"Pins generated values."},
   "seed_instructions":{"type":"string","x-in":"body","description":"Plain-language preconditions."},
   "seedInstructions":{"type":"string","x-in":"body"},
   "recordOutputs":{"type":"boolean","x-in":"body"},
   "record_outputs":{"type":"boolean","x-in":"body"},
   "trace":{"x-in":"body","oneOf":[{"type":"string"},{"type":"object","additionalProperties":true}]}}}},
 {"name":"sessions.call","kind":"mutation","method":"POST","path":"/v1/sessions/{session_id}/call","summary":"Call a tool","credentials":["sessionToken","workspaceKey"],
  "input":{"type":"object","required":["arguments","name","session_id"],"properties":{
   "session_id":{"type":"string","x-in":"path"},"name":{"type":"string","x-in":"body"},
   "arguments":{"type":"object","x-in":"body","additionalProperties":true}}}},
 {"name":"test.echo","kind":"mutation","method":"POST","path":"/v1/test/{thing_id}/echo","summary":"Echo the input","credentials":[],
  "input":{"type":"object","required":["message","thing_id"],"properties":{
   "thing_id":{"type":"string","x-in":"path","description":"The thing."},
   "message":{"type":"string","x-in":"body","description":"What to echo."},
   "count":{"type":"integer","x-in":"query","description":"How many times."},
   "loud":{"type":"boolean","x-in":"body"},
   "ratio":{"type":"number","x-in":"body"},
   "mode":{"type":"string","x-in":"body","enum":["plain","fancy"],"description":"Echo style."},
   "extra":{"type":"object","x-in":"body"}}}},
 {"name":"builds.get","kind":"query","method":"GET","path":"/v1/envs/{slug}/builds/{build_id}","summary":"Show a build","credentials":["workspaceKey"],
  "input":{"type":"object","required":["build_id","slug"],"properties":{"slug":{"type":"string","x-in":"path"},"build_id":{"type":"string","x-in":"path"}}}},
 {"name":"test.fail","kind":"query","method":"GET","path":"/v1/test/fail","summary":"Always fails","credentials":[],
  "input":{"type":"object","required":[],"properties":{}}}
]}`

type gotCall struct {
	method, path, auth string
	input              map[string]any
}

type fakeAPI struct {
	mu     sync.Mutex
	calls  []gotCall
	builds int
	srv    *httptest.Server
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/registry", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, testRegistry)
	})
	mux.HandleFunc("/trpc/", func(w http.ResponseWriter, r *http.Request) {
		verb := strings.TrimPrefix(r.URL.Path, "/trpc/")
		raw := []byte(r.URL.Query().Get("input"))
		if r.Method == http.MethodPost {
			raw, _ = io.ReadAll(r.Body)
		}
		c := gotCall{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization")}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &c.input); err != nil {
				t.Errorf("%s: input %q is not a JSON object: %v", verb, raw, err)
			}
		}
		f.mu.Lock()
		f.calls = append(f.calls, c)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		var data any
		switch verb {
		case "test.fail":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"message":"it broke","code":-32009,"data":{"code":"CONFLICT","httpStatus":409,"path":"test.fail",`+
				`"envelope":{"status":409,"title":"Conflict","detail":"the thing is busy","code":"notReady","requestId":"req_abc123"}}}}`)
			return
		case "builds.get":
			f.mu.Lock()
			f.builds++
			n := f.builds
			f.mu.Unlock()
			final := "succeeded"
			if c.input["build_id"] == "bld_bad" {
				final = "failed"
			}
			switch {
			case n%3 == 1:
				data = map[string]any{"id": c.input["build_id"], "status": "queued", "progress": 0}
			case n%3 == 2:
				data = map[string]any{"id": c.input["build_id"], "status": "running", "stage": "infer", "progress": 0.5}
			default:
				data = map[string]any{"id": c.input["build_id"], "status": final, "progress": 1}
			}
		case "envs.list":
			data = json.RawMessage(`[{"slug":"tau2-retail","name":"Retail","tools":15},{"slug":"tau2-airline","name":"Airline","tools":12}]`)
		default:
			data = map[string]any{"echo": c.input}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"result": map[string]any{"data": data}})
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) last(t *testing.T) gotCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		t.Fatal("no tRPC call")
	}
	return f.calls[len(f.calls)-1]
}

func (f *fakeAPI) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeAPI) run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	err := RunVerb(context.Background(), VerbOptions{URL: f.srv.URL, Key: "mk_live_test", Stdout: &out, Stderr: &errb}, args)
	if err != nil {
		errb.WriteString(err.Error())
	}
	return ExitCode(err), out.String(), errb.String()
}

func TestRegistryVerbs(t *testing.T) {
	f := newFakeAPI(t)

	// Types, a positional path parameter, a query parameter and JSON text; a mutation is a POST with the key.
	code, out, errs := f.run("test", "echo", "T1", "--message", "hi", "--count", "3", "--loud", "--ratio", "0.5",
		"--mode", "fancy", "--extra", `{"a":[1,2]}`)
	if code != 0 {
		t.Fatalf("test echo: exit %d: %s", code, errs)
	}
	c := f.last(t)
	if c.method != http.MethodPost || c.path != "/trpc/test.echo" || c.auth != "Bearer mk_live_test" {
		t.Fatalf("call = %+v", c)
	}
	want := map[string]any{"thing_id": "T1", "message": "hi", "count": float64(3), "loud": true, "ratio": 0.5,
		"mode": "fancy", "extra": map[string]any{"a": []any{float64(1), float64(2)}}}
	if g, w := mustJSON(t, c.input), mustJSON(t, want); g != w {
		t.Fatalf("input = %s, want %s", g, w)
	}
	if !strings.Contains(out, `"echo"`) || !strings.Contains(out, `"message": "hi"`) {
		t.Fatalf("an object answer is printed as JSON by default:\n%s", out)
	}
	// A path parameter as a flag; only the flags given are sent.
	if code, _, errs := f.run("test", "echo", "--thing-id", "T2", "--message", "x"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if g := mustJSON(t, f.last(t).input); g != `{"message":"x","thing_id":"T2"}` {
		t.Fatalf("input = %s", g)
	}

	// Usage errors (exit 2) send nothing: enum refused, bad integer, missing required, unknown flag, extra argument.
	before := f.n()
	for _, args := range [][]string{
		{"test", "echo", "T1", "--message", "hi", "--mode", "loud"},
		{"test", "echo", "T1", "--message", "hi", "--count", "many"},
		{"test", "echo", "T1"},
		{"test", "echo", "--message", "hi"},
		{"test", "echo", "T1", "--message", "hi", "--colour", "red"},
		{"test", "echo", "T1", "T2", "--message", "hi"},
		{"test", "echo", "T1", "--message", "hi", "--extra", "{not json"},
		{"test", "nope"},
		{"nosuchgroup"},
	} {
		code, _, errs := f.run(args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, errs)
		}
	}
	if code, _, errs := f.run("test", "echo", "T1", "--message", "hi", "--mode", "loud"); !strings.Contains(errs, "plain, fancy") {
		t.Errorf("enum refusal names the values: %d %s", code, errs)
	}
	if f.n() != before {
		t.Fatalf("usage errors sent %d calls", f.n()-before)
	}

	// A query is a GET with ?input=; --env answers for slug.
	if code, _, errs := f.run("envs", "get", "--env", "tau2-retail"); code != 0 {
		t.Fatalf("envs get --env: exit %d %s", code, errs)
	}
	c = f.last(t)
	if c.method != http.MethodGet || c.path != "/trpc/envs.get" || mustJSON(t, c.input) != `{"slug":"tau2-retail"}` {
		t.Fatalf("envs get = %+v", c)
	}
	if code, _, _ := f.run("envs", "get", "tau2-retail"); code != 0 || mustJSON(t, f.last(t).input) != `{"slug":"tau2-retail"}` {
		t.Fatalf("envs get positional = %d %+v", code, f.last(t))
	}

	// camelCase duplicates are hidden aliases of one flag; --session answers for session_id; --token replaces the key.
	if code, _, errs := f.run("sessions", "open", "--env", "tau2-retail", "--seed", "42", "--seed-instructions", "one order",
		"--record-outputs"); code != 0 {
		t.Fatalf("sessions open: %d %s", code, errs)
	}
	if g := mustJSON(t, f.last(t).input); g != `{"record_outputs":true,"seed":42,"seed_instructions":"one order","slug":"tau2-retail"}` {
		t.Fatalf("sessions open input = %s", g)
	}
	// A JSON flag whose schema also takes a string: plain text is that string (a trace id), JSON is JSON, and
	// @file reads the file.
	if code, _, errs := f.run("sessions", "open", "tau2-retail", "--trace", "task-12/trial-0"); code != 0 ||
		mustJSON(t, f.last(t).input) != `{"slug":"tau2-retail","trace":"task-12/trial-0"}` {
		t.Fatalf("--trace id: %d %s %+v", code, errs, f.last(t))
	}
	traceFile := filepath.Join(t.TempDir(), "trace.json")
	if err := os.WriteFile(traceFile, []byte(`{"id":"t1","messages":[{"role":"user","content":"hi"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := f.run("sessions", "open", "tau2-retail", "--trace", "@"+traceFile); code != 0 ||
		mustJSON(t, f.last(t).input) != `{"slug":"tau2-retail","trace":{"id":"t1","messages":[{"content":"hi","role":"user"}]}}` {
		t.Fatalf("--trace @file: %d %s %+v", code, errs, f.last(t))
	}
	if code, _, _ := f.run("sessions", "open", "tau2-retail", "--seedInstructions", "x"); code != 0 ||
		mustJSON(t, f.last(t).input) != `{"seed_instructions":"x","slug":"tau2-retail"}` {
		t.Fatalf("camelCase alias: %d %+v", code, f.last(t))
	}
	if code, _, errs := f.run("sessions", "call", "--session", "ses_1", "--name", "get_order_details",
		"--arguments", `{"order_id":"#W1"}`, "--token", "ms_tok"); code != 0 {
		t.Fatalf("sessions call: %d %s", code, errs)
	}
	c = f.last(t)
	if c.auth != "Bearer ms_tok" || mustJSON(t, c.input) != `{"arguments":{"order_id":"#W1"},"name":"get_order_details","session_id":"ses_1"}` {
		t.Fatalf("sessions call = %+v", c)
	}

	// API error: exit 1 with the envelope's detail, code and requestId.
	code, _, errs = f.run("test", "fail")
	if code != 1 || !strings.Contains(errs, "the thing is busy") || !strings.Contains(errs, "notReady") || !strings.Contains(errs, "req_abc123") {
		t.Fatalf("test fail: exit %d: %s", code, errs)
	}

	// A list of objects is a table by default, JSON on request; --output table renders an object as fields.
	code, out, _ = f.run("envs", "list")
	if code != 0 || !strings.Contains(out, "SLUG") || !strings.Contains(out, "tau2-airline") || strings.Contains(out, "{") {
		t.Fatalf("envs list table:\n%s", out)
	}
	if strings.Index(out, "SLUG") > strings.Index(out, "NAME") {
		t.Errorf("columns keep the answer's key order:\n%s", out)
	}
	code, out, _ = f.run("envs", "list", "--output", "json")
	var list []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 {
		t.Fatalf("envs list json:\n%s", out)
	}
	code, out, _ = f.run("envs", "get", "x", "--output", "table")
	if code != 0 || !strings.Contains(out, "FIELD") || !strings.Contains(out, "echo") {
		t.Fatalf("object as table:\n%s", out)
	}
	if code, _, _ := f.run("envs", "list", "--output", "yaml"); code != 2 {
		t.Fatalf("--output yaml: exit %d", code)
	}

	// Help from the registry: a group lists its verbs, a verb its flags (aliases hidden).
	code, out, _ = f.run("test", "--help")
	if code != 0 || !strings.Contains(out, "test echo THING_ID") || !strings.Contains(out, "Echo the input") || !strings.Contains(out, "test fail") {
		t.Fatalf("group help:\n%s", out)
	}
	code, out, _ = f.run("test", "echo", "--help")
	for _, s := range []string{"--message string", "required", "--count int", "--loud", "--mode string", "plain|fancy", "--ratio float", "--extra string", "JSON", "--output", "--token"} {
		if code != 0 || !strings.Contains(out, s) {
			t.Errorf("verb help lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "mk_live_test") {
		t.Errorf("help shows the key:\n%s", out)
	}
	code, out, _ = f.run("sessions", "open", "--help")
	if code != 0 || strings.Contains(out, "seedInstructions") || strings.Contains(out, "recordOutputs") || !strings.Contains(out, "--seed-instructions") || !strings.Contains(out, "also --env") {
		t.Errorf("aliases are hidden:\n%s", out)
	}
	// --wait polls a query until its status is final, reporting progress on stderr; a failed end is exit 1.
	code, out, errs = f.run("builds", "get", "--env", "tau2-retail", "bld_1", "--wait", "--interval", "10ms")
	if code != 0 || !strings.Contains(out, `"status": "succeeded"`) || !strings.Contains(errs, "running · infer  50%") {
		t.Fatalf("builds get --wait: exit %d\n%s\n%s", code, out, errs)
	}
	if code, _, errs := f.run("builds", "get", "--env", "tau2-retail", "bld_bad", "--wait", "--interval", "10ms"); code != 1 || !strings.Contains(errs, "failed") {
		t.Fatalf("failed build --wait: exit %d %s", code, errs)
	}
	if code, _, _ := f.run("test", "echo", "T1", "--message", "x", "--wait"); code != 2 {
		t.Fatalf("--wait on a mutation: exit %d, want 2", code)
	}

	var hb bytes.Buffer
	if err := VerbHelp(context.Background(), VerbOptions{URL: f.srv.URL}, &hb); err != nil || !strings.Contains(hb.String(), "test echo") || !strings.Contains(hb.String(), "sessions call SESSION_ID") {
		t.Fatalf("help: %v\n%s", err, hb.String())
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
