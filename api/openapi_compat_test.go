package api_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/usage"
)

// walkJSON calls fn on every object under v with its JSON pointer.
func walkJSON(v any, ptr string, fn func(ptr string, m map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(ptr, x)
		for k, e := range x {
			walkJSON(e, ptr+"/"+k, fn)
		}
	case []any:
		for i, e := range x {
			walkJSON(e, ptr+"/"+strconv.Itoa(i), fn)
		}
	}
}

// The 3.0 document holds no 3.1-only schema keyword (a binary part is format: binary), and no multipart body has
// an encoding object (ogen skips an operation whose part lists several types, or one that is not JSON or a form).
func TestOpenAPI30Keywords(t *testing.T) {
	_, doc := docAPI()
	var v map[string]any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	if v["openapi"] != "3.0.3" {
		t.Fatalf("openapi %v", v["openapi"])
	}
	binary := 0
	walkJSON(v, "", func(ptr string, m map[string]any) {
		for _, k := range []string{"contentMediaType", "contentEncoding", "const", "prefixItems", "$defs"} {
			if _, ok := m[k]; ok && !strings.Contains(ptr, "/properties/"+k) {
				t.Errorf("%s: 3.1 keyword %s in the 3.0 document", ptr, k)
			}
		}
		if m["format"] == "binary" {
			binary++
		}
		if _, ok := m["encoding"]; ok && strings.HasSuffix(ptr, "/multipart/form-data") {
			t.Errorf("%s: an encoding object (ogen skips the operation; the parts' default type is accepted)", ptr)
		}
	})
	if binary < 4 { // uploads' file, builds' tools, code and config
		t.Errorf("%d binary schemas in the 3.0 document, want the multipart files (at least 4)", binary)
	}
}

// Every meter GET /v1/usage answers is one MeterOut documents: its name and unit are in the schema's enums.
func TestUsageMetersDocumented(t *testing.T) {
	plans := &usage.Plans{Default: "trial", ByName: map[string]usage.Plan{"trial": {TaskMinutes: 100, ModelTokens: 1000}}}
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{plans: plans})
	code, out := p.do(http.MethodGet, "/v1/usage", p.key, nil)
	if code != http.StatusOK {
		t.Fatalf("usage: %d %v", code, out)
	}
	s := huma.NewMapRegistry("#/components/schemas/", huma.DefaultSchemaNamer).Schema(reflect.TypeFor[api.MeterOut](), false, "")
	names, units := s.Properties["name"].Enum, s.Properties["unit"].Enum
	meters, _ := out["meters"].([]any)
	seen := map[string]bool{}
	for _, m := range meters {
		m := m.(map[string]any)
		seen[m["name"].(string)] = true
		if !slices.Contains(names, m["name"]) || !slices.Contains(units, m["unit"]) {
			t.Errorf("meter %v: name or unit outside MeterOut's enums %v %v", m, names, units)
		}
	}
	if !seen[usage.MeterModelTokens] {
		t.Errorf("usage answers no %s meter: %v", usage.MeterModelTokens, meters)
	}
}

// The tools listing: every format's entries carry only ToolEntry's documented fields; openai-responses is the
// Responses API's function tool; descriptions are the definitions' (no provenance in the text).
func TestToolListingDocumented(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	entry := huma.NewMapRegistry("#/components/schemas/", huma.DefaultSchemaNamer).Schema(reflect.TypeFor[api.ToolEntry](), false, "")
	for _, format := range []string{"native", "openai", "openai-responses", "anthropic"} {
		res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools?format="+format, "Authorization: Bearer "+p.key)
		var list []map[string]any
		if res.Code != 200 || json.Unmarshal(res.Body.Bytes(), &list) != nil || len(list) == 0 {
			t.Fatalf("format=%s: %d %s", format, res.Code, res.Body)
		}
		for _, e := range list {
			for k := range e {
				if _, ok := entry.Properties[k]; !ok {
					t.Errorf("format=%s: field %q is not in ToolEntry", format, k)
				}
			}
			desc, _ := e["description"].(string)
			if f, ok := e["function"].(map[string]any); ok {
				desc, _ = f["description"].(string)
			}
			if desc == "" || strings.Contains(desc, "described from") {
				t.Errorf("format=%s: description %q", format, desc)
			}
		}
		if format == "openai-responses" {
			e := list[0]
			if e["type"] != "function" || e["name"] == nil || e["parameters"] == nil || e["strict"] != false || e["function"] != nil {
				t.Errorf("openai-responses entry %v: want {type: function, name, description, parameters, strict: false}", e)
			}
		}
		if format == "native" && list[0]["descriptionFrom"] != "definition" {
			t.Errorf("native entry %v: descriptionFrom, want definition", list[0])
		}
	}
	res := p.api.Get("/v1/envs/"+p.env.Slug+"/tools?format=openai-chat", "Authorization: Bearer "+p.key)
	if res.Code != http.StatusUnprocessableEntity || !strings.Contains(res.Body.String(), "format") {
		t.Errorf("format=openai-chat: %d %s, want 422 naming format", res.Code, res.Body)
	}
}
