package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/doppel-dev/doppel/trace"
)

// A trace in the OpenAI Responses API's shape (FormatResponses):
//
//	{"id": …, "model": …, "instructions": "…", "input": "…" or [items], "output": [items], "tools": [...]}
//
// Items, in order, become chat messages: a message item (type "message", or no type with a role) becomes a
// message of its role (developer counts as system; content a string or input_text/output_text parts); a
// function_call item ({call_id, name, arguments}) becomes a tool call of the assistant message just before it
// (a new assistant message when there is none); a function_call_output item ({call_id, output}) becomes the
// tool message answering it. Other items (reasoning, built-in tool calls) carry nothing of the agent's own tools
// and are skipped. instructions become the leading system message.

type responsesTrace struct {
	ID           string          `json:"id"`
	Model        string          `json:"model"`
	Instructions json.RawMessage `json:"instructions"`
	Input        json.RawMessage `json:"input"`
	Output       json.RawMessage `json:"output"`
	Tools        json.RawMessage `json:"tools"`
}

type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ID        string          `json:"id"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

func decodeResponses(raw []byte) (*trace.Trace, []ToolDef, error) {
	var rt responsesTrace
	if err := json.Unmarshal(raw, &rt); err != nil {
		return nil, nil, fieldErr("trace", "is not a Responses-shaped trace object: "+err.Error())
	}
	t := &trace.Trace{ID: rt.ID, Model: rt.Model}
	if s, ok := textOf(rt.Instructions); !ok {
		return nil, nil, fieldErr("instructions", "must be a string or an array of text parts")
	} else if s != "" {
		t.Messages = append(t.Messages, trace.Message{Role: trace.RoleSystem, Content: str(s)})
	}
	b := chatBuilder{t: t}
	for _, side := range []struct {
		name string
		raw  json.RawMessage
	}{{"input", rt.Input}, {"output", rt.Output}} {
		v := bytes.TrimSpace(side.raw)
		if len(v) == 0 || string(v) == "null" {
			continue
		}
		if v[0] == '"' {
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, nil, fieldErr(side.name, "must be a string or an array of items")
			}
			b.message(trace.RoleUser, str(s))
			continue
		}
		var items []json.RawMessage
		if err := json.Unmarshal(v, &items); err != nil {
			return nil, nil, fieldErr(side.name, "must be a string or an array of items")
		}
		for i, item := range items {
			if err := b.responsesItem(item, fmt.Sprintf("%s[%d]", side.name, i)); err != nil {
				return nil, nil, err
			}
		}
	}
	tools, err := ParseTools(rt.Tools, "tools")
	if err != nil {
		return nil, nil, err
	}
	return t, tools, nil
}

func (b *chatBuilder) responsesItem(raw json.RawMessage, path string) error {
	var it responsesItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return fieldErr(path, "must be an item object")
	}
	switch it.Type {
	case "message", "":
		if it.Role == "" {
			if it.Type == "" {
				return fieldErr(path+".type", "is required: message, function_call or function_call_output")
			}
			return fieldErr(path+".role", "is required on a message item")
		}
		role, err := chatRole(it.Role, path+".role")
		if err != nil {
			return err
		}
		text, ok := textOf(it.Content)
		if !ok {
			return fieldErr(path+".content", "must be a string or an array of content parts")
		}
		b.message(role, str(text))
	case "function_call":
		id := it.CallID
		if id == "" {
			id = it.ID
		}
		if id == "" {
			return fieldErr(path+".call_id", "is required on a function_call item")
		}
		if it.Name == "" {
			return fieldErr(path+".name", "is required on a function_call item")
		}
		b.call(id, it.Name, argsString(it.Arguments))
	case "function_call_output":
		if it.CallID == "" {
			return fieldErr(path+".call_id", "is required on a function_call_output item")
		}
		b.answer(it.CallID, resultString(it.Output))
	}
	return nil
}

// chatRole maps a role a format names to a chat role: developer is system; roles chat has are themselves.
func chatRole(role, path string) (string, error) {
	switch role {
	case "developer", trace.RoleSystem:
		return trace.RoleSystem, nil
	case trace.RoleUser, trace.RoleAssistant, trace.RoleTool:
		return role, nil
	}
	return "", fieldErr(path, "must be one of system, developer, user, assistant; got "+quote(role))
}

// chatBuilder appends chat messages to a trace as a format's items are read.
type chatBuilder struct {
	t *trace.Trace
	// open is true while the last message is an assistant message a following tool call may join.
	open bool
}

// message appends a message of role; an assistant message stays open to the tool calls that follow it.
func (b *chatBuilder) message(role string, content *string) {
	b.t.Messages = append(b.t.Messages, trace.Message{Role: role, Content: content})
	b.open = role == trace.RoleAssistant
}

// call adds a tool call to the open assistant message, or to a new one.
func (b *chatBuilder) call(id, name, args string) {
	if !b.open {
		b.t.Messages = append(b.t.Messages, trace.Message{Role: trace.RoleAssistant})
		b.open = true
	}
	m := &b.t.Messages[len(b.t.Messages)-1]
	m.ToolCalls = append(m.ToolCalls, trace.ToolCall{ID: id, Type: "function", Function: trace.Function{Name: name, Arguments: args}})
}

// answer appends the tool message answering call id.
func (b *chatBuilder) answer(id, content string) {
	b.t.Messages = append(b.t.Messages, trace.Message{Role: trace.RoleTool, ToolCallID: id, Content: str(content)})
	b.open = false
}
