package ingest

import (
	"errors"
	"fmt"
	"slices"
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

// keyName answers a key of the collect body's objects as a string, without allocating one for the keys it knows.
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

const (
	bProject = 1 << iota
	bTraces
)

func (p *parser) body(b *trace.Batch) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	var seen, bad uint32
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil {
			return err
		}
		if end {
			break
		}
		switch string(key) {
		case "project":
			if p.twice(&seen, bProject, "project") {
				break
			}
			p.push("project")
			s, ok, _, err := p.str(false)
			p.pop()
			if err != nil {
				return err
			}
			if ok {
				b.Project = s
			} else {
				bad |= bProject
			}
		case "traces":
			if p.twice(&seen, bTraces, "traces") {
				break
			}
			p.push("traces")
			ok, err := p.traces(b)
			p.pop()
			if err != nil {
				return err
			}
			if !ok {
				bad |= bTraces
			}
		default:
			p.push(string(key))
			err := p.skip(1)
			p.pop()
			if err != nil {
				return err
			}
		}
		if p.stopped {
			return errStop
		}
	}
	if p.lenient {
		return nil
	}
	if bad&bProject == 0 {
		p.push("project")
		p.checkProject(b.Project)
		p.pop()
	}
	if bad&bTraces == 0 && len(b.Traces) == 0 {
		p.failField("traces", "is required and must hold at least one trace")
	}
	return nil
}

// twice reports a field given a second time in one object; the value is then skipped.
func (p *parser) twice(seen *uint32, bit uint32, key string) bool {
	if *seen&bit == 0 {
		*seen |= bit
		return false
	}
	p.push(key)
	if err := p.skip(1); err == nil {
		p.fail("is given twice")
	}
	p.pop()
	return true
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

const (
	tID = 1 << iota
	tModel
	tMessages
)

func (p *parser) trace(t *trace.Trace, ti int) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	clear(p.callIDs)
	var seen, bad uint32
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil {
			return err
		}
		if end {
			break
		}
		switch string(key) {
		case "id":
			if p.twice(&seen, tID, "id") {
				break
			}
			p.push("id")
			s, ok, _, err := p.str(false)
			p.pop()
			if err != nil {
				return err
			}
			t.ID = s
			if !ok {
				bad |= tID
			}
		case "model":
			if p.twice(&seen, tModel, "model") {
				break
			}
			p.push("model")
			s, ok, null, err := p.str(true)
			p.pop()
			if err != nil {
				return err
			}
			t.Model = s
			if !ok && !null {
				bad |= tModel
			}
		case "messages":
			if p.twice(&seen, tMessages, "messages") {
				break
			}
			p.push("messages")
			ok, err := p.messages(t)
			p.pop()
			if err != nil {
				return err
			}
			if !ok {
				bad |= tMessages
			}
		default:
			p.push(string(key))
			err := p.skip(1)
			p.pop()
			if err != nil {
				return err
			}
		}
		if p.stopped {
			return errStop
		}
	}
	p.checkTrace(t, bad, ti, false)
	return nil
}

func (p *parser) messages(t *trace.Trace) (bool, error) {
	if ok, _, err := p.open('[', false); err != nil || !ok {
		return false, err
	}
	first := true
	for j := 0; ; j++ {
		end, err := p.nextElem(&first)
		if err != nil {
			return false, err
		}
		if end {
			if p.lean {
				return true, p.keepTexts(t)
			}
			return true, nil
		}
		t.Messages = append(t.Messages, trace.Message{})
		if p.lean {
			p.contentAt = append(p.contentAt[:j], -1)
		}
		p.pushIdx(j)
		err = p.message(&t.Messages[j])
		p.pop()
		if err != nil {
			return false, err
		}
		if p.stopped {
			return false, errStop
		}
	}
}

// Field bits of a message. Spelling bits tell the two names of an aliased field apart.
const (
	mRole = 1 << iota
	mContent
	mToolCalls
	mToolCallID
	mName
	kToolCalls
	kToolCallsCamel
	kToolCallID
	kToolCallIDCamel
	mText // content is a string, checked and not kept (Check)
)

func (p *parser) message(m *trace.Message) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	var seen, bad, present uint32
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil {
			return err
		}
		if end {
			break
		}
		switch k := keyName(key); k {
		case "role":
			if p.twice(&seen, mRole, k) {
				break
			}
			p.push(k)
			s, ok, _, err := p.str(false)
			p.pop()
			if err != nil {
				return err
			}
			m.Role = s
			if !ok {
				bad |= mRole
			}
		case "content":
			if p.twice(&seen, mContent, k) {
				break
			}
			present |= mContent
			if p.lean {
				if err := p.skipContent(); err != nil {
					return err
				}
				break
			}
			keep := !p.textless || seen&mRole == 0 || m.Role == trace.RoleSystem
			p.push(k)
			b, ok, null, err := p.strBytes(true, keep)
			p.pop()
			switch {
			case err != nil:
				return err
			case ok && !keep:
				present |= mText
			case ok:
				s := p.share(b)
				m.Content = &s
			case !null:
				bad |= mContent
			}
		case "name":
			if p.twice(&seen, mName, k) {
				break
			}
			p.push(k)
			s, ok, null, err := p.str(true)
			p.pop()
			if err != nil {
				return err
			}
			m.Name = s
			if !ok && !null {
				bad |= mName
			}
		case "tool_calls", "toolCalls":
			spell, other := uint32(kToolCalls), uint32(kToolCallsCamel)
			if k == "toolCalls" {
				spell, other = other, spell
			}
			if p.twice(&seen, spell, k) {
				break
			}
			p.push(k)
			var calls []trace.ToolCall
			ok, err := p.toolCalls(&calls)
			if err == nil && ok && seen&other != 0 && bad&mToolCalls == 0 && !slices.Equal(calls, m.ToolCalls) {
				p.fail("differs from the other spelling given (tool_calls, toolCalls): give one")
				ok = false
			}
			p.pop()
			if err != nil {
				return err
			}
			if !ok {
				bad |= mToolCalls
			}
			m.ToolCalls = calls
		case "tool_call_id", "toolCallId":
			spell, other := uint32(kToolCallID), uint32(kToolCallIDCamel)
			if k == "toolCallId" {
				spell, other = other, spell
			}
			if p.twice(&seen, spell, k) {
				break
			}
			p.push(k)
			s, ok, null, err := p.str(true)
			if err == nil && ok && seen&other != 0 && bad&mToolCallID == 0 && s != m.ToolCallID {
				p.fail("differs from the other spelling given (tool_call_id, toolCallId): give one")
				ok = false
			}
			p.pop()
			if err != nil {
				return err
			}
			if ok {
				m.ToolCallID = s
			} else if !null {
				bad |= mToolCallID
			}
		default:
			p.push(k)
			err := p.skip(1)
			p.pop()
			if err != nil {
				return err
			}
		}
		if p.stopped {
			return errStop
		}
	}
	p.checkMessage(m, bad, present, false)
	return nil
}

func (p *parser) toolCalls(calls *[]trace.ToolCall) (bool, error) {
	ok, null, err := p.open('[', true)
	if err != nil || null {
		return null, err
	}
	if !ok {
		return false, nil
	}
	first := true
	for k := 0; ; k++ {
		end, err := p.nextElem(&first)
		if err != nil {
			return false, err
		}
		if end {
			return true, nil
		}
		*calls = append(*calls, trace.ToolCall{})
		p.pushIdx(k)
		err = p.toolCall(&(*calls)[k])
		p.pop()
		if err != nil {
			return false, err
		}
		if p.stopped {
			return false, errStop
		}
	}
}

// Field bits of a tool call and its function.
const (
	cID = 1 << iota
	cType
	cFunction
	cName
	cArguments
)

func (p *parser) toolCall(tc *trace.ToolCall) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	var seen, bad, present uint32
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil {
			return err
		}
		if end {
			break
		}
		switch k := keyName(key); k {
		case "id", "type":
			bit := uint32(cID)
			dst := &tc.ID
			if k == "type" {
				bit, dst = cType, &tc.Type
			}
			if p.twice(&seen, bit, k) {
				break
			}
			p.push(k)
			s, ok, null, err := p.str(k == "type")
			p.pop()
			if err != nil {
				return err
			}
			*dst = s
			if !ok && !(null && k == "type") {
				bad |= bit
			}
		case "function":
			if p.twice(&seen, cFunction, k) {
				break
			}
			present |= cFunction
			p.push(k)
			fbad, err := p.function(&tc.Function)
			p.pop()
			if err != nil {
				return err
			}
			bad |= fbad
		default:
			p.push(k)
			err := p.skip(1)
			p.pop()
			if err != nil {
				return err
			}
		}
		if p.stopped {
			return errStop
		}
	}
	p.checkToolCall(tc, bad, present)
	return nil
}

// function reads a tool call's function object; it answers the bits of fields already reported.
func (p *parser) function(f *trace.Function) (uint32, error) {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return cFunction, err
	}
	var seen, bad uint32
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil {
			return bad, err
		}
		if end {
			return bad, nil
		}
		switch k := keyName(key); k {
		case "name", "arguments":
			bit := uint32(cName)
			dst := &f.Name
			if k == "arguments" {
				bit, dst = cArguments, &f.Arguments
			}
			if p.twice(&seen, bit, k) {
				break
			}
			p.push(k)
			var s string
			var ok bool
			if k == "arguments" {
				s, ok, err = p.arguments()
			} else {
				s, ok, _, err = p.str(false)
			}
			p.pop()
			if err != nil {
				return bad, err
			}
			*dst = s
			if !ok {
				bad |= bit
			}
		default:
			p.push(k)
			err := p.skip(1)
			p.pop()
			if err != nil {
				return bad, err
			}
		}
		if p.stopped {
			return bad, errStop
		}
	}
}

// arguments reads function.arguments, which must be a string; a JSON object or array given directly
// gets a message that says how to send it.
func (p *parser) arguments() (string, bool, error) {
	c, err := p.peek()
	if err != nil {
		return "", false, err
	}
	if c == '{' || c == '[' {
		if err := p.skip(1); err != nil {
			return "", false, err
		}
		p.fail(fmt.Sprintf("must be a string holding JSON, got %s (encode the arguments as a JSON string)", kind(c)))
		return "", false, nil
	}
	s, ok, _, err := p.str(false)
	return s, ok, err
}
