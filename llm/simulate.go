package llm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Example is one recorded call of a tool, shown to the model.
type Example struct {
	Arguments json.RawMessage `json:"arguments"`
	Content   string          `json:"content"`
	Error     bool            `json:"error"`
}

// SimRequest asks the model to answer one tool call as production would.
type SimRequest struct {
	StateHash    string            // the session world's state_hash before the call (part of the cache key)
	Tool         string            // the production tool name
	Description  string            // the tool's description
	InputSchema  json.RawMessage   // optional
	OutputSchema json.RawMessage   // a successful answer must validate against it; empty: not checked
	Examples     []Example         // a few recorded calls, in a deterministic order chosen by the caller
	Rows         []json.RawMessage // world rows relevant to the call, in a deterministic order
	Arguments    json.RawMessage   // the call's arguments (a JSON object)
}

// Answer is a tool's answer as the agent sees it.
type Answer struct {
	Content string `json:"content"`
	Error   bool   `json:"error"`
}

// ErrInvalidAnswer means the model's answer failed validation twice (first try and one retry).
var ErrInvalidAnswer = errors.New("model answer did not validate")

// Simulator answers tool calls with the model (the simulate rung). Answers are cached per (state hash,
// tool, canonical arguments): a repeated call in the same world state gets the identical answer, and a
// cache primed from a session's journal (Cache.Prime) replays a rebuilt session without calling the model.
type Simulator struct {
	c     *Client
	cache *Cache
	group flight[Answer]
}

// NewSimulator returns a Simulator over c using cache (nil: a cache of its own).
func NewSimulator(c *Client, cache *Cache) *Simulator {
	if cache == nil {
		cache = NewCache()
	}
	return &Simulator{c: c, cache: cache}
}

// Cache returns the simulator's answer cache.
func (s *Simulator) Cache() *Cache { return s.cache }

// Simulate answers r. A cached answer is returned without calling the model; concurrent identical calls
// share one model request. An answer that fails validation is retried once with the reason, then
// ErrInvalidAnswer.
func (s *Simulator) Simulate(ctx context.Context, r SimRequest) (Answer, error) {
	key, err := CacheKey(r.StateHash, r.Tool, r.Arguments)
	if err != nil {
		return Answer{}, err
	}
	if a, ok := s.cache.Get(key); ok {
		return a, nil
	}
	return s.group.do(key, func() (Answer, error) {
		if a, ok := s.cache.Get(key); ok {
			return a, nil
		}
		a, err := s.ask(ctx, r)
		if err != nil {
			return Answer{}, err
		}
		return s.cache.PutIfAbsent(key, a), nil
	})
}

var simFormat = &ResponseFormat{Type: "json_schema", JSONSchema: &JSONSchema{
	Name: "tool_answer",
	Schema: json.RawMessage(`{"type":"object","properties":{"error":{"type":"boolean"},"content":{"type":"string"}},` +
		`"required":["error","content"],"additionalProperties":false}`),
	Strict: true,
}}

func (s *Simulator) ask(ctx context.Context, r SimRequest) (Answer, error) {
	msgs := simPrompt(r)
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		out, err := s.c.Complete(ctx, Request{Messages: msgs, ResponseFormat: simFormat})
		if err != nil {
			return Answer{}, fmt.Errorf("simulate %s: %w", r.Tool, err)
		}
		a, verr := parseAnswer(out, r.OutputSchema)
		if verr == nil {
			return a, nil
		}
		lastErr = verr
		msgs = append(msgs,
			Message{Role: "assistant", Content: out},
			Message{Role: "user", Content: "That answer is invalid: " + verr.Error() +
				". Answer again with the JSON object {\"error\": boolean, \"content\": string} only, " +
				"content being the exact text the tool returns."})
	}
	return Answer{}, fmt.Errorf("simulate %s: %w: %v", r.Tool, ErrInvalidAnswer, lastErr)
}

func simPrompt(r SimRequest) []Message {
	var sys strings.Builder
	fmt.Fprintf(&sys, "You are the production backend tool %q. You are not an assistant: answer exactly as "+
		"the production tool would answer the call, with the same text format, field names, key order, "+
		"number spelling and error wording as the recorded examples.\n\n", r.Tool)
	if r.Description != "" {
		fmt.Fprintf(&sys, "Tool description:\n%s\n\n", r.Description)
	}
	if len(r.InputSchema) > 0 {
		fmt.Fprintf(&sys, "Input schema:\n%s\n\n", r.InputSchema)
	}
	if len(r.OutputSchema) > 0 {
		fmt.Fprintf(&sys, "A successful answer is JSON text that validates against this schema:\n%s\n\n", r.OutputSchema)
	}
	if len(r.Examples) > 0 {
		sys.WriteString("Recorded calls of this tool in production:\n")
		for _, e := range r.Examples {
			fmt.Fprintf(&sys, "- arguments: %s\n  error: %t\n  answer: %s\n", e.Arguments, e.Error, e.Content)
		}
		sys.WriteString("\n")
	}
	if len(r.Rows) > 0 {
		sys.WriteString("Current records of the world relevant to this call (answer consistently with them):\n")
		for _, row := range r.Rows {
			fmt.Fprintf(&sys, "%s\n", row)
		}
		sys.WriteString("\n")
	}
	sys.WriteString("Reply with one JSON object {\"error\": boolean, \"content\": string}: error is true when " +
		"the tool would report an error (as in the examples), and content is the exact text the tool returns.")
	return []Message{
		{Role: "system", Content: sys.String()},
		{Role: "user", Content: fmt.Sprintf("Call %s with arguments %s", r.Tool, r.Arguments)},
	}
}

// parseAnswer reads the model's {"error","content"} object and validates a successful content against the
// output schema. A content the model gave as a JSON value instead of a string is taken as its JSON text.
func parseAnswer(out string, outputSchema json.RawMessage) (Answer, error) {
	out = stripFences(out)
	var w struct {
		Error   *bool           `json:"error"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal([]byte(out), &w); err != nil {
		return Answer{}, fmt.Errorf("not a JSON object: %v", err)
	}
	if w.Error == nil {
		return Answer{}, errors.New(`field "error" missing`)
	}
	if len(w.Content) == 0 || bytes.Equal(w.Content, []byte("null")) {
		return Answer{}, errors.New(`field "content" missing`)
	}
	a := Answer{Error: *w.Error}
	if w.Content[0] == '"' {
		if err := json.Unmarshal(w.Content, &a.Content); err != nil {
			return Answer{}, fmt.Errorf(`field "content": %v`, err)
		}
	} else {
		var b bytes.Buffer
		if err := json.Compact(&b, w.Content); err != nil {
			return Answer{}, fmt.Errorf(`field "content": %v`, err)
		}
		a.Content = b.String()
	}
	if a.Error || len(bytes.TrimSpace(outputSchema)) == 0 {
		return a, nil
	}
	if err := validateContent(a.Content, outputSchema); err != nil {
		return Answer{}, err
	}
	return a, nil
}

// validateContent checks answer text against a tool's output schema. Text that is not JSON passes only
// when the schema allows a string (a bare-string tool such as a user-id lookup).
func validateContent(content string, schema json.RawMessage) error {
	v, err := jsonvalue.Decode([]byte(content))
	if err != nil {
		if verr := jsonvalue.Validate(schema, content); verr != nil {
			return fmt.Errorf("content is not JSON and the output schema wants %s", strings.TrimPrefix(verr.Error(), "$: "))
		}
		return nil
	}
	if verr := jsonvalue.Validate(schema, v); verr != nil {
		// A bare string answer that happens to parse as JSON (e.g. "12345") may still be a string answer.
		if jsonvalue.Validate(schema, content) == nil {
			return nil
		}
		return fmt.Errorf("content does not match the output schema: %w", verr)
	}
	return nil
}

func stripFences(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "```") {
		s = strings.TrimPrefix(s, "```")
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
		s = strings.TrimSuffix(strings.TrimSpace(s), "```")
	}
	return strings.TrimSpace(s)
}

// CacheKey is the answer-cache key of a call: hex SHA-256 over the state hash, the tool name and the
// canonical JSON of the arguments. Arguments that are not one JSON document are an error.
func CacheKey(stateHash, tool string, args json.RawMessage) (string, error) {
	ca, err := jsonvalue.CanonicalDoc(args)
	if err != nil {
		return "", fmt.Errorf("arguments: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(stateHash))
	h.Write([]byte{0})
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write(ca)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Cache holds simulated answers by CacheKey. The first answer stored for a key wins and never changes.
// It is safe for concurrent use.
type Cache struct {
	mu sync.RWMutex
	m  map[string]Answer
}

// NewCache returns an empty cache.
func NewCache() *Cache { return &Cache{m: map[string]Answer{}} }

// Get returns the answer cached under key.
func (c *Cache) Get(key string) (Answer, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	a, ok := c.m[key]
	return a, ok
}

// PutIfAbsent stores a under key unless an answer is there already, and returns the answer now cached.
func (c *Cache) PutIfAbsent(key string, a Answer) Answer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[key]; ok {
		return old
	}
	c.m[key] = a
	return a
}

// Len is the number of cached answers.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Journaled is a simulated call as the journal holds it: the state hash the call ran in (a simulated call
// never changes the world, so it is also the call's resulting state hash), tool, arguments and answer.
type Journaled struct {
	StateHash string
	Tool      string
	Arguments json.RawMessage
	Answer    Answer
}

// Prime loads journaled simulated calls, in journal order, so a rebuilt session replays them exactly.
func (c *Cache) Prime(calls []Journaled) error {
	for i, j := range calls {
		key, err := CacheKey(j.StateHash, j.Tool, j.Arguments)
		if err != nil {
			return fmt.Errorf("journaled call %d (%s): %w", i, j.Tool, err)
		}
		c.PutIfAbsent(key, j.Answer)
	}
	return nil
}

// flight collapses concurrent calls with the same key into one.
type flight[T any] struct {
	mu sync.Mutex
	m  map[string]*flightCall[T]
}

type flightCall[T any] struct {
	done chan struct{}
	v    T
	err  error
}

func (f *flight[T]) do(key string, fn func() (T, error)) (T, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flightCall[T]{}
	}
	if c, ok := f.m[key]; ok {
		f.mu.Unlock()
		<-c.done
		return c.v, c.err
	}
	c := &flightCall[T]{done: make(chan struct{})}
	f.m[key] = c
	f.mu.Unlock()
	c.v, c.err = fn()
	close(c.done)
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
	return c.v, c.err
}
