package ingest

import "github.com/doppel-dev/doppel/trace"

// Each object of a collect body (the body, a trace, a message, a tool call, its function) declares its fields once,
// in a table of field; readFields walks an object's keys against its table, and keys not in it are read and ignored.
// A value other than a string is read by the method its field's how names, through one switch (value): a function
// in the table would take the parser, which would then escape to the heap, one allocation more per body.

// object holds the bits of one object being read: the fields given (and, in a message, mText) and those whose
// value was reported wrong, which the checks after the object skip.
type object struct {
	seen, bad uint32
}

// how names the way a field's value is read.
type how uint8

const (
	asText      how = iota // a string, into the field's str (the zero how)
	asTraces               // the body's traces (parser.traces)
	asMessages             // a trace's messages (parser.messages)
	asContent              // a message's content (parser.content)
	asToolCalls            // a message's tool calls, either spelling (parser.messageToolCalls)
	asFunction             // a tool call's function (parser.function)
	asArguments            // a function's arguments (parser.arguments)
)

// field is one key of an object read into a T.
type field[T any] struct {
	name string
	// bit is the key's bit in object.seen: a key given again is reported ("is given twice") and skipped.
	bit uint32
	// bad is the bit a wrong value sets in object.bad; 0 means bit. The two spellings of a field have a bit each
	// and one bad bit.
	bad uint32
	// other is the seen bit of the field's other spelling, if it has one, and both names the two spellings: the
	// second spelling given must hold the value of the first, when that was read well.
	other uint32
	both  string
	// read is how the value is read.
	read how
	// str says where a string field's value goes (set only when it is a string); nullOK lets it be null.
	str    func(o *T) *string
	nullOK bool
}

// readFields reads the keys of an object whose '{' is consumed, up to its '}', by the object's table, and answers
// the object's bits.
func readFields[T any](p *parser, o *T, fields []field[T]) (object, error) {
	var st object
	first := true
	for {
		key, end, err := p.nextKey(&first)
		if err != nil || end {
			return st, err
		}
		var f *field[T]
		for i := range fields {
			if string(key) == fields[i].name { // compared without a conversion
				f = &fields[i]
				break
			}
		}
		switch {
		case f == nil:
			p.push(keyName(key))
			err = p.skip(1)
			p.pop()
		case p.twice(&st.seen, f.bit, f.name):
		default:
			bad := f.bad
			if bad == 0 {
				bad = f.bit
			}
			same := st.seen&f.other != 0 && st.bad&bad == 0
			ok := false
			p.push(f.name)
			if f.read == asText {
				ok, err = p.text(f.str(o), f.nullOK, same, f.both)
			} else {
				ok, err = p.value(f.read, o, &st, same)
			}
			p.pop()
			if !ok {
				st.bad |= bad
			}
		}
		if err != nil {
			return st, err
		}
		if p.stopped {
			return st, errStop
		}
	}
}

// value reads a field's value that is not a plain string into o, the object whose bits are st, as read says; it
// answers false when the value was reported wrong. When same, it must equal the value of the field's other spelling.
func (p *parser) value(read how, o any, st *object, same bool) (bool, error) {
	switch read {
	case asTraces:
		return p.traces(o.(*trace.Batch))
	case asMessages:
		return p.messages(o.(*trace.Trace))
	case asContent:
		return p.content(o.(*trace.Message), st)
	case asToolCalls:
		return p.messageToolCalls(o.(*trace.Message), same)
	case asFunction:
		bad, err := p.function(&o.(*trace.ToolCall).Function)
		st.bad |= bad
		return true, err
	case asArguments:
		s, ok, err := p.arguments()
		o.(*trace.Function).Arguments = s
		return ok, err
	}
	panic("ingest: a field read no way")
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

// text reads a string field's value into dst, which a null leaves as it is; it answers false when the value was
// reported wrong (null too, unless nullOK). When same, the string must equal dst, given by the other spelling of
// the field (both names them).
func (p *parser) text(dst *string, nullOK, same bool, both string) (bool, error) {
	s, ok, null, err := p.str(nullOK)
	if err != nil {
		return false, err
	}
	if ok && same && s != *dst {
		p.differs(both)
		return false, nil
	}
	if ok {
		*dst = s
	}
	return ok || null && nullOK, nil
}

// differs reports a value that does not equal the one given by the other spelling of its field (both names them).
func (p *parser) differs(both string) {
	p.fail("differs from the other spelling given (" + both + "): give one")
}
