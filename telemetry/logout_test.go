package telemetry

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a destination the periodic flush may write to while the test reads it.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Writes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writes
}

func newTestLogger(dst *lockedBuffer, every time.Duration) (*slog.Logger, *LogOutput) {
	out := NewLogOutput(dst, every)
	return slog.New(FlushOnWarn(slog.NewTextHandler(out, nil), out)), out
}

func TestLogOutputBuffersInfoAndWritesWarningsAtOnce(t *testing.T) {
	var dst lockedBuffer
	log, out := newTestLogger(&dst, time.Hour) // the interval never comes in this test
	for i := range 100 {
		log.Info("request", "n", i)
	}
	if got := dst.String(); got != "" {
		t.Fatalf("info lines were written before a flush: %q", got)
	}
	log.Warn("disk low")
	got := dst.String()
	if n := strings.Count(got, "msg=request"); n != 100 {
		t.Fatalf("the warning wrote %d of the 100 info lines before it", n)
	}
	if !strings.HasSuffix(got, "msg=\"disk low\"\n") {
		t.Fatalf("the warning is not the last line written: %q", got[max(0, len(got)-80):])
	}
	if w := dst.Writes(); w != 1 {
		t.Errorf("101 lines took %d writes, want 1", w)
	}

	log.Info("after")
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(dst.String(), "msg=after\n") {
		t.Fatalf("Close did not write the buffered line")
	}
	log.Info("closed")
	if !strings.HasSuffix(dst.String(), "msg=closed\n") {
		t.Fatalf("a line logged after Close was not written at once")
	}
}

// TestFlushOnWarnKeptByDerivedLoggers: a logger made with With or WithGroup (a component's) still writes a warning
// at once.
func TestFlushOnWarnKeptByDerivedLoggers(t *testing.T) {
	for _, derive := range []func(*slog.Logger) *slog.Logger{
		func(l *slog.Logger) *slog.Logger { return l.With("component", "journal") },
		func(l *slog.Logger) *slog.Logger { return l.WithGroup("journal") },
	} {
		var dst lockedBuffer
		log, out := newTestLogger(&dst, time.Hour)
		derived := derive(log)
		derived.Info("request")
		derived.Warn("disk low")
		if got := dst.String(); !strings.Contains(got, "msg=request") || !strings.Contains(got, "disk low") {
			t.Errorf("a derived logger's warning was held back: written %q", got)
		}
		_ = out.Close()
	}
}

func TestLogOutputUnbufferedWritesEachLine(t *testing.T) {
	var dst lockedBuffer
	log, out := newTestLogger(&dst, 0)
	log.Info("one")
	log.Info("two")
	if w := dst.Writes(); w != 2 || !strings.Contains(dst.String(), "msg=two") {
		t.Fatalf("unbuffered output: %d writes, %q", w, dst.String())
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLogOutputFlushesOnItsInterval(t *testing.T) {
	var dst lockedBuffer
	log, out := newTestLogger(&dst, 5*time.Millisecond)
	defer out.Close()
	log.Info("tick")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !strings.Contains(dst.String(), "msg=tick") {
		select {
		case <-ctx.Done():
			t.Fatal("a buffered line was never written by the periodic flush")
		case <-time.After(time.Millisecond):
		}
	}
}

func TestLogOutputFullBufferWritesWholeLines(t *testing.T) {
	var dst lockedBuffer
	log, out := newTestLogger(&dst, time.Hour)
	defer out.Close()
	line := strings.Repeat("x", 1000)
	n := 0
	for dst.Writes() == 0 {
		log.Info("big", "v", line)
		n++
		if n > 1000 {
			t.Fatal("a full buffer was never written")
		}
	}
	got := dst.String()
	if !strings.HasSuffix(got, "\n") || strings.Count(got, "\n") != n-1 {
		t.Fatalf("the first write held %d lines (want the %d before the one that did not fit), ending %q",
			strings.Count(got, "\n"), n-1, got[max(0, len(got)-20):])
	}
	if len(got) > logBufferSize {
		t.Fatalf("the first write was %d bytes, over the %d-byte buffer", len(got), logBufferSize)
	}
}

// BenchmarkLogOutput: an access-log line (the API writes one a request) written to a file, each with its own
// write(2) (flush_every=0) or buffered (the default): ns/op is the line's cost on this machine, syscall included.
func BenchmarkLogOutput(b *testing.B) {
	for _, every := range []time.Duration{0, 100 * time.Millisecond} {
		b.Run("flush_every="+every.String(), func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			out := NewLogOutput(f, every)
			defer out.Close()
			log := slog.New(FlushOnWarn(slog.NewTextHandler(out, nil), out))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					log.Info("request", "request_id", "req_0123456789abcdef", "method", "POST",
						"path", "/v1/sessions/ses_0123456789abcdef/call", "status", 200, "dur", 2*time.Millisecond)
				}
			})
		})
	}
}
