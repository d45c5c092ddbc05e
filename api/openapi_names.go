package api

import (
	"fmt"
	"sort"
	"strings"
	"unicode"

	"github.com/danielgtaylor/huma/v2"
)

// Names for code generators. Several bodies accept and answer a field under both naming variants (session_id and
// sessionId, seed_instructions and seedInstructions, build_id and buildId, …). On the wire that is fine, but a
// generator derives one identifier from both (oapi-codegen: SessionId), and its output does not compile. So every
// property whose name folds (case, `_` and `-` ignored) onto another property of the same object gets an
// `x-go-name` (honoured by oapi-codegen and go-swagger) and its object an `x-ogen-properties` entry (ogen's way to
// name a field): the variant without separators (camelCase, variant B) keeps its plain name, the others get it with
// an `A` (variant A) suffix: session_id is SessionIdA. Nothing changes on the wire: the extensions only name the
// field in generated code.
//
// Schema names have the same problem the other way round: oapi-codegen names the wrapper of an operation's answer
// <OperationId>Response (envs.get: EnvsGetResponse), its parameters <OperationId>Params and its body
// <OperationId>JSONRequestBody, so no schema may be called so; GeneratedNameClashes lists those that are.

// goNameExt is the extension naming a property's field in generated Go (oapi-codegen, go-swagger); ogenPropsExt is
// ogen's, set on the object: {"session_id": {"name": "SessionIdA"}}.
const (
	goNameExt    = "x-go-name"
	ogenPropsExt = "x-ogen-properties"
)

// nameGenerated is an OnAddOperation hook: after each operation's schemas are registered it gives every
// colliding property of every registered schema an x-go-name. It is idempotent, so running it per operation
// covers the schemas of routes registered later too.
func nameGenerated(oapi *huma.OpenAPI, _ *huma.Operation) {
	if oapi.Components == nil || oapi.Components.Schemas == nil {
		return
	}
	seen := map[*huma.Schema]bool{}
	for _, s := range oapi.Components.Schemas.Map() {
		nameProperties(s, seen)
	}
}

// nameProperties names the colliding properties of s and of the schemas nested in it.
func nameProperties(s *huma.Schema, seen map[*huma.Schema]bool) {
	if s == nil || seen[s] {
		return
	}
	seen[s] = true
	groups := map[string][]string{}
	for name := range s.Properties {
		k := foldName(name)
		groups[k] = append(groups[k], name)
	}
	taken := map[string]bool{}
	for name := range s.Properties {
		taken[generatedName(name)] = true
	}
	for _, names := range groups {
		if len(names) < 2 {
			continue
		}
		// Variant B (no separators) first, then by name: the first keeps its plain name.
		sort.Slice(names, func(i, j int) bool {
			bi, bj := !hasSeparator(names[i]), !hasSeparator(names[j])
			if bi != bj {
				return bi
			}
			return names[i] < names[j]
		})
		for i, name := range names[1:] {
			p := s.Properties[name]
			if p == nil || p.Ref != "" {
				// A $ref takes no siblings in OpenAPI 3.0; none of ours collide, and the test would say so.
				continue
			}
			if _, ok := p.Extensions[goNameExt]; ok {
				continue
			}
			goName := generatedName(name) + "A"
			if i > 0 || taken[goName] {
				for n := 2; ; n++ {
					if c := fmt.Sprintf("%sA%d", generatedName(name), n); !taken[c] {
						goName = c
						break
					}
				}
			}
			taken[goName] = true
			if p.Extensions == nil {
				p.Extensions = map[string]any{}
			}
			p.Extensions[goNameExt] = goName
			// ogen reads its field names from the object, not the property.
			if s.Extensions == nil {
				s.Extensions = map[string]any{}
			}
			named, _ := s.Extensions[ogenPropsExt].(map[string]any)
			if named == nil {
				named = map[string]any{}
				s.Extensions[ogenPropsExt] = named
			}
			named[name] = map[string]any{"name": goName}
		}
	}
	for _, p := range s.Properties {
		nameProperties(p, seen)
	}
	nameProperties(s.Items, seen)
	if ap, ok := s.AdditionalProperties.(*huma.Schema); ok {
		nameProperties(ap, seen)
	}
	for _, l := range [][]*huma.Schema{s.OneOf, s.AnyOf, s.AllOf} {
		for _, x := range l {
			nameProperties(x, seen)
		}
	}
}

// foldName is the key two property names collide on: lower case, letters and digits only.
func foldName(name string) string {
	var b strings.Builder
	for _, r := range name {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

func hasSeparator(name string) bool { return strings.ContainsAny(name, "_-. ") }

// generatedName is the identifier oapi-codegen derives from a name (its ToCamelCase): upper case after a
// separator and at the start, separators dropped.
func generatedName(name string) string {
	var b strings.Builder
	up := true
	for _, r := range name {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if up {
				r = unicode.ToUpper(r)
			}
			b.WriteRune(r)
			up = false
		default:
			up = true
		}
	}
	return b.String()
}

// generatedSuffixes are what oapi-codegen appends to an operation id for the types of that operation.
var generatedSuffixes = []string{"Response", "Params", "JSONBody", "JSONRequestBody", "RequestBody"}

// GeneratedNameClashes lists the component schemas named as a generator names an operation's own types
// (<OperationId>Response and the like), as "schema (operation id)". Empty for a document generated clients compile.
func GeneratedNameClashes(oapi *huma.OpenAPI) []string {
	ops := map[string]string{}
	for _, item := range oapi.Paths {
		for _, op := range []*huma.Operation{item.Get, item.Put, item.Post, item.Delete, item.Options, item.Head, item.Patch, item.Trace} {
			if op == nil || op.OperationID == "" {
				continue
			}
			for _, suf := range generatedSuffixes {
				ops[strings.ToLower(generatedName(op.OperationID)+suf)] = op.OperationID
			}
		}
	}
	var out []string
	if oapi.Components == nil || oapi.Components.Schemas == nil {
		return nil
	}
	for name := range oapi.Components.Schemas.Map() {
		if id, ok := ops[strings.ToLower(generatedName(name))]; ok {
			out = append(out, fmt.Sprintf("%s (%s)", name, id))
		}
	}
	sort.Strings(out)
	return out
}
