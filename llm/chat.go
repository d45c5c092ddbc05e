package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// ChatMessage is one message of a tool-calling conversation, in the OpenAI chat-completions shape: an assistant
// message may carry ToolCalls (Content then may be empty), a tool message answers one by ToolCallID.
type ChatMessage struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is a call the model asks for: Arguments is JSON text, as the model wrote it.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// MarshalJSON writes the OpenAI shape {id, type: "function", function: {name, arguments}}.
func (c ToolCall) MarshalJSON() ([]byte, error) {
	w := wireToolCall{ID: c.ID, Type: "function"}
	w.Function.Name, w.Function.Arguments = c.Name, c.Arguments
	return json.Marshal(w)
}

// UnmarshalJSON reads the OpenAI shape.
func (c *ToolCall) UnmarshalJSON(b []byte) error {
	var w wireToolCall
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*c = ToolCall{ID: w.ID, Name: w.Function.Name, Arguments: w.Function.Arguments}
	return nil
}

// Tool is a function the model may call: the OpenAI tools= entry {type: "function", function: {name,
// description, parameters}}.
type Tool struct {
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction describes one callable function.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Usage counts a request's tokens as the endpoint reports them.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// ChatRequest is one tool-calling chat request. Model overrides the client's model when set.
type ChatRequest struct {
	Model       string
	Messages    []ChatMessage
	Tools       []Tool
	Temperature float64
	Seed        *int64
	MaxTokens   int
}

// ChatResponse is the model's next message (text, tool calls or both), the model that answered and the usage.
type ChatResponse struct {
	Message      ChatMessage
	Model        string
	FinishReason string
	Usage        Usage
	// Attempts is how many requests it took (retries included).
	Attempts int
}

type wireChatRequest struct {
	Model       string        `json:"model"`
	Messages    []ChatMessage `json:"messages"`
	Tools       []Tool        `json:"tools,omitempty"`
	Temperature float64       `json:"temperature"`
	Seed        *int64        `json:"seed,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
}

type wireChatResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string    `json:"content"`
			Refusal   *string    `json:"refusal"`
			ToolCalls []ToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage Usage `json:"usage"`
}

// ErrUnavailable wraps a failure to get an answer from the endpoint after retries: it is down, unreachable,
// timing out, rate limiting or answering 5xx. Other failures (a 4xx, a malformed answer) are not retried.
var ErrUnavailable = errors.New("model endpoint unavailable")

// Retries of Chat: up to chatTries requests, waiting chatBackoff, doubling (with jitter), between them; a
// Retry-After the endpoint sends (429, 503) is honoured up to chatMaxWait.
const (
	chatTries   = 3
	chatBackoff = 250 * time.Millisecond
	chatMaxWait = 10 * time.Second
)

// Chat sends a tool-calling chat request and answers the model's next message. Each attempt is bounded by the
// client's timeout; a down, slow, rate-limiting or 5xx endpoint is retried with exponential backoff and then
// answered with an error wrapping ErrUnavailable (and the last APIError, if any).
func (c *Client) Chat(ctx context.Context, r ChatRequest) (ChatResponse, error) {
	model := r.Model
	if model == "" {
		model = c.model
	}
	body, err := json.Marshal(wireChatRequest{Model: model, Messages: r.Messages, Tools: r.Tools,
		Temperature: r.Temperature, Seed: r.Seed, MaxTokens: r.MaxTokens})
	if err != nil {
		return ChatResponse{}, fmt.Errorf("encode chat request: %w", err)
	}
	attempts := 0
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = chatBackoff, chatMaxWait
	out, err := backoff.Retry(ctx, func() (ChatResponse, error) {
		attempts++
		return c.chatOnce(ctx, body)
	}, backoff.WithBackOff(b), backoff.WithMaxTries(chatTries), backoff.WithMaxElapsedTime(0))
	out.Attempts = attempts
	var ae *APIError
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &ae) && !retryableStatus(ae.Status):
		return out, err
	case errors.Is(err, ErrNoAnswer), ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded):
		return out, err
	}
	return out, fmt.Errorf("%w after %d attempts: %w", ErrUnavailable, attempts, err)
}

func retryableStatus(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500
}

// chatOnce sends one request; errors that a retry cannot help are backoff.Permanent.
func (c *Client) chatOnce(ctx context.Context, body []byte) (ChatResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return ChatResponse{}, backoff.Permanent(fmt.Errorf("chat request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return ChatResponse{}, fmt.Errorf("chat request to %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return ChatResponse{}, fmt.Errorf("read chat response: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Status: resp.StatusCode, Message: errorMessage(raw)}
		if !retryableStatus(resp.StatusCode) {
			return ChatResponse{}, backoff.Permanent(ae)
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && time.Duration(s)*time.Second <= chatMaxWait {
			return ChatResponse{}, backoff.RetryAfter(s)
		}
		return ChatResponse{}, ae
	}
	var wr wireChatResponse
	if err := json.Unmarshal(raw, &wr); err != nil {
		return ChatResponse{}, backoff.Permanent(fmt.Errorf("%w: decode chat response: %w", ErrNoAnswer, err))
	}
	if len(wr.Choices) == 0 {
		return ChatResponse{}, backoff.Permanent(fmt.Errorf("%w: no choices", ErrNoAnswer))
	}
	ch := wr.Choices[0]
	if ch.Message.Refusal != nil && *ch.Message.Refusal != "" {
		return ChatResponse{}, backoff.Permanent(fmt.Errorf("%w: refused: %s", ErrNoAnswer, *ch.Message.Refusal))
	}
	msg := ChatMessage{Role: "assistant", ToolCalls: ch.Message.ToolCalls}
	if ch.Message.Content != nil {
		msg.Content = *ch.Message.Content
	}
	if msg.Content == "" && len(msg.ToolCalls) == 0 {
		return ChatResponse{}, backoff.Permanent(fmt.Errorf("%w: neither text nor tool calls (finish_reason %q)", ErrNoAnswer, ch.FinishReason))
	}
	return ChatResponse{Message: msg, Model: wr.Model, FinishReason: ch.FinishReason, Usage: wr.Usage}, nil
}

// Model is the client's default model name.
func (c *Client) Model() string { return c.model }
