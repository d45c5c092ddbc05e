// Package ingest decodes and validates collect bodies (spec §2.7) and encodes accepted ones as blobs.
//
// Decode is a hand-written, single-pass JSON decoder for the collect body: it fills trace.Batch,
// checks every field while it reads, and names the exact JSON path of each problem
// (traces[3].messages[2].role). It does not use reflection.
//
// Rules the decoder applies, beyond spec §2.7's field list:
//
//   - The body is one JSON object in UTF-8; anything after it, invalid UTF-8 or nesting deeper
//     than 10,000 levels is an error. Field names match exactly (case-sensitive).
//   - Unknown fields are ignored (collectors that forward whole OpenAI message objects, with refusal,
//     annotations and the like, keep working); they must still be valid JSON. Collect stores a body
//     as it came (EncodeBodyBlob), so they stay in its blob, where nothing reads them.
//     A field given twice in one object is an error.
//   - camelCase aliases toolCalls and toolCallId are accepted; giving both spellings with
//     different values is an error.
//   - project: a string of 1–128 characters, no control characters, holding at least one ASCII
//     letter or digit (the environment slug is made from it, see Slug).
//   - traces: 1–Options.MaxTraces traces. trace.id: a non-empty string of at most 512 bytes without
//     control characters, unique within the batch. trace.model: optional string. trace.messages:
//     at least one message.
//   - message.role: system, user, assistant or tool. content: a string; null or absent only on an
//     assistant message that has tool_calls. tool_calls: only on assistant messages. tool_call_id:
//     required on tool messages, only there, and it must name a tool call made earlier in the same
//     trace (ids may be reused across turns; the answer pairs with the latest such call).
//     name: optional string.
//   - tool_calls[k]: id a non-empty string unique within its message; type absent or "function";
//     function.name a non-empty string of at most 256 bytes without whitespace or control
//     characters; function.arguments a string holding one JSON value (usually an object).
//   - Optional fields given as null count as absent.
//
// Errors come back as *Error: a list of FieldError (path and message) in document order, at most
// Options.MaxErrors of them. A syntax error stops decoding and is reported at the path where it
// occurred, with its byte offset.
package ingest

import (
	"fmt"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// Defaults for Options.
const (
	DefaultMaxErrors = 20
	DefaultMaxTraces = 1000
	// MaxProjectLen is the longest project name accepted, in characters.
	MaxProjectLen = 128
	// MaxIDLen is the longest trace id accepted, in bytes.
	MaxIDLen = 512
	// MaxNameLen is the longest tool name, tool-call id or model accepted, in bytes.
	MaxNameLen = 256
	// maxDepth bounds the nesting of unknown fields and of tool arguments (as encoding/json does).
	maxDepth = 10000
)

// Options tune Decode. The zero value means the defaults.
type Options struct {
	// MaxErrors is how many field errors to collect before stopping (default 20).
	MaxErrors int
	// MaxTraces is the most traces one body may hold (default 1000).
	MaxTraces int
}

func (o Options) withDefaults() Options {
	if o.MaxErrors <= 0 {
		o.MaxErrors = DefaultMaxErrors
	}
	if o.MaxTraces <= 0 {
		o.MaxTraces = DefaultMaxTraces
	}
	return o
}

// Parsed is an accepted collect body with the facts the API stores beside it.
type Parsed struct {
	Batch trace.Batch
	// Slug is the environment slug made from Batch.Project.
	Slug string
	// Tools lists the tool names called in the batch, sorted, each once.
	Tools []string
	// Messages and Calls count the batch's messages and tool calls.
	Messages int
	Calls    int
	// TraceBytes are the bytes each trace takes in the body, parallel to Batch.Traces.
	TraceBytes []int64
}

// TraceIDs returns the batch's trace ids in batch order.
func (p *Parsed) TraceIDs() []string {
	ids := make([]string, len(p.Batch.Traces))
	for i, t := range p.Batch.Traces {
		ids[i] = t.ID
	}
	return ids
}

// FieldError is one problem with one field of a collect body.
type FieldError struct {
	// Path is the field's JSON path, e.g. traces[3].messages[2].role; "body" means the body as a whole.
	Path string `json:"path"`
	// Message says what is wrong, e.g. `must be one of system, user, assistant, tool; got "bot"`.
	Message string `json:"message"`
}

func (f FieldError) String() string { return f.Path + ": " + f.Message }

// Error is a rejected collect body: the field errors found, in document order.
type Error struct {
	Fields []FieldError
	// Truncated is true when decoding stopped at Options.MaxErrors with more problems possible.
	Truncated bool
	// OverLimit is true when the body holds more than Options.MaxTraces traces (an API answers 413).
	OverLimit bool
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, f := range e.Fields {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(e.Fields)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.String())
	}
	if e.Truncated {
		b.WriteString(" (stopped after the first errors)")
	}
	return b.String()
}

// Decode reads and validates a collect body. It returns *Error when the body is rejected.
func Decode(body []byte, opts Options) (*Parsed, error) { return decode(body, opts, false) }

// Check is Decode for a caller that keeps the body itself, as collect does (EncodeBodyBlob): it checks the body as
// Decode does and answers the same, except that of the messages' contents the batch holds only those of system
// messages (Detect reads them) and of messages whose role comes after their content; the others are absent (nil).
// Most of a body is those texts, and Check makes no copy of them.
func Check(body []byte, opts Options) (*Parsed, error) { return decode(body, opts, true) }

func decode(body []byte, opts Options, textless bool) (*Parsed, error) {
	opts = opts.withDefaults()
	p := newParser(body, opts)
	p.textless = textless
	var out Parsed
	p.parseBody(&out.Batch)
	if len(p.errs) > 0 {
		return nil, &Error{Fields: p.errs, Truncated: p.truncated, OverLimit: p.overLimit}
	}
	out.Slug = Slug(out.Batch.Project)
	out.TraceBytes = p.traceBytes
	out.Tools, out.Messages, out.Calls = summarize(out.Batch.Traces)
	return &out, nil
}

// ValidateTrace checks one in-memory trace by the rules Decode applies; paths are relative to the
// trace (messages[2].role). Collectors call it so that one bad trace never costs a whole batch.
func ValidateTrace(t *trace.Trace) error {
	p := newParser(nil, Options{}.withDefaults())
	p.checkUTF8 = true
	p.checkTrace(t, 0, 0, true)
	if len(p.errs) > 0 {
		return &Error{Fields: p.errs, Truncated: p.truncated}
	}
	return nil
}

// DecodeTrace reads and validates one trace given alone (an element of a traces array, a JSONL
// line), by the rules Decode applies; paths are relative to the trace, and "trace" names it whole.
func DecodeTrace(data []byte) (*trace.Trace, error) {
	p := newParser(data, Options{}.withDefaults())
	p.root = "trace"
	var t trace.Trace
	if err := p.trace(&t, 0); err == nil {
		p.ws()
		if p.pos < len(p.buf) {
			p.syntax(p.pos, "unexpected data after the trace")
		}
	}
	if len(p.errs) > 0 {
		return nil, &Error{Fields: p.errs, Truncated: p.truncated}
	}
	return &t, nil
}

func summarize(traces []trace.Trace) (tools []string, messages, calls int) {
	seen := map[string]struct{}{}
	for i := range traces {
		messages += len(traces[i].Messages)
		for j := range traces[i].Messages {
			for _, tc := range traces[i].Messages[j].ToolCalls {
				calls++
				if _, ok := seen[tc.Function.Name]; !ok {
					seen[tc.Function.Name] = struct{}{}
					tools = append(tools, tc.Function.Name)
				}
			}
		}
	}
	sort.Strings(tools)
	return tools, messages, calls
}
