package twin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// The canonical bundle bytes are the canonical JSON of the bundle's encoding/json form. A large bundle
// (hundreds of MB) is written a piece at a time: each long list (recordings, answers, tables and their
// rows) element by element, so no parsed copy of the whole bundle is ever held.

// flushAt is how much canonical output is buffered before it is written on.
const flushAt = 64 << 10

// canonWriter buffers canonical output and passes it on in chunks, keeping the first error.
type canonWriter struct {
	w   io.Writer
	buf bytes.Buffer
	err error
}

func (cw *canonWriter) flush(force bool) {
	if cw.err != nil || (!force && cw.buf.Len() < flushAt) {
		return
	}
	if _, err := cw.w.Write(cw.buf.Bytes()); err != nil {
		cw.err = err
	}
	cw.buf.Reset()
}

// value writes the canonical JSON of v's encoding/json form.
func (cw *canonWriter) value(v any) error {
	if s, ok := v.(string); ok && utf8.ValidString(s) {
		// encoding/json and the parser give a valid string back unchanged.
		jsonvalue.AppendString(&cw.buf, s)
		return nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p, err := jsonvalue.Parse(raw)
	if err != nil {
		return err
	}
	jsonvalue.AppendCanonical(&cw.buf, p)
	cw.flush(false)
	return cw.err
}

// longList is a list field written element by element, or (whole set) a field whose value writes itself.
type longList struct {
	n     int
	at    func(i int) error // writes element i
	whole func() error
}

// object writes the canonical JSON of a struct whose long list fields head holds as placeholders
// (empty when the list is empty, one zero element otherwise, so encoding/json decides whether the key
// appears and spells an empty list as it would); lists writes those fields' elements by json key.
func (cw *canonWriter) object(head any, lists map[string]longList) error {
	raw, err := json.Marshal(head)
	if err != nil {
		return err
	}
	p, err := jsonvalue.Parse(raw)
	if err != nil {
		return err
	}
	o, ok := p.(*jsonvalue.Object)
	if !ok {
		return fmt.Errorf("encoded as %T, not an object", p)
	}
	idx := make([]int, len(o.Keys))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return o.Keys[idx[i]] < o.Keys[idx[j]] })
	cw.buf.WriteByte('{')
	for n, i := range idx {
		if n > 0 {
			cw.buf.WriteByte(',')
		}
		jsonvalue.AppendString(&cw.buf, o.Keys[i])
		cw.buf.WriteByte(':')
		l, long := lists[o.Keys[i]]
		if long && l.whole != nil {
			if err := l.whole(); err != nil {
				return fmt.Errorf("%s: %w", o.Keys[i], err)
			}
			continue
		}
		if !long || l.n == 0 {
			jsonvalue.AppendCanonical(&cw.buf, o.Vals[i])
			continue
		}
		cw.buf.WriteByte('[')
		for e := range l.n {
			if e > 0 {
				cw.buf.WriteByte(',')
			}
			if err := l.at(e); err != nil {
				return fmt.Errorf("%s[%d]: %w", o.Keys[i], e, err)
			}
			cw.flush(false)
			if cw.err != nil {
				return cw.err
			}
		}
		cw.buf.WriteByte(']')
	}
	cw.buf.WriteByte('}')
	cw.flush(false)
	return cw.err
}

// placeholder is what a head holds in place of a long list: the list itself when empty (nil or not),
// else one zero element.
func placeholder[T any](xs []T) []T {
	if len(xs) == 0 {
		return xs
	}
	return make([]T, 1)
}

func list[T any](cw *canonWriter, xs []T) longList {
	return longList{n: len(xs), at: func(i int) error {
		if d, ok := any(&xs[i]).(directCanonical); ok && d.appendCanonical(&cw.buf) {
			return nil
		}
		return cw.value(&xs[i])
	}}
}

// directCanonical is a list element that can write its own canonical form, without the round trip
// through encoding/json and the parser that value takes (a large bundle has millions of recordings).
// appendCanonical writes nothing and answers false when it cannot (a string that is not valid UTF-8,
// which encoding/json would have changed).
type directCanonical interface {
	appendCanonical(b *bytes.Buffer) bool
}

// appendCanonical writes r as value(r) would: keys in byte order, omitempty fields left out.
func (r *Recording) appendCanonical(b *bytes.Buffer) bool {
	if !validUTF8(r.Args, r.State, r.Tool, r.Trace) {
		return false
	}
	b.WriteString(`{"answer":`)
	b.WriteString(strconv.Itoa(r.Answer))
	b.WriteString(`,"args":`)
	jsonvalue.AppendString(b, r.Args)
	b.WriteString(`,"call":`)
	b.WriteString(strconv.Itoa(r.Call))
	if r.Error {
		b.WriteString(`,"error":true`)
	}
	if r.State != "" {
		b.WriteString(`,"state":`)
		jsonvalue.AppendString(b, r.State)
	}
	b.WriteString(`,"tool":`)
	jsonvalue.AppendString(b, r.Tool)
	b.WriteString(`,"trace":`)
	jsonvalue.AppendString(b, r.Trace)
	b.WriteByte('}')
	return true
}

// appendCanonical writes r as value(r) would.
func (r *Row) appendCanonical(b *bytes.Buffer) bool {
	if !validUTF8(r.Key, r.JSON) || !validUTF8(r.From...) {
		return false
	}
	b.WriteByte('{')
	if len(r.From) > 0 {
		b.WriteString(`"from":[`)
		for i, f := range r.From {
			if i > 0 {
				b.WriteByte(',')
			}
			jsonvalue.AppendString(b, f)
		}
		b.WriteString(`],`)
	}
	b.WriteString(`"json":`)
	jsonvalue.AppendString(b, r.JSON)
	b.WriteString(`,"key":`)
	jsonvalue.AppendString(b, r.Key)
	b.WriteByte('}')
	return true
}

// appendCanonical writes r as value(r) would.
func (r *AgentRun) appendCanonical(b *bytes.Buffer) bool {
	if !validUTF8(r.TraceID, r.Request, r.Answer) {
		return false
	}
	for _, c := range r.Calls {
		if !validUTF8(c.Tool, c.Arguments) {
			return false
		}
	}
	b.WriteString(`{"answer":`)
	jsonvalue.AppendString(b, r.Answer)
	if len(r.Calls) > 0 {
		b.WriteString(`,"calls":[`)
		for i, c := range r.Calls {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"arguments":`)
			jsonvalue.AppendString(b, c.Arguments)
			b.WriteString(`,"tool":`)
			jsonvalue.AppendString(b, c.Tool)
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	b.WriteString(`,"request":`)
	jsonvalue.AppendString(b, r.Request)
	b.WriteString(`,"trace_id":`)
	jsonvalue.AppendString(b, r.TraceID)
	b.WriteByte('}')
	return true
}

func validUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

func (cw *canonWriter) table(t *Table) error {
	head := *t
	head.Rows, head.Facts = placeholder(t.Rows), placeholder(t.Facts)
	return cw.object(&head, map[string]longList{"rows": list(cw, t.Rows), "facts": list(cw, t.Facts)})
}

// WriteCanonical writes the bundle's canonical bytes, exactly what Marshal answers, to w a piece at a time.
func (b *Bundle) WriteCanonical(w io.Writer) error {
	c := *b
	c.Format = FormatVersion
	c.Tools = append([]Tool(nil), b.Tools...)
	sort.SliceStable(c.Tools, func(i, j int) bool { return c.Tools[i].Name < c.Tools[j].Name })
	c.Tables = append([]Table(nil), b.Tables...)
	sort.SliceStable(c.Tables, func(i, j int) bool { return c.Tables[i].Name < c.Tables[j].Name })
	cw := &canonWriter{w: w}
	head := c
	head.Tools, head.Tables = placeholder(c.Tools), placeholder(c.Tables)
	head.Recordings, head.Answers = placeholder(c.Recordings), placeholder(c.Answers)
	lists := map[string]longList{
		"tools":      list(cw, c.Tools),
		"tables":     {n: len(c.Tables), at: func(i int) error { return cw.table(&c.Tables[i]) }},
		"recordings": list(cw, c.Recordings),
		"answers":    {n: len(c.Answers), at: func(i int) error { return cw.value(c.Answers[i]) }},
	}
	if c.Agent != nil {
		// The agent's runs (one per trace) are a long list too.
		agent := *c.Agent
		agent.Runs = placeholder(c.Agent.Runs)
		head.Agent = &agent
		lists["agent"] = longList{whole: func() error {
			return cw.object(&agent, map[string]longList{"runs": list(cw, c.Agent.Runs)})
		}}
	}
	err := cw.object(&head, lists)
	if err != nil {
		return fmt.Errorf("marshal bundle: %w", err)
	}
	if cw.flush(true); cw.err != nil {
		return fmt.Errorf("marshal bundle: %w", cw.err)
	}
	return nil
}

// blockSize is the size of the blocks blockWriter fills.
const blockSize = 1 << 20

// blockWriter keeps what is written in blocks and joins them once at the end: a bytes.Buffer grown
// to hundreds of MB by doubling clears and copies each size on the way.
type blockWriter struct {
	blocks [][]byte
	n      int
}

func (w *blockWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.n += n
	for len(p) > 0 {
		if len(w.blocks) == 0 || len(w.blocks[len(w.blocks)-1]) == cap(w.blocks[len(w.blocks)-1]) {
			w.blocks = append(w.blocks, make([]byte, 0, max(blockSize, len(p))))
		}
		last := &w.blocks[len(w.blocks)-1]
		k := min(len(p), cap(*last)-len(*last))
		*last = append(*last, p[:k]...)
		p = p[k:]
	}
	return n, nil
}

// bytes joins the blocks, letting each go once copied.
func (w *blockWriter) bytes() []byte {
	out := make([]byte, 0, w.n)
	for i, b := range w.blocks {
		out = append(out, b...)
		w.blocks[i] = nil
	}
	return out
}
