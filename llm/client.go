// Package llm talks to an OpenAI-compatible chat-completions endpoint: the simulate rung and model seeding.
package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Options configure a Client; the lead's cmd/ fills them from config's model.* keys.
type Options struct {
	BaseURL    string        // e.g. https://api.openai.com/v1; requests go to BaseURL + "/chat/completions"
	APIKey     string        // sent as a Bearer token when set
	Model      string        // model name sent with every request
	Timeout    time.Duration // limit of one request; 0 means 30s
	HTTPClient *http.Client  // nil means a client of its own
}

// Client sends chat-completion requests. It is safe for concurrent use.
type Client struct {
	url     string
	key     string
	model   string
	timeout time.Duration
	hc      *http.Client
}

// New checks o and returns a Client. BaseURL and Model are required.
func New(o Options) (*Client, error) {
	if strings.TrimSpace(o.BaseURL) == "" {
		return nil, errors.New("model.base_url: empty; no model endpoint configured")
	}
	if !strings.HasPrefix(o.BaseURL, "http://") && !strings.HasPrefix(o.BaseURL, "https://") {
		return nil, fmt.Errorf("model.base_url: %q is not an http(s) URL", o.BaseURL)
	}
	if strings.TrimSpace(o.Model) == "" {
		return nil, errors.New("model.name: empty; the endpoint needs a model name")
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("model.timeout: %s is negative", o.Timeout)
	}
	c := &Client{
		url:     strings.TrimRight(o.BaseURL, "/") + "/chat/completions",
		key:     o.APIKey,
		model:   o.Model,
		timeout: o.Timeout,
		hc:      o.HTTPClient,
	}
	if c.timeout == 0 {
		c.timeout = 30 * time.Second
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	return c, nil
}

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ResponseFormat asks for JSON output: Type "json_object", or "json_schema" with Schema.
type ResponseFormat struct {
	Type       string      `json:"type"`
	JSONSchema *JSONSchema `json:"json_schema,omitempty"`
}

// JSONSchema names a schema for structured output.
type JSONSchema struct {
	Name   string          `json:"name"`
	Schema json.RawMessage `json:"schema"`
	Strict bool            `json:"strict"`
}

// Request is one chat-completion request. Temperature is always sent (0 unless set) so answers are as
// repeatable as the endpoint allows; Seed is forwarded to endpoints that honour it.
type Request struct {
	Messages       []Message
	ResponseFormat *ResponseFormat
	Temperature    float64
	Seed           *int64
	MaxTokens      int
}

type wireRequest struct {
	Model          string          `json:"model"`
	Messages       []Message       `json:"messages"`
	Temperature    float64         `json:"temperature"`
	Seed           *int64          `json:"seed,omitempty"`
	MaxTokens      int             `json:"max_tokens,omitempty"`
	ResponseFormat *ResponseFormat `json:"response_format,omitempty"`
}

type wireResponse struct {
	Choices []struct {
		Message struct {
			Content *string `json:"content"`
			Refusal *string `json:"refusal"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// APIError is a non-2xx answer from the endpoint.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("model endpoint answered %d: %s", e.Status, e.Message)
}

// ErrNoAnswer means the endpoint answered 2xx without usable message content (refusal, empty choices,
// truncated output).
var ErrNoAnswer = errors.New("model gave no answer")

// Complete sends r and returns the first choice's message content.
func (c *Client) Complete(ctx context.Context, r Request) (string, error) {
	body, err := json.Marshal(wireRequest{
		Model:          c.model,
		Messages:       r.Messages,
		Temperature:    r.Temperature,
		Seed:           r.Seed,
		MaxTokens:      r.MaxTokens,
		ResponseFormat: r.ResponseFormat,
	})
	if err != nil {
		return "", fmt.Errorf("encode chat request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("chat request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("chat request to %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", fmt.Errorf("read chat response: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return "", &APIError{Status: resp.StatusCode, Message: errorMessage(raw)}
	}
	var wr wireResponse
	if err := json.Unmarshal(raw, &wr); err != nil {
		return "", fmt.Errorf("decode chat response: %w", err)
	}
	if len(wr.Choices) == 0 {
		return "", fmt.Errorf("%w: no choices", ErrNoAnswer)
	}
	ch := wr.Choices[0]
	if ch.Message.Refusal != nil && *ch.Message.Refusal != "" {
		return "", fmt.Errorf("%w: refused: %s", ErrNoAnswer, *ch.Message.Refusal)
	}
	if ch.Message.Content == nil || *ch.Message.Content == "" {
		return "", fmt.Errorf("%w: empty content (finish_reason %q)", ErrNoAnswer, ch.FinishReason)
	}
	if ch.FinishReason == "length" {
		return "", fmt.Errorf("%w: output truncated at max_tokens", ErrNoAnswer)
	}
	return *ch.Message.Content, nil
}

// errorMessage pulls {"error":{"message":…}} out of an error body, or returns the body's start.
func errorMessage(raw []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
