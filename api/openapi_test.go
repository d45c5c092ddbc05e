package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

func TestOpenAPIDocument(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	w := f.api.Get("/openapi.json")
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	var doc struct {
		OpenAPI    string `json:"openapi"`
		Info       struct{ Description string }
		Paths      map[string]map[string]json.RawMessage
		Components struct {
			Schemas         map[string]map[string]any
			SecuritySchemes map[string]any
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
	for _, p := range []string{"/healthz", "/readyz", "/v1/envs", "/v1/envs/{slug}", "/v1/keys", "/v1/keys/{id}", "/api/registry", "/test/seed"} {
		if doc.Paths[p] == nil {
			t.Errorf("path %s missing", p)
		}
	}
	env := doc.Components.Schemas["Envelope"]
	if env == nil {
		t.Fatal("no Envelope schema")
	}
	req, _ := env["required"].([]any)
	var names []string
	for _, r := range req {
		names = append(names, r.(string))
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "code,detail,requestId" {
		t.Errorf("Envelope required = %v", names)
	}
	props := env["properties"].(map[string]any)
	for _, k := range []string{"errors", "access", "meter", "cardWouldLift"} {
		if props[k] == nil {
			t.Errorf("Envelope lacks %s", k)
		}
	}
	codes := props["code"].(map[string]any)["enum"].([]any)
	for _, c := range api.Codes() {
		found := false
		for _, e := range codes {
			found = found || e == c.Code
		}
		if !found {
			t.Errorf("code %s not in the Envelope enum", c.Code)
		}
		if !strings.Contains(doc.Info.Description, "`"+c.Code+"`") {
			t.Errorf("code %s not documented in the description", c.Code)
		}
	}
	for _, s := range []string{api.SchemeWorkspaceKey, api.SchemeSessionToken, api.SchemeMCPToken} {
		if doc.Components.SecuritySchemes[s] == nil {
			t.Errorf("security scheme %s missing", s)
		}
	}
	// Every operation documents the envelope as its default response, and 401 when it takes a credential.
	for path, item := range doc.Paths {
		for method, raw := range item {
			var op struct {
				Security  []map[string]any
				ErrorBody string `json:"x-doppel-error-body"`
				Responses map[string]struct {
					Content map[string]struct {
						Schema map[string]any
					}
				}
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				continue
			}
			def, ok := op.Responses["default"]
			want := "#/components/schemas/Envelope"
			if op.ErrorBody == "google.rpc.Status" { // POST /v1/traces: OTLP/HTTP's error body, documented as such
				want = "#/components/schemas/OTLPStatus"
			}
			if !ok || def.Content["application/json"].Schema["$ref"] != want {
				t.Errorf("%s %s: default response is not %s", method, path, want)
			}
			if len(op.Security) > 0 {
				if _, ok := op.Responses["401"]; !ok {
					t.Errorf("%s %s: takes a credential but documents no 401", method, path)
				}
			}
		}
	}
	if w := f.api.Get("/openapi.yaml"); w.Code != 200 || !strings.Contains(w.Body.String(), "openapi: 3.1.0") {
		t.Errorf("openapi.yaml: %d", w.Code)
	}
}

func TestDocsPage(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	// /docs: Swagger UI over /openapi.json, its assets served from this binary.
	w := f.api.Get("/docs")
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("/docs: %d %s", w.Code, w.Header())
	}
	page := w.Body.String()
	for _, src := range []string{"/docs/swagger-ui-bundle.js", "/docs/swagger-ui-standalone-preset.js", "/docs/doppel-init.js", "/docs/swagger-ui.css"} {
		if !strings.Contains(page, src) {
			t.Errorf("/docs does not load %s", src)
		}
		if a := f.api.Get(src); a.Code != 200 || a.Body.Len() < 20 {
			t.Errorf("GET %s: %d, %d bytes", src, a.Code, a.Body.Len())
		}
	}
	if strings.Contains(page, "//cdn") || strings.Contains(page, "https://") {
		t.Errorf("/docs loads something from elsewhere; it must work offline")
	}
	if init := f.api.Get("/docs/doppel-init.js").Body.String(); !strings.Contains(init, `url: "/openapi.json"`) {
		t.Errorf("the initializer does not read /openapi.json: %s", init)
	}
	if w := f.api.Get("/docs/index.html"); w.Code != 404 {
		t.Errorf("the module's sample index is served: %d", w.Code)
	}

	// /docs/reference: the same reference without scripts.
	w = f.api.Get("/docs/reference")
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("/docs/reference: %d %s", w.Code, w.Header())
	}
	page = w.Body.String()
	for _, want := range []string{"/v1/envs/{slug}", "/v1/keys/{id}", "/readyz", "/test/seed", "envs.list", "keys.revoke", "requestId", "paymentRequired", "notReady", "/openapi.json"} {
		if !strings.Contains(page, want) {
			t.Errorf("docs page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script") {
		t.Errorf("/docs/reference loads scripts; it must work without them")
	}
}

func TestRegistry(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	w := f.api.Get("/api/registry")
	var reg struct{ Verbs []api.RegistryVerb }
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &reg) != nil {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	byName := map[string]api.RegistryVerb{}
	var names []string
	for _, v := range reg.Verbs {
		byName[v.Name] = v
		names = append(names, v.Name)
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("verbs not sorted: %v", names)
	}
	for _, want := range []string{"envs.list", "envs.get", "keys.create", "keys.list", "keys.revoke", "test.seed", "test.session"} {
		if _, ok := byName[want]; !ok {
			t.Errorf("verb %s missing from %v", want, names)
		}
	}
	for _, not := range []string{"health.live", "health.ready", "registry"} {
		if _, ok := byName[not]; ok {
			t.Errorf("%s is plain HTTP, not a verb", not)
		}
	}
	type prop struct {
		Type      any      `json:"type"`
		In        string   `json:"x-in"`
		Enum      []string `json:"enum"`
		MaxLength int      `json:"maxLength"`
	}
	type input struct {
		Type       string          `json:"type"`
		Properties map[string]prop `json:"properties"`
		Required   []string        `json:"required"`
		Additional bool            `json:"additionalProperties"`
	}
	decode := func(v api.RegistryVerb) input {
		b, _ := json.Marshal(v.Input)
		var in input
		if err := json.Unmarshal(b, &in); err != nil {
			t.Fatalf("%s input: %v", v.Name, err)
		}
		return in
	}
	tests := []struct {
		verb, kind, method, prop, in, typ string
		required                          bool
	}{
		{"envs.get", "query", "GET", "slug", "path", "string", true},
		{"keys.create", "mutation", "POST", "name", "body", "string", true},
		{"keys.create", "mutation", "POST", "kind", "body", "string", false},
		{"keys.revoke", "mutation", "DELETE", "id", "path", "string", true},
		{"test.seed", "mutation", "POST", "seed", "body", "integer", true},
	}
	for _, tt := range tests {
		v := byName[tt.verb]
		in := decode(v)
		p, ok := in.Properties[tt.prop]
		if v.Kind != tt.kind || v.Method != tt.method || in.Type != "object" || in.Additional || !ok || p.In != tt.in || p.Type != tt.typ {
			t.Errorf("%s: kind %s method %s input %+v", tt.verb, v.Kind, v.Method, in)
			continue
		}
		req := false
		for _, r := range in.Required {
			req = req || r == tt.prop
		}
		if req != tt.required {
			t.Errorf("%s.%s required = %v, want %v", tt.verb, tt.prop, req, tt.required)
		}
	}
	if in := decode(byName["keys.create"]); strings.Join(in.Properties["kind"].Enum, ",") != "workspace,mcp" || in.Properties["name"].MaxLength != 100 {
		t.Errorf("keys.create input lost its constraints: %+v", in.Properties)
	}
	if v := byName["envs.list"]; len(v.Credentials) != 1 || v.Credentials[0] != api.SchemeWorkspaceKey {
		t.Errorf("envs.list credentials %v", v.Credentials)
	}
	if v := byName["test.session"]; strings.Join(v.Credentials, ",") != "sessionToken,workspaceKey" {
		t.Errorf("session verb credentials %v", v.Credentials)
	}
}

// A body whose schema nests other components keeps them under $defs.
func TestRegistryNestedRefs(t *testing.T) {
	type Item struct {
		ID   string `json:"id"`
		Next *Item  `json:"next,omitempty"`
	}
	type in struct {
		Body struct {
			Items []Item `json:"items"`
		}
	}
	_, a := api.New(api.Options{Routes: []func(huma.API, *api.Deps){func(a huma.API, _ *api.Deps) {
		huma.Register(a, huma.Operation{OperationID: "items.put", Method: http.MethodPost, Path: "/items"},
			func(_ context.Context, _ *in) (*struct{}, error) { return nil, nil })
	}}})
	var v *api.RegistryVerb
	for _, x := range api.Registry(a.OpenAPI()) {
		if x.Name == "items.put" {
			v = &x
		}
	}
	if v == nil {
		t.Fatal("items.put missing")
	}
	b, _ := json.Marshal(v.Input)
	s := string(b)
	if !strings.Contains(s, `"$ref":"#/$defs/Item"`) || !strings.Contains(s, `"$defs":{"Item":`) || strings.Contains(s, "#/components/") {
		t.Errorf("input schema refs not rewritten to $defs: %s", s)
	}
}
