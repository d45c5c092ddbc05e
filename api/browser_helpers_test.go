package api_test

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser starts headless Chromium from bin at 1280x900 and watches its console from the first page on; the
// browser stops with the test.
func browser(t *testing.T, bin string) (context.Context, *consoleWatch) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)

	cctx, stop := context.WithCancel(ctx)
	w := &consoleWatch{stop: stop, done: make(chan struct{})}
	messages := chromedp.Console(cctx)
	go func() {
		defer close(w.done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				w.mu.Lock()
				w.problems = append(w.problems, m.String()+" ("+m.URL+")")
				w.mu.Unlock()
			}
		}
	}()
	return ctx, w
}

// consoleWatch collects the browser console's errors and uncaught exceptions.
type consoleWatch struct {
	mu       sync.Mutex
	problems []string
	stop     context.CancelFunc
	done     chan struct{}
}

// seen is what has been collected so far.
func (w *consoleWatch) seen() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.problems)
}

// finish lets the last messages arrive, stops watching and returns everything collected.
func (w *consoleWatch) finish() []string {
	time.Sleep(200 * time.Millisecond)
	w.stop()
	<-w.done
	return w.seen()
}

// artifacts is where screenshots go: DOPPEL_TEST_ARTIFACTS, or the test's temp dir.
func artifacts(t *testing.T) string {
	if dir := os.Getenv("DOPPEL_TEST_ARTIFACTS"); dir != "" {
		return dir
	}
	return t.TempDir()
}
