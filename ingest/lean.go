package ingest

import (
	"bytes"

	"github.com/doppel-dev/doppel/trace"
)

// skipContent reads a message's content (lean) without making a string of it, noting where it starts for
// keepTexts; the path names the content.
func (p *parser) skipContent() error {
	c, err := p.peek()
	if err != nil {
		return err
	}
	switch c {
	case '"':
		p.contentAt[len(p.contentAt)-1] = p.pos
		return p.skipString()
	case 'n':
		return p.literal("null")
	}
	return p.wrongType("a string")
}

// keepTexts gives t's messages the texts a build reads (see DecodeBlobCalls), read again from where skipContent
// noted them: every tool and system message's (system prompts repeat, so they are shared and cost little), the
// first user text that is not empty and the last text the assistant said without tool calls that is not blank.
func (p *parser) keepTexts(t *trace.Trace) error {
	at := p.pos
	defer func() { p.pos = at }()
	read := func(j int) ([]byte, error) {
		p.pos = p.contentAt[j]
		return p.rawString()
	}
	set := func(j int, b []byte) {
		s := p.share(b)
		t.Messages[j].Content = &s
	}
	user, answer := false, -1
	for j := range t.Messages {
		m := &t.Messages[j]
		always := m.Role == trace.RoleTool || m.Role == trace.RoleSystem
		wanted := always || m.Role == trace.RoleUser && !user || m.Role == trace.RoleAssistant && len(m.ToolCalls) == 0
		if p.contentAt[j] < 0 || !wanted {
			continue
		}
		b, err := read(j)
		if err != nil {
			return err
		}
		switch {
		case always:
			set(j, b)
		case m.Role == trace.RoleUser:
			if len(b) > 0 {
				user = true
				set(j, b)
			}
		default: // the assistant's text said without tool calls
			if len(bytes.TrimSpace(b)) > 0 {
				answer = j // read again at the end: b may be the parser's scratch, which later reads overwrite
			}
		}
	}
	if answer >= 0 {
		b, err := read(answer)
		if err != nil {
			return err
		}
		set(answer, b)
	}
	return nil
}
