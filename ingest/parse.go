package ingest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/trace"
)

// errStop unwinds the parser after a syntax error or when MaxErrors is reached; the reason is in p.errs.
var errStop = errors.New("ingest: stop")

// seg is one step of a JSON path: an object key, or an array index when idx >= 0.
type seg struct {
	key string
	idx int
}

type parser struct {
	buf       []byte
	pos       int
	opts      Options
	path      []seg
	errs      []FieldError
	truncated bool
	stopped   bool
	overLimit bool
	// checkUTF8 is set when checking in-memory values (ValidateTrace), which may hold invalid UTF-8.
	checkUTF8 bool
	// lenient skips the field rules (types and syntax are still checked): DecodeBlob reads stored batches.
	lenient bool
	// root names the whole input in paths ("body" when empty).
	root     string
	scratch  []byte
	traceIDs map[string]int
	callIDs  map[string]struct{}
	// traceBytes are the bytes each trace of the body takes, in order.
	traceBytes []int64
	// textless checks message contents but keeps only system messages' (Check).
	textless bool
	// lean leaves out the message texts a build does not read (DecodeBlobCalls); contentAt holds, while a trace's
	// messages are read, where each message's content string starts (-1: none), to read the kept ones after.
	lean      bool
	contentAt []int
	// long holds the long strings met so far (up to maxShared), so that a text every trace repeats (a system
	// prompt: some 7 KB in each tau trace, a third of a batch's text) is one string rather than one per trace.
	long map[string]string
}

// Strings of sharedMinLen bytes or more are shared within one body, at most maxShared distinct ones.
const (
	sharedMinLen = 1024
	maxShared    = 64
)

// share answers b as a string, the one met before where a long string repeats.
func (p *parser) share(b []byte) string {
	if len(b) < sharedMinLen {
		switch string(b) { // the values every message or call repeats, without allocating
		case trace.RoleSystem:
			return trace.RoleSystem
		case trace.RoleUser:
			return trace.RoleUser
		case trace.RoleAssistant:
			return trace.RoleAssistant
		case trace.RoleTool:
			return trace.RoleTool
		case "function":
			return "function"
		}
		return string(b)
	}
	if s, ok := p.long[string(b)]; ok { // the conversion in a map index allocates nothing
		return s
	}
	s := string(b)
	if len(p.long) < maxShared {
		if p.long == nil {
			p.long = map[string]string{}
		}
		p.long[s] = s
	}
	return s
}

// keyName answers a key of the collect body's objects as a string, without allocating one for the keys it knows;
// readFields names by it the keys an object's table does not hold (the table names its own).
func keyName(key []byte) string {
	switch string(key) { // compared without a conversion
	case "role":
		return "role"
	case "content":
		return "content"
	case "name":
		return "name"
	case "tool_calls":
		return "tool_calls"
	case "toolCalls":
		return "toolCalls"
	case "tool_call_id":
		return "tool_call_id"
	case "toolCallId":
		return "toolCallId"
	case "id":
		return "id"
	case "type":
		return "type"
	case "function":
		return "function"
	case "arguments":
		return "arguments"
	}
	return string(key)
}

func newParser(buf []byte, opts Options) *parser {
	return &parser{
		buf:      buf,
		opts:     opts,
		path:     make([]seg, 0, 8),
		traceIDs: map[string]int{},
		callIDs:  map[string]struct{}{},
	}
}

func (p *parser) push(key string) { p.path = append(p.path, seg{key: key, idx: -1}) }
func (p *parser) pushIdx(i int)   { p.path = append(p.path, seg{idx: i}) }
func (p *parser) pop()            { p.path = p.path[:len(p.path)-1] }

func (p *parser) pathString() string {
	if len(p.path) == 0 {
		if p.root != "" {
			return p.root
		}
		return "body"
	}
	var b strings.Builder
	for i, s := range p.path {
		switch {
		case s.idx >= 0:
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.idx))
			b.WriteByte(']')
		case isPlainKey(s.key):
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key)
		default:
			b.WriteByte('[')
			b.WriteString(strconv.Quote(s.key))
			b.WriteByte(']')
		}
	}
	return b.String()
}

func isPlainKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// fail records a field error at the current path.
func (p *parser) fail(msg string) {
	if p.stopped {
		return
	}
	if len(p.errs) >= p.opts.MaxErrors {
		p.truncated, p.stopped = true, true
		return
	}
	p.errs = append(p.errs, FieldError{Path: p.pathString(), Message: msg})
}

// failField records a field error at the current path plus key.
func (p *parser) failField(key, msg string) {
	p.push(key)
	p.fail(msg)
	p.pop()
}

// parseBody reads the whole collect body into b.
func (p *parser) parseBody(b *trace.Batch) {
	if err := p.body(b); err != nil {
		return
	}
	p.ws()
	if p.pos < len(p.buf) {
		p.syntax(p.pos, "unexpected data after the body's object")
	}
}

// Field bits of the body.
const (
	bProject = 1 << iota
	bTraces
)

var bodyFields = []field[trace.Batch]{
	{name: "project", bit: bProject, str: func(b *trace.Batch) *string { return &b.Project }},
	{name: "traces", bit: bTraces, read: asTraces},
}

func (p *parser) body(b *trace.Batch) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	st, err := readFields(p, b, bodyFields)
	if err != nil {
		return err
	}
	if p.lenient {
		return nil
	}
	if st.bad&bProject == 0 {
		p.push("project")
		p.checkProject(b.Project)
		p.pop()
	}
	if st.bad&bTraces == 0 && len(b.Traces) == 0 {
		p.failField("traces", "is required and must hold at least one trace")
	}
	return nil
}

func (p *parser) traces(b *trace.Batch) (ok bool, err error) {
	if ok, _, err := p.open('[', false); err != nil || !ok {
		return false, err
	}
	first := true
	for i := 0; ; i++ {
		end, err := p.nextElem(&first)
		if err != nil {
			return false, err
		}
		if end {
			return true, nil
		}
		if i == p.opts.MaxTraces {
			p.fail(fmt.Sprintf("holds more than the limit of %d traces in one batch", p.opts.MaxTraces))
			p.stopped, p.overLimit = true, true
			return false, errStop
		}
		b.Traces = append(b.Traces, trace.Trace{})
		p.pushIdx(i)
		start := p.pos
		err = p.trace(&b.Traces[i], i)
		p.traceBytes = append(p.traceBytes, int64(p.pos-start))
		p.pop()
		if err != nil {
			return false, err
		}
		if p.stopped {
			return false, errStop
		}
	}
}

// Field bits of a trace.
const (
	tID = 1 << iota
	tModel
	tMessages
)

var traceFields = []field[trace.Trace]{
	{name: "id", bit: tID, str: func(t *trace.Trace) *string { return &t.ID }},
	{name: "model", bit: tModel, nullOK: true, str: func(t *trace.Trace) *string { return &t.Model }},
	{name: "messages", bit: tMessages, read: asMessages},
}

func (p *parser) trace(t *trace.Trace, ti int) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	clear(p.callIDs)
	st, err := readFields(p, t, traceFields)
	if err != nil {
		return err
	}
	p.checkTrace(t, st.bad, ti, false)
	return nil
}
