package devserver

import (
	"context"
	"log/slog"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// minLevelHandler drops records below min before they reach the wrapped handler.
type minLevelHandler struct {
	min *slog.LevelVar
	h   slog.Handler
}

func (m minLevelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min.Level() && m.h.Enabled(ctx, l)
}
func (m minLevelHandler) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevelHandler{min: m.min, h: m.h.WithAttrs(as)}
}
func (m minLevelHandler) WithGroup(name string) slog.Handler {
	return minLevelHandler{min: m.min, h: m.h.WithGroup(name)}
}

// quiet returns l limited to records at or above min (a discarding logger when l is nil).
func quiet(l *slog.Logger, min *slog.LevelVar) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(minLevelHandler{min: min, h: l.Handler()})
}

// serverLogger adapts an slog.Logger to the Temporal server's logger interface.
// DPanic, Panic and Fatal are logged as errors: an embedded server must not end the host process.
type serverLogger struct{ l *slog.Logger }

var (
	_ log.Logger      = serverLogger{}
	_ log.SLogWrapper = serverLogger{}
)

func (s serverLogger) Debug(msg string, tags ...tag.Tag)  { s.emit(slog.LevelDebug, msg, tags) }
func (s serverLogger) Info(msg string, tags ...tag.Tag)   { s.emit(slog.LevelInfo, msg, tags) }
func (s serverLogger) Warn(msg string, tags ...tag.Tag)   { s.emit(slog.LevelWarn, msg, tags) }
func (s serverLogger) Error(msg string, tags ...tag.Tag)  { s.emit(slog.LevelError, msg, tags) }
func (s serverLogger) DPanic(msg string, tags ...tag.Tag) { s.emit(slog.LevelError, msg, tags) }
func (s serverLogger) Panic(msg string, tags ...tag.Tag)  { s.emit(slog.LevelError, msg, tags) }
func (s serverLogger) Fatal(msg string, tags ...tag.Tag)  { s.emit(slog.LevelError, msg, tags) }

// SLog lets the server hand the same (already level-limited) logger to code that wants an slog.Logger.
func (s serverLogger) SLog() *slog.Logger { return s.l }

func (s serverLogger) emit(level slog.Level, msg string, tags []tag.Tag) {
	ctx := context.Background()
	if !s.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, len(tags))
	for i, t := range tags {
		attrs[i] = slog.Any(t.Key(), t.Value())
	}
	s.l.LogAttrs(ctx, level, msg, attrs...)
}
