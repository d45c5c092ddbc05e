package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/oauth2"

	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
)

// The OAuth consent in a real browser (issue 34): headless Chromium loads the consent page, the user types the
// workspace key and authorizes, and the browser follows the answer to the client's loopback callback, which
// receives code, state and iss; the code then exchanges for a token that works on /mcp. Chromium applies the
// consent page's CSP form-action to the redirect that follows the form post, so a policy that names only 'self'
// leaves the user on the page and the callback never called — which a test posting the form over plain HTTP
// cannot see.
func TestOAuthConsentInBrowser(t *testing.T) {
	bin := testenv.Chromium(t)
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))

	// The client's loopback callback, as an MCP client (Claude Code, mcp-remote) runs one.
	got := make(chan url.Values, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/callback" {
			http.NotFound(w, r)
			return
		}
		select {
		case got <- r.URL.Query():
		default:
		}
		_, _ = w.Write([]byte("<!doctype html><title>done</title><p>You can close this window.</p>"))
	}))
	t.Cleanup(cb.Close)
	redirect := cb.URL + "/callback"

	reg, _ := json.Marshal(map[string]any{"client_name": "browser test", "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code", "refresh_token"}, "token_endpoint_auth_method": "none"})
	resp, err := http.Post(p.srv.URL+"/oauth/register", "application/json", bytes.NewReader(reg))
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register: %d", resp.StatusCode)
	}
	cfg := &oauth2.Config{ClientID: client.ClientID, RedirectURL: redirect, Endpoint: oauth2.Endpoint{
		AuthURL: p.srv.URL + "/oauth/authorize", TokenURL: p.srv.URL + "/oauth/token", AuthStyle: oauth2.AuthStyleInParams}}
	verifier := oauth2.GenerateVerifier()
	authURL := cfg.AuthCodeURL("state-in-browser", oauth2.S256ChallengeOption(verifier),
		oauth2.SetAuthURLParam("resource", p.srv.URL+"/mcp"))

	ctx, console := browser(t, bin)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a guard, not a measure: Chromium is slow on a busy machine
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(authURL),
		chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), p.key),
		chromedp.Click(chromedp.CSS(`button[value="allow"]`)),
	); err != nil {
		t.Fatalf("consent: %v", err)
	}
	var q url.Values
	select {
	case q = <-got:
	case <-time.After(30 * time.Second):
		// Where the browser stayed, for the failure message.
		loc, _ := chromedp.Run(tctx, chromedp.Location())
		if png, err := chromedp.Run(tctx, chromedp.FullScreenshot(90)); err == nil {
			_ = os.WriteFile(filepath.Join(artifacts(t), "oauth-consent-stuck.png"), png, 0o644)
		}
		t.Fatalf("the client's callback was never called: the browser stayed at %s (console: %v)", loc, console.seen())
	}
	if q.Get("code") == "" || q.Get("state") != "state-in-browser" || q.Get("iss") != p.srv.URL {
		t.Fatalf("callback query %v: want code, state and iss %s", q, p.srv.URL)
	}
	tok, err := cfg.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(verifier),
		oauth2.SetAuthURLParam("resource", p.srv.URL+"/mcp"))
	if err != nil {
		t.Fatalf("exchange the code from the browser: %v", err)
	}
	if hr, _ := p.postInitialize(t, "/mcp", tok.AccessToken); hr.StatusCode != http.StatusOK {
		t.Fatalf("the token from the browser's consent on /mcp: %d", hr.StatusCode)
	}
	for _, m := range console.finish() {
		if !strings.Contains(m, "/favicon.ico") { // the browser asks each server for one; neither has it
			t.Errorf("browser console: %s", m)
		}
	}
}
