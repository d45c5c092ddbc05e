package ingest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/doppel-dev/doppel/trace"
)

// BlobFormat names the batch blob encoding; EncodeBlob writes it as the gzip header's comment.
const BlobFormat = "doppel collect batch v1"

// blobLevel is the gzip level of batch blobs. Measured in CPU time on the tau traces: level 1 runs
// at ~140 MB/s per core and compresses to 22 %; levels 2-3 at ~100 MB/s to 18-19 %, 4 at ~92 MB/s
// to 15 %, 6 at ~45 MB/s to 14 %. Compression is the largest cost of an ingest request, so the
// fastest level wins: its blobs are a fifth bigger, and still a fifth of the body.
const blobLevel = gzip.BestSpeed

var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(io.Discard, blobLevel)
	return w
}}

// AppendJSON appends the canonical JSON of b: fields in the order of the trace types, optional fields
// left out when empty, content written as null when nil, strings escaped minimally (only '"', '\\'
// and control characters; everything else as UTF-8). Equal batches give equal bytes.
func AppendJSON(dst []byte, b *trace.Batch) []byte {
	e := encoder{buf: dst}
	e.batch(b)
	return e.buf
}

// AppendTrace appends the canonical JSON of one trace, as AppendJSON writes it inside a batch.
func AppendTrace(dst []byte, t *trace.Trace) []byte {
	e := encoder{buf: dst}
	e.trace(t)
	return e.buf
}

// AppendBody appends a collect body for project around traces already encoded by AppendTrace.
func AppendBody(dst []byte, project string, traces [][]byte) []byte {
	e := encoder{buf: dst}
	e.raw(`{"project":`)
	e.str(project)
	e.raw(`,"traces":[`)
	for i, t := range traces {
		if i > 0 {
			e.raw(",")
		}
		e.buf = append(e.buf, t...)
	}
	e.raw("]}")
	return e.buf
}

// EncodeBlob returns the blob of an accepted batch: its canonical JSON, gzip-compressed with a fixed
// header (no name, no time, BlobFormat as comment) and a fixed level, so equal batches give equal
// blobs (with one Go version) and a content address names the batch.
func EncodeBlob(b *trace.Batch) ([]byte, error) {
	var out bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&out)
	zw.Comment = BlobFormat
	e := encoder{buf: make([]byte, 0, 64<<10), w: zw}
	e.batch(b)
	if err := e.flush(); err != nil {
		return nil, fmt.Errorf("ingest: compress batch: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("ingest: compress batch: %w", err)
	}
	return out.Bytes(), nil
}

// DecodeBlob reads a blob written by EncodeBlob back into its batch. It checks the JSON's shape and
// types but not the field rules, so a blob stays readable when the rules change.
func DecodeBlob(blob []byte) (*trace.Batch, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, fmt.Errorf("ingest: read batch blob: %w", err)
	}
	if zr.Comment != BlobFormat {
		return nil, fmt.Errorf("ingest: read batch blob: format %q, want %q", zr.Comment, BlobFormat)
	}
	body, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("ingest: read batch blob: %w", err)
	}
	p := newParser(body, Options{MaxErrors: 1, MaxTraces: int(^uint(0) >> 1)})
	p.lenient = true
	var b trace.Batch
	p.parseBody(&b)
	if len(p.errs) > 0 {
		return nil, fmt.Errorf("ingest: read batch blob: %w", &Error{Fields: p.errs})
	}
	return &b, nil
}

// encoder writes canonical JSON into buf, handing it to w (when set) in chunks.
type encoder struct {
	buf []byte
	w   io.Writer
	err error
}

const chunk = 32 << 10

func (e *encoder) flush() error {
	if e.w != nil && len(e.buf) > 0 && e.err == nil {
		_, e.err = e.w.Write(e.buf)
		e.buf = e.buf[:0]
	}
	return e.err
}

func (e *encoder) maybeFlush() {
	if e.w != nil && len(e.buf) >= chunk {
		e.flush()
	}
}

func (e *encoder) raw(s string) { e.buf = append(e.buf, s...) }

func (e *encoder) batch(b *trace.Batch) {
	e.raw(`{"project":`)
	e.str(b.Project)
	e.raw(`,"traces":[`)
	for i := range b.Traces {
		if i > 0 {
			e.raw(",")
		}
		e.trace(&b.Traces[i])
	}
	e.raw("]}")
}

func (e *encoder) trace(t *trace.Trace) {
	e.raw(`{"id":`)
	e.str(t.ID)
	if t.Model != "" {
		e.raw(`,"model":`)
		e.str(t.Model)
	}
	e.raw(`,"messages":[`)
	for j := range t.Messages {
		if j > 0 {
			e.raw(",")
		}
		e.message(&t.Messages[j])
		e.maybeFlush()
	}
	e.raw("]}")
}

func (e *encoder) message(m *trace.Message) {
	e.raw(`{"role":`)
	e.str(m.Role)
	e.raw(`,"content":`)
	if m.Content == nil {
		e.raw("null")
	} else {
		e.str(*m.Content)
	}
	if len(m.ToolCalls) > 0 {
		e.raw(`,"tool_calls":[`)
		for k := range m.ToolCalls {
			tc := &m.ToolCalls[k]
			if k > 0 {
				e.raw(",")
			}
			e.raw(`{"id":`)
			e.str(tc.ID)
			if tc.Type != "" {
				e.raw(`,"type":`)
				e.str(tc.Type)
			}
			e.raw(`,"function":{"name":`)
			e.str(tc.Function.Name)
			e.raw(`,"arguments":`)
			e.str(tc.Function.Arguments)
			e.raw("}}")
		}
		e.raw("]")
	}
	if m.ToolCallID != "" {
		e.raw(`,"tool_call_id":`)
		e.str(m.ToolCallID)
	}
	if m.Name != "" {
		e.raw(`,"name":`)
		e.str(m.Name)
	}
	e.raw("}")
}

const hexDigits = "0123456789abcdef"

// str writes s as a JSON string. Invalid UTF-8 (only possible in values that did not come through
// Decode) is written as U+FFFD.
func (e *encoder) str(s string) {
	b := append(e.buf, '"')
	start := 0
	for i := 0; ; {
		i = nextSpecialString(s, i)
		if i >= len(s) {
			break
		}
		c := s[i]
		if c >= 0x80 {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[start:i]...)
			b = append(b, "\uFFFD"...)
			i++
			start = i
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	e.buf = append(b, '"')
}
