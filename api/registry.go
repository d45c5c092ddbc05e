package api

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/danielgtaylor/huma/v2"
)

// RegistryVerb is one registry entry: an operation and the JSON Schema of its input.
type RegistryVerb struct {
	Name        string         `json:"name" doc:"The verb, the operation id (e.g. envs.get)."`
	Kind        string         `json:"kind" enum:"query,mutation" doc:"query: a read (GET); mutation: a write."`
	Method      string         `json:"method"`
	Path        string         `json:"path"`
	Summary     string         `json:"summary,omitempty"`
	Description string         `json:"description,omitempty"`
	Tags        []string       `json:"tags,omitempty"`
	Credentials []string       `json:"credentials" doc:"Security schemes accepted, any one of them; empty when none is needed."`
	Input       map[string]any `json:"input" doc:"JSON Schema (2020-12) of the input: path, query and header parameters and the JSON body's fields, each property's x-in saying where it goes."`
	Output      map[string]any `json:"output,omitempty" doc:"JSON Schema (2020-12) of the success answer's body (the tRPC result's data)."`
}

// RegistryOutput is GET /api/registry.
type RegistryOutput struct {
	Body struct {
		Verbs []RegistryVerb `json:"verbs"`
	}
}

func registerRegistry(a huma.API) {
	var once sync.Once
	var verbs []RegistryVerb
	huma.Register(a, huma.Operation{
		OperationID: "registry",
		Method:      http.MethodGet,
		Path:        "/api/registry",
		Summary:     "Verb registry",
		Description: "Every verb with its input as JSON Schema, derived from the registered operations. The CLI derives its commands from it.",
		Tags:        []string{"meta"},
		Metadata:    map[string]any{MetaVerb: false},
	}, func(ctx context.Context, _ *struct{}) (*RegistryOutput, error) {
		once.Do(func() { verbs = Registry(a.OpenAPI()) })
		out := &RegistryOutput{}
		out.Body.Verbs = verbs
		return out, nil
	})
}

// Registry derives the verb registry from an OpenAPI document: every operation with an id,
// not hidden and not marked Metadata[MetaVerb] = false, sorted by name.
func Registry(oapi *huma.OpenAPI) []RegistryVerb {
	verbs := []RegistryVerb{}
	for path, item := range oapi.Paths {
		for _, op := range []*huma.Operation{item.Get, item.Post, item.Put, item.Patch, item.Delete} {
			if op == nil || op.OperationID == "" || op.Hidden {
				continue
			}
			if v, ok := op.Metadata[MetaVerb].(bool); ok && !v {
				continue
			}
			kind, _ := op.Metadata[MetaKind].(Kind)
			if kind == "" {
				kind = Mutation
				if op.Method == http.MethodGet {
					kind = Query
				}
			}
			creds := []string{}
			for _, req := range op.Security {
				for name := range req {
					creds = append(creds, name)
				}
			}
			sort.Strings(creds)
			verbs = append(verbs, RegistryVerb{
				Name: op.OperationID, Kind: string(kind), Method: op.Method, Path: path,
				Summary: op.Summary, Description: op.Description, Tags: op.Tags,
				Credentials: creds, Input: inputSchema(oapi, op), Output: outputSchema(oapi, op),
			})
		}
	}
	sort.Slice(verbs, func(i, j int) bool { return verbs[i].Name < verbs[j].Name })
	return verbs
}

const componentPrefix = "#/components/schemas/"

// outputSchema is the JSON Schema of an operation's success body (its lowest 2xx JSON response), nil when it has none.
func outputSchema(oapi *huma.OpenAPI, op *huma.Operation) map[string]any {
	keys := make([]string, 0, len(op.Responses))
	for k := range op.Responses {
		if strings.HasPrefix(k, "2") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		mt, ok := op.Responses[k].Content["application/json"]
		if !ok || mt.Schema == nil {
			continue
		}
		refs := &refCollector{oapi: oapi, defs: map[string]any{}}
		out, _ := refs.rewrite(toMap(mt.Schema)).(map[string]any)
		if out == nil {
			return nil
		}
		out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
		if len(refs.defs) > 0 {
			out["$defs"] = refs.defs
		}
		return out
	}
	return nil
}

// inputSchema builds one object schema over an operation's parameters and JSON body.
func inputSchema(oapi *huma.OpenAPI, op *huma.Operation) map[string]any {
	refs := &refCollector{oapi: oapi, defs: map[string]any{}}
	props := map[string]any{}
	required := []string{}
	for _, p := range op.Parameters {
		if p == nil || p.In == "cookie" {
			continue
		}
		s, _ := refs.rewrite(toMap(p.Schema)).(map[string]any)
		if s == nil {
			s = map[string]any{}
		}
		s["x-in"] = p.In
		if p.Description != "" {
			s["description"] = p.Description
		}
		props[p.Name] = s
		if p.Required {
			required = append(required, p.Name)
		}
	}
	if rb := op.RequestBody; rb != nil {
		cts := make([]string, 0, len(rb.Content))
		for ct := range rb.Content {
			cts = append(cts, ct)
		}
		sort.Strings(cts)
		if mt, ok := rb.Content["application/json"]; ok && mt.Schema != nil {
			body := refs.resolveTop(toMap(mt.Schema))
			bodyProps, _ := body["properties"].(map[string]any)
			if body["type"] == "object" && len(bodyProps) > 0 {
				for name, ps := range bodyProps {
					m, _ := refs.rewrite(ps).(map[string]any)
					if m == nil {
						m = map[string]any{}
					}
					m["x-in"] = "body"
					props[name] = m
				}
				if req, ok := body["required"].([]any); ok {
					for _, r := range req {
						if s, ok := r.(string); ok {
							required = append(required, s)
						}
					}
				}
			} else {
				m, _ := refs.rewrite(body).(map[string]any)
				if m == nil {
					m = map[string]any{}
				}
				m["x-in"] = "body"
				m["x-body"] = "whole"
				props["body"] = m
				if rb.Required {
					required = append(required, "body")
				}
			}
		} else if len(cts) > 0 {
			m, _ := refs.rewrite(toMap(rb.Content[cts[0]].Schema)).(map[string]any)
			if m == nil {
				m = map[string]any{}
			}
			m["x-in"] = "body"
			m["x-content-type"] = cts[0]
			props["body"] = m
			if rb.Required {
				required = append(required, "body")
			}
		}
	}
	sort.Strings(required)
	out := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"type":                 "object",
		"properties":           props,
		"required":             required,
		"additionalProperties": false,
	}
	if len(refs.defs) > 0 {
		out["$defs"] = refs.defs
	}
	return out
}

// toMap renders a huma schema as generic JSON.
func toMap(s *huma.Schema) map[string]any {
	if s == nil {
		return nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// refCollector rewrites component refs to #/$defs/… and gathers the referenced schemas.
type refCollector struct {
	oapi *huma.OpenAPI
	defs map[string]any
}

// resolveTop replaces a top-level $ref with the schema it names.
func (r *refCollector) resolveTop(m map[string]any) map[string]any {
	ref, _ := m["$ref"].(string)
	name, ok := strings.CutPrefix(ref, componentPrefix)
	if !ok {
		return m
	}
	if s := r.oapi.Components.Schemas.Map()[name]; s != nil {
		return toMap(s)
	}
	return m
}

func (r *refCollector) rewrite(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			if k == "$ref" {
				if ref, ok := val.(string); ok {
					if name, ok := strings.CutPrefix(ref, componentPrefix); ok {
						out[k] = "#/$defs/" + name
						r.define(name)
						continue
					}
				}
			}
			out[k] = r.rewrite(val)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = r.rewrite(x[i])
		}
		return out
	}
	return v
}

func (r *refCollector) define(name string) {
	if _, done := r.defs[name]; done {
		return
	}
	r.defs[name] = true // placeholder: stops cycles
	r.defs[name] = r.rewrite(toMap(r.oapi.Components.Schemas.Map()[name]))
}
