// Package tauformats writes recorded traces in the shapes agents emit them — the OpenAI Responses API's items,
// Anthropic's Messages, OpenTelemetry GenAI and OpenInference spans — for tests. It is written from those formats'
// documentation, independently of ingest, which reads them.
package tauformats

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// Tool is a tool definition as the tau tool files give it.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Tools reads a tau domain's tool definitions (testdata/tau-<domain>-tools.json.gz).
func Tools(domain string) ([]Tool, error) {
	data, err := sampledata.Read("tau-" + domain + "-tools.json")
	if err != nil {
		return nil, err
	}
	var file struct {
		Tools []Tool `json:"tools"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("decode tau-%s-tools: %w", domain, err)
	}
	return file.Tools, nil
}

// raw answers s as JSON when it holds JSON, else as a JSON string.
func raw(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}

func text(m trace.Message) string {
	if m.Content == nil {
		return ""
	}
	return *m.Content
}

// Responses writes t as an OpenAI Responses API trace: the system message as instructions, the conversation as
// input items (message, function_call, function_call_output), and tools in the Responses function shape.
func Responses(t trace.Trace, tools []Tool) map[string]any {
	var items []any
	instructions := ""
	for i, m := range t.Messages {
		switch {
		case m.Role == trace.RoleSystem && i == 0:
			instructions = text(m)
		case m.Role == trace.RoleTool:
			items = append(items, map[string]any{"type": "function_call_output", "call_id": m.ToolCallID, "output": text(m)})
		default:
			if m.Content != nil {
				part := "input_text"
				if m.Role == trace.RoleAssistant {
					part = "output_text"
				}
				items = append(items, map[string]any{"type": "message", "role": m.Role,
					"content": []any{map[string]any{"type": part, "text": text(m)}}})
			}
			for _, tc := range m.ToolCalls {
				items = append(items, map[string]any{"type": "function_call", "call_id": tc.ID, "name": tc.Function.Name,
					"arguments": tc.Function.Arguments, "id": "fc_" + tc.ID})
			}
		}
	}
	defs := make([]any, len(tools))
	for i, d := range tools {
		defs[i] = map[string]any{"type": "function", "name": d.Name, "description": d.Description, "parameters": d.Parameters}
	}
	return map[string]any{"id": t.ID, "model": t.Model, "instructions": instructions, "input": items, "tools": defs}
}

// Messages writes t as an Anthropic Messages trace: system apart, assistant turns of text and tool_use blocks,
// tool answers as tool_result blocks of a user turn, and tools with input_schema.
func Messages(t trace.Trace, tools []Tool) map[string]any {
	var msgs []any
	system := ""
	var results []any // tool_result blocks waiting for their user turn
	flush := func() {
		if len(results) > 0 {
			msgs = append(msgs, map[string]any{"role": "user", "content": results})
			results = nil
		}
	}
	for i, m := range t.Messages {
		switch {
		case m.Role == trace.RoleSystem && i == 0:
			system = text(m)
		case m.Role == trace.RoleTool:
			results = append(results, map[string]any{"type": "tool_result", "tool_use_id": m.ToolCallID, "content": text(m)})
		case m.Role == trace.RoleAssistant:
			flush()
			var blocks []any
			if m.Content != nil {
				blocks = append(blocks, map[string]any{"type": "text", "text": text(m)})
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": raw(tc.Function.Arguments)})
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "content": blocks})
		default:
			flush()
			msgs = append(msgs, map[string]any{"role": m.Role, "content": text(m)})
		}
	}
	flush()
	defs := make([]any, len(tools))
	for i, d := range tools {
		defs[i] = map[string]any{"name": d.Name, "description": d.Description, "input_schema": d.Parameters}
	}
	return map[string]any{"id": t.ID, "model": t.Model, "system": system, "messages": msgs, "tools": defs}
}

// Span conventions Emit writes.
const (
	GenAI = iota
	OpenInference
)

// EmitOptions say how Emit writes a trace's spans.
type EmitOptions struct {
	// Style is GenAI or OpenInference.
	Style int
	// Conversation, when set, is the conversation id the spans carry (gen_ai.conversation.id, session.id).
	Conversation string
	// TaskAttr and Task, when both set, put the task on the agent's span.
	TaskAttr, Task string
	// Tools are the definitions every model call carries.
	Tools []Tool
	// Start is when the trace's first span starts; spans follow a millisecond apart.
	Start time.Time
}

// Emit replays t as an instrumented agent loop records it with tracer: an agent span, under it one model-call
// span per assistant message (its input the conversation before it, its output the message) and one tool span
// per tool call (its arguments and the answer the tool message gave). Content capture is on.
func Emit(ctx context.Context, tracer oteltrace.Tracer, t trace.Trace, o EmitOptions) {
	clock := o.Start
	tick := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	agentAttrs := []attribute.KeyValue{attribute.String("gen_ai.operation.name", "invoke_agent"),
		attribute.String("gen_ai.agent.name", "tau-agent"), attribute.String("gen_ai.provider.name", "openai")}
	if o.Style == OpenInference {
		agentAttrs = []attribute.KeyValue{attribute.String("openinference.span.kind", "AGENT")}
	}
	agentAttrs = append(agentAttrs, conversation(o)...)
	if o.TaskAttr != "" && o.Task != "" {
		agentAttrs = append(agentAttrs, attribute.String(o.TaskAttr, o.Task))
	}
	ctx, agent := tracer.Start(ctx, "invoke_agent tau-agent", oteltrace.WithTimestamp(tick()), oteltrace.WithAttributes(agentAttrs...))
	answers := map[string]string{}
	for _, m := range t.Messages {
		if m.Role == trace.RoleTool {
			answers[m.ToolCallID] = text(m)
		}
	}
	for i, m := range t.Messages {
		if m.Role != trace.RoleAssistant {
			continue
		}
		var attrs []attribute.KeyValue
		if o.Style == OpenInference {
			attrs = openInferenceLLM(t, i, o)
		} else {
			attrs = genaiChat(t, i, o)
		}
		_, chat := tracer.Start(ctx, "chat "+t.Model, oteltrace.WithTimestamp(tick()), oteltrace.WithSpanKind(oteltrace.SpanKindClient),
			oteltrace.WithAttributes(attrs...))
		chat.End(oteltrace.WithTimestamp(tick()))
		for _, tc := range m.ToolCalls {
			var attrs []attribute.KeyValue
			if o.Style == OpenInference {
				attrs = []attribute.KeyValue{attribute.String("openinference.span.kind", "TOOL"), attribute.String("tool.name", tc.Function.Name),
					attribute.String("input.value", tc.Function.Arguments), attribute.String("input.mime_type", "application/json"),
					attribute.String("output.value", answers[tc.ID])}
			} else {
				attrs = []attribute.KeyValue{attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("gen_ai.tool.name", tc.Function.Name),
					attribute.String("gen_ai.tool.call.id", tc.ID), attribute.String("gen_ai.tool.type", "function"),
					attribute.String("gen_ai.tool.call.arguments", tc.Function.Arguments), attribute.String("gen_ai.tool.call.result", answers[tc.ID])}
			}
			attrs = append(attrs, conversation(o)...)
			_, tool := tracer.Start(ctx, "execute_tool "+tc.Function.Name, oteltrace.WithTimestamp(tick()), oteltrace.WithAttributes(attrs...))
			tool.End(oteltrace.WithTimestamp(tick()))
		}
	}
	agent.End(oteltrace.WithTimestamp(tick()))
}

func conversation(o EmitOptions) []attribute.KeyValue {
	if o.Conversation == "" {
		return nil
	}
	if o.Style == OpenInference {
		return []attribute.KeyValue{attribute.String("session.id", o.Conversation)}
	}
	return []attribute.KeyValue{attribute.String("gen_ai.conversation.id", o.Conversation)}
}

// genaiChat is the attributes of the model call that answered with message i (OpenTelemetry GenAI: messages of
// typed parts, recorded as JSON strings as the Go SDK must).
func genaiChat(t trace.Trace, i int, o EmitOptions) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "openai"),
		attribute.String("gen_ai.request.model", t.Model)}
	attrs = append(attrs, conversation(o)...)
	in := []any{}
	for j, m := range t.Messages[:i] {
		if m.Role == trace.RoleSystem && j == 0 {
			sys, _ := json.Marshal([]any{map[string]any{"type": "text", "content": text(m)}})
			attrs = append(attrs, attribute.String("gen_ai.system_instructions", string(sys)))
			continue
		}
		in = append(in, genaiMessage(m))
	}
	out := genaiMessage(t.Messages[i]).(map[string]any)
	out["finish_reason"] = "stop"
	if len(t.Messages[i].ToolCalls) > 0 {
		out["finish_reason"] = "tool_call"
	}
	inJSON, _ := json.Marshal(in)
	outJSON, _ := json.Marshal([]any{out})
	attrs = append(attrs, attribute.String("gen_ai.input.messages", string(inJSON)), attribute.String("gen_ai.output.messages", string(outJSON)))
	if len(o.Tools) > 0 {
		defs := make([]any, len(o.Tools))
		for k, d := range o.Tools {
			defs[k] = map[string]any{"type": "function", "name": d.Name, "description": d.Description, "parameters": d.Parameters}
		}
		b, _ := json.Marshal(defs)
		attrs = append(attrs, attribute.String("gen_ai.tool.definitions", string(b)))
	}
	return attrs
}

func genaiMessage(m trace.Message) any {
	var parts []any
	switch m.Role {
	case trace.RoleTool:
		parts = append(parts, map[string]any{"type": "tool_call_response", "id": m.ToolCallID, "response": text(m)})
	default:
		if m.Content != nil {
			parts = append(parts, map[string]any{"type": "text", "content": text(m)})
		}
		for _, tc := range m.ToolCalls {
			parts = append(parts, map[string]any{"type": "tool_call", "id": tc.ID, "name": tc.Function.Name, "arguments": raw(tc.Function.Arguments)})
		}
	}
	return map[string]any{"role": m.Role, "parts": parts}
}

// openInferenceLLM is the attributes of the LLM span that answered with message i (OpenInference: flattened
// llm.input_messages.N.message.* and llm.output_messages.N.message.*, tools as llm.tools.N.tool.json_schema).
func openInferenceLLM(t trace.Trace, i int, o EmitOptions) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("openinference.span.kind", "LLM"), attribute.String("llm.model_name", t.Model),
		attribute.String("llm.system", "openai")}
	attrs = append(attrs, conversation(o)...)
	flatMsg := func(prefix string, m trace.Message) {
		attrs = append(attrs, attribute.String(prefix+"message.role", m.Role))
		if m.Content != nil {
			attrs = append(attrs, attribute.String(prefix+"message.content", text(m)))
		}
		if m.ToolCallID != "" {
			attrs = append(attrs, attribute.String(prefix+"message.tool_call_id", m.ToolCallID))
		}
		for k, tc := range m.ToolCalls {
			p := fmt.Sprintf("%smessage.tool_calls.%d.tool_call.", prefix, k)
			attrs = append(attrs, attribute.String(p+"id", tc.ID), attribute.String(p+"function.name", tc.Function.Name),
				attribute.String(p+"function.arguments", tc.Function.Arguments))
		}
	}
	for j, m := range t.Messages[:i] {
		flatMsg(fmt.Sprintf("llm.input_messages.%d.", j), m)
	}
	flatMsg("llm.output_messages.0.", t.Messages[i])
	for k, d := range o.Tools {
		schema, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": d.Name, "description": d.Description, "parameters": d.Parameters}})
		attrs = append(attrs, attribute.String(fmt.Sprintf("llm.tools.%d.tool.json_schema", k), string(schema)))
	}
	return attrs
}

// Comparable is t as span assembly can give it back: the messages after the last assistant message dropped (no
// model call records them), tool calls typed function, and with compactArgs their arguments written compactly
// (GenAI carries them as JSON objects, so their spelling is not kept; OpenInference keeps the string).
func Comparable(t trace.Trace, compactArgs bool) trace.Trace {
	last := -1
	for i, m := range t.Messages {
		if m.Role == trace.RoleAssistant {
			last = i
		}
	}
	// Tool answers to the last assistant message's calls come after it, and the tool spans record them.
	end := last + 1
	for end < len(t.Messages) && t.Messages[end].Role == trace.RoleTool {
		end++
	}
	out := t
	out.Messages = make([]trace.Message, end)
	for i, m := range t.Messages[:end] {
		out.Messages[i] = m
		if len(m.ToolCalls) == 0 {
			continue
		}
		out.Messages[i].ToolCalls = make([]trace.ToolCall, len(m.ToolCalls))
		for k, tc := range m.ToolCalls {
			var b bytes.Buffer
			if err := json.Compact(&b, []byte(tc.Function.Arguments)); err == nil && compactArgs {
				tc.Function.Arguments = b.String()
			}
			tc.Type = "function"
			out.Messages[i].ToolCalls[k] = tc
		}
	}
	return out
}

// CompactArgs is t with every call's arguments written compactly, its messages kept (the Messages format carries
// arguments as objects too).
func CompactArgs(t trace.Trace) trace.Trace {
	out := Comparable(trace.Trace{ID: t.ID, Model: t.Model, Messages: append(t.Messages[:len(t.Messages):len(t.Messages)], trace.Message{Role: trace.RoleAssistant})}, true)
	out.Messages = out.Messages[:len(out.Messages)-1]
	return out
}
