package otlp

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/klauspost/compress/s2"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/doppel-dev/doppel/ingest"
)

// Limits Extract applies.
const (
	// MaxConversationLen is the longest conversation id (and task) a span may name, in bytes: a trace id made from
	// it, with a task and the separator, stays within ingest.MaxIDLen.
	MaxConversationLen = 400
	// MaxTaskLen is the longest task a span may name, in bytes.
	MaxTaskLen = 64
	// serviceName is the resource attribute naming the project.
	serviceName = "service.name"
	// sdkLanguage is the resource attribute naming the SDK's language.
	sdkLanguage = "telemetry.sdk.language"
)

// Options tune Extract.
type Options struct {
	// Project, when set, is the project of every span (a header or query of the request named it); otherwise a
	// span's project is its resource's service.name.
	Project string
	// TaskAttr is the span attribute naming a trace's task (kept when staged; see ingest.TraceID).
	TaskAttr string
}

// Project is the spans of one project an export carried, in the order met.
type Project struct {
	Name  string
	Spans []Staged
	// Language is the resource's telemetry.sdk.language (python, go, nodejs, …) and Scopes the instrumentation
	// scopes of its spans (e.g. openinference.instrumentation.langchain): what they tell of the agent.
	Language string
	Scopes   []string
}

// Rejection is a span Extract refused, and why.
type Rejection struct {
	// Path locates it: resourceSpans[0].scopeSpans[1].spans[2] (and a field, when one is at fault).
	Path   string
	Reason string
}

func (r Rejection) String() string { return r.Path + ": " + r.Reason }

// Extracted is what an export holds for doppel.
type Extracted struct {
	Projects []Project
	// Spans counts every span of the export; Ignored the valid ones that record neither a model call, a tool's
	// execution, a conversation nor a task (an HTTP client's span, say): they are dropped, not rejected.
	Spans, Ignored int
	// Rejected are the spans refused (an id of the wrong length, no project), in order.
	Rejected []Rejection
	// Truncated counts the staged spans whose sender dropped attributes or events (the SDK's limits, e.g.
	// OTEL_ATTRIBUTE_COUNT_LIMIT, 128 by default): what they lost cannot be assembled.
	Truncated int
}

// Extract reads the spans of an export that can carry a conversation, grouped by project. A span is rejected
// (and counted as such, not staged) when its trace or span id is not 16 or 8 bytes (or all zero), its parent id
// is not empty or 8 bytes, it names no project, or the conversation or task it names is too long or holds
// control characters.
func Extract(req *coltracepb.ExportTraceServiceRequest, opts Options) *Extracted {
	out := &Extracted{}
	byName := map[string]int{}
	for ri, rs := range req.GetResourceSpans() {
		project := opts.Project
		if project == "" {
			project = attrString(rs.GetResource().GetAttributes(), serviceName)
		}
		badProject := ""
		switch {
		case project == "":
			badProject = "names no service.name, and the request names no project (X-Doppel-Project header or project query)"
		case utf8.RuneCountInString(project) > ingest.MaxProjectLen || !validName(project, 4*ingest.MaxProjectLen) || ingest.Slug(project) == "":
			badProject = fmt.Sprintf("the project %q must be 1-%d characters without control characters, holding an ASCII letter or digit", project, ingest.MaxProjectLen)
		}
		for si, ss := range rs.GetScopeSpans() {
			for pi, s := range ss.GetSpans() {
				out.Spans++
				path := fmt.Sprintf("resourceSpans[%d].scopeSpans[%d].spans[%d]", ri, si, pi)
				if badProject != "" {
					out.Rejected = append(out.Rejected, Rejection{fmt.Sprintf("resourceSpans[%d].resource.attributes", ri), badProject})
					continue
				}
				span, field, reason := stage(s, opts.TaskAttr)
				if reason != "" {
					out.Rejected = append(out.Rejected, Rejection{path + "." + field, reason})
					continue
				}
				if span.Data == nil {
					out.Ignored++
					continue
				}
				if s.GetDroppedAttributesCount() > 0 || s.GetDroppedEventsCount() > 0 {
					out.Truncated++
				}
				i, ok := byName[project]
				if !ok {
					i = len(out.Projects)
					byName[project] = i
					out.Projects = append(out.Projects, Project{Name: project})
				}
				p := &out.Projects[i]
				p.Spans = append(p.Spans, span)
				if p.Language == "" {
					p.Language = attrString(rs.GetResource().GetAttributes(), sdkLanguage)
				}
				if sc := ss.GetScope().GetName(); sc != "" && !slices.Contains(p.Scopes, sc) {
					p.Scopes = append(p.Scopes, sc)
				}
			}
		}
	}
	return out
}

// Staged is a span as staging keeps it: its ids, the conversation it names, and the span itself.
type Staged struct {
	TraceID, SpanID, Parent string // lower-case hex
	Conversation            string // gen_ai.conversation.id, else session.id
	// Data is the span as OTLP protobuf (opentelemetry.proto.trace.v1.Span) with only the attributes and events
	// ingest reads (ingest.KeepAttr, ingest.KeepEvent), S2-compressed: Span reads it back. A model call's span
	// carries the conversation so far, so staging keeps it compact and never re-encodes its texts.
	Data []byte
}

// probeLen bounds the attribute values a relevance probe carries (longer ones are there by name only).
const probeLen = 1024

// stage makes the staged form of s, or answers which field is at fault and why. A span that records no model
// call, tool execution, conversation or task answers a Staged with no Data (dropped).
func stage(s *tracepb.Span, taskAttr string) (st Staged, field, reason string) {
	if !validID(s.GetTraceId(), 16) {
		return st, "traceId", fmt.Sprintf("must be 16 bytes, not all zero; got %d", len(s.GetTraceId()))
	}
	if !validID(s.GetSpanId(), 8) {
		return st, "spanId", fmt.Sprintf("must be 8 bytes, not all zero; got %d", len(s.GetSpanId()))
	}
	if p := s.GetParentSpanId(); len(p) != 0 && len(p) != 8 {
		return st, "parentSpanId", fmt.Sprintf("must be empty or 8 bytes; got %d", len(p))
	}
	kept := &tracepb.Span{TraceId: s.GetTraceId(), SpanId: s.GetSpanId(), Name: s.GetName(),
		StartTimeUnixNano: s.GetStartTimeUnixNano(), EndTimeUnixNano: s.GetEndTimeUnixNano(), Status: s.GetStatus()}
	if p := s.GetParentSpanId(); len(p) == 8 && !allZero(p) {
		kept.ParentSpanId = p
	}
	// The probe holds the kept attributes' short values (and the long ones by name): enough to classify the span.
	probe := ingest.Span{}
	for _, kv := range s.GetAttributes() {
		k := kv.GetKey()
		if !ingest.KeepAttr(k, taskAttr) {
			continue
		}
		kept.Attributes = append(kept.Attributes, kv)
		if probe.Attrs == nil {
			probe.Attrs = map[string]json.RawMessage{}
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			if len(v.StringValue) > probeLen {
				probe.Attrs[k] = json.RawMessage("null")
				continue
			}
		case *commonpb.AnyValue_ArrayValue, *commonpb.AnyValue_KvlistValue, *commonpb.AnyValue_BytesValue:
			probe.Attrs[k] = json.RawMessage("null") // structured: there by name
			continue
		}
		probe.Attrs[k] = appendValue(nil, kv.GetValue())
	}
	for _, e := range s.GetEvents() {
		if ingest.KeepEvent(e.GetName()) {
			kept.Events = append(kept.Events, e)
			probe.Events = append(probe.Events, ingest.SpanEvent{Name: e.GetName()})
		}
	}
	conv := attrString(s.GetAttributes(), "gen_ai.conversation.id")
	if conv == "" {
		conv = attrString(s.GetAttributes(), "session.id")
	}
	if !validName(conv, MaxConversationLen) {
		return st, "attributes", fmt.Sprintf("the conversation id (gen_ai.conversation.id or session.id) must be at most %d bytes of text without control characters", MaxConversationLen)
	}
	if taskAttr != "" && !validName(attrString(s.GetAttributes(), taskAttr), MaxTaskLen) {
		return st, "attributes", fmt.Sprintf("%s must be at most %d bytes of text without control characters", taskAttr, MaxTaskLen)
	}
	st = Staged{TraceID: hex.EncodeToString(kept.TraceId), SpanID: hex.EncodeToString(kept.SpanId), Conversation: conv}
	if len(kept.ParentSpanId) == 8 {
		st.Parent = hex.EncodeToString(kept.ParentSpanId)
	}
	if !probe.Relevant(taskAttr) {
		return st, "", ""
	}
	raw, err := proto.Marshal(kept)
	if err != nil { // only for invalid UTF-8 in a string field, which Unmarshal already refused
		return st, "attributes", err.Error()
	}
	st.Data = s2.Encode(nil, raw)
	return st, "", ""
}

// Span reads a staged span back (Staged.Data) as assembly reads it: ids in hex, attribute values as JSON.
func Span(data []byte) (ingest.Span, error) {
	raw, err := s2.Decode(nil, data)
	if err != nil {
		return ingest.Span{}, fmt.Errorf("otlp: staged span: %w", err)
	}
	s := &tracepb.Span{}
	if err := proto.Unmarshal(raw, s); err != nil {
		return ingest.Span{}, fmt.Errorf("otlp: staged span: %w", err)
	}
	span := ingest.Span{
		TraceID: hex.EncodeToString(s.GetTraceId()),
		SpanID:  hex.EncodeToString(s.GetSpanId()),
		Name:    s.GetName(),
		Start:   clampNanos(s.GetStartTimeUnixNano()),
		End:     clampNanos(s.GetEndTimeUnixNano()),
	}
	if p := s.GetParentSpanId(); len(p) == 8 {
		span.Parent = hex.EncodeToString(p)
	}
	if st := s.GetStatus(); st.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		span.Error = st.GetMessage()
		if span.Error == "" {
			span.Error = "error"
		}
	}
	for _, kv := range s.GetAttributes() {
		if span.Attrs == nil {
			span.Attrs = map[string]json.RawMessage{}
		}
		span.Attrs[kv.GetKey()] = appendValue(nil, kv.GetValue())
	}
	for _, e := range s.GetEvents() {
		ev := ingest.SpanEvent{Name: e.GetName(), Time: clampNanos(e.GetTimeUnixNano())}
		for _, kv := range e.GetAttributes() {
			if ev.Attrs == nil {
				ev.Attrs = map[string]json.RawMessage{}
			}
			ev.Attrs[kv.GetKey()] = appendValue(nil, kv.GetValue())
		}
		span.Events = append(span.Events, ev)
	}
	return span, nil
}

func validID(id []byte, n int) bool { return len(id) == n && !allZero(id) }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func validName(s string, limit int) bool {
	if len(s) > limit || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// clampNanos keeps a time within int64 (a span time past 2262 is a sender's bug, not a reason to fail).
func clampNanos(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// attrString answers a string attribute's value ("" when absent or not a string).
func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// appendValue appends v as JSON: a string as a JSON string (invalid UTF-8 replaced), numbers and booleans as
// themselves (a double that JSON cannot hold as its name, "NaN"), bytes as base64, an array as an array and a
// key-value list as an object, keys in their order; no value is null.
func appendValue(dst []byte, v *commonpb.AnyValue) []byte {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return appendString(dst, x.StringValue)
	case *commonpb.AnyValue_BoolValue:
		return strconv.AppendBool(dst, x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return strconv.AppendInt(dst, x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		f := x.DoubleValue
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return appendString(dst, strconv.FormatFloat(f, 'g', -1, 64))
		}
		return strconv.AppendFloat(dst, f, 'g', -1, 64)
	case *commonpb.AnyValue_BytesValue:
		return appendString(dst, base64.StdEncoding.EncodeToString(x.BytesValue))
	case *commonpb.AnyValue_ArrayValue:
		dst = append(dst, '[')
		for i, e := range x.ArrayValue.GetValues() {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e)
		}
		return append(dst, ']')
	case *commonpb.AnyValue_KvlistValue:
		dst = append(dst, '{')
		for i, kv := range x.KvlistValue.GetValues() {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, kv.GetKey())
			dst = append(dst, ':')
			dst = appendValue(dst, kv.GetValue())
		}
		return append(dst, '}')
	}
	return append(dst, "null"...)
}

// appendString appends s as a JSON string.
func appendString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // replaces invalid UTF-8; never fails for a string
	return append(dst, b...)
}
