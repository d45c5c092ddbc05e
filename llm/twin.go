package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/twin"
)

// TwinSimulator serves the twin's simulate rung (twin.Simulator) with the model. The twin keeps its own
// answer cache per (state hash, tool, canonical arguments) and replays journaled answers on rebuild, so
// this adapter asks the model every time it is called; it validates the answer against the tool's output
// schema (one retry with the reason, then an error) and returns its text. An answer the model marks as an
// error is returned so that it reads as one (twin.IsErrorText), so the twin labels it error: true.
type TwinSimulator struct {
	S *Simulator
}

var _ twin.Simulator = TwinSimulator{}

// Simulate implements twin.Simulator.
func (t TwinSimulator) Simulate(ctx context.Context, req twin.SimRequest) (string, error) {
	r := SimRequest{
		Tool:         req.Tool,
		Description:  req.Description,
		InputSchema:  req.InputSchema,
		OutputSchema: req.OutputSchema,
		Rows:         req.Rows,
		Arguments:    req.Args,
	}
	for _, e := range req.Examples {
		r.Examples = append(r.Examples, Example{Arguments: e.Args, Content: e.Answer, Error: twin.IsErrorText(e.Answer)})
	}
	a, err := t.S.ask(ctx, r)
	if err != nil {
		return "", err
	}
	if a.Error && !twin.IsErrorText(a.Content) {
		return "Error: " + a.Content, nil
	}
	return a.Content, nil
}

// TwinSeeder serves the twin's seeding hook (twin.Seeder) with the model: instructions the twin's own parser
// cannot read become rows checked against a schema drawn from each table's example rows. The twin returns the rows
// in the session's receipts and a rebuild reuses them, so the model is asked once per session.
type TwinSeeder struct {
	S *Seeder
}

var _ twin.Seeder = TwinSeeder{}

// SeedRows implements twin.Seeder.
func (t TwinSeeder) SeedRows(ctx context.Context, req twin.SeedRequest) ([]twin.SeedRow, string, error) {
	ents := make([]Entity, 0, len(req.Tables))
	keys := map[string]string{}
	for _, tb := range req.Tables {
		schema, err := rowSchema(tb.Key, tb.Examples)
		if err != nil {
			return nil, "", fmt.Errorf("table %s: %w", tb.Name, err)
		}
		ents = append(ents, Entity{Name: tb.Name, Key: tb.Key, Schema: schema, Examples: tb.Examples})
		keys[tb.Name] = tb.Key
	}
	res, err := t.S.Seed(ctx, SeedRequest{Instructions: req.Instructions, Seed: req.Seed, Clock: req.Clock, Entities: ents})
	if err != nil {
		return nil, "", err
	}
	names := make([]string, 0, len(res.Rows))
	for n := range res.Rows {
		names = append(names, n)
	}
	sort.Strings(names)
	var rows []twin.SeedRow
	for _, n := range names {
		for _, raw := range res.Rows[n] {
			var fields map[string]any
			if err := json.Unmarshal(raw, &fields); err != nil {
				return nil, "", fmt.Errorf("rows.%s: %w", n, err)
			}
			key, _ := fields[keys[n]].(string)
			rows = append(rows, twin.SeedRow{Table: n, Key: key, Row: raw})
		}
	}
	return rows, res.Note, nil
}

// rowSchema is the JSON Schema of a table's rows as its examples show them: each top-level field with the JSON
// type it holds, and the key field required.
func rowSchema(key string, examples []json.RawMessage) (json.RawMessage, error) {
	props := map[string]any{key: map[string]any{"type": "string"}}
	for i, ex := range examples {
		var fields map[string]any
		if err := json.Unmarshal(ex, &fields); err != nil {
			return nil, fmt.Errorf("example %d: %w", i, err)
		}
		for f, v := range fields {
			if _, seen := props[f]; !seen {
				props[f] = map[string]any{"type": jsonType(v)}
			}
		}
	}
	return json.Marshal(map[string]any{"type": "object", "properties": props, "required": []string{key}})
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "null"
}
