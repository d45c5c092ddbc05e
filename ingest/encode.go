package ingest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/doppel-dev/doppel/trace"
)

// BlobFormat names the batch blob's content: the JSON of an accepted collect body as the collector sent it (Decode
// reads it back). EncodeBodyBlob writes it as an S2 stream (github.com/klauspost/compress/s2, the framing format
// of Snappy extended) whose first chunk after the stream identifier is a skippable chunk (id blobFormatChunk)
// holding this name; each block carries a CRC-32C of its data.
const BlobFormat = "doppel collect body v1"

// legacyFormat names the content of blobs written before: the canonical JSON of a batch (AppendJSON), as one zstd
// frame after a skippable frame holding this name, or earlier in gzip with it as the header's comment. DecodeBlob
// reads both.
const legacyFormat = "doppel collect batch v1"

// BlobContentType is the content type of the blobs EncodeBodyBlob writes.
const BlobContentType = "application/x-s2"

// Measured per core of CPU on 50 tau traces, 1.1 MB of JSON (BenchmarkBlobCodecs, two runs on a 2-core VM):
// compressing the body as it came costs ~1.45 ms and gives 15.2 % of its size; the zstd blob this replaced cost
// ~6.8 ms (canonical JSON, then zstd's fastest level) for 10.5 %. An ingest request's CPU went mostly to that, and
// the machine's to ingest. Reading back: S2 ~1,600 MB/s, zstd ~1,220.
const (
	// blobFormatChunk is the id of the skippable chunk naming BlobFormat (S2 reserves 0x80–0xfd for them).
	blobFormatChunk = 0x80
	// maxBlobJSON bounds the JSON one blob may hold, so a damaged blob cannot ask for more.
	maxBlobJSON = 4 << 30
	// zstdSkippable is the magic of the zstd skippable frame that carries legacyFormat (RFC 8878 §3.1.2).
	zstdSkippable = 0x184D2A50
)

// s2Magic is the start of every S2 stream: its stream identifier chunk.
var s2Magic = []byte("\xff\x06\x00\x00S2sTwO")

// zstdMagic starts every zstd blob: the magic of the skippable frame naming legacyFormat.
var zstdMagic = binary.LittleEndian.AppendUint32(nil, zstdSkippable)

var gzipMagic = []byte{0x1f, 0x8b}

// Writers, readers and decoders each serve one call at a time (concurrency 1: no goroutines of their own); the
// pools keep their buffers and tables between calls.
var (
	s2Writers    = sync.Pool{New: func() any { return s2.NewWriter(nil, s2.WriterConcurrency(1)) }}
	s2Readers    = sync.Pool{New: func() any { return new(s2Reader) }}
	zstdDecoders = sync.Pool{New: func() any {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxBlobJSON))
		if err != nil {
			panic(err) // only for invalid options
		}
		return d
	}}
	jsonBuffers = sync.Pool{New: func() any { return new([]byte) }}
)

// AppendJSON appends the canonical JSON of b: fields in the order of the trace types, optional fields
// left out when empty, content written as null when nil, strings escaped minimally (only '"', '\\'
// and control characters; everything else as UTF-8). Equal batches give equal bytes. It is a collect body.
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

// EncodeBodyBlob returns the blob of an accepted collect body: body's bytes, unchanged, in BlobFormat. Equal bodies
// give equal blobs (with one version of the compressor), so a content address names the body.
func EncodeBodyBlob(body []byte) ([]byte, error) {
	if len(body) > maxBlobJSON {
		return nil, fmt.Errorf("ingest: compress batch: %d bytes of JSON, over %d", len(body), maxBlobJSON)
	}
	out := bytes.NewBuffer(make([]byte, 0, len(body)/5+64))
	w := s2Writers.Get().(*s2.Writer)
	defer s2Writers.Put(w)
	w.Reset(out)
	err := w.AddSkippableBlock(blobFormatChunk, []byte(BlobFormat))
	if err == nil {
		err = w.EncodeBuffer(body)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	w.Reset(nil) // the pool keeps no reference to out or body
	if err != nil {
		return nil, fmt.Errorf("ingest: compress batch: %w", err)
	}
	return out.Bytes(), nil
}

// EncodeBlob returns the blob of batch b: its canonical JSON (AppendJSON, itself a collect body) in BlobFormat.
func EncodeBlob(b *trace.Batch) ([]byte, error) {
	bufp := jsonBuffers.Get().(*[]byte)
	defer jsonBuffers.Put(bufp)
	js := AppendJSON((*bufp)[:0], b)
	*bufp = js[:0]
	return EncodeBodyBlob(js)
}

// DecodeBlob reads a blob back into its batch: one of BlobFormat, or of the formats written before (told apart by
// their first bytes). It checks the JSON's shape and types but not the field rules, so a blob stays readable when
// the rules change.
func DecodeBlob(blob []byte) (*trace.Batch, error) { return decodeBlob(blob, false) }

// DecodeBlobCalls is DecodeBlob for a build, which reads a trace's tool calls, their answers and system prompts
// but few of its other texts: of the user and assistant messages' contents it keeps just the first user text
// that is not empty and the last text the assistant said without tool calls that is not blank; the others read
// as absent (nil). Every other field is as DecodeBlob reads it. Most of a batch's text is the conversation's, so
// a build reading hundreds of blobs allocates far less.
func DecodeBlobCalls(blob []byte) (*trace.Batch, error) { return decodeBlob(blob, true) }

func decodeBlob(blob []byte, lean bool) (*trace.Batch, error) {
	// The JSON goes once it is parsed (the batch's strings are copies), so its buffer serves the next blob: a
	// build reads hundreds of blobs of ~10 MB of JSON each, and fresh buffers would be most of what it allocates.
	bufp := jsonBuffers.Get().(*[]byte)
	body, err := blobJSON(blob, (*bufp)[:0])
	if err != nil {
		jsonBuffers.Put(bufp)
		return nil, fmt.Errorf("ingest: read batch blob: %w", err)
	}
	defer func() {
		*bufp = body[:0]
		jsonBuffers.Put(bufp)
	}()
	p := newParser(body, Options{MaxErrors: 1, MaxTraces: int(^uint(0) >> 1)})
	p.lenient, p.lean = true, lean
	var b trace.Batch
	p.parseBody(&b)
	if len(p.errs) > 0 {
		return nil, fmt.Errorf("ingest: read batch blob: %w", &Error{Fields: p.errs})
	}
	return &b, nil
}

// blobJSON answers the JSON inside a batch blob of any format, in dst's memory when it has room.
func blobJSON(blob, dst []byte) ([]byte, error) {
	switch {
	case bytes.HasPrefix(blob, s2Magic):
		return s2JSON(blob, dst)
	case bytes.HasPrefix(blob, zstdMagic):
		return zstdJSON(blob, dst)
	case bytes.HasPrefix(blob, gzipMagic):
		return gzipJSON(blob)
	}
	return nil, errors.New("not a batch blob (neither S2, zstd nor gzip)")
}

// s2Reader reads S2 blobs, noting the format its skippable chunk names.
type s2Reader struct {
	r      *s2.Reader
	format []byte
	seen   bool
}

func (r *s2Reader) reset(blob []byte) {
	if r.r == nil {
		r.r = s2.NewReader(nil, s2.ReaderSkippableCB(blobFormatChunk, func(c io.Reader) error {
			var err error
			r.format, err = io.ReadAll(io.LimitReader(c, 256))
			r.seen = true
			return err
		}))
	}
	r.r.Reset(bytes.NewReader(blob))
	r.format, r.seen = r.format[:0], false
}

// s2JSON reads a blob of BlobFormat.
func s2JSON(blob, dst []byte) ([]byte, error) {
	r := s2Readers.Get().(*s2Reader)
	defer s2Readers.Put(r)
	r.reset(blob)
	defer r.r.Reset(nil)
	out := dst[:0]
	for {
		if len(out) == cap(out) {
			if len(out) >= maxBlobJSON {
				return nil, fmt.Errorf("decompress: more than %d bytes of JSON", maxBlobJSON)
			}
			out = append(out, 0)[:len(out)] // grows the capacity
		}
		n, err := r.r.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("decompress: %w", err)
		}
		// The chunk naming the format comes first, so the first read has seen it, even of an empty stream.
		if !r.seen {
			return nil, errors.New("an S2 stream without the chunk naming its format")
		}
		if err == io.EOF {
			break
		}
	}
	if string(r.format) != BlobFormat {
		return nil, fmt.Errorf("format %q, want %q", r.format, BlobFormat)
	}
	return out, nil
}

// zstdJSON reads a blob of legacyFormat written with zstd.
func zstdJSON(blob, dst []byte) ([]byte, error) {
	if len(blob) < 8 {
		return nil, errors.New("truncated format frame")
	}
	n := binary.LittleEndian.Uint32(blob[4:8])
	if uint64(len(blob)-8) < uint64(n) {
		return nil, errors.New("truncated format frame")
	}
	if format := string(blob[8 : 8+n]); format != legacyFormat {
		return nil, fmt.Errorf("format %q, want %q", format, legacyFormat)
	}
	zr := zstdDecoders.Get().(*zstd.Decoder)
	defer zstdDecoders.Put(zr)
	body, err := zr.DecodeAll(blob[8+n:], dst[:0])
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return body, nil
}

// gzipJSON reads a blob of legacyFormat written with gzip, whose header comment names the format.
func gzipJSON(blob []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}
	if zr.Comment != legacyFormat {
		return nil, fmt.Errorf("format %q, want %q", zr.Comment, legacyFormat)
	}
	return io.ReadAll(zr)
}

// encoder appends canonical JSON to buf.
type encoder struct {
	buf []byte
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
