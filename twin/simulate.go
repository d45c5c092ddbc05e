package twin

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Simulator answers a call from a model when no other rung can. The twin never
// lets its answer change the world. The model-backed implementation lives elsewhere.
type Simulator interface {
	Simulate(ctx context.Context, req SimRequest) (string, error)
}

// SimRequest is what a simulator is told about a call.
type SimRequest struct {
	Tool         string          `json:"tool"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Examples are recorded calls of the tool, nearest first.
	Examples []SimExample `json:"examples"`
	// Rows are the world rows the arguments name.
	Rows []json.RawMessage `json:"rows"`
	Args json.RawMessage   `json:"args"`
}

// SimExample is one recorded call.
type SimExample struct {
	Args   json.RawMessage `json:"args"`
	Answer string          `json:"answer"`
}

func (s *Session) simulate(ctx context.Context, t *rtTool, args *jsonvalue.Object) (*answer, string) {
	ck := s.currentHash() + "\x00" + t.def.Name + "\x00" + jsonvalue.CanonicalText(args)
	s.rt.simMu.Lock()
	cached, ok := s.rt.simCache[ck]
	s.rt.simMu.Unlock()
	if ok {
		return &answer{content: cached, isErr: isErrorText(cached)}, ""
	}
	req := SimRequest{Tool: t.def.Name, Description: t.def.Description, InputSchema: t.def.InputSchema,
		OutputSchema: t.def.OutputSchema, Args: json.RawMessage(Render(args, StyleCompact))}
	flat := flatten(args)
	exs := append([]*rec(nil), t.all...)
	sort.SliceStable(exs, func(i, j int) bool { return distance(flat, exs[i].flat) < distance(flat, exs[j].flat) })
	if len(exs) > 5 {
		exs = exs[:5]
	}
	for _, r := range exs {
		req.Examples = append(req.Examples, SimExample{Args: json.RawMessage(Render(r.args, StyleCompact)), Answer: r.answer})
	}
	for _, tk := range s.rowsNamed(args) {
		if r, ok := s.row(tk.table, tk.key); ok {
			req.Rows = append(req.Rows, json.RawMessage(Render(r, StyleCompact)))
		}
	}
	text, err := s.rt.opts.Simulator.Simulate(ctx, req)
	if err != nil {
		return nil, "simulator: " + err.Error()
	}
	if why := validateAgainst(t.def.OutputSchema, text); why != "" && !isErrorText(text) {
		return nil, "simulated answer rejected: " + why
	}
	s.rt.simMu.Lock()
	if _, ok := s.rt.simCache[ck]; !ok {
		s.rt.simCache[ck] = text
		s.rt.simOrder = append(s.rt.simOrder, ck)
		for len(s.rt.simOrder) > s.rt.opts.SimCacheSize {
			delete(s.rt.simCache, s.rt.simOrder[0])
			s.rt.simOrder = s.rt.simOrder[1:]
		}
	}
	s.rt.simMu.Unlock()
	return &answer{content: text, isErr: isErrorText(text)}, ""
}

// rowsNamed answers the rows whose keys appear among the argument values.
func (s *Session) rowsNamed(args *jsonvalue.Object) []tableKey {
	var out []tableKey
	seen := map[tableKey]bool{}
	for _, v := range flatten(args) {
		sv, err := jsonvalue.ParseString(v)
		if err != nil {
			continue
		}
		str, ok := sv.(string)
		if !ok {
			continue
		}
		for _, name := range s.rt.tableNames {
			tk := tableKey{name, str}
			if _, ok := s.row(name, str); ok && !seen[tk] {
				seen[tk] = true
				out = append(out, tk)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].table != out[j].table {
			return out[i].table < out[j].table
		}
		return out[i].key < out[j].key
	})
	return out
}

// validateAgainst checks an answer's JSON type against a schema's top-level "type".
func validateAgainst(schema json.RawMessage, text string) string {
	if len(schema) == 0 {
		return ""
	}
	var s struct {
		Type any `json:"type"`
	}
	if json.Unmarshal(schema, &s) != nil || s.Type == nil {
		return ""
	}
	want := map[string]bool{}
	switch x := s.Type.(type) {
	case string:
		want[x] = true
	case []any:
		for _, e := range x {
			if str, ok := e.(string); ok {
				want[str] = true
			}
		}
	}
	got := "string"
	if jsonvalue.LooksJSON(text) {
		if v, err := jsonvalue.ParseString(text); err == nil {
			switch x := v.(type) {
			case *jsonvalue.Object:
				got = "object"
			case []any:
				got = "array"
			case jsonvalue.Number:
				got = "number"
				if !x.IsFloat() {
					got = "integer"
				}
			case bool:
				got = "boolean"
			case nil:
				got = "null"
			}
		}
	}
	if want[got] || (got == "integer" && want["number"]) {
		return ""
	}
	return "answer is " + got + ", schema wants " + fmt.Sprint(s.Type)
}
