package ingest

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/trace"
)

// The checks below run on decoded values, after their object is read; fields whose bit is set in bad
// already had an error reported while decoding. ValidateTrace runs the same checks on in-memory traces.

func (p *parser) checkProject(name string) {
	switch {
	case name == "":
		p.fail("is required and must not be empty")
	case p.checkUTF8 && !utf8.ValidString(name):
		p.fail("is not valid UTF-8")
	case utf8.RuneCountInString(name) > MaxProjectLen:
		p.fail(fmt.Sprintf("is %d characters long, more than the limit of %d", utf8.RuneCountInString(name), MaxProjectLen))
	case hasControl(name):
		p.fail("must not hold control characters")
	case Slug(name) == "":
		p.fail(fmt.Sprintf("must hold at least one ASCII letter or digit (the environment slug is made from it); got %s", quote(name)))
	}
}

// checkTrace checks a trace's own fields, its id's uniqueness in the batch (ti >= 0 with a batch's
// ids in p.traceIDs) and, when all is true, its messages too.
func (p *parser) checkTrace(t *trace.Trace, bad uint32, ti int, all bool) {
	if p.lenient {
		return
	}
	if bad&tID == 0 {
		p.push("id")
		if p.checkIdent(t.ID, MaxIDLen, false) && !all {
			if j, dup := p.traceIDs[t.ID]; dup {
				p.fail(fmt.Sprintf("duplicates traces[%d].id (%s): trace ids are unique within a batch", j, quote(t.ID)))
			} else {
				p.traceIDs[t.ID] = ti
			}
		}
		p.pop()
	}
	if bad&tModel == 0 && t.Model != "" {
		p.push("model")
		p.checkText(t.Model, MaxNameLen)
		p.pop()
	}
	if all {
		clear(p.callIDs)
		p.push("messages")
		for j := range t.Messages {
			p.pushIdx(j)
			for k := range t.Messages[j].ToolCalls {
				p.push("tool_calls")
				p.pushIdx(k)
				p.checkToolCall(&t.Messages[j].ToolCalls[k], 0, cFunction)
				p.pop()
				p.pop()
			}
			present := uint32(0)
			if t.Messages[j].Content != nil {
				present = mContent
			}
			p.checkMessage(&t.Messages[j], 0, present, true)
			p.pop()
		}
		p.pop()
	}
	if bad&tMessages == 0 && len(t.Messages) == 0 {
		p.failField("messages", "is required and must hold at least one message")
	}
}

func (p *parser) checkMessage(m *trace.Message, bad, present uint32, inMemory bool) {
	if p.lenient {
		return
	}
	known := true
	if bad&mRole == 0 {
		switch m.Role {
		case trace.RoleSystem, trace.RoleUser, trace.RoleAssistant, trace.RoleTool:
		case "":
			known = false
			p.failField("role", "is required: one of system, user, assistant, tool")
		default:
			known = false
			p.failField("role", "must be one of system, user, assistant, tool; got "+quote(m.Role))
		}
	} else {
		known = false
	}
	if bad&mContent == 0 {
		switch {
		case present&mText != 0:
		case m.Content != nil:
			if p.checkUTF8 && !utf8.ValidString(*m.Content) {
				p.failField("content", "is not valid UTF-8")
			}
		case !known:
		case m.Role == trace.RoleAssistant && len(m.ToolCalls) > 0:
		case present&mContent != 0 && !inMemory:
			p.failField("content", "must be a string: null is allowed only on an assistant message with tool_calls")
		default:
			p.failField("content", "is required: a string (null or absent only on an assistant message with tool_calls)")
		}
	}
	if bad&mToolCalls == 0 && len(m.ToolCalls) > 0 {
		if known && m.Role != trace.RoleAssistant {
			p.failField("tool_calls", "only assistant messages carry tool_calls; this one's role is "+m.Role)
		}
		for k := range m.ToolCalls {
			id := m.ToolCalls[k].ID
			if id == "" {
				continue
			}
			for j := range k {
				if m.ToolCalls[j].ID == id {
					p.push("tool_calls")
					p.pushIdx(k)
					p.failField("id", fmt.Sprintf("duplicates tool_calls[%d].id (%s) in the same message", j, quote(id)))
					p.pop()
					p.pop()
					break
				}
			}
			p.callIDs[id] = struct{}{}
		}
	}
	if bad&mToolCallID == 0 {
		switch {
		case !known:
		case m.Role == trace.RoleTool && m.ToolCallID == "":
			p.failField("tool_call_id", "is required on a tool message: the id of the tool call it answers")
		case m.Role == trace.RoleTool:
			if _, ok := p.callIDs[m.ToolCallID]; !ok {
				p.failField("tool_call_id", fmt.Sprintf("names no earlier tool call in this trace (%s)", quote(m.ToolCallID)))
			}
		case m.ToolCallID != "":
			p.failField("tool_call_id", "only tool messages carry tool_call_id; this one's role is "+m.Role)
		}
	}
	if bad&mName == 0 && m.Name != "" {
		p.push("name")
		p.checkText(m.Name, MaxNameLen)
		p.pop()
	}
}

func (p *parser) checkToolCall(tc *trace.ToolCall, bad, present uint32) {
	if p.lenient {
		return
	}
	if bad&cID == 0 {
		p.push("id")
		p.checkIdent(tc.ID, MaxNameLen, false)
		p.pop()
	}
	if bad&cType == 0 && tc.Type != "" && tc.Type != "function" {
		p.failField("type", `must be "function" when given; got `+quote(tc.Type))
	}
	if bad&cFunction != 0 {
		return
	}
	if present&cFunction == 0 {
		p.failField("function", "is required: {name, arguments}")
		return
	}
	p.push("function")
	defer p.pop()
	if bad&cName == 0 {
		p.push("name")
		p.checkIdent(tc.Function.Name, MaxNameLen, true)
		p.pop()
	}
	if bad&cArguments == 0 {
		p.push("arguments")
		switch {
		case tc.Function.Arguments == "":
			p.fail(`is required: a string holding JSON, e.g. "{}"`)
		case p.checkUTF8 && !utf8.ValidString(tc.Function.Arguments):
			p.fail("is not valid UTF-8")
		default:
			if msg := jsonError([]byte(tc.Function.Arguments)); msg != "" {
				p.fail("must be a string holding JSON; " + msg)
			}
		}
		p.pop()
	}
}

// checkIdent checks a required identifier at the current path; it answers whether it passed.
func (p *parser) checkIdent(s string, limit int, noSpace bool) bool {
	switch {
	case s == "":
		p.fail("is required and must not be empty")
	case p.checkUTF8 && !utf8.ValidString(s):
		p.fail("is not valid UTF-8")
	case len(s) > limit:
		p.fail(fmt.Sprintf("is %d bytes long, more than the limit of %d", len(s), limit))
	case hasControl(s):
		p.fail("must not hold control characters")
	case noSpace && hasSpace(s):
		p.fail("must not hold white space; got " + quote(s))
	default:
		return true
	}
	return false
}

// checkText checks an optional short text at the current path.
func (p *parser) checkText(s string, limit int) {
	switch {
	case p.checkUTF8 && !utf8.ValidString(s):
		p.fail("is not valid UTF-8")
	case len(s) > limit:
		p.fail(fmt.Sprintf("is %d bytes long, more than the limit of %d", len(s), limit))
	case hasControl(s):
		p.fail("must not hold control characters")
	}
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

func hasSpace(s string) bool {
	for _, r := range s {
		if unicode.IsSpace(r) {
			return true
		}
	}
	return false
}

// quote quotes a value for an error message, cut to 60 bytes.
func quote(s string) string {
	const limit = 60
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
