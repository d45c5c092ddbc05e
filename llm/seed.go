package llm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Entity describes one entity table of a world to the seeder.
type Entity struct {
	Name     string            `json:"name"`     // e.g. "orders"
	Key      string            `json:"key"`      // the key field, e.g. "order_id"
	Schema   json.RawMessage   `json:"schema"`   // JSON Schema of one row (an object)
	Examples []json.RawMessage `json:"examples"` // a few existing rows, in a deterministic order
}

// SeedRequest asks for the rows that make plain-language instructions true.
type SeedRequest struct {
	Instructions string
	Seed         int64
	Clock        string // RFC 3339 world time, or empty
	Entities     []Entity
}

// SeedResult is the model's rows per entity name (each validated against its entity schema and carrying
// its key field), plus a note about words that could not become rows. No rows and a note means the
// instructions could not be turned into rows.
type SeedResult struct {
	Rows map[string][]json.RawMessage `json:"rows"`
	Note string                       `json:"note"`
}

// SeedStore persists seeding results by SeedKey so the same (entities, instructions, seed, clock) always
// yields the same rows, across sessions, restarts and machines, without asking the model again.
type SeedStore interface {
	GetSeed(ctx context.Context, key string) (SeedResult, bool, error)
	PutSeed(ctx context.Context, key string, r SeedResult) error
}

// Seeder turns seed instructions into rows with the model's structured output.
type Seeder struct {
	c     *Client
	store SeedStore
	group flight[SeedResult]
}

// NewSeeder returns a Seeder over c. store may be nil (then results are not reused across calls).
func NewSeeder(c *Client, store SeedStore) *Seeder { return &Seeder{c: c, store: store} }

// SeedKey is the hex SHA-256 identifying a seeding request: instructions, seed, clock and the entity
// schemas (by name, key and canonical schema; examples excluded).
func SeedKey(r SeedRequest) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%q\x00%d\x00%q\x00", r.Instructions, r.Seed, r.Clock)
	ents := append([]Entity(nil), r.Entities...)
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	for _, e := range ents {
		cs, err := jsonvalue.CanonicalDoc(e.Schema)
		if err != nil {
			return "", fmt.Errorf("entity %s: schema: %w", e.Name, err)
		}
		fmt.Fprintf(h, "%q\x00%q\x00%s\x00", e.Name, e.Key, cs)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Seed returns the rows for r: from the store when it holds them, else from the model (validated, one
// retry with the reason on a bad answer, then ErrInvalidAnswer), stored for next time.
func (s *Seeder) Seed(ctx context.Context, r SeedRequest) (SeedResult, error) {
	if strings.TrimSpace(r.Instructions) == "" {
		return SeedResult{Rows: map[string][]json.RawMessage{}}, nil
	}
	if len(r.Entities) == 0 {
		return SeedResult{}, errors.New("seed: the world has no entities to seed")
	}
	key, err := SeedKey(r)
	if err != nil {
		return SeedResult{}, err
	}
	return s.group.do(key, func() (SeedResult, error) { return s.seedOnce(ctx, key, r) })
}

func (s *Seeder) seedOnce(ctx context.Context, key string, r SeedRequest) (SeedResult, error) {
	if s.store != nil {
		if res, ok, err := s.store.GetSeed(ctx, key); err != nil {
			return SeedResult{}, fmt.Errorf("seed store: %w", err)
		} else if ok {
			return res, nil
		}
	}
	res, err := s.ask(ctx, r)
	if err != nil {
		return SeedResult{}, err
	}
	if s.store != nil {
		if err := s.store.PutSeed(ctx, key, res); err != nil {
			return SeedResult{}, fmt.Errorf("seed store: %w", err)
		}
	}
	return res, nil
}

func (s *Seeder) ask(ctx context.Context, r SeedRequest) (SeedResult, error) {
	format, err := seedFormat(r.Entities)
	if err != nil {
		return SeedResult{}, err
	}
	msgs := seedPrompt(r)
	seed := r.Seed
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		out, err := s.c.Complete(ctx, Request{Messages: msgs, ResponseFormat: format, Seed: &seed})
		if err != nil {
			return SeedResult{}, fmt.Errorf("seed: %w", err)
		}
		res, verr := parseSeed(out, r.Entities)
		if verr == nil {
			return res, nil
		}
		lastErr = verr
		msgs = append(msgs,
			Message{Role: "assistant", Content: out},
			Message{Role: "user", Content: "That answer is invalid: " + verr.Error() + ". Answer again with the JSON object only."})
	}
	return SeedResult{}, fmt.Errorf("seed: %w: %v", ErrInvalidAnswer, lastErr)
}

// seedFormat is the structured-output schema: {"rows": {<entity>: [row…]}, "note": string}.
func seedFormat(ents []Entity) (*ResponseFormat, error) {
	props := map[string]any{}
	for _, e := range ents {
		var s any
		if err := json.Unmarshal(e.Schema, &s); err != nil {
			return nil, fmt.Errorf("entity %s: schema: %w", e.Name, err)
		}
		props[e.Name] = map[string]any{"type": "array", "items": s}
	}
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"rows": map[string]any{"type": "object", "properties": props, "additionalProperties": false},
			"note": map[string]any{"type": "string"},
		},
		"required":             []string{"rows", "note"},
		"additionalProperties": false,
	}
	b, err := json.Marshal(schema) // json.Marshal sorts map keys: deterministic
	if err != nil {
		return nil, err
	}
	return &ResponseFormat{Type: "json_schema", JSONSchema: &JSONSchema{Name: "seed_rows", Schema: b}}, nil
}

func seedPrompt(r SeedRequest) []Message {
	var sys strings.Builder
	sys.WriteString("You create the database rows that make a test world satisfy plain-language seed instructions. " +
		"Return only rows the instructions call for (new rows, or existing rows with changed fields, each with " +
		"its key field); use the same value styles as the example rows (id formats, casing, number spelling). " +
		"If some words cannot be turned into rows, leave them out and say which in note; otherwise note is \"\".\n\n")
	if r.Clock != "" {
		fmt.Fprintf(&sys, "The world's current time is %s.\n\n", r.Clock)
	}
	ents := append([]Entity(nil), r.Entities...)
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	for _, e := range ents {
		fmt.Fprintf(&sys, "Entity %q (key field %q), row schema:\n%s\n", e.Name, e.Key, e.Schema)
		for _, ex := range e.Examples {
			fmt.Fprintf(&sys, "example row: %s\n", ex)
		}
		sys.WriteString("\n")
	}
	sys.WriteString(`Reply with one JSON object {"rows": {"<entity>": [<row>, …]}, "note": "<string>"}.`)
	return []Message{
		{Role: "system", Content: sys.String()},
		{Role: "user", Content: fmt.Sprintf("Seed %d. Instructions: %s", r.Seed, r.Instructions)},
	}
}

func parseSeed(out string, ents []Entity) (SeedResult, error) {
	var w struct {
		Rows map[string][]json.RawMessage `json:"rows"`
		Note *string                      `json:"note"`
	}
	if err := json.Unmarshal([]byte(stripFences(out)), &w); err != nil {
		return SeedResult{}, fmt.Errorf("not a JSON object with rows and note: %v", err)
	}
	byName := map[string]Entity{}
	for _, e := range ents {
		byName[e.Name] = e
	}
	res := SeedResult{Rows: map[string][]json.RawMessage{}}
	if w.Note != nil {
		res.Note = strings.TrimSpace(*w.Note)
	}
	names := make([]string, 0, len(w.Rows))
	for n := range w.Rows {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		e, ok := byName[name]
		if !ok {
			return SeedResult{}, fmt.Errorf("rows.%s: no such entity", name)
		}
		seen := map[string]bool{}
		for i, raw := range w.Rows[name] {
			v, err := jsonvalue.Decode(raw)
			if err != nil {
				return SeedResult{}, fmt.Errorf("rows.%s[%d]: %v", name, i, err)
			}
			if err := jsonvalue.Validate(e.Schema, v); err != nil {
				return SeedResult{}, fmt.Errorf("rows.%s[%d]%s", name, i, strings.TrimPrefix(err.Error(), "$"))
			}
			obj, ok := v.(map[string]any)
			if !ok {
				return SeedResult{}, fmt.Errorf("rows.%s[%d]: want an object", name, i)
			}
			kv, ok := obj[e.Key]
			if !ok || kv == nil {
				return SeedResult{}, fmt.Errorf("rows.%s[%d]: missing key field %q", name, i, e.Key)
			}
			ks := jsonvalue.CanonicalText(kv)
			if seen[ks] {
				return SeedResult{}, fmt.Errorf("rows.%s[%d]: key %s=%s appears twice", name, i, e.Key, ks)
			}
			seen[ks] = true
			res.Rows[name] = append(res.Rows[name], json.RawMessage(jsonvalue.Canonical(v)))
		}
	}
	if len(res.Rows) == 0 && res.Note == "" {
		res.Note = "the model produced no rows for these instructions"
	}
	return res, nil
}
