package twin

import (
	"encoding/json"
	"strings"
	"unicode"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Tools with a definition but no recorded call. The build lists every tool its uploaded definitions name; one the
// traces never called has no recording and no handler of its own, so without a model its answer is inferred from
// the tool most like it — the most words of its name in common (the verb counting most), then the most argument
// names, then the most recordings (so some recorded tool always answers) — as that tool's nearest recording, in its style, with this call's values where that call's were. It is
// labelled B_inferred and downgraded, and changes nothing in the world: a write nothing has shown cannot be
// simulated without a model.

// NameWords splits a tool or field name (snake, kebab or camel case) into lower-case words.
func NameWords(name string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	rs := []rune(name)
	for i, r := range rs {
		switch {
		case r == '_' || r == '-' || r == '.' || r == ' ':
			flush()
		case unicode.IsUpper(r) && i > 0 && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]))):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
	}
	flush()
	return words
}

// similarTool answers the recorded tool most like t (nil when no tool has a successful recording).
func (rt *Runtime) similarTool(t *rtTool) *rtTool {
	words := NameWords(t.def.Name)
	args := schemaArgNames(t.def.InputSchema)
	var best *rtTool
	bestScore := -1
	for _, name := range rt.toolNames {
		u := rt.tools[name]
		if u == t || !hasSuccess(u.all) {
			continue
		}
		uw := NameWords(name)
		score := 0
		for i, w := range words {
			for j, x := range uw {
				if w == x {
					score += 2
					if i == 0 && j == 0 {
						score += 2 // the same verb
					}
				}
			}
		}
		seen := map[string]bool{}
		for _, r := range u.all {
			if o, ok := r.args.(*jsonvalue.Object); ok {
				for _, k := range o.Keys {
					if args[k] && !seen[k] {
						seen[k] = true
						score++
					}
				}
			}
		}
		if score > bestScore || score == bestScore && len(u.all) > len(best.all) {
			best, bestScore = u, score
		}
	}
	return best
}

func hasSuccess(recs []*rec) bool {
	for _, r := range recs {
		if !r.isErr {
			return true
		}
	}
	return false
}

// schemaArgNames answers the property names of an input schema.
func schemaArgNames(schema json.RawMessage) map[string]bool {
	var sc struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	out := map[string]bool{}
	if json.Unmarshal(schema, &sc) == nil {
		for k := range sc.Properties {
			out[k] = true
		}
	}
	return out
}

// inferFromSimilar answers a call of a tool with no recording from the most similar recorded tool's nearest
// successful recording, this call's values substituted (see above).
func (s *Session) inferFromSimilar(t *rtTool, args *jsonvalue.Object) (*answer, string) {
	u := s.rt.similarTool(t)
	if u == nil {
		return nil, "no recordings of this tool or any other"
	}
	flat := flatten(args)
	var best *rec
	bestD := -1
	for _, r := range u.all {
		if r.isErr {
			continue
		}
		if d := distance(flat, r.flat); bestD < 0 || d < bestD {
			best, bestD = r, d
		}
	}
	content := substitute(best.answer, best.flat, flat, s.rt.style)
	return &answer{content: content, note: "no recording of " + t.def.Name + ": inferred from the recorded tool most like it, " +
		u.def.Name + ", in its style; nothing in the world changed"}, ""
}
