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
