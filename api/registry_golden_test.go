package api_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/api"
)

var updateRegistry = flag.Bool("update-registry", false, "rewrite testdata/registry.golden.json from the current verbs")

const registryGolden = "testdata/registry.golden.json"

// pinnedVerb is what the golden file pins of a verb: its kind and its input and output schemas.
type pinnedVerb struct {
	Kind   string         `json:"kind"`
	Input  map[string]any `json:"input"`
	Output map[string]any `json:"output,omitempty"`
}

// fullRegistry is the registry of every route group the binary serves (as `doppel openapi` registers them).
func fullRegistry(t *testing.T) map[string]pinnedVerb {
	t.Helper()
	_, a := api.New(api.Options{Routes: []func(huma.API, *api.Deps){
		func(a huma.API, d *api.Deps) { api.RegisterCollect(a, d, api.CollectOptions{}) },
		(&api.BuildRoutes{}).Register,
		(&api.SessionRoutes{}).Register,
		(&api.WakeRoutes{}).Register,
		(&api.QueryRoutes{}).Register,
		(&api.UsageRoutes{}).Register,
		(&api.WebhookRoutes{}).Register,
	}})
	out := map[string]pinnedVerb{}
	for _, v := range api.Registry(a.OpenAPI()) {
		// Round-trip through JSON so the comparison sees what the registry answers.
		b, err := json.Marshal(pinnedVerb{Kind: v.Kind, Input: v.Input, Output: v.Output})
		if err != nil {
			t.Fatal(err)
		}
		var p pinnedVerb
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		out[v.Name] = p
	}
	return out
}

// TestRegistryPinned fails when a verb changes in place (spec §9: verbs are added, never changed): a verb removed,
// its kind changed, an input or output field removed, renamed or retyped, or an input field newly required. New
// verbs and new optional fields pass. Run with -update-registry after adding a verb or an optional field.
func TestRegistryPinned(t *testing.T) {
	cur := fullRegistry(t)
	if *updateRegistry {
		if err := os.MkdirAll(filepath.Dir(registryGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(registryGolden, registryBytes(t, cur), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(registryGolden)
	if err != nil {
		t.Fatalf("%v (run go test ./api -run TestRegistryPinned -update-registry)", err)
	}
	var pinned map[string]pinnedVerb
	if err := json.Unmarshal(b, &pinned); err != nil {
		t.Fatal(err)
	}
	if len(pinned) < 10 {
		t.Fatalf("golden pins only %d verbs", len(pinned))
	}
	for _, p := range registryBreaks(pinned, cur) {
		t.Error(p)
	}
}

// registryBytes is the golden file's text for reg.
func registryBytes(t *testing.T, reg map[string]pinnedVerb) []byte {
	t.Helper()
	b, err := json.MarshalIndent(reg, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestRegistryGoldenUnchanged: the registry the verbs give today is the committed golden, byte for byte. A change
// that moves code and changes no document leaves it so; a change that adds a verb or a field rewrites the golden
// with -update-registry, in the commit that adds them.
func TestRegistryGoldenUnchanged(t *testing.T) {
	want, err := os.ReadFile(registryGolden)
	if err != nil {
		t.Fatal(err)
	}
	if got := registryBytes(t, fullRegistry(t)); !bytes.Equal(got, want) {
		t.Errorf("the registry differs from %s (run go test ./api -run TestRegistryPinned -update-registry if the change is meant)", registryGolden)
	}
}

// registryBreaks lists the in-place changes from pinned to cur.
func registryBreaks(pinned, cur map[string]pinnedVerb) []string {
	var out []string
	names := make([]string, 0, len(pinned))
	for n := range pinned {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		old := pinned[n]
		now, ok := cur[n]
		if !ok {
			out = append(out, fmt.Sprintf("verb %s was removed", n))
			continue
		}
		if old.Kind != now.Kind {
			out = append(out, fmt.Sprintf("verb %s changed kind %s → %s", n, old.Kind, now.Kind))
		}
		out = append(out, schemaBreaks(n+" input", old.Input, now.Input, old.Input, now.Input, true)...)
		out = append(out, schemaBreaks(n+" output", old.Output, now.Output, old.Output, now.Output, false)...)
	}
	return out
}

// schemaBreaks compares an old schema with the new one: every old property must still be there with the same
// type; in an input no property may become required that was not.
func schemaBreaks(where string, old, now, oldRoot, nowRoot map[string]any, input bool) []string {
	old, now = deref(old, oldRoot), deref(now, nowRoot)
	if old == nil {
		return nil
	}
	if now == nil {
		return []string{where + ": schema removed"}
	}
	var out []string
	if fmt.Sprint(old["type"]) != fmt.Sprint(now["type"]) {
		out = append(out, fmt.Sprintf("%s: type %v → %v", where, old["type"], now["type"]))
	}
	oldProps, _ := old["properties"].(map[string]any)
	nowProps, _ := now["properties"].(map[string]any)
	keys := make([]string, 0, len(oldProps))
	for k := range oldProps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		np, ok := nowProps[k].(map[string]any)
		if !ok {
			out = append(out, fmt.Sprintf("%s.%s: field removed or renamed", where, k))
			continue
		}
		op, _ := oldProps[k].(map[string]any)
		out = append(out, schemaBreaks(where+"."+k, op, np, oldRoot, nowRoot, input)...)
	}
	if items, ok := old["items"].(map[string]any); ok {
		ni, _ := now["items"].(map[string]any)
		out = append(out, schemaBreaks(where+"[]", items, ni, oldRoot, nowRoot, input)...)
	}
	if input {
		was := map[string]bool{}
		if req, ok := old["required"].([]any); ok {
			for _, r := range req {
				was[fmt.Sprint(r)] = true
			}
		}
		if req, ok := now["required"].([]any); ok {
			for _, r := range req {
				if !was[fmt.Sprint(r)] {
					out = append(out, fmt.Sprintf("%s.%v: newly required", where, r))
				}
			}
		}
	}
	return out
}

// deref resolves a #/$defs/ reference against the schema's root.
func deref(s, root map[string]any) map[string]any {
	for i := 0; s != nil && i < 8; i++ {
		ref, ok := s["$ref"].(string)
		if !ok {
			return s
		}
		defs, _ := root["$defs"].(map[string]any)
		const prefix = "#/$defs/"
		if len(ref) <= len(prefix) {
			return nil
		}
		s, _ = defs[ref[len(prefix):]].(map[string]any)
	}
	return s
}

// TestRegistryBreaksDetected: the checker itself catches each kind of in-place change and lets additions pass.
func TestRegistryBreaksDetected(t *testing.T) {
	base := func() map[string]pinnedVerb {
		return map[string]pinnedVerb{"x.get": {Kind: "query",
			Input: map[string]any{"type": "object", "properties": map[string]any{
				"id": map[string]any{"type": "string"}, "n": map[string]any{"type": "integer"}}, "required": []any{"id"}},
			Output: map[string]any{"$ref": "#/$defs/Out", "$defs": map[string]any{"Out": map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}}}}}}
	}
	cases := []struct {
		name   string
		change func(m map[string]pinnedVerb)
		breaks bool
	}{
		{"unchanged", func(map[string]pinnedVerb) {}, false},
		{"new verb", func(m map[string]pinnedVerb) { m["x.new"] = pinnedVerb{Kind: "query"} }, false},
		{"new optional input field", func(m map[string]pinnedVerb) {
			m["x.get"].Input["properties"].(map[string]any)["extra"] = map[string]any{"type": "string"}
		}, false},
		{"verb removed", func(m map[string]pinnedVerb) { delete(m, "x.get") }, true},
		{"kind changed", func(m map[string]pinnedVerb) { v := m["x.get"]; v.Kind = "mutation"; m["x.get"] = v }, true},
		{"input field removed", func(m map[string]pinnedVerb) { delete(m["x.get"].Input["properties"].(map[string]any), "n") }, true},
		{"input field retyped", func(m map[string]pinnedVerb) {
			m["x.get"].Input["properties"].(map[string]any)["n"] = map[string]any{"type": "string"}
		}, true},
		{"input field newly required", func(m map[string]pinnedVerb) { m["x.get"].Input["required"] = []any{"id", "n"} }, true},
		{"output field renamed", func(m map[string]pinnedVerb) {
			props := m["x.get"].Output["$defs"].(map[string]any)["Out"].(map[string]any)["properties"].(map[string]any)
			props["title"] = props["name"]
			delete(props, "name")
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cur := base()
			c.change(cur)
			got := registryBreaks(base(), cur)
			if (len(got) > 0) != c.breaks {
				t.Fatalf("breaks = %v, want breaking %v", got, c.breaks)
			}
		})
	}
}
