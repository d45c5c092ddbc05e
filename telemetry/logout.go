package telemetry

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
)

// logBufferSize is how many bytes of log lines wait before they are written, whatever the flush interval.
const logBufferSize = 64 << 10

// A LogOutput is where a process's log lines go: w itself, or, with a flush interval, a buffer in front of w
// written at least that often (zap's BufferedWriteSyncer). The API logs a line a request: written alone, a line
// cost 7.7 µs of CPU, its write(2) most of it, and buffered 2.2 µs (BenchmarkLogOutput, to a file, 2 cores),
// beside the ~150 µs a session call costs at the API's peak. FlushOnWarn writes the buffer at once for a record
// at slog.LevelWarn and above, so a warning or an error is never held back, nor the lines before it.
type LogOutput struct {
	w   io.Writer
	mu  sync.RWMutex                 // write-held by Close while it hands the buffer's lines to w
	buf *zapcore.BufferedWriteSyncer // nil: unbuffered (or closed)
}

// NewLogOutput returns a LogOutput writing to w, buffered when every > 0. Close writes what is left.
func NewLogOutput(w io.Writer, every time.Duration) *LogOutput {
	o := &LogOutput{w: w}
	if every > 0 {
		// The writer is wrapped so that Sync only writes the buffer: w's own Sync (fsync of a file, an error on a
		// terminal) is not wanted for each warning.
		o.buf = &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(struct{ io.Writer }{w}), Size: logBufferSize,
			FlushInterval: every}
	}
	return o
}

// Write takes one log line (slog's handlers write a record with one Write).
func (o *LogOutput) Write(p []byte) (int, error) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.buf == nil {
		return o.w.Write(p)
	}
	return o.buf.Write(p)
}

// Flush writes the buffered lines now. A nil LogOutput has none.
func (o *LogOutput) Flush() error {
	if o == nil {
		return nil
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.buf == nil {
		return nil
	}
	return o.buf.Sync()
}

// Close writes the buffered lines and stops the periodic flush. Lines written after it go to w at once.
func (o *LogOutput) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.buf == nil {
		return nil
	}
	err := o.buf.Stop()
	o.buf = nil
	return err
}

// FlushOnWarn wraps h, which writes to o, so that a record at slog.LevelWarn or above is written out at once with
// the lines buffered before it.
func FlushOnWarn(h slog.Handler, o *LogOutput) slog.Handler { return flushHandler{h, o} }

type flushHandler struct {
	slog.Handler
	o *LogOutput
}

func (h flushHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		if ferr := h.o.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h flushHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return flushHandler{h.Handler.WithAttrs(as), h.o}
}
func (h flushHandler) WithGroup(name string) slog.Handler {
	return flushHandler{h.Handler.WithGroup(name), h.o}
}
