package llm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeOpenAI is a local HTTP server speaking the OpenAI chat-completions protocol. It stands in for a paid
// model API (the one outside service tests may not reach); the test scripts what "the model" says.
type fakeOpenAI struct {
	*httptest.Server
	mu    sync.Mutex
	reqs  []fakeRequest
	reply func(n int, r fakeRequest) (status int, content string) // n: 0-based request count
}

type fakeRequest struct {
	Auth           string
	Model          string          `json:"model"`
	Messages       []Message       `json:"messages"`
	Temperature    *float64        `json:"temperature"`
	Seed           *int64          `json:"seed"`
	ResponseFormat *ResponseFormat `json:"response_format"`
}

func newFakeOpenAI(t *testing.T, reply func(n int, r fakeRequest) (int, string)) *fakeOpenAI {
	t.Helper()
	f := &fakeOpenAI{reply: reply}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"no such route"}}`, http.StatusNotFound)
		return
	}
	var fr fakeRequest
	if err := json.NewDecoder(r.Body).Decode(&fr); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":%q}}`, err.Error())
		return
	}
	fr.Auth = r.Header.Get("Authorization")
	f.mu.Lock()
	n := len(f.reqs)
	f.reqs = append(f.reqs, fr)
	f.mu.Unlock()
	status, content := f.reply(n, fr)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status != http.StatusOK {
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error"}}`, content)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id":      fmt.Sprintf("chatcmpl-%d", n),
		"object":  "chat.completion",
		"model":   fr.Model,
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": content}}},
		"usage":   map[string]any{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
	})
}

func (f *fakeOpenAI) requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.reqs...)
}

func (f *fakeOpenAI) client(t *testing.T) *Client {
	t.Helper()
	c, err := New(Options{BaseURL: f.URL + "/v1", APIKey: "sk-test", Model: "gpt-test"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
