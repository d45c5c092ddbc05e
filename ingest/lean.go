package ingest

import (
	"bytes"

	"github.com/doppel-dev/doppel/trace"
)

// skipContent reads a message's content (lean) without making a string of it, noting where it starts for
// keepTexts.
func (p *parser) skipContent() error {
	p.push("content")
	defer p.pop()
	c, err := p.peek()
	if err != nil {
		return err
	}
	switch c {
	case '"':
		p.contentAt[len(p.contentAt)-1] = p.pos
		_, err := p.rawString()
		return err
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
	keep := func(j int) error {
		b, err := read(j)
		if err != nil {
			return err
		}
		s := p.share(b)
		t.Messages[j].Content = &s
		return nil
	}
	user, answer := false, -1
	for j := range t.Messages {
		if p.contentAt[j] < 0 {
			continue
		}
		m := &t.Messages[j]
		switch {
		case m.Role == trace.RoleTool || m.Role == trace.RoleSystem:
			if err := keep(j); err != nil {
				return err
			}
		case m.Role == trace.RoleUser && !user:
			b, err := read(j)
			if err != nil {
				return err
			}
			if len(b) > 0 {
				user = true
				if err := keep(j); err != nil {
					return err
				}
			}
		case m.Role == trace.RoleAssistant && len(m.ToolCalls) == 0:
			b, err := read(j)
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(b)) > 0 {
				answer = j
			}
		}
	}
	if answer >= 0 {
		return keep(answer)
	}
	return nil
}
