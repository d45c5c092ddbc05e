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

	"github.com/klauspost/compress/zstd"

	"github.com/doppel-dev/doppel/trace"
)

// BlobFormat names the batch blob's content, the canonical JSON of a batch. EncodeBlob writes it in a
// zstd skippable frame ahead of the compressed JSON; blobs written before zstd carry it as the gzip
// header's comment.
const BlobFormat = "doppel collect batch v1"

// BlobContentType is the content type of the blobs EncodeBlob writes.
const BlobContentType = "application/zstd"

// blobLevel is the zstd level of batch blobs. Measured on the JSON of 50 tau traces (1.1 MB) per core
// of CPU (BenchmarkBlobCodecs, one run): EncodeBlob, canonical JSON and compression, at ~370 MB/s to
// 10.5 % of the JSON, where the gzip encoder it replaced ran at ~180 MB/s to 21 %; reading a blob back
// at ~2,200 MB/s against ~320 MB/s. Compression alone: zstd's fastest level ~580 MB/s, its default
// ~480 MB/s to 9.6 %. Compression was the largest cost of an ingest request, so the fastest level wins.
const blobLevel = zstd.SpeedFastest

// maxBlobJSON bounds the JSON a blob may declare, so a damaged frame header cannot ask for more.
const maxBlobJSON = 4 << 30

// zstdSkippable is the magic of the zstd skippable frame that carries BlobFormat (RFC 8878 §3.1.2).
const zstdSkippable = 0x184D2A50

// blobHeader is the skippable frame every zstd blob starts with: magic, payload size, BlobFormat.
var blobHeader = binary.LittleEndian.AppendUint32(
	binary.LittleEndian.AppendUint32(nil, zstdSkippable), uint32(len(BlobFormat))) // payload follows

var gzipMagic = []byte{0x1f, 0x8b}

// Encoders and decoders each serve one call at a time (concurrency 1: no goroutines of their own);
// the pools keep their tables between calls.
var (
	zstdEncoders = sync.Pool{New: func() any {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(blobLevel), zstd.WithEncoderConcurrency(1))
		if err != nil {
			panic(err) // only for invalid options
		}
		return e
	}}
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

// EncodeBlob returns the blob of an accepted batch: a zstd skippable frame naming BlobFormat, then
// the batch's canonical JSON as one zstd frame at a fixed level, so equal batches give equal blobs
// (with one version of the compressor) and a content address names the batch.
func EncodeBlob(b *trace.Batch) ([]byte, error) {
	bufp := jsonBuffers.Get().(*[]byte)
	defer jsonBuffers.Put(bufp)
	js := AppendJSON((*bufp)[:0], b)
	*bufp = js
	if len(js) > maxBlobJSON {
		return nil, fmt.Errorf("ingest: compress batch: %d bytes of JSON, over %d", len(js), maxBlobJSON)
	}
	zw := zstdEncoders.Get().(*zstd.Encoder)
	defer zstdEncoders.Put(zw)
	out := make([]byte, 0, len(blobHeader)+len(BlobFormat)+len(js)/6+64)
	out = append(append(out, blobHeader...), BlobFormat...)
	return zw.EncodeAll(js, out), nil
}

// DecodeBlob reads a blob written by EncodeBlob back into its batch; blobs written with gzip before
// zstd (told apart by their first bytes) read as well. It checks the JSON's shape and types but not
// the field rules, so a blob stays readable when the rules change.
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

// blobJSON answers the canonical JSON inside a batch blob, zstd or gzip, in dst's memory when it has room.
func blobJSON(blob, dst []byte) ([]byte, error) {
	if bytes.HasPrefix(blob, gzipMagic) {
		return gzipJSON(blob)
	}
	if !bytes.HasPrefix(blob, blobHeader[:4]) || len(blob) < 8 {
		return nil, errors.New("neither a zstd nor a gzip batch blob")
	}
	n := binary.LittleEndian.Uint32(blob[4:8])
	if uint64(len(blob)-8) < uint64(n) {
		return nil, errors.New("truncated format frame")
	}
	if format := string(blob[8 : 8+n]); format != BlobFormat {
		return nil, fmt.Errorf("format %q, want %q", format, BlobFormat)
	}
	zr := zstdDecoders.Get().(*zstd.Decoder)
	defer zstdDecoders.Put(zr)
	body, err := zr.DecodeAll(blob[8+n:], dst[:0])
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return body, nil
}

// gzipJSON reads a blob of the gzip format, whose header comment names BlobFormat.
func gzipJSON(blob []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}
	if zr.Comment != BlobFormat {
		return nil, fmt.Errorf("format %q, want %q", zr.Comment, BlobFormat)
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
