package api_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// web is a browser's view of a console sign-in: its session cookie and CSRF token.
type web struct {
	cookie *http.Cookie
	csrf   string
}

// signIn posts key to /console/signin.
func signIn(t testing.TB, h http.Handler, key string, hdr map[string]string) (*httptest.ResponseRecorder, web) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/console/signin", strings.NewReader(`{"key":`+strconvQuote(key)+`}`))
	r.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var out web
	for _, c := range w.Result().Cookies() {
		if c.Name == api.WebCookie {
			out.cookie = c
		}
	}
	var body struct {
		CSRF string `json:"csrf"`
	}
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	out.csrf = body.CSRF
	return w, out
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// trpcAs sends a tRPC request carrying the web session (cookie, and csrf when set).
func trpcAs(t *testing.T, h http.Handler, method, path string, s web, csrf string, body any) (int, map[string]any) {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	r := jsonRequest(method, path, b)
	if s.cookie != nil {
		r.AddCookie(&http.Cookie{Name: s.cookie.Name, Value: s.cookie.Value})
	}
	if csrf != "" {
		r.Header.Set(api.CSRFHeader, csrf)
	}
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var out map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out
}

func trpcStatus(out map[string]any) (int, string) {
	e, _ := out["error"].(map[string]any)
	d, _ := e["data"].(map[string]any)
	env, _ := d["envelope"].(map[string]any)
	st, _ := d["httpStatus"].(float64)
	code, _ := env["code"].(string)
	return int(st), code
}

func countKeys(t *testing.T, f *fixture) int {
	t.Helper()
	ks, err := store.ListKeys(context.Background(), f.db, f.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	return len(ks)
}

func TestConsoleSignInSetsStrictHttpOnlyCookie(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	w, s := signIn(t, f.h, f.key, nil)
	if w.Code != http.StatusOK || s.cookie == nil || s.csrf == "" {
		t.Fatalf("sign-in: %d %s (cookie %v)", w.Code, w.Body, s.cookie)
	}
	c := s.cookie
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != "/" || c.MaxAge <= 0 {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP, Path=/, an expiry", c)
	}
	if strings.Contains(w.Body.String(), c.Value) {
		t.Error("the sign-in answer shows the JWT; it belongs in the HttpOnly cookie only")
	}
	_, tls := signIn(t, f.h, f.key, map[string]string{"X-Forwarded-Proto": "https"})
	if tls.cookie == nil || !tls.cookie.Secure {
		t.Errorf("behind TLS the cookie is %+v, want Secure", tls.cookie)
	}

	for _, tc := range []struct {
		name, key string
		status    int
		code      string
	}{
		{"unknown key", "mk_live_" + strings.Repeat("a", 40), http.StatusUnauthorized, "unauthorized"},
		{"revoked key", f.revokedKey, http.StatusUnauthorized, "unauthorized"},
		{"session token", f.sessionTok, http.StatusUnauthorized, "unauthorized"},
		{"MCP token", f.mcpKey, http.StatusUnauthorized, "unauthorized"},
		{"pending workspace", f.pendingKey, http.StatusForbidden, "forbidden"},
		{"empty", "", http.StatusUnprocessableEntity, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, s := signIn(t, f.h, tc.key, nil)
			envelope(t, w, tc.status, tc.code)
			if s.cookie != nil {
				t.Errorf("a refused sign-in set a cookie: %+v", s.cookie)
			}
		})
	}
	w, _ = signIn(t, f.h, f.key, map[string]string{"Sec-Fetch-Site": "cross-site"})
	envelope(t, w, http.StatusForbidden, "forbidden")
}

func TestConsoleSessionOverTRPC(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	_, s := signIn(t, f.h, f.key, nil)

	code, out := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", s, "", nil)
	if code != http.StatusOK {
		t.Fatalf("envs.list with the web session: %d %v", code, out)
	}
	b, _ := json.Marshal(out)
	if !strings.Contains(string(b), f.retail.Slug) || strings.Contains(string(b), f.theirs.Slug) {
		t.Errorf("envs.list = %s; want this workspace's environments only", b)
	}

	// Another workspace's slug is a 404, as with the key.
	code, out = trpcAs(t, f.h, http.MethodGet, "/trpc/envs.get?input="+urlJSON(map[string]any{"slug": f.theirs.Slug}), s, "", nil)
	if st, c := trpcStatus(out); code != http.StatusNotFound || st != http.StatusNotFound || c != "notFound" {
		t.Errorf("another workspace's slug: %d %v", code, out)
	}
	// A session route: the workspace's session reads; another's is a 404.
	code, _ = trpcAs(t, f.h, http.MethodGet, "/trpc/sessions.get?input="+urlJSON(map[string]any{"session_id": f.session.ID}), s, "", nil)
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		t.Errorf("sessions.get of the workspace's session with the web session: %d", code)
	}

	// A mutation needs the CSRF token bound to the JWT; refused, it changes nothing.
	before := countKeys(t, f)
	wrong := "x" + s.csrf[1:]
	if wrong == s.csrf { // the token may itself start with x
		wrong = "y" + s.csrf[1:]
	}
	for _, tc := range []struct{ name, csrf string }{{"none", ""}, {"wrong", wrong}} {
		code, out = trpcAs(t, f.h, http.MethodPost, "/trpc/keys.create", s, tc.csrf, map[string]any{"name": "from the console"})
		if st, c := trpcStatus(out); code != http.StatusForbidden || st != http.StatusForbidden || c != "forbidden" {
			t.Errorf("keys.create with %s CSRF token: %d %v; want 403", tc.name, code, out)
		}
	}
	if n := countKeys(t, f); n != before {
		t.Fatalf("refused mutations changed the keys: %d → %d", before, n)
	}
	code, out = trpcAs(t, f.h, http.MethodPost, "/trpc/keys.create", s, s.csrf, map[string]any{"name": "from the console"})
	if code != http.StatusOK || countKeys(t, f) != before+1 {
		t.Fatalf("keys.create with the CSRF token: %d %v", code, out)
	}
	// The token of one session is not another's.
	_, s2 := signIn(t, f.h, f.key, nil)
	if s2.csrf == s.csrf {
		t.Fatal("two sign-ins share a CSRF token")
	}
	code, _ = trpcAs(t, f.h, http.MethodPost, "/trpc/keys.create", s2, s.csrf, map[string]any{"name": "crossed"})
	if code != http.StatusForbidden {
		t.Errorf("another session's CSRF token: %d, want 403", code)
	}

	// The cookie is the console's credential over /trpc only: REST routes still want a bearer credential.
	r := httptest.NewRequest(http.MethodGet, "/v1/envs", nil)
	r.AddCookie(&http.Cookie{Name: s.cookie.Name, Value: s.cookie.Value})
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	envelope(t, w, http.StatusUnauthorized, "unauthorized")
}

// forge signs claims with secret as the console would.
func forge(t *testing.T, secret []byte, method jwt.SigningMethod, claims jwt.MapClaims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(method, claims).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestConsoleRefusesForgedAndExpiredJWTs(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	_, s := signIn(t, f.h, f.key, nil)
	// The generated secret is kept in the database; a test that reads it can sign what the server would accept,
	// which is how the expired token below is made.
	var row schema.WebSecret
	if err := f.db.NewSelect().Model(&row).Limit(1).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	secret, _ := hex.DecodeString(row.Secret)
	now := time.Now()
	claims := func(exp time.Time) jwt.MapClaims {
		return jwt.MapClaims{"iss": "doppel", "aud": []string{"doppel-console"}, "sub": f.keyRow.ID, "ws": f.ws.ID,
			"jti": "0123456789abcdef", "iat": now.Add(-time.Hour).Unix(), "exp": exp.Unix()}
	}
	valid := forge(t, secret, jwt.SigningMethodHS256, claims(now.Add(time.Hour)))
	parts := strings.Split(s.cookie.Value, ".")
	otherWS, _ := json.Marshal(map[string]any{"iss": "doppel", "aud": "doppel-console", "sub": f.keyRow.ID, "ws": f.other.ID,
		"jti": "x", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
	for _, tc := range []struct{ name, tok, want string }{
		{"signed with another secret", forge(t, []byte(strings.Repeat("k", 32)), jwt.SigningMethodHS256, claims(now.Add(time.Hour))), "invalid"},
		{"alg none", func() string {
			tok, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims(now.Add(time.Hour))).SignedString(jwt.UnsafeAllowNoneSignatureType)
			return tok
		}(), "invalid"},
		{"payload swapped to another workspace", parts[0] + "." + b64(otherWS) + "." + parts[2], "invalid"},
		{"expired", forge(t, secret, jwt.SigningMethodHS256, claims(now.Add(-time.Minute))), "expired"},
		{"garbage", "not-a-jwt", "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", web{cookie: &http.Cookie{Name: api.WebCookie, Value: tc.tok}}, "", nil)
			st, c := trpcStatus(out)
			e, _ := out["error"].(map[string]any)
			msg, _ := e["message"].(string)
			if code != http.StatusUnauthorized || st != http.StatusUnauthorized || c != "unauthorized" || !strings.Contains(msg, tc.want) {
				t.Errorf("%d %v; want 401 saying %q", code, out, tc.want)
			}
		})
	}
	// The control: the same secret and claims with a future expiry are accepted.
	if code, out := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", web{cookie: &http.Cookie{Name: api.WebCookie, Value: valid}}, "", nil); code != http.StatusOK {
		t.Errorf("a well-signed, unexpired JWT: %d %v", code, out)
	}
}

func TestConsoleSessionEndsWithSignOutAndKeyRevocation(t *testing.T) {
	eachDriver(t, testConsoleSessionEnds)
}

func testConsoleSessionEnds(t *testing.T, driver string) {
	f := newFixture(t, driver, nil)
	_, s := signIn(t, f.h, f.key, nil)
	_, s2 := signIn(t, f.h, f.key2, nil)

	signOut := func(s web, csrf string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/console/signout", nil)
		r.AddCookie(&http.Cookie{Name: s.cookie.Name, Value: s.cookie.Value})
		if csrf != "" {
			r.Header.Set(api.CSRFHeader, csrf)
		}
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	envelope(t, signOut(s, ""), http.StatusForbidden, "forbidden")
	if code, _ := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", s, "", nil); code != http.StatusOK {
		t.Fatalf("a sign-out without the CSRF token ended the session: %d", code)
	}
	w := signOut(s, s.csrf)
	if w.Code != http.StatusNoContent {
		t.Fatalf("sign-out: %d %s", w.Code, w.Body)
	}
	var cleared bool
	for _, c := range w.Result().Cookies() {
		cleared = cleared || (c.Name == api.WebCookie && c.MaxAge < 0)
	}
	if !cleared {
		t.Error("sign-out did not clear the cookie")
	}
	// The old cookie, replayed, is refused.
	if code, out := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", s, "", nil); code != http.StatusUnauthorized {
		t.Errorf("a signed-out JWT replayed: %d %v", code, out)
	}

	// Revoking the second key ends its web session at once.
	code, _ := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", s2, "", nil)
	if code != http.StatusOK {
		t.Fatalf("second session: %d", code)
	}
	if _, err := store.RevokeKey(context.Background(), f.db, f.ws.ID, f.key2Row.ID); err != nil {
		t.Fatal(err)
	}
	if code, out := trpcAs(t, f.h, http.MethodGet, "/trpc/envs.list", s2, "", nil); code != http.StatusUnauthorized {
		t.Errorf("the web session of a revoked key: %d %v", code, out)
	}
	// The console's session read says so, and clears the stale cookie.
	r := httptest.NewRequest(http.MethodGet, "/console/session", nil)
	r.AddCookie(&http.Cookie{Name: s2.cookie.Name, Value: s2.cookie.Value})
	w = httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	var read struct {
		SignedIn bool   `json:"signedIn"`
		Detail   string `json:"detail"`
	}
	_ = json.Unmarshal(w.Body.Bytes(), &read)
	cleared = false
	for _, c := range w.Result().Cookies() {
		cleared = cleared || (c.Name == api.WebCookie && c.MaxAge < 0)
	}
	if w.Code != http.StatusOK || read.SignedIn || !strings.Contains(read.Detail, "revoked") || !cleared {
		t.Errorf("session read of a revoked key's session: %d %s (cookie cleared: %v)", w.Code, w.Body, cleared)
	}
}

func TestConsoleSecretSurvivesRestart(t *testing.T) {
	eachDriver(t, testConsoleSecretSurvives)
}

func testConsoleSecretSurvives(t *testing.T, driver string) {
	f := newFixture(t, driver, nil)
	_, s := signIn(t, f.h, f.key, nil)
	// A second API over the same database (a restart, or another process) accepts the session.
	h2, _ := api.New(api.Options{DB: f.db})
	if code, out := trpcAs(t, h2, http.MethodGet, "/trpc/envs.list", s, "", nil); code != http.StatusOK {
		t.Fatalf("after a restart: %d %v", code, out)
	}
	// A configured secret replaces the stored one: sessions signed under the old one end.
	h3, _ := api.New(api.Options{DB: f.db, WebSecret: []byte(strings.Repeat("s", 32))})
	if code, _ := trpcAs(t, h3, http.MethodGet, "/trpc/envs.list", s, "", nil); code != http.StatusUnauthorized {
		t.Errorf("under another configured secret: %d, want 401", code)
	}
}

func urlJSON(v any) string {
	b, _ := json.Marshal(v)
	return url.QueryEscape(string(b))
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// TestConsoleSignInLimitsFailuresPerAddress: past DefaultFailedSignInBurst keys that do not resolve, an address is
// refused with 429 and Retry-After before any key is looked up (its right key too, until a token refills); another
// address signs in as before.
func TestConsoleSignInLimitsFailuresPerAddress(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	from := func(addr, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/console/signin", strings.NewReader(`{"key":`+strconvQuote(key)+`}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	wrong := "mk_live_" + strings.Repeat("b", 40)
	for i := range api.DefaultFailedSignInBurst {
		if w := from("198.51.100.7:4000", wrong); w.Code != http.StatusUnauthorized {
			t.Fatalf("failed sign-in %d: %d %s, want 401", i+1, w.Code, w.Body)
		}
	}
	for _, key := range []string{wrong, f.key} {
		w := from("198.51.100.7:4001", key)
		envelope(t, w, http.StatusTooManyRequests, "rateLimited")
		if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
			t.Errorf("429 without a Retry-After: %q", ra)
		}
	}
	if w := from("203.0.113.9:4000", f.key); w.Code != http.StatusOK {
		t.Fatalf("another address's sign-in: %d %s", w.Code, w.Body)
	}
	// Good sign-ins spend nothing.
	for range api.DefaultFailedSignInBurst + 2 {
		if w := from("203.0.113.10:4000", f.key); w.Code != http.StatusOK {
			t.Fatalf("repeated good sign-in: %d %s", w.Code, w.Body)
		}
	}
}
