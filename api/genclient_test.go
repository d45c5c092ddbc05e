package api_test

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	// The generated client's runtime: imported here so go.mod keeps it and the generated package builds offline.
	_ "github.com/oapi-codegen/runtime"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// docAPI is the API with every route group the OpenAPI document describes (as `doppel openapi` builds it).
func docAPI() (*huma.OpenAPI, []byte) {
	builds := &api.BuildRoutes{}
	sessions := &api.SessionRoutes{}
	h, humaAPI := api.New(api.Options{Routes: []func(huma.API, *api.Deps){
		func(a huma.API, d *api.Deps) { api.RegisterCollect(a, d, api.CollectOptions{}) },
		api.TracesRoutes(api.TracesOptions{}, nil),
		builds.Register,
		sessions.Register,
		(&api.WakeRoutes{}).Register,
		(&api.QueryRoutes{}).Register,
	}})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/openapi-3.0.json", nil))
	if w.Code != 200 {
		panic("openapi-3.0.json: " + w.Body.String())
	}
	return humaAPI.OpenAPI(), w.Body.Bytes()
}

// TestOpenAPIGeneratedNames: no schema is named as a generator names an operation's own types, and every
// property that folds onto another one of its object has a distinct x-go-name.
func TestOpenAPIGeneratedNames(t *testing.T) {
	oapi, doc := docAPI()
	if c := api.GeneratedNameClashes(oapi); len(c) > 0 {
		t.Errorf("schemas named like an operation's generated types: %v", c)
	}
	var d struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]map[string]any
			}
		}
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	fold := func(s string) string { return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s)) }
	for name, s := range d.Components.Schemas {
		goNames := map[string]string{}
		for prop, p := range s.Properties {
			g, _ := p["x-go-name"].(string)
			if g == "" {
				g = prop
			}
			if other, ok := goNames[fold(g)]; ok {
				t.Errorf("%s: properties %s and %s get one Go name", name, other, prop)
			}
			goNames[fold(g)] = prop
		}
	}
	// The pairs the issue named, answered and accepted under both names.
	for _, c := range [][3]string{
		{"OpenSessionBody", "seed_instructions", "SeedInstructionsA"},
		{"OpenSessionBody", "record_outputs", "RecordOutputsA"},
		{"OpenSessionBodyOut", "session_id", "SessionIdA"},
		{"BuildStarted", "build_id", "BuildIdA"},
	} {
		if g := d.Components.Schemas[c[0]].Properties[c[1]]["x-go-name"]; g != c[2] {
			t.Errorf("%s.%s: x-go-name %v, want %s", c[0], c[1], g, c[2])
		}
	}
}

// genClientProgram uses the generated client: it lists the environments, opens a seeded session (variant A
// names), calls a tool, reads the session and its transcript back, and prints what it decoded as JSON.
const genClientProgram = `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"IMPORT"
)

func main() {
	url, key := os.Args[1], os.Args[2]
	ctx := context.Background()
	bearer := func(tok string) gen.RequestEditorFn {
		return func(_ context.Context, r *http.Request) error { r.Header.Set("Authorization", "Bearer "+tok); return nil }
	}
	c, err := gen.NewClientWithResponses(url)
	check(err)
	out := map[string]any{}

	envs, err := c.EnvsListWithResponse(ctx, bearer(key))
	check(err)
	if envs.JSON200 == nil {
		fail("envs.list", envs.HTTPResponse, envs.Body)
	}
	var slugs []string
	for _, e := range *envs.JSON200 {
		slugs = append(slugs, e.Slug)
	}
	out["envs"] = slugs

	seed, instr, record := int64(42), "2 orders with status pending", true
	open, err := c.SessionsOpenWithResponse(ctx, slugs[0],
		gen.SessionsOpenJSONRequestBody{Seed: &seed, SeedInstructionsA: &instr, RecordOutputsA: &record}, bearer(key))
	check(err)
	if open.JSON201 == nil {
		fail("sessions.open", open.HTTPResponse, open.Body)
	}
	// Without n the answer is one open answer (the oneOf's first shape; with n, an array of them).
	s, err := open.JSON201.AsOpenSessionBodyOut()
	check(err)
	out["sessionId"], out["session_id"], out["token"], out["session_token"] = s.SessionId, s.SessionIdA, s.Token, s.SessionToken
	out["seed"], out["world_hash"], out["receipts"] = s.Seed, s.WorldHash, s.Receipts

	call, err := c.SessionsCallWithResponse(ctx, s.SessionId,
		gen.SessionsCallJSONRequestBody{Name: "get_order_details", Arguments: map[string]any{"order_id": "#W0000001"}}, bearer(s.Token))
	check(err)
	if call.JSON200 == nil {
		fail("sessions.call", call.HTTPResponse, call.Body)
	}
	out["call"] = map[string]any{"content": call.JSON200.Content, "error": call.JSON200.Error, "callId": call.JSON200.CallId}

	get, err := c.SessionsGetWithResponse(ctx, s.SessionId, bearer(s.Token))
	check(err)
	if get.JSON200 == nil {
		fail("sessions.get", get.HTTPResponse, get.Body)
	}
	out["get"] = map[string]any{"id": get.JSON200.Id, "status": get.JSON200.Status, "n_calls": get.JSON200.NCalls, "world_hash": get.JSON200.WorldHash}

	tr, err := c.SessionsTranscriptWithResponse(ctx, s.SessionId, nil, bearer(s.Token))
	check(err)
	if tr.JSON200 == nil || tr.JSON200.Calls == nil {
		fail("sessions.transcript", tr.HTTPResponse, tr.Body)
	}
	var calls []map[string]any
	for _, e := range *tr.JSON200.Calls {
		calls = append(calls, map[string]any{"name": e.Name, "callId": e.CallId, "result": e.Result, "arguments": e.Arguments})
	}
	out["transcript"] = map[string]any{"sessionId": tr.JSON200.SessionId, "recordOutputs": tr.JSON200.RecordOutputs, "calls": calls}
	check(json.NewEncoder(os.Stdout).Encode(out))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func fail(op string, r *http.Response, body []byte) {
	fmt.Fprintf(os.Stderr, "%s: %d %s\n", op, r.StatusCode, body)
	os.Exit(1)
}
`

// TestGeneratedClient runs oapi-codegen on the served 3.0 document, builds its output and drives a running
// API with the generated client.
func TestGeneratedClient(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	start := time.Now()
	_, doc := docAPI()

	// Inside the module (so the generated code builds against go.mod), under testdata (so ./... skips it).
	dir, err := os.MkdirTemp("testdata", "genclient_tmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.MkdirAll(filepath.Join(dir, "gen"), 0o755); err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(dir, "openapi3.json")
	if err := os.WriteFile(specPath, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return out
	}
	run("tool", "oapi-codegen", "-generate", "types,client", "-package", "gen",
		"-o", filepath.Join(dir, "gen", "gen.go"), specPath)
	t.Logf("generated in %v", time.Since(start).Round(time.Millisecond))

	prog := strings.Replace(genClientProgram, "IMPORT", "github.com/doppel-dev/doppel/api/"+filepath.ToSlash(dir)+"/gen", 1)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	pkg := "./" + filepath.ToSlash(dir)
	run("vet", pkg, pkg+"/gen")
	bin := filepath.Join(t.TempDir(), "genclient")
	run("build", "-o", bin, pkg)
	t.Logf("built in %v", time.Since(start).Round(time.Millisecond))

	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	srv := httptest.NewServer(p.h)
	defer srv.Close()
	cmd := exec.Command(bin, srv.URL, p.key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("generated client: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		Envs          []string
		SessionID     string `json:"sessionId"`
		SessionIDA    string `json:"session_id"`
		Token         string `json:"token"`
		SessionTokenA string `json:"session_token"`
		Seed          int64
		WorldHash     string `json:"world_hash"`
		Receipts      struct {
			Seed      int64
			Seeded    bool
			WorldHash string `json:"worldHash"`
		}
		Call struct {
			Content string
			Error   bool
			CallID  string `json:"callId"`
		}
		Get struct {
			ID        string `json:"id"`
			Status    string
			NCalls    int64  `json:"n_calls"`
			WorldHash string `json:"world_hash"`
		}
		Transcript struct {
			SessionID     string `json:"sessionId"`
			RecordOutputs bool
			Calls         []struct {
				Name      string
				CallID    string `json:"callId"`
				Result    *string
				Arguments map[string]any
			}
		}
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if len(got.Envs) != 1 || got.Envs[0] != p.env.Slug {
		t.Errorf("envs = %v, want [%s]", got.Envs, p.env.Slug)
	}
	if !strings.HasPrefix(got.SessionID, "ses_") || got.SessionIDA != got.SessionID ||
		!strings.HasPrefix(got.Token, "ms_") || got.SessionTokenA != got.Token {
		t.Errorf("open: both variants not decoded alike: %s", raw)
	}
	if got.Seed != 42 || got.Receipts.Seed != 42 || !got.Receipts.Seeded || got.WorldHash == "" || got.Receipts.WorldHash != got.WorldHash {
		t.Errorf("open receipts: %s", raw)
	}
	var order map[string]any
	if err := json.Unmarshal([]byte(got.Call.Content), &order); err != nil || got.Call.Error ||
		order["order_id"] != "#W0000001" || order["status"] != "delivered" || order["total"] != 12.5 {
		t.Errorf("call: %+v (%v)", got.Call, err)
	}
	if got.Get.ID != got.SessionID || got.Get.Status != "open" || got.Get.NCalls != 1 || got.Get.WorldHash != got.WorldHash {
		t.Errorf("get: %+v", got.Get)
	}
	tr := got.Transcript
	if tr.SessionID != got.SessionID || !tr.RecordOutputs || len(tr.Calls) != 1 || tr.Calls[0].Name != "get_order_details" ||
		tr.Calls[0].CallID != got.Call.CallID || tr.Calls[0].Arguments["order_id"] != "#W0000001" ||
		tr.Calls[0].Result == nil || *tr.Calls[0].Result != got.Call.Content {
		t.Errorf("transcript: %s", raw)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}
