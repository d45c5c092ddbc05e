package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/trace"
)

// server is a local collect endpoint: it checks the key, decodes bodies with ingest.Decode, keeps
// trace ids once (as doppel does) and fails requests as script says.
type server struct {
	t      *testing.T
	mu     sync.Mutex
	n      int            // requests seen
	ids    map[string]int // trace id -> times received in an accepted request
	sizes  []int          // traces per accepted request
	agents []string
	// script answers, for request n (from 1), a status to fail with, -1 to cut the connection,
	// or 0 to accept. hold, when set, blocks a request until it is closed.
	script func(n int) int
	hold   chan struct{}
}

func newServer(t *testing.T, script func(int) int) (*server, *httptest.Server) {
	s := &server{t: t, ids: map[string]int{}, script: script}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, hs
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/collect" || r.Method != http.MethodPost {
		http.Error(w, "no route", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.n++
	n := s.n
	s.agents = append(s.agents, r.Header.Get("User-Agent"))
	s.mu.Unlock()
	if s.hold != nil {
		select {
		case <-s.hold:
		case <-r.Context().Done():
			return
		}
	}
	if r.Header.Get("Authorization") != "Bearer mk_live_test" || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, `{"detail":"bad credential"}`, http.StatusUnauthorized)
		return
	}
	code := 0
	if s.script != nil {
		code = s.script(n)
	}
	switch {
	case code == -1:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case code == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(code)
		return
	case code != 0:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"detail":"scripted failure %d","code":"x","requestId":"req_1"}`, code)
		return
	}
	// As doppel does: traces in another format are mapped to the chat format first.
	norm, err := ingest.NormalizeBody(body)
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"detail":%q}`, err.Error())
		return
	}
	p, err := ingest.Decode(norm.Body, ingest.Options{})
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"detail":%q}`, err.Error())
		return
	}
	s.mu.Lock()
	accepted, dups := 0, 0
	for _, id := range p.TraceIDs() {
		if s.ids[id] > 0 {
			dups++
		} else {
			accepted++
		}
		s.ids[id]++
	}
	s.sizes = append(s.sizes, len(p.Batch.Traces))
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, `{"accepted":%d,"duplicates":%d,"env":%q,"batch":"sha256:x"}`, accepted, dups, p.Slug)
}

func (s *server) received() (ids map[string]int, sizes []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids = map[string]int{}
	for k, v := range s.ids {
		ids[k] = v
	}
	return ids, append([]int(nil), s.sizes...)
}

func mkTrace(id string) trace.Trace {
	q, a := "where is order 7?", `{"status":"shipped"}`
	return trace.Trace{ID: id, Model: "gpt-x", Messages: []trace.Message{
		{Role: "user", Content: &q},
		{Role: "assistant", ToolCalls: []trace.ToolCall{{ID: "c1", Type: "function", Function: trace.Function{Name: "get_order", Arguments: `{"id":7}`}}}},
		{Role: "tool", ToolCallID: "c1", Content: &a},
	}}
}

// noWait makes retries immediate and records the waits asked for.
func noWait(c *Collector) *[]time.Duration {
	var waits []time.Duration
	var mu sync.Mutex
	c.client.sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return ctx.Err()
	}
	return &waits
}

func newCollector(t *testing.T, url string, o Options) *Collector {
	t.Helper()
	o.Endpoint, o.Key = url, "mk_live_test"
	if o.Project == "" {
		o.Project = "Shop Agent"
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = time.Hour // tests flush explicitly unless they test the interval
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func addN(t *testing.T, c *Collector, prefix string, n int) {
	t.Helper()
	for i := range n {
		if err := c.Add(mkTrace(fmt.Sprintf("%s-%d", prefix, i))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBatchesAndFlush(t *testing.T) {
	s, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{})
	addN(t, c, "t", 120)
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids, sizes := s.received()
	if len(ids) != 120 {
		t.Fatalf("server has %d traces, want 120", len(ids))
	}
	if len(sizes) != 3 || sizes[0] != 50 || sizes[1] != 50 || sizes[2] != 20 {
		t.Errorf("batch sizes %v, want [50 50 20]", sizes)
	}
	st := c.Stats()
	if st.Sent != 120 || st.Accepted != 120 || st.Batches != 3 || st.Dropped != 0 || st.Retried != 0 {
		t.Errorf("stats %+v", st)
	}
	if s.agents[0] != DefaultUserAgent {
		t.Errorf("User-Agent %q", s.agents[0])
	}
}

func TestFullBatchSentWithoutFlush(t *testing.T) {
	s, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{BatchSize: 10})
	addN(t, c, "t", 25)
	waitFor(t, func() bool { _, sizes := s.received(); return len(sizes) == 2 })
	// The 5 left wait for a flush, the interval (an hour here) or Close.
	if ids, _ := s.received(); len(ids) != 20 {
		t.Fatalf("server has %d traces before Close, want 20", len(ids))
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids, sizes := s.received(); len(ids) != 25 || sizes[2] != 5 {
		t.Fatalf("after Close: %d traces, sizes %v", len(ids), sizes)
	}
	if err := c.Add(mkTrace("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close = %v, want ErrClosed", err)
	}
	if err := c.Flush(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close = %v, want ErrClosed", err)
	}
}

func TestFlushInterval(t *testing.T) {
	s, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{FlushInterval: 20 * time.Millisecond})
	addN(t, c, "t", 3)
	waitFor(t, func() bool { ids, _ := s.received(); return len(ids) == 3 })
}

func TestMaxBatchBytes(t *testing.T) {
	s, hs := newServer(t, nil)
	one := len(ingest.AppendTrace(nil, ptr(mkTrace("t-0"))))
	c := newCollector(t, hs.URL, Options{MaxBatchBytes: 3*one + 1})
	addN(t, c, "t", 7)
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, sizes := s.received(); fmt.Sprint(sizes) != "[3 3 1]" {
		t.Fatalf("batch sizes %v, want [3 3 1]", sizes)
	}
}

func ptr[T any](v T) *T { return &v }

func TestRetries(t *testing.T) {
	cases := []struct {
		name    string
		script  func(n int) int
		retries int
		// wanted outcome for one batch of 5 traces
		sent, dropped, retried int64
		requests               int
		waits                  []time.Duration
	}{
		{"recovers after 503s", func(n int) int { return map[int]int{1: 503, 2: 502}[n] }, 0, 5, 0, 2, 3, []time.Duration{500 * time.Millisecond, time.Second}},
		{"recovers after a cut connection", func(n int) int { return map[int]int{1: -1}[n] }, 0, 5, 0, 1, 2, []time.Duration{500 * time.Millisecond}},
		{"honours Retry-After", func(n int) int { return map[int]int{1: 429}[n] }, 0, 5, 0, 1, 2, []time.Duration{7 * time.Second}},
		{"drops after retries", func(int) int { return 500 }, 0, 0, 5, 2, 3, []time.Duration{500 * time.Millisecond, time.Second}},
		{"more retries", func(int) int { return 500 }, 4, 0, 5, 4, 5, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}},
		{"no retries", func(int) int { return 503 }, -1, 0, 5, 0, 1, nil},
		{"permanent 413 not retried", func(int) int { return 413 }, 0, 0, 5, 0, 1, nil},
		{"permanent 422 not retried", func(int) int { return 422 }, 0, 0, 5, 0, 1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, hs := newServer(t, tc.script)
			var drops []error
			c := newCollector(t, hs.URL, Options{Retries: tc.retries, OnDrop: func(n int, err error) { drops = append(drops, err) }})
			waits := noWait(c)
			addN(t, c, "t", 5)
			err := c.Flush(context.Background())
			st := c.Stats()
			if st.Sent != tc.sent || st.Dropped != tc.dropped || st.Retried != tc.retried {
				t.Errorf("stats %+v, want sent %d dropped %d retried %d", st, tc.sent, tc.dropped, tc.retried)
			}
			if s.n != tc.requests {
				t.Errorf("%d requests, want %d", s.n, tc.requests)
			}
			if fmt.Sprint(*waits) != fmt.Sprint(tc.waits) {
				t.Errorf("waits %v, want %v", *waits, tc.waits)
			}
			if (err != nil) != (tc.dropped > 0) || len(drops) != map[bool]int{true: 1}[tc.dropped > 0] {
				t.Errorf("Flush = %v, drops %v", err, drops)
			}
			var se *StatusError
			if tc.dropped > 0 && tc.script(1) > 0 && (!errors.As(err, &se) || se.Code != tc.script(1)) {
				t.Errorf("Flush error %v, want a StatusError %d", err, tc.script(1))
			}
			if ids, _ := s.received(); int64(len(ids)) != tc.sent {
				t.Errorf("server kept %d traces, want %d", len(ids), tc.sent)
			}
		})
	}
}

// A retry after the server stored a batch but the answer was lost must not count traces twice.
func TestRetryAfterLostAnswerIsNotCountedTwice(t *testing.T) {
	s, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{})
	noWait(c)
	addN(t, c, "t", 4)
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The same traces again, as a collector resending after a timeout would.
	addN(t, c, "t", 4)
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Accepted != 4 || st.Duplicates != 4 || st.Sent != 8 {
		t.Fatalf("stats %+v, want 4 accepted and 4 duplicates", st)
	}
	if ids, _ := s.received(); len(ids) != 4 {
		t.Fatalf("server has %d distinct traces", len(ids))
	}
}

func TestAddRejectsInvalidTrace(t *testing.T) {
	_, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{})
	bad := mkTrace("x")
	bad.Messages[2].ToolCallID = "nope"
	err := c.Add(bad)
	var ie *ingest.Error
	if !errors.As(err, &ie) || ie.Fields[0].Path != "messages[2].tool_call_id" {
		t.Fatalf("Add = %v, want a field error at messages[2].tool_call_id", err)
	}
	if c.Stats().Invalid != 1 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

func TestQueueFull(t *testing.T) {
	s, hs := newServer(t, nil)
	s.hold = make(chan struct{})
	c := newCollector(t, hs.URL, Options{BatchSize: 2, MaxQueue: 3})
	addN(t, c, "a", 2) // a full batch: the goroutine takes it and blocks on the held server
	waitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.n == 1 })
	addN(t, c, "b", 3)
	if err := c.Add(mkTrace("c")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Add on a full queue = %v", err)
	}
	close(s.hold)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Sent != 5 || st.Dropped != 1 {
		t.Fatalf("stats %+v, want 5 sent, 1 dropped", st)
	}
}

func TestCloseDeadlineDropsTheRest(t *testing.T) {
	s, hs := newServer(t, nil)
	s.hold = make(chan struct{}) // never released: the server hangs
	c := newCollector(t, hs.URL, Options{BatchSize: 2})
	addN(t, c, "t", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want the deadline", err)
	}
	if st := c.Stats(); st.Dropped != 5 || st.Sent != 0 {
		t.Fatalf("stats %+v, want all 5 dropped", st)
	}
}

func TestNewChecksOptions(t *testing.T) {
	cases := []Options{
		{Endpoint: "", Key: "k", Project: "p"},
		{Endpoint: "ftp://x", Key: "k", Project: "p"},
		{Endpoint: "http://x", Key: "", Project: "p"},
		{Endpoint: "http://x", Key: "k", Project: "!!"},
	}
	for _, o := range cases {
		if c, err := New(o); err == nil {
			c.Close(context.Background())
			t.Errorf("New(%+v) accepted", o)
		}
	}
	for in, want := range map[string]string{
		"http://h:8080":              "http://h:8080/api/collect",
		"https://h/":                 "https://h/api/collect",
		"http://h/custom/ingest":     "http://h/custom/ingest",
		"http://h:1/api/collect?x=1": "http://h:1/api/collect?x=1",
	} {
		if got, err := CollectURL(in); err != nil || got != want {
			t.Errorf("CollectURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// waitFor polls cond until it holds; the 10 s bound only keeps a broken test from hanging.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAddRawFormats: traces in the Responses and Messages shapes are checked as the server maps them and sent as
// given; one that breaks its format is refused at once and counted invalid.
func TestAddRawFormats(t *testing.T) {
	s, hs := newServer(t, nil)
	c := newCollector(t, hs.URL, Options{})
	resp := `{"id":"r1","format":"openai-responses","input":[{"role":"user","content":"where is 7?"},` +
		`{"type":"function_call","call_id":"c1","name":"get_order","arguments":"{\"id\":7}"},{"type":"function_call_output","call_id":"c1","output":"shipped"}],` +
		`"tools":[{"type":"function","name":"get_order","parameters":{"type":"object"}}]}`
	msgs := `{"id":"m1","system":"be brief","messages":[{"role":"user","content":"where is 7?"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_order","input":{"id":7}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"shipped"}]}]}`
	for _, raw := range []string{resp, msgs} {
		if err := c.AddRaw([]byte(raw)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Add(mkTrace("chat-1")); err != nil {
		t.Fatal(err)
	}
	err := c.AddRaw([]byte(`{"id":"bad","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`))
	var ie *ingest.Error
	if !errors.As(err, &ie) || ie.Fields[0].Path != "input[0].call_id" {
		t.Fatalf("a call without an id: %v", err)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids, _ := s.received()
	if len(ids) != 3 || ids["r1"] != 1 || ids["m1"] != 1 || ids["chat-1"] != 1 {
		t.Errorf("server received %v", ids)
	}
	if st := c.Stats(); st.Accepted != 3 || st.Invalid != 1 {
		t.Errorf("stats %+v", st)
	}
}
