package toolplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/twin"
)

// Sessions opened from a trace: the world a recorded conversation saw (twin/fromtrace.go). The trace is given whole
// or as a prefix, in the collect format (spec §2.7), or by the id of a trace the environment holds; its answered
// calls go to the twin, which uses those before the first write.

// maxTraceCallBytes bounds the calls of a trace a session opens from (they travel in the session-open workflow's
// input and stay in the session's receipts for a rebuild).
const maxTraceCallBytes = 1 << 20

// TraceParam is the trace a session opens from as a request gives it: the id of a trace the environment holds (a
// JSON string), or a trace in the collect format (a JSON object: id, model, messages).
type TraceParam struct {
	ID    string
	Trace *trace.Trace
}

// ParseTraceParam reads a trace parameter (field names it in errors: "body.trace", "query.trace").
func ParseTraceParam(field string, raw []byte) (*TraceParam, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var id string
		if err := json.Unmarshal(raw, &id); err != nil || strings.TrimSpace(id) == "" {
			return nil, invalid(field, "expected the id of a trace the environment holds, or a trace {id, model, messages}")
		}
		return &TraceParam{ID: id}, nil
	case raw[0] == '{':
		var t trace.Trace
		dec := json.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(&t); err != nil {
			return nil, invalid(field, "not a trace in the collect format {id, model, messages}: "+err.Error())
		}
		if len(t.Messages) == 0 {
			return nil, invalid(field+".messages", "required: the trace's messages (OpenAI chat shape), whole or a prefix")
		}
		for i, m := range t.Messages {
			switch m.Role {
			case trace.RoleSystem, trace.RoleUser, trace.RoleAssistant, trace.RoleTool:
			default:
				return nil, invalid(fmt.Sprintf("%s.messages[%d].role", field, i), fmt.Sprintf("%q is not system, user, assistant or tool", m.Role))
			}
		}
		return &TraceParam{Trace: &t}, nil
	}
	return nil, invalid(field, "expected the id of a trace the environment holds (a string), or a trace {id, model, messages}")
}

// traceSpec resolves a trace parameter into the twin's: the trace the environment holds under the id, or the one
// given; its answered calls in order.
func (p *Plane) traceSpec(ctx context.Context, envID, slug string, tp *TraceParam) (*twin.TraceSpec, error) {
	t := tp.Trace
	if t == nil {
		held, err := p.heldTrace(ctx, envID, tp.ID)
		if err != nil {
			return nil, notFoundOr(err, "trace "+tp.ID+" in environment "+slug)
		}
		t = held
	}
	spec := &twin.TraceSpec{ID: t.ID, Calls: twin.TraceCallsOf(*t)}
	size := 0
	for _, c := range spec.Calls {
		size += len(c.Tool) + len(c.Args) + len(c.Answer)
	}
	if size > maxTraceCallBytes {
		return nil, invalid("body.trace", fmt.Sprintf("its calls hold %d bytes, more than %d: give a prefix", size, maxTraceCallBytes))
	}
	return spec, nil
}

// heldTrace reads a trace the environment holds from the batch blob it came in.
func (p *Plane) heldTrace(ctx context.Context, envID, id string) (*trace.Trace, error) {
	row, batch, err := store.FindTrace(ctx, p.db, envID, id)
	if err != nil {
		return nil, err
	}
	if p.bundles == nil || p.bundles.Blob == nil {
		return nil, errorf(Unavailable, "traces cannot be read: no blob store is configured")
	}
	rc, err := p.bundles.Blob.Get(ctx, batch.BlobKey)
	if err != nil {
		return nil, fmt.Errorf("read trace batch %s: %w", batch.ID, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read trace batch %s: %w", batch.ID, err)
	}
	b, err := ingest.DecodeBlob(data)
	if err != nil {
		return nil, fmt.Errorf("decode trace batch %s: %w", batch.ID, err)
	}
	if i := int(row.Idx); i >= 0 && i < len(b.Traces) && b.Traces[i].ID == id {
		return &b.Traces[i], nil
	}
	for i := range b.Traces {
		if b.Traces[i].ID == id {
			return &b.Traces[i], nil
		}
	}
	return nil, fmt.Errorf("trace %s: %w (batch %s does not hold it)", id, store.ErrNotFound, batch.ID)
}
