package ingest

import (
	"fmt"
	"slices"

	"github.com/doppel-dev/doppel/trace"
)

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

// The two spellings of a message's aliased fields, as an error names them.
const (
	toolCallsNames  = "tool_calls, toolCalls"
	toolCallIDNames = "tool_call_id, toolCallId"
)

var messageFields = []field[trace.Message]{
	{name: "role", bit: mRole, str: func(m *trace.Message) *string { return &m.Role }},
	{name: "content", bit: mContent, read: asContent},
	{name: "name", bit: mName, nullOK: true, str: func(m *trace.Message) *string { return &m.Name }},
	{name: "tool_calls", bit: kToolCalls, bad: mToolCalls, other: kToolCallsCamel, both: toolCallsNames, read: asToolCalls},
	{name: "toolCalls", bit: kToolCallsCamel, bad: mToolCalls, other: kToolCalls, both: toolCallsNames, read: asToolCalls},
	{name: "tool_call_id", bit: kToolCallID, bad: mToolCallID, other: kToolCallIDCamel, both: toolCallIDNames, nullOK: true,
		str: func(m *trace.Message) *string { return &m.ToolCallID }},
	{name: "toolCallId", bit: kToolCallIDCamel, bad: mToolCallID, other: kToolCallID, both: toolCallIDNames, nullOK: true,
		str: func(m *trace.Message) *string { return &m.ToolCallID }},
}

func (p *parser) message(m *trace.Message) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	st, err := readFields(p, m, messageFields)
	if err != nil {
		return err
	}
	p.checkMessage(m, st.bad, st.seen, false)
	return nil
}

// content reads a message's content: a string or null. Lean, it only notes where the string starts (skipContent);
// textless, it keeps only a system message's (or one whose role comes after it) and marks the others mText.
func (p *parser) content(m *trace.Message, st *object) (bool, error) {
	if p.lean {
		return true, p.skipContent()
	}
	keep := !p.textless || st.seen&mRole == 0 || m.Role == trace.RoleSystem
	b, ok, null, err := p.strBytes(true, keep)
	switch {
	case err != nil:
		return false, err
	case ok && !keep:
		st.seen |= mText
	case ok:
		s := p.share(b)
		m.Content = &s
	}
	return ok || null, nil
}

// messageToolCalls reads a message's tool calls (either spelling); when same, they must equal those of the other.
func (p *parser) messageToolCalls(m *trace.Message, same bool) (bool, error) {
	var calls []trace.ToolCall
	ok, err := p.toolCalls(&calls)
	if err != nil {
		return false, err
	}
	if ok && same && !slices.Equal(calls, m.ToolCalls) {
		p.differs(toolCallsNames)
		ok = false
	}
	m.ToolCalls = calls
	return ok, nil
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

var toolCallFields = []field[trace.ToolCall]{
	{name: "id", bit: cID, str: func(tc *trace.ToolCall) *string { return &tc.ID }},
	{name: "type", bit: cType, nullOK: true, str: func(tc *trace.ToolCall) *string { return &tc.Type }},
	{name: "function", bit: cFunction, read: asFunction},
}

func (p *parser) toolCall(tc *trace.ToolCall) error {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return err
	}
	st, err := readFields(p, tc, toolCallFields)
	if err != nil {
		return err
	}
	p.checkToolCall(tc, st.bad, st.seen)
	return nil
}

var functionFields = []field[trace.Function]{
	{name: "name", bit: cName, str: func(f *trace.Function) *string { return &f.Name }},
	{name: "arguments", bit: cArguments, read: asArguments},
}

// function reads a tool call's function object; it answers the bits of fields already reported.
func (p *parser) function(f *trace.Function) (uint32, error) {
	ok, _, err := p.open('{', false)
	if err != nil || !ok {
		return cFunction, err
	}
	st, err := readFields(p, f, functionFields)
	return st.bad, err
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
