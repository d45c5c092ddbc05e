package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/twin"
)

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"no base url", Options{Model: "m"}, "model.base_url"},
		{"not http", Options{BaseURL: "ftp://x", Model: "m"}, "model.base_url"},
		{"no model", Options{BaseURL: "http://x"}, "model.name"},
		{"negative timeout", Options{BaseURL: "http://x", Model: "m", Timeout: -time.Second}, "model.timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(%+v) = %v, want an error naming %s", tt.o, err, tt.want)
			}
		})
	}
}

func TestCompleteSendsProtocol(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 200, "hello" })
	c := f.client(t)
	seed := int64(7)
	got, err := c.Complete(context.Background(), Request{
		Messages:       []Message{{Role: "user", Content: "hi"}},
		Seed:           &seed,
		ResponseFormat: &ResponseFormat{Type: "json_object"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != "hello" {
		t.Fatalf("content = %q, want hello", got)
	}
	r := f.requests()[0]
	if r.Auth != "Bearer sk-test" || r.Model != "gpt-test" {
		t.Fatalf("auth %q model %q", r.Auth, r.Model)
	}
	if r.Temperature == nil || *r.Temperature != 0 {
		t.Fatalf("temperature not sent as 0: %v", r.Temperature)
	}
	if r.Seed == nil || *r.Seed != 7 || r.ResponseFormat == nil || r.ResponseFormat.Type != "json_object" {
		t.Fatalf("seed/response_format not forwarded: %+v", r)
	}
}

func TestCompleteErrors(t *testing.T) {
	t.Run("api error carries status and message", func(t *testing.T) {
		f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 429, "rate limited, slow down" })
		_, err := f.client(t).Complete(context.Background(), Request{Messages: []Message{{Role: "user", Content: "x"}}})
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 429 || ae.Message != "rate limited, slow down" {
			t.Fatalf("err = %v, want APIError 429", err)
		}
	})
	t.Run("empty content", func(t *testing.T) {
		f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 200, "" })
		_, err := f.client(t).Complete(context.Background(), Request{})
		if !errors.Is(err, ErrNoAnswer) {
			t.Fatalf("err = %v, want ErrNoAnswer", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		block := make(chan struct{})
		f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { <-block; return 200, "late" })
		defer close(block)
		c, err := New(Options{BaseURL: f.URL + "/v1", Model: "m", Timeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Complete(context.Background(), Request{})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want deadline exceeded", err)
		}
	})
}

var orderSchema = json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"},` +
	`"status":{"type":"string","enum":["pending","delivered","cancelled"]},"total":{"type":"number"}},` +
	`"required":["order_id","status"]}`)

func simReq(args string) SimRequest {
	return SimRequest{
		StateHash:    "sha256:aa",
		Tool:         "get_order_details",
		Description:  "Get the status and details of an order.",
		OutputSchema: orderSchema,
		Examples:     []Example{{Arguments: json.RawMessage(`{"order_id":"#W1"}`), Content: `{"order_id": "#W1", "status": "pending"}`}},
		Rows:         []json.RawMessage{json.RawMessage(`{"order_id":"#W2","status":"delivered"}`)},
		Arguments:    json.RawMessage(args),
	}
}

func TestSimulateValidAnswerIsCached(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) {
		return 200, `{"error":false,"content":"{\"order_id\": \"#W2\", \"status\": \"delivered\"}"}`
	})
	s := NewSimulator(f.client(t), nil)
	a, err := s.Simulate(context.Background(), simReq(`{"order_id":"#W2"}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.Error || a.Content != `{"order_id": "#W2", "status": "delivered"}` {
		t.Fatalf("answer = %+v", a)
	}
	// Same state, same arguments in another key order: served from the cache.
	b, err := s.Simulate(context.Background(), simReq(`{ "order_id" : "#W2" }`))
	if err != nil || b != a {
		t.Fatalf("second answer = %+v, %v; want %+v", b, err, a)
	}
	if n := len(f.requests()); n != 1 {
		t.Fatalf("model called %d times, want 1", n)
	}
	// A different state hash is a different key.
	r := simReq(`{"order_id":"#W2"}`)
	r.StateHash = "sha256:bb"
	if _, err := s.Simulate(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if n := len(f.requests()); n != 2 {
		t.Fatalf("model called %d times after a state change, want 2", n)
	}
	req := f.requests()[0]
	sys := req.Messages[0].Content
	for _, want := range []string{"get_order_details", "Get the status", `"#W1"`, `"#W2","status":"delivered"`, `"enum"`} {
		if !strings.Contains(sys, want) {
			t.Errorf("system prompt lacks %q", want)
		}
	}
	if req.ResponseFormat == nil || req.ResponseFormat.Type != "json_schema" {
		t.Errorf("no structured output requested: %+v", req.ResponseFormat)
	}
}

func TestSimulateRetriesOnceThenFails(t *testing.T) {
	bad := `{"error":false,"content":"{\"order_id\": \"#W2\", \"status\": \"lost\"}"}`
	good := `{"error":false,"content":"{\"order_id\": \"#W2\", \"status\": \"pending\"}"}`
	t.Run("second answer valid", func(t *testing.T) {
		f := newFakeOpenAI(t, func(n int, _ fakeRequest) (int, string) {
			if n == 0 {
				return 200, bad
			}
			return 200, good
		})
		a, err := NewSimulator(f.client(t), nil).Simulate(context.Background(), simReq(`{"order_id":"#W2"}`))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(a.Content, "pending") {
			t.Fatalf("answer = %+v", a)
		}
		reqs := f.requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2", len(reqs))
		}
		last := reqs[1].Messages[len(reqs[1].Messages)-1].Content
		if !strings.Contains(last, "$.status") || !strings.Contains(last, `"lost"`) {
			t.Fatalf("retry does not say what was wrong: %q", last)
		}
	})
	t.Run("both invalid", func(t *testing.T) {
		f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 200, bad })
		s := NewSimulator(f.client(t), nil)
		_, err := s.Simulate(context.Background(), simReq(`{"order_id":"#W2"}`))
		if !errors.Is(err, ErrInvalidAnswer) {
			t.Fatalf("err = %v, want ErrInvalidAnswer", err)
		}
		if len(f.requests()) != 2 || s.Cache().Len() != 0 {
			t.Fatalf("requests %d, cached %d; want 2 and nothing cached", len(f.requests()), s.Cache().Len())
		}
	})
}

func TestSimulateAnswerForms(t *testing.T) {
	tests := []struct {
		name   string
		schema string
		model  string
		want   Answer
		valid  bool
	}{
		{"bare string tool", `{"type":"string"}`, `{"error":false,"content":"liam_thomas_7882"}`, Answer{Content: "liam_thomas_7882"}, true},
		{"numeric-looking string", `{"type":"string"}`, `{"error":false,"content":"85049"}`, Answer{Content: "85049"}, true},
		{"error answers skip the schema", `{"type":"object"}`, `{"error":true,"content":"Error: order not found"}`, Answer{Content: "Error: order not found", Error: true}, true},
		{"content given as JSON value", `{"type":"object","required":["a"]}`, "```json\n{\"error\":false,\"content\":{\"a\": 1}}\n```", Answer{Content: `{"a":1}`}, true},
		{"prose where an object is due", `{"type":"object"}`, `{"error":false,"content":"the order is pending"}`, Answer{}, false},
		{"missing error flag", ``, `{"content":"x"}`, Answer{}, false},
		{"not json", ``, `sure, here it is`, Answer{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 200, tt.model })
			r := simReq(`{"x":1}`)
			r.OutputSchema = json.RawMessage(tt.schema)
			a, err := NewSimulator(f.client(t), nil).Simulate(context.Background(), r)
			if tt.valid {
				if err != nil || a != tt.want {
					t.Fatalf("got %+v, %v; want %+v", a, err, tt.want)
				}
			} else if !errors.Is(err, ErrInvalidAnswer) {
				t.Fatalf("got %+v, %v; want ErrInvalidAnswer", a, err)
			}
		})
	}
}

func TestSimulateConcurrentIdenticalCallsShareOneRequest(t *testing.T) {
	release := make(chan struct{})
	f := newFakeOpenAI(t, func(n int, _ fakeRequest) (int, string) {
		<-release
		return 200, fmt.Sprintf(`{"error":false,"content":"answer %d"}`, n)
	})
	s := NewSimulator(f.client(t), nil)
	r := simReq(`{"order_id":"#W9"}`)
	r.OutputSchema = nil
	var wg sync.WaitGroup
	answers := make([]Answer, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := s.Simulate(context.Background(), r)
			if err != nil {
				t.Error(err)
			}
			answers[i] = a
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the goroutines pile onto the one in-flight request
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a != answers[0] {
			t.Fatalf("answer %d = %+v differs from %+v", i, a, answers[0])
		}
	}
	if n := len(f.requests()); n != 1 {
		t.Fatalf("model called %d times, want 1", n)
	}
}

func TestPrimedCacheReplaysWithoutModel(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 500, "must not be called" })
	cache := NewCache()
	err := cache.Prime([]Journaled{
		{StateHash: "sha256:aa", Tool: "get_order_details", Arguments: json.RawMessage(`{"order_id":"#W2"}`),
			Answer: Answer{Content: `{"order_id": "#W2", "status": "pending"}`}},
		// A later journal entry for the same key does not replace the first answer.
		{StateHash: "sha256:aa", Tool: "get_order_details", Arguments: json.RawMessage(`{"order_id": "#W2"}`),
			Answer: Answer{Content: "other"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewSimulator(f.client(t), cache).Simulate(context.Background(), simReq(`{"order_id":"#W2"}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.Content != `{"order_id": "#W2", "status": "pending"}` || len(f.requests()) != 0 {
		t.Fatalf("answer %+v after %d model calls", a, len(f.requests()))
	}
	if err := cache.Prime([]Journaled{{Tool: "t", Arguments: json.RawMessage(`{bad`)}}); err == nil {
		t.Fatal("priming with broken arguments succeeded")
	}
}

var seedEntities = []Entity{
	{Name: "orders", Key: "order_id", Schema: orderSchema, Examples: []json.RawMessage{json.RawMessage(`{"order_id":"#W1","status":"pending"}`)}},
	{Name: "users", Key: "user_id", Schema: json.RawMessage(`{"type":"object","properties":{"user_id":{"type":"string"}},"required":["user_id"]}`)},
}

type memSeedStore struct {
	mu sync.Mutex
	m  map[string]SeedResult
}

func (s *memSeedStore) GetSeed(_ context.Context, k string) (SeedResult, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[k]
	return r, ok, nil
}

func (s *memSeedStore) PutSeed(_ context.Context, k string, r SeedResult) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = r
	return nil
}

func TestSeedRowsValidatedAndStored(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) {
		return 200, `{"rows":{"orders":[{"status":"pending","order_id":"#W7","total":10.50},{"order_id":"#W8","status":"pending"}]},"note":""}`
	})
	store := &memSeedStore{m: map[string]SeedResult{}}
	s := NewSeeder(f.client(t), store)
	req := SeedRequest{Instructions: "2 pending orders", Seed: 42, Clock: "2026-01-02T03:04:05Z", Entities: seedEntities}
	res, err := s.Seed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"order_id":"#W7","status":"pending","total":10.5}`, `{"order_id":"#W8","status":"pending"}`}
	if len(res.Rows["orders"]) != 2 || string(res.Rows["orders"][0]) != want[0] || string(res.Rows["orders"][1]) != want[1] {
		t.Fatalf("rows = %s", res.Rows)
	}
	// Same request again (entities listed in another order): from the store, no model call.
	req2 := req
	req2.Entities = []Entity{seedEntities[1], seedEntities[0]}
	res2, err := s.Seed(context.Background(), req2)
	if err != nil || len(res2.Rows["orders"]) != 2 || len(f.requests()) != 1 {
		t.Fatalf("second seed: %v, %d model calls", err, len(f.requests()))
	}
	r := f.requests()[0]
	if r.Seed == nil || *r.Seed != 42 || r.ResponseFormat == nil || r.ResponseFormat.JSONSchema == nil {
		t.Fatalf("seed or schema not sent: %+v", r)
	}
	if !strings.Contains(r.Messages[0].Content, "2026-01-02T03:04:05Z") || !strings.Contains(r.Messages[1].Content, "2 pending orders") {
		t.Fatal("clock or instructions missing from the prompt")
	}
	// A different seed is a different key.
	req.Seed = 43
	if _, err := s.Seed(context.Background(), req); err != nil || len(f.requests()) != 2 {
		t.Fatalf("other seed: %v, %d model calls", err, len(f.requests()))
	}
}

func TestSeedBadAnswers(t *testing.T) {
	tests := []struct {
		name  string
		model string
		want  string
	}{
		{"row breaks schema", `{"rows":{"orders":[{"order_id":"#W7","status":"weird"}]},"note":""}`, `rows.orders[0].status`},
		{"unknown entity", `{"rows":{"planets":[{"id":1}]},"note":""}`, "rows.planets: no such entity"},
		{"missing key", `{"rows":{"users":[{}]},"note":""}`, `missing required field "user_id"`},
		{"duplicate key", `{"rows":{"users":[{"user_id":"u"},{"user_id":"u"}]},"note":""}`, "appears twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return 200, tt.model })
			_, err := NewSeeder(f.client(t), nil).Seed(context.Background(),
				SeedRequest{Instructions: "something", Entities: seedEntities})
			if !errors.Is(err, ErrInvalidAnswer) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidAnswer naming %s", err, tt.want)
			}
			if len(f.requests()) != 2 {
				t.Fatalf("%d requests, want 2 (one retry)", len(f.requests()))
			}
		})
	}
}

func TestSeedUnseedableWordsGiveNote(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) {
		return 200, `{"rows":{},"note":"there is no entity for weather"}`
	})
	res, err := NewSeeder(f.client(t), nil).Seed(context.Background(),
		SeedRequest{Instructions: "make it rain", Entities: seedEntities})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 0 || res.Note != "there is no entity for weather" {
		t.Fatalf("result = %+v", res)
	}
	// Empty instructions never reach the model.
	if _, err := NewSeeder(f.client(t), nil).Seed(context.Background(), SeedRequest{Entities: seedEntities}); err != nil || len(f.requests()) != 1 {
		t.Fatalf("empty instructions: %v, %d requests", err, len(f.requests()))
	}
}

func TestSeedPropagatesAPIError(t *testing.T) {
	f := newFakeOpenAI(t, func(int, fakeRequest) (int, string) { return http.StatusUnauthorized, "bad key" })
	_, err := NewSeeder(f.client(t), nil).Seed(context.Background(), SeedRequest{Instructions: "x", Entities: seedEntities})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("err = %v, want APIError 401", err)
	}
}

func TestTwinSimulator(t *testing.T) {
	f := newFakeOpenAI(t, func(n int, _ fakeRequest) (int, string) {
		if n == 0 {
			return 200, `{"error":false,"content":"{\"order_id\": \"#W3\", \"status\": \"pending\"}"}`
		}
		return 200, `{"error":true,"content":"order not found"}`
	})
	ts := TwinSimulator{S: NewSimulator(f.client(t), nil)}
	req := twin.SimRequest{Tool: "get_order_details", OutputSchema: orderSchema, Args: json.RawMessage(`{"order_id":"#W3"}`),
		Examples: []twin.SimExample{{Args: json.RawMessage(`{"order_id":"#W0"}`), Answer: "Error: order not found"}}}
	got, err := ts.Simulate(context.Background(), req)
	if err != nil || got != `{"order_id": "#W3", "status": "pending"}` {
		t.Fatalf("Simulate = %q, %v", got, err)
	}
	if !strings.Contains(f.requests()[0].Messages[0].Content, "error: true\n  answer: Error: order not found") {
		t.Fatal("the recorded error example is not shown as an error")
	}
	// An error answer comes back reading as one, so the twin labels it error: true.
	got, err = ts.Simulate(context.Background(), req)
	if err != nil || got != "Error: order not found" || !twin.IsErrorText(got) {
		t.Fatalf("Simulate = %q, %v", got, err)
	}
}
