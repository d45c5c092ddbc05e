package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// A trace in Anthropic's Messages shape (FormatMessages):
//
//	{"id": …, "model": …, "system": "…" or [text blocks], "messages": [...], "response": {…}, "tools": [...]}
//
// system becomes the leading system message. Each message's content is a string or an array of blocks: text
// blocks make the message's text; an assistant's tool_use blocks ({id, name, input}) become its tool calls; a
// user's tool_result blocks ({tool_use_id, content}) become tool messages answering them, before any text the
// same message holds. Other blocks (thinking, images, server tools) are skipped. response, when given, is the
// Messages API's answer to the last request ({role: assistant, content: [...]}) and is appended as an assistant
// message.

type messagesTrace struct {
	ID       string            `json:"id"`
	Model    string            `json:"model"`
	System   json.RawMessage   `json:"system"`
	Messages []json.RawMessage `json:"messages"`
	Response json.RawMessage   `json:"response"`
	Tools    json.RawMessage   `json:"tools"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

func decodeMessages(raw []byte) (*trace.Trace, []ToolDef, error) {
	var mt messagesTrace
	if err := json.Unmarshal(raw, &mt); err != nil {
		return nil, nil, fieldErr("trace", "is not a Messages-shaped trace object: "+err.Error())
	}
	t := &trace.Trace{ID: mt.ID, Model: mt.Model}
	if s, ok := textOf(mt.System); !ok {
		return nil, nil, fieldErr("system", "must be a string or an array of text blocks")
	} else if s != "" {
		t.Messages = append(t.Messages, trace.Message{Role: trace.RoleSystem, Content: str(s)})
	}
	msgs := mt.Messages
	if r := bytes.TrimSpace(mt.Response); len(r) > 0 && string(r) != "null" {
		msgs = append(msgs[:len(msgs):len(msgs)], r)
	}
	b := chatBuilder{t: t}
	for i, m := range msgs {
		path := fmt.Sprintf("messages[%d]", i)
		if i == len(mt.Messages) {
			path = "response"
		}
		if err := b.anthropicMessage(m, path); err != nil {
			return nil, nil, err
		}
	}
	tools, err := ParseTools(mt.Tools, "tools")
	if err != nil {
		return nil, nil, err
	}
	return t, tools, nil
}

func (b *chatBuilder) anthropicMessage(raw json.RawMessage, path string) error {
	var m anthropicMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fieldErr(path, "must be a message object")
	}
	if path == "response" && m.Role == "" {
		m.Role = trace.RoleAssistant
	}
	role, err := chatRole(m.Role, path+".role")
	if err != nil {
		return err
	}
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || c[0] != '[' {
		text, ok := textOf(c)
		if !ok {
			return fieldErr(path+".content", "must be a string or an array of content blocks")
		}
		b.message(role, str(text))
		return nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(c, &blocks); err != nil {
		return fieldErr(path+".content", "must be a string or an array of content blocks")
	}
	var text strings.Builder
	hasText := false
	for j, bl := range blocks {
		bpath := fmt.Sprintf("%s.content[%d]", path, j)
		switch bl.Type {
		case "text":
			text.WriteString(bl.Text)
			hasText = true
		case "tool_result":
			if bl.ToolUseID == "" {
				return fieldErr(bpath+".tool_use_id", "is required on a tool_result block")
			}
			b.answer(bl.ToolUseID, resultString(bl.Content))
		}
	}
	if role == trace.RoleAssistant {
		var content *string
		if hasText {
			content = str(text.String())
		}
		b.message(trace.RoleAssistant, content)
		for j, bl := range blocks {
			if bl.Type != "tool_use" {
				continue
			}
			bpath := fmt.Sprintf("%s.content[%d]", path, j)
			if bl.ID == "" {
				return fieldErr(bpath+".id", "is required on a tool_use block")
			}
			if bl.Name == "" {
				return fieldErr(bpath+".name", "is required on a tool_use block")
			}
			b.call(bl.ID, bl.Name, argsString(bl.Input))
		}
		if content == nil && len(b.t.Messages[len(b.t.Messages)-1].ToolCalls) == 0 {
			b.t.Messages[len(b.t.Messages)-1].Content = str("") // an empty answer (only thinking, say)
		}
		return nil
	}
	if hasText {
		b.message(role, str(text.String()))
	}
	return nil
}
