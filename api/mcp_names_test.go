package api_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// toolNamePattern is the tool and function name alphabet MCP hosts (Claude Desktop) and model APIs (OpenAI's
// function names) accept.
var toolNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// Every tool name on both MCP faces is in the hosts' alphabet and unique; a workspace-face tool names its verb in
// _meta, and its former dotted name is still served on tools/call.
func TestMCPToolNames(t *testing.T) {
	ctx := context.Background()
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))

	var reg struct{ Verbs []api.RegistryVerb }
	if err := json.Unmarshal(p.api.Get("/api/registry").Body.Bytes(), &reg); err != nil {
		t.Fatal(err)
	}
	verbs := map[string]bool{}
	for _, v := range reg.Verbs {
		verbs[v.Name] = true
	}

	ws := p.connect(t, "/mcp", p.key)
	tools, err := ws.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tl := range tools.Tools {
		if !toolNamePattern.MatchString(tl.Name) {
			t.Errorf("workspace tool %q does not match %s", tl.Name, toolNamePattern)
		}
		if seen[tl.Name] {
			t.Errorf("workspace tool name %q used twice", tl.Name)
		}
		seen[tl.Name] = true
		verb, _ := tl.Meta[api.MetaToolVerb].(string)
		if !verbs[verb] || api.VerbToolName(verb) != tl.Name {
			t.Errorf("workspace tool %q: _meta %s = %q, want the registry verb it serves", tl.Name, api.MetaToolVerb, verb)
		}
	}
	if len(tools.Tools) != len(reg.Verbs) || len(tools.Tools) == 0 {
		t.Errorf("%d workspace tools for %d verbs", len(tools.Tools), len(reg.Verbs))
	}
	t.Logf("workspace face: %d tools, all in %s", len(tools.Tools), toolNamePattern)

	// The new name and the deprecated dotted one answer the same; an unknown name is still refused.
	for _, name := range []string{"envs_get", "envs.get"} {
		r, err := ws.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"slug": p.env.Slug}})
		if err != nil || r.IsError {
			t.Fatalf("tools/call %s: %+v %v", name, r, err)
		}
		if got, _ := r.StructuredContent.(map[string]any); got["slug"] != p.env.Slug {
			t.Errorf("tools/call %s = %v, want environment %s", name, r.StructuredContent, p.env.Slug)
		}
	}
	if r, err := ws.CallTool(ctx, &mcp.CallToolParams{Name: "envs.nope", Arguments: map[string]any{}}); err == nil && !r.IsError {
		t.Errorf("tools/call envs.nope answered %+v, want an error", r)
	}

	// The whole registry (the golden of every verb a full server declares) maps to distinct names in the alphabet.
	golden, err := os.ReadFile("testdata/registry.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(golden, &all); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for verb := range all {
		name := api.VerbToolName(verb)
		if !toolNamePattern.MatchString(name) {
			t.Errorf("verb %s: tool name %q does not match %s", verb, name, toolNamePattern)
		}
		if other, ok := names[name]; ok {
			t.Errorf("verbs %s and %s share the tool name %q", verb, other, name)
		}
		names[name] = verb
	}
	t.Logf("registry: %d verbs, %d distinct tool names", len(all), len(names))

	env := p.connect(t, "/mcp/envs/"+p.env.Slug+"?seed=1", p.key)
	etools, err := env.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(etools.Tools) == 0 {
		t.Fatal("environment face lists no tools")
	}
	for _, tl := range etools.Tools {
		if !toolNamePattern.MatchString(tl.Name) {
			t.Errorf("environment tool %q does not match %s", tl.Name, toolNamePattern)
		}
	}
}
