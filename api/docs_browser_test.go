package api_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
)

// TestDocsInBrowser drives real headless Chromium (DOPPEL_TEST_CHROMIUM) through /docs: Swagger UI renders every
// operation from /openapi.json with its assets from this server, "Authorize" takes the workspace key, and "Try it
// out" is on, so "Execute" on envs.list answers 200 with the workspace's environments. Any console error or uncaught
// exception fails it. Screenshots go to DOPPEL_TEST_ARTIFACTS (default: the test's temp dir).
func TestDocsInBrowser(t *testing.T) {
	bin := testenv.Chromium(t)
	f := newFixture(t, schema.DriverSQLite, nil)
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)

	ctx, console := browser(t, bin)
	dir := artifacts(t)

	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // a guard, not a measure: a busy 2-core machine makes Chromium slow
	defer cancel()
	op := `[id="operations-envs-envs\\.list"] ` // Swagger UI escapes the dot into the id itself
	keyBox := `Array.from(document.querySelectorAll('.auth-container')).find(c => c.textContent.includes('workspaceKey'))`
	err := chromedp.Do(tctx,
		chromedp.Navigate(srv.URL+"/docs"),
		chromedp.WaitVisible(chromedp.CSS(`.opblock`)),
	)
	if err != nil {
		t.Fatalf("load /docs: %v", err)
	}
	steps := []struct {
		name string
		a    chromedp.Action[chromedp.Void]
	}{
		// Authorize through the dialog: the workspaceKey scheme's field takes the key.
		{"open Authorize", chromedp.Click(chromedp.CSS(`.auth-wrapper .authorize`))},
		{"type the key", chromedp.SendKeys(chromedp.JSPath(keyBox+`.querySelector('input')`), f.key)},
		{"authorize", chromedp.Click(chromedp.JSPath(keyBox + `.querySelector('button.authorize')`))},
		{"close the dialog", chromedp.Click(chromedp.CSS(`.modal-ux .close-modal`))},
		// Opening it shows "Execute" at once: /docs starts Swagger UI with "Try it out" on.
		{"open envs.list", chromedp.Click(chromedp.CSS(op + `.opblock-summary-control`))},
		{"execute", chromedp.Click(chromedp.CSS(op + `.execute`))},
		{"the response", chromedp.WaitVisible(chromedp.CSS(op + `.live-responses-table .response .response-col_status`))},
	}
	for _, st := range steps {
		sctx, cancel := context.WithTimeout(tctx, time.Minute)
		err := chromedp.Do(sctx, st.a)
		cancel()
		if err != nil {
			if png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "docs-failed.png"), png, 0o644)
			}
			t.Fatalf("%s: %v (screenshot docs-failed.png in %s)", st.name, err, dir)
		}
	}
	status, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(op+`.live-responses-table .response .response-col_status`)))
	if err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(op+`.live-responses-table .response .response-col_description`)))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('.opblock').length`))
	if err != nil {
		t.Fatal(err)
	}
	if png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "docs-try-it.png"), png, 0o644)
	}
	problems := console.finish()
	want := 0
	for _, item := range f.api.OpenAPI().Paths {
		for _, o := range []*huma.Operation{item.Get, item.Post, item.Put, item.Patch, item.Delete} {
			if o != nil && !o.Hidden {
				want++
			}
		}
	}
	if ops != want {
		t.Errorf("Swagger UI rendered %d operations, /openapi.json has %d", ops, want)
	}
	if strings.TrimSpace(status) != "200" || !strings.Contains(body, f.retail.Slug) {
		t.Errorf("Try it out on envs.list: status %q, body %.300q; want 200 listing %s", status, body, f.retail.Slug)
	}
	for _, p := range problems {
		t.Errorf("%s", p)
	}
	t.Logf("screenshot in %s", dir)
}
