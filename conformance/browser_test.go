package conformance

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium is the headless Chromium at DOPPEL_TEST_CHROMIUM. Without it the test is skipped, unless
// DOPPEL_TEST_REQUIRE=1 (CI), which makes a missing browser a failure, as the root module's testenv does for every
// real service.
func chromium(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("DOPPEL_TEST_CHROMIUM")
	switch {
	case bin != "":
		return bin
	case os.Getenv("DOPPEL_TEST_REQUIRE") == "1":
		t.Fatal("DOPPEL_TEST_CHROMIUM is not set but DOPPEL_TEST_REQUIRE=1: the browser test must not be skipped")
	default:
		t.Skip("DOPPEL_TEST_CHROMIUM not set: skipping the headless Chromium test")
	}
	return ""
}

// browser is headless Chromium, stopped with the test.
type browser struct{ ctx context.Context }

func newBrowser(t *testing.T, bin string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// The first action on a context starts the browser and ties it to that context: start it on this one, which
	// lives as long as the test, not on a consent's shorter one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium %s: %v", bin, err)
	}
	return &browser{ctx: ctx}
}

// consent is the user at doppel's consent page: the browser opens authURL, types the workspace key, authorizes,
// and follows the redirect to the client's loopback callback, whose query it answers.
func (b *browser) consent(t *testing.T, authURL, key string, cb *callback) url.Values {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute) // a guard, not a measure: Chromium is slow on a busy machine
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(authURL),
		chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), key),
		chromedp.Click(chromedp.CSS(`button[value="allow"]`)),
	); err != nil {
		t.Fatalf("consent page %s: %v", authURL, err)
	}
	select {
	case q := <-cb.got:
		return q
	case <-ctx.Done():
		loc, _ := chromedp.Run(b.ctx, chromedp.Location())
		t.Fatalf("the client's callback was never called: the browser stayed at %s", loc)
		return nil
	}
}

// callback is a client's loopback redirect endpoint (RFC 8252), as an MCP host runs one during authorization.
type callback struct {
	url string
	got chan url.Values
}

func newCallback(t *testing.T) *callback {
	cb := &callback{got: make(chan url.Values, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/callback" {
			http.NotFound(w, r)
			return
		}
		select {
		case cb.got <- r.URL.Query():
		default:
		}
		_, _ = w.Write([]byte("<!doctype html><title>done</title><p>You can close this window."))
	}))
	t.Cleanup(srv.Close)
	cb.url = srv.URL + "/callback"
	return cb
}
