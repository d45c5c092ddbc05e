// Package blob stores immutable byte objects (trace batches, build bundles) by key, on local disk or S3/MinIO.
package blob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) by Get and Stat when no object has the key.
var ErrNotFound = errors.New("blob: not found")

// ErrInvalidKey is returned (wrapped) when a key is empty, too long, or could escape its namespace.
var ErrInvalidKey = errors.New("blob: invalid key")

// ErrSizeMismatch is returned (wrapped) by Put when the reader yields more or fewer bytes than the declared size.
// Nothing is stored in that case.
var ErrSizeMismatch = errors.New("blob: size mismatch")

// MaxKeyLen is the longest key accepted, in bytes (the S3 limit).
const MaxKeyLen = 1024

// MaxSegmentLen is the longest slash-separated key segment accepted, in bytes (MinIO stores segments as file names).
const MaxSegmentLen = 255

// Store is the blob store used by ingest and builds.
//
// Put stores r under key, replacing any object there atomically: readers see the whole old or the whole new
// object, never a part. size is the exact byte count r yields, or -1 if unknown; a reader yielding a different
// count fails with ErrSizeMismatch and stores nothing. An empty contentType is stored as application/octet-stream.
// Get and Stat fail with ErrNotFound for a missing key. Delete of a missing key succeeds.
// Ping reports whether the store answers.
type Store interface {
	Put(ctx context.Context, key string, r io.Reader, size int64, contentType string) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (Info, error)
	Delete(ctx context.Context, key string) error
	Ping(ctx context.Context) error
}

// Info describes a stored object.
type Info struct {
	Key         string
	Size        int64
	ContentType string
	ModTime     time.Time
}

// DefaultContentType is stored when Put is given an empty content type.
const DefaultContentType = "application/octet-stream"

// ContentKey returns the content address of data under prefix: "prefix/<hex sha256 of data>"
// (just the hex digest when prefix is empty). Equal data gives equal keys.
func ContentKey(prefix string, data []byte) string {
	sum := sha256.Sum256(data)
	return keyOf(prefix, hex.EncodeToString(sum[:]))
}

// keyOf is the content address under prefix of the bytes whose hex SHA-256 is sum.
func keyOf(prefix, sum string) string {
	if prefix = strings.TrimSuffix(prefix, "/"); prefix != "" {
		return prefix + "/" + sum
	}
	return sum
}

// Putter is the part of a Store that writes.
type Putter interface {
	Put(ctx context.Context, key string, r io.Reader, size int64, contentType string) error
}

// PutContent stores data under its content address ContentKey(prefix, data) and returns the key. Storing the same
// bytes again writes the same key, so a retry never makes a second copy.
func PutContent(ctx context.Context, s Putter, prefix string, data []byte, contentType string) (string, error) {
	key := ContentKey(prefix, data)
	if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data)), contentType); err != nil {
		return key, err
	}
	return key, nil
}

// PutContentFrom is PutContent of the bytes write writes, without ever holding them: write runs twice, once
// into a hash (the content address and the size) and once into the store's Put, streamed through a pipe. It
// must write the same bytes both times. It answers the key and the hex SHA-256 of the bytes.
func PutContentFrom(ctx context.Context, s Putter, prefix string, write func(io.Writer) error, contentType string) (key, sum string, err error) {
	h := sha256.New()
	n := &countWriter{w: h}
	if err := write(n); err != nil {
		return "", "", err
	}
	sum = hex.EncodeToString(h.Sum(nil))
	key = keyOf(prefix, sum)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(write(pw))
	}()
	err = s.Put(ctx, key, pr, n.n, contentType)
	pr.CloseWithError(io.ErrClosedPipe) // a Put that stopped early unblocks the writer
	<-done
	return key, sum, err
}

// PutContentSpooled is PutContentFrom with write run once: its bytes are hashed on their way into a temporary
// file in dir (os.TempDir when dir is ""), which is then stored and removed. Where that file cannot be made or
// written (a full disk), it falls back to PutContentFrom. A bundle's canonical bytes cost far more to make than
// to write to disk and read back, so this halves a large build's writing.
func PutContentSpooled(ctx context.Context, s Putter, prefix, dir string, write func(io.Writer) error, contentType string) (key, sum string, err error) {
	f, err := os.CreateTemp(dir, "doppel-spool-*")
	if err != nil {
		return PutContentFrom(ctx, s, prefix, write, contentType)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	fw := &errWriter{w: f}
	h, bw := sha256.New(), bufio.NewWriterSize(fw, 1<<20)
	n := &countWriter{w: io.MultiWriter(h, bw)}
	werr := write(n)
	if werr == nil {
		werr = bw.Flush()
	}
	if fw.err != nil {
		return PutContentFrom(ctx, s, prefix, write, contentType)
	}
	if werr != nil {
		return "", "", werr
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return PutContentFrom(ctx, s, prefix, write, contentType)
	}
	sum = hex.EncodeToString(h.Sum(nil))
	key = keyOf(prefix, sum)
	return key, sum, s.Put(ctx, key, f, n.n, contentType)
}

// errWriter keeps the first error of w, so a spool's own failure is told from its writer's.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ValidateKey reports why key is not acceptable, wrapping ErrInvalidKey, or nil.
// A key is 1..MaxKeyLen bytes of slash-separated segments; each segment is 1..MaxSegmentLen bytes, does not start
// with a dot
// (so "." and ".." are out), and uses only ASCII letters, digits and - _ . = + : @ characters.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i, seg := range strings.Split(key, "/") {
		if seg == "" {
			return fmt.Errorf("%w: key %q has an empty segment %d (leading, trailing or double slash)", ErrInvalidKey, key, i)
		}
		if len(seg) > MaxSegmentLen {
			return fmt.Errorf("%w: key %q has a segment of %d bytes, longer than %d", ErrInvalidKey, key, len(seg), MaxSegmentLen)
		}
		if seg[0] == '.' {
			return fmt.Errorf("%w: key %q has segment %q starting with a dot", ErrInvalidKey, key, seg)
		}
		for j := 0; j < len(seg); j++ {
			if !keyByte(seg[j]) {
				return fmt.Errorf("%w: key %q has a disallowed character %q", ErrInvalidKey, key, seg[j])
			}
		}
	}
	return nil
}

func keyByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.=+:@", c) >= 0
}

// exactReader yields exactly want bytes from r, failing with ErrSizeMismatch when r is shorter or longer.
// On an over-long input it withholds the final chunk, so a consumer that fills fixed buffers sees a failure too.
type exactReader struct {
	ctx   context.Context
	r     io.Reader
	left  int64
	want  int64
	ended bool
	err   error
}

func newExactReader(ctx context.Context, r io.Reader, size int64) *exactReader {
	return &exactReader{ctx: ctx, r: r, left: size, want: size}
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if err := e.ctx.Err(); err != nil {
		return 0, err
	}
	if e.left == 0 {
		if err := e.checkEnd(); err != nil {
			return 0, err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if e.left == 0 {
		if cerr := e.checkEnd(); cerr != nil {
			return 0, cerr
		}
		return n, nil
	}
	if err == io.EOF {
		e.err = fmt.Errorf("%w: reader ended after %d of the declared %d bytes", ErrSizeMismatch, e.want-e.left, e.want)
		return n, e.err
	}
	return n, err
}

// checkEnd makes sure the underlying reader has nothing past the declared size.
func (e *exactReader) checkEnd() error {
	if e.ended {
		return nil
	}
	var probe [1]byte
	m, err := io.ReadFull(e.r, probe[:])
	switch {
	case m > 0:
		e.err = fmt.Errorf("%w: reader has more than the declared %d bytes", ErrSizeMismatch, e.want)
		return e.err
	case err != nil && err != io.EOF:
		e.err = err
		return err
	}
	e.ended = true
	return nil
}

// ctxReader stops reading when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
