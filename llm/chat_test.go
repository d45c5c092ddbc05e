package llm

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// scriptedChat is a local server speaking the OpenAI chat-completions protocol with tool calling: the stand-in
// for the paid model API. reply scripts the answer to the n-th request (0-based).
func scriptedChat(t *testing.T, reply func(n int, req wireChatRequest, w http.ResponseWriter)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req wireChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply(int(n.Add(1)-1), req, w)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestChatToolCalls(t *testing.T) {
	srv, _ := scriptedChat(t, func(n int, req wireChatRequest, w http.ResponseWriter) {
		if req.Model != "per-request" || len(req.Tools) != 1 || req.Tools[0].Function.Name != "get_order" {
			http.Error(w, `{"error":{"message":"bad request shape"}}`, http.StatusBadRequest)
			return
		}
		if len(req.Messages) == 3 && req.Messages[2].Role == "tool" && req.Messages[2].ToolCallID == "c1" {
			w.Write([]byte(`{"model":"per-request","choices":[{"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32}}`))
			return
		}
		w.Write([]byte(`{"model":"per-request","choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_order","arguments":"{\"order_id\":\"#W1\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`))
	})
	c, err := New(Options{BaseURL: srv.URL, Model: "default"})
	if err != nil {
		t.Fatal(err)
	}
	tools := []Tool{{Type: "function", Function: ToolFunction{Name: "get_order", Parameters: json.RawMessage(`{"type":"object"}`)}}}
	msgs := []ChatMessage{{Role: "user", Content: "where is #W1"}}
	res, err := c.Chat(context.Background(), ChatRequest{Model: "per-request", Messages: msgs, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	tc := res.Message.ToolCalls
	if len(tc) != 1 || tc[0].ID != "c1" || tc[0].Name != "get_order" || tc[0].Arguments != `{"order_id":"#W1"}` || res.Usage.PromptTokens != 20 || res.Usage.CompletionTokens != 7 {
		t.Fatalf("first turn: %+v", res)
	}
	msgs = append(msgs, res.Message, ChatMessage{Role: "tool", ToolCallID: "c1", Content: `{"status":"pending"}`})
	res, err = c.Chat(context.Background(), ChatRequest{Model: "per-request", Messages: msgs, Tools: tools})
	if err != nil || res.Message.Content != "done" || len(res.Message.ToolCalls) != 0 || res.Usage.TotalTokens != 32 || res.Attempts != 1 {
		t.Fatalf("second turn: %+v %v", res, err)
	}
}

func TestChatRetries(t *testing.T) {
	srv, n := scriptedChat(t, func(n int, _ wireChatRequest, w http.ResponseWriter) {
		if n < 2 {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`))
	})
	c, _ := New(Options{BaseURL: srv.URL, Model: "m"})
	res, err := c.Chat(context.Background(), ChatRequest{Messages: []ChatMessage{{Role: "user", Content: "hi"}}})
	if err != nil || res.Message.Content != "ok" || res.Attempts != 3 || n.Load() != 3 {
		t.Fatalf("after two 503s: %+v %v (requests %d)", res, err, n.Load())
	}

	// A 4xx is not retried and is not "unavailable".
	bad, nb := scriptedChat(t, func(int, wireChatRequest, http.ResponseWriter) {})
	bad.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nb.Add(1)
		http.Error(w, `{"error":{"message":"no such model"}}`, http.StatusNotFound)
	})
	c, _ = New(Options{BaseURL: bad.URL, Model: "m"})
	_, err = c.Chat(context.Background(), ChatRequest{Messages: []ChatMessage{{Role: "user", Content: "hi"}}})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || errors.Is(err, ErrUnavailable) || nb.Load() != 1 {
		t.Fatalf("404: %v (requests %d)", err, nb.Load())
	}
}

func TestChatEndpointDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, _ := New(Options{BaseURL: "http://" + addr + "/v1", Model: "m", Timeout: time.Second})
	_, err = c.Chat(context.Background(), ChatRequest{Messages: []ChatMessage{{Role: "user", Content: "hi"}}})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("down endpoint: %v", err)
	}

	// A hanging endpoint is cut by the per-request timeout, retried, then unavailable.
	hang, _ := scriptedChat(t, func(int, wireChatRequest, http.ResponseWriter) { time.Sleep(2 * time.Second) })
	c, _ = New(Options{BaseURL: hang.URL, Model: "m", Timeout: 100 * time.Millisecond})
	_, err = c.Chat(context.Background(), ChatRequest{Messages: []ChatMessage{{Role: "user", Content: "hi"}}})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("hanging endpoint: %v", err)
	}
}
