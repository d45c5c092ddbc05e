package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// The messages a model-call span records, in each convention that records them. Each reader answers the span's
// input messages (system instructions first), its output messages, and whether the span used the convention.

// chatSpanMessages reads a chat span's messages: the GenAI attributes, else OpenInference's, else the older
// GenAI forms (OpenLLMetry's flattened gen_ai.prompt.N attributes, the gen_ai.content.prompt events).
func chatSpanMessages(s *Span) (in, out []trace.Message, err error) {
	for _, read := range []func(*Span) ([]trace.Message, []trace.Message, bool, error){
		genaiSpanMessages, openInferenceMessages, flatPromptMessages, eventMessages,
	} {
		in, out, ok, err := read(s)
		if err != nil || ok {
			return in, out, err
		}
	}
	return nil, nil, nil
}

// genaiSpanMessages reads gen_ai.system_instructions, gen_ai.input.messages and gen_ai.output.messages
// (OpenTelemetry GenAI conventions: messages of typed parts).
func genaiSpanMessages(s *Span) (in, out []trace.Message, ok bool, err error) {
	rawIn, rawOut, rawSys := s.Attrs[attrInputMessages], s.Attrs[attrOutputMessages], s.Attrs[attrSystem]
	if rawIn == nil && rawOut == nil && rawSys == nil {
		return nil, nil, false, nil
	}
	if rawSys != nil {
		text, ok := textOf(jsonAttr(rawSys))
		if !ok {
			return nil, nil, true, fieldErr(attrSystem, "must be an array of text parts or a string")
		}
		if text != "" {
			in = append(in, trace.Message{Role: trace.RoleSystem, Content: str(text)})
		}
	}
	msgs, err := genaiMessages(rawIn, attrInputMessages)
	if err != nil {
		return nil, nil, true, err
	}
	in = append(in, msgs...)
	if out, err = genaiMessages(rawOut, attrOutputMessages); err != nil {
		return nil, nil, true, err
	}
	return in, firstChoice(out), true, nil
}

// firstChoice keeps the first of several output messages: each is one choice, and an agent goes on with one.
func firstChoice(out []trace.Message) []trace.Message {
	if len(out) > 1 {
		return out[:1]
	}
	return out
}

type genaiMessage struct {
	Role  string      `json:"role"`
	Parts []genaiPart `json:"parts"`
	Name  string      `json:"name"`
}

type genaiPart struct {
	Type      string          `json:"type"`
	Content   json.RawMessage `json:"content"`
	ID        *string         `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Response  json.RawMessage `json:"response"`
	Result    json.RawMessage `json:"result"`
}

// genaiMessages maps GenAI messages ({role, parts}) to chat messages: text parts make the text; tool_call parts
// ({id, name, arguments}) the tool calls of an assistant message; tool_call_response parts ({id, response}) one
// tool message each, whatever the message's role. Other parts (media, reasoning, server tools) are skipped.
func genaiMessages(raw json.RawMessage, name string) ([]trace.Message, error) {
	raw = jsonAttr(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var msgs []genaiMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fieldErr(name, "must be an array of messages {role, parts}: "+err.Error())
	}
	var out []trace.Message
	for i, m := range msgs {
		if len(m.Parts) == 0 {
			continue // content not captured
		}
		role := m.Role
		if role == "model" {
			role = trace.RoleAssistant // Gemini's name
		}
		var text strings.Builder
		hasText := false
		var calls []trace.ToolCall
		for j, p := range m.Parts {
			switch p.Type {
			case "text":
				s, _ := textOf(p.Content)
				text.WriteString(s)
				hasText = true
			case "tool_call":
				if p.Name == "" {
					return nil, fieldErr(fmt.Sprintf("%s[%d].parts[%d].name", name, i, j), "is required on a tool_call part")
				}
				id := ""
				if p.ID != nil {
					id = strings.TrimSpace(*p.ID)
				}
				calls = append(calls, trace.ToolCall{ID: id, Type: "function", Function: trace.Function{Name: p.Name, Arguments: argsString(p.Arguments)}})
			case "tool_call_response":
				id := ""
				if p.ID != nil {
					id = strings.TrimSpace(*p.ID)
				}
				resp := p.Response
				if resp == nil {
					resp = p.Result
				}
				out = append(out, trace.Message{Role: trace.RoleTool, ToolCallID: id, Content: str(resultString(resp))})
			}
		}
		switch {
		case len(calls) > 0 || role == trace.RoleAssistant:
			var content *string
			if hasText || len(calls) == 0 {
				content = str(text.String())
			}
			out = append(out, trace.Message{Role: trace.RoleAssistant, Content: content, ToolCalls: calls})
		case hasText:
			r, err := chatRole(role, fmt.Sprintf("%s[%d].role", name, i))
			if err != nil {
				return nil, err
			}
			if r == trace.RoleTool {
				r = trace.RoleUser // text in a tool message answers no call: keep it as the user's
			}
			out = append(out, trace.Message{Role: r, Content: str(text.String())})
		}
	}
	return out, nil
}

// openInferenceMessages reads OpenInference's flattened llm.input_messages.N.message.* and
// llm.output_messages.N.message.* attributes.
func openInferenceMessages(s *Span) (in, out []trace.Message, ok bool, err error) {
	ins, outs := flat(s.Attrs, attrOIInput), flat(s.Attrs, attrOIOutput)
	if len(ins) == 0 && len(outs) == 0 {
		return nil, nil, false, nil
	}
	for i, m := range ins {
		msg, err := oiMessage(m, fmt.Sprintf("%s%d", attrOIInput, i))
		if err != nil {
			return nil, nil, true, err
		}
		in = append(in, msg)
	}
	for i, m := range outs {
		msg, err := oiMessage(m, fmt.Sprintf("%s%d", attrOIOutput, i))
		if err != nil {
			return nil, nil, true, err
		}
		out = append(out, msg)
	}
	return in, firstChoice(out), true, nil
}

func oiMessage(m map[string]json.RawMessage, path string) (trace.Message, error) {
	role, err := chatRole(attrStr(m["message.role"]), path+".message.role")
	if err != nil {
		return trace.Message{}, err
	}
	msg := trace.Message{Role: role, ToolCallID: attrStr(m["message.tool_call_id"]), Name: attrStr(m["message.name"])}
	if role != trace.RoleTool {
		msg.Name = ""
	}
	text, hasText := "", false
	if c, ok := m["message.content"]; ok {
		text, hasText = attrStr(c), true
	} else if parts := flat(m, "message.contents."); len(parts) > 0 {
		var b strings.Builder
		for _, p := range parts {
			if t := attrStr(p["message_content.type"]); t == "text" || t == "" {
				b.WriteString(attrStr(p["message_content.text"]))
				hasText = true
			}
		}
		text = b.String()
	}
	for k, c := range flat(m, "message.tool_calls.") {
		name := attrStr(c["tool_call.function.name"])
		if name == "" {
			return trace.Message{}, fieldErr(fmt.Sprintf("%s.message.tool_calls.%d.tool_call.function.name", path, k), "is required")
		}
		msg.ToolCalls = append(msg.ToolCalls, trace.ToolCall{ID: attrStr(c["tool_call.id"]), Type: "function",
			Function: trace.Function{Name: name, Arguments: argsString(c["tool_call.function.arguments"])}})
	}
	if hasText || len(msg.ToolCalls) == 0 {
		msg.Content = str(text)
	}
	return msg, nil
}

// flatPromptMessages reads OpenLLMetry's flattened gen_ai.prompt.N.* and gen_ai.completion.N.* attributes
// (role, content, tool_call_id, tool_calls.M.{id, name, arguments}).
func flatPromptMessages(s *Span) (in, out []trace.Message, ok bool, err error) {
	ins, outs := flat(s.Attrs, attrPromptPrefix), flat(s.Attrs, attrComplPrefix)
	if len(ins) == 0 && len(outs) == 0 {
		return nil, nil, false, nil
	}
	read := func(list []map[string]json.RawMessage, prefix string) ([]trace.Message, error) {
		var msgs []trace.Message
		for i, m := range list {
			role := attrStr(m["role"])
			if role == "" {
				role = trace.RoleAssistant
				if prefix == attrPromptPrefix {
					role = trace.RoleUser
				}
			}
			r, err := chatRole(role, fmt.Sprintf("%s%d.role", prefix, i))
			if err != nil {
				return nil, err
			}
			msg := trace.Message{Role: r, ToolCallID: attrStr(m["tool_call_id"])}
			for k, c := range flat(m, "tool_calls.") {
				name := attrStr(c["name"])
				if name == "" {
					return nil, fieldErr(fmt.Sprintf("%s%d.tool_calls.%d.name", prefix, i, k), "is required")
				}
				msg.ToolCalls = append(msg.ToolCalls, trace.ToolCall{ID: attrStr(c["id"]), Type: "function",
					Function: trace.Function{Name: name, Arguments: argsString(c["arguments"])}})
			}
			if c, has := m["content"]; has || len(msg.ToolCalls) == 0 {
				text, _ := textOf(jsonAttr(c))
				msg.Content = str(text)
			}
			msgs = append(msgs, msg)
		}
		return msgs, nil
	}
	if in, err = read(ins, attrPromptPrefix); err != nil {
		return nil, nil, true, err
	}
	if out, err = read(outs, attrComplPrefix); err != nil {
		return nil, nil, true, err
	}
	return in, firstChoice(out), true, nil
}

// eventMessages reads the gen_ai.content.prompt and gen_ai.content.completion events, whose gen_ai.prompt and
// gen_ai.completion attributes hold the request's and the answer's messages as JSON (OpenAI chat messages).
func eventMessages(s *Span) (in, out []trace.Message, ok bool, err error) {
	for _, e := range s.Events {
		var key string
		var dst *[]trace.Message
		switch e.Name {
		case eventPrompt:
			key, dst = attrPromptEvent, &in
		case eventCompletion:
			key, dst = attrComplEvent, &out
		default:
			continue
		}
		ok = true
		msgs, err := chatMessagesJSON(e.Attrs[key], e.Name+"."+key)
		if err != nil {
			return nil, nil, true, err
		}
		*dst = append(*dst, msgs...)
	}
	return in, firstChoice(out), ok, nil
}

// chatMessagesJSON reads messages given as JSON in the chat format ({role, content, tool_calls, tool_call_id}),
// an object holding them ({"messages": [...]}), or OpenAI choices ({"message": {...}}); a bare string is one
// user message.
func chatMessagesJSON(raw json.RawMessage, name string) ([]trace.Message, error) {
	raw = jsonAttr(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		return []trace.Message{{Role: trace.RoleUser, Content: str(attrStr(raw))}}, nil
	}
	if raw[0] == '{' {
		var wrap struct {
			Messages json.RawMessage `json:"messages"`
			Choices  json.RawMessage `json:"choices"`
			Message  json.RawMessage `json:"message"`
			Role     string          `json:"role"`
		}
		if json.Unmarshal(raw, &wrap) != nil {
			return nil, fieldErr(name, "must be JSON messages")
		}
		switch {
		case wrap.Messages != nil:
			raw = wrap.Messages
		case wrap.Choices != nil:
			raw = wrap.Choices
		case wrap.Message != nil:
			raw = append(append(json.RawMessage{'['}, wrap.Message...), ']')
		default:
			raw = append(append(json.RawMessage{'['}, raw...), ']')
		}
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fieldErr(name, "must be an array of messages")
	}
	t := trace.Trace{}
	b := chatBuilder{t: &t}
	for i, it := range items {
		var m struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			Message    json.RawMessage `json:"message"`
			ToolCallID string          `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		}
		if json.Unmarshal(it, &m) != nil {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", name, i), "must be a message object")
		}
		if m.Message != nil && m.Role == "" { // a choice
			more, err := chatMessagesJSON(m.Message, fmt.Sprintf("%s[%d].message", name, i))
			if err != nil {
				return nil, err
			}
			t.Messages = append(t.Messages, more...)
			b.open = false
			continue
		}
		if c := bytes.TrimSpace(m.Content); len(c) > 0 && c[0] == '[' && m.Role != trace.RoleTool && len(m.ToolCalls) == 0 {
			if err := b.anthropicMessage(it, fmt.Sprintf("%s[%d]", name, i)); err != nil {
				return nil, err
			}
			continue
		}
		role, err := chatRole(m.Role, fmt.Sprintf("%s[%d].role", name, i))
		if err != nil {
			return nil, err
		}
		if role == trace.RoleTool {
			b.answer(m.ToolCallID, resultString(m.Content))
			continue
		}
		text, _ := textOf(m.Content)
		var content *string
		if text != "" || len(m.ToolCalls) == 0 {
			content = str(text)
		}
		b.message(role, content)
		for _, tc := range m.ToolCalls {
			b.call(tc.ID, tc.Function.Name, argsString(tc.Function.Arguments))
		}
	}
	return t.Messages, nil
}

// spanToolDefs reads the tool definitions a model-call span carries: gen_ai.tool.definitions, OpenInference's
// llm.tools.N.tool.json_schema, OpenLLMetry's llm.request.functions.N.*.
func spanToolDefs(s *Span) []ToolDef {
	var defs []ToolDef
	if raw := s.Attrs[attrToolDefs]; raw != nil {
		if d, err := ParseTools(jsonAttr(raw), attrToolDefs); err == nil {
			defs = AddToolDefs(defs, d)
		}
	}
	for _, m := range flat(s.Attrs, attrOITools) {
		schema := jsonAttr(m["tool.json_schema"])
		if len(schema) == 0 || schema[0] != '{' {
			continue
		}
		d, err := ParseTools(append(append(json.RawMessage{'['}, schema...), ']'), attrOITools)
		if err != nil || len(d) == 0 {
			continue
		}
		if d[0].Description == "" {
			d[0].Description = attrStr(m["tool.description"])
		}
		defs = AddToolDefs(defs, d)
	}
	for _, m := range flat(s.Attrs, attrFunctionsFlat) {
		schema := compactJSON(jsonAttr(m["parameters"]))
		name := attrStr(m["name"])
		if name == "" || len(schema) == 0 || schema[0] != '{' {
			continue
		}
		defs = AddToolDefs(defs, []ToolDef{{Name: name, Description: attrStr(m["description"]), InputSchema: schema}})
	}
	return defs
}
