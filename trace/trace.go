// Package trace holds the collected-trace format of spec §2.7 and the pairing of tool calls with their answers.
package trace

import (
	"bytes"
	"encoding/json"
)

// Roles a message may carry.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Batch is the body of POST /api/collect: one project's traces.
type Batch struct {
	Project string  `json:"project"`
	Traces  []Trace `json:"traces"`
}

// Trace is one recorded conversation of an agent.
type Trace struct {
	ID       string    `json:"id"`
	Model    string    `json:"model,omitempty"`
	Messages []Message `json:"messages"`
}

// Message is one OpenAI-style chat message.
// Content is nil on an assistant message that only carries tool calls.
type Message struct {
	Role       string     `json:"role"`
	Content    *string    `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
}

// ToolCall is one call an assistant message asks for.
type ToolCall struct {
	ID       string   `json:"id"`
	Type     string   `json:"type,omitempty"`
	Function Function `json:"function"`
}

// Function names the tool and carries its arguments as a string holding JSON.
type Function struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Call is a tool call paired with the tool message that answered it.
type Call struct {
	TraceID string
	// Index is the call's position among the trace's calls, from 0.
	Index int
	ID    string
	Tool  string
	// RawArgs is the arguments string as recorded; Args is it decoded, nil when it is not a JSON object.
	RawArgs string
	Args    map[string]any
	// Answered is false when no tool message answered the call.
	Answered bool
	Result   string
}

// Calls pairs every tool call in t with its answer, in call order.
// A call nobody answered is kept with Answered false; answers to unknown ids are dropped.
func Calls(t Trace) []Call {
	calls := RawCalls(t)
	for i := range calls {
		calls[i].Args = DecodeArgs(calls[i].RawArgs)
	}
	return calls
}

// RawCalls is Calls without Args decoded, for readers that parse RawArgs their own way (a large build's
// encoding/json decoding of every call's arguments was a tenth of its allocations, and went unread).
func RawCalls(t Trace) []Call {
	var calls []Call
	pos := map[string]int{}
	for _, m := range t.Messages {
		switch m.Role {
		case RoleAssistant:
			for _, tc := range m.ToolCalls {
				c := Call{TraceID: t.ID, Index: len(calls), ID: tc.ID, Tool: tc.Function.Name, RawArgs: tc.Function.Arguments}
				pos[tc.ID] = len(calls)
				calls = append(calls, c)
			}
		case RoleTool:
			i, ok := pos[m.ToolCallID]
			if !ok || calls[i].Answered {
				continue
			}
			calls[i].Answered = true
			if m.Content != nil {
				calls[i].Result = *m.Content
			}
		}
	}
	return calls
}

// DecodeArgs decodes an arguments string into an object, keeping numbers as json.Number so their
// spelling survives; it answers nil when the string is not a JSON object.
func DecodeArgs(raw string) map[string]any {
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	var args map[string]any
	if dec.Decode(&args) != nil || dec.More() {
		return nil
	}
	return args
}
