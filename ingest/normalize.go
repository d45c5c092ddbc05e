package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Normalized is a collect body whose traces are all in the chat format (spec §2.7), with the tool definitions its
// traces carried.
type Normalized struct {
	// Body is the body to check and store: the body given, unchanged, when every trace was in the chat format
	// already; else {project, traces} with the other formats' traces mapped to chat messages.
	Body []byte
	// Tools are the tool definitions the traces carried ("tools" of a trace in any format), the first definition
	// of a name winning, in the order met.
	Tools []ToolDef
	// Converted counts the traces mapped from another format.
	Converted int
}

// formatMarkers are the keys (quoted, as they appear before their colon) of which a chat-only body holds none but
// a trace of another format, or a trace carrying tools, holds at least one. Inside a JSON string a quote is
// escaped, so these bytes never match text.
var formatMarkers = [][]byte{[]byte(`"format"`), []byte(`"input"`), []byte(`"output"`), []byte(`"instructions"`),
	[]byte(`"system"`), []byte(`"tools"`), []byte(`"response"`), []byte(`"content"`)}

// NormalizeBody maps the traces of a collect body that are in another format (FormatResponses, FormatMessages:
// named by their format field, or detected) to the chat format, and gathers the tool definitions traces carry.
// A body whose traces are all chat-shaped and carry no tools is answered as it is, without being decoded; so is a
// body that is not an object with a traces array (Check then says what is wrong with it). Errors are *Error
// naming the field as the body gave it (traces[2].input[5].call_id).
func NormalizeBody(body []byte) (*Normalized, error) {
	if !mayNeedNormalizing(body) {
		return &Normalized{Body: body}, nil
	}
	var top struct {
		Project json.RawMessage   `json:"project"`
		Traces  []json.RawMessage `json:"traces"`
	}
	if json.Unmarshal(body, &top) != nil || top.Traces == nil {
		return &Normalized{Body: body}, nil
	}
	n := &Normalized{Body: body}
	out := make([][]byte, len(top.Traces))
	for i, raw := range top.Traces {
		path := fmt.Sprintf("traces[%d]", i)
		format, err := DetectFormat(raw)
		if err != nil {
			return nil, prefixed(err, path)
		}
		if format == FormatChat {
			var extra struct {
				Tools json.RawMessage `json:"tools"`
			}
			if json.Unmarshal(raw, &extra) == nil && extra.Tools != nil {
				tools, err := ParseTools(extra.Tools, "tools")
				if err != nil {
					return nil, prefixed(err, path)
				}
				n.Tools = AddToolDefs(n.Tools, tools)
			}
			out[i] = raw
			continue
		}
		t, tools, _, err := DecodeAnyTrace(raw)
		if err != nil {
			return nil, prefixed(err, path)
		}
		n.Tools = AddToolDefs(n.Tools, tools)
		out[i] = AppendTrace(nil, t)
		n.Converted++
	}
	if n.Converted == 0 {
		return n, nil
	}
	project := top.Project
	if project == nil {
		project = json.RawMessage("null")
	}
	size := len(project) + 32
	for _, t := range out {
		size += len(t) + 1
	}
	b := make([]byte, 0, size)
	b = append(b, `{"project":`...)
	b = append(b, project...)
	b = append(b, `,"traces":[`...)
	for i, t := range out {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, t...)
	}
	n.Body = append(b, "]}"...)
	return n, nil
}

// mayNeedNormalizing reports whether body holds a key only other formats' traces, or traces carrying tools, hold
// (a content that is an array counts: Anthropic blocks).
func mayNeedNormalizing(body []byte) bool {
	for _, m := range formatMarkers {
		for rest := body; ; {
			i := bytes.Index(rest, m)
			if i < 0 {
				break
			}
			after := bytes.TrimLeft(rest[i+len(m):], " \t\r\n")
			if len(after) > 0 && after[0] == ':' {
				if !bytes.Equal(m, []byte(`"content"`)) {
					return true
				}
				if v := bytes.TrimLeft(after[1:], " \t\r\n"); len(v) > 0 && v[0] == '[' {
					return true
				}
			}
			rest = rest[i+len(m):]
		}
	}
	return false
}
