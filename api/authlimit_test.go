package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
)

// failedCredentialAnswer sends one request from addr and answers its status, Retry-After and envelope code.
func failedCredentialAnswer(t *testing.T, h http.Handler, r *http.Request, addr string) (int, string, string) {
	t.Helper()
	r.RemoteAddr = addr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var env struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(w.Body.Bytes(), &env)
	return w.Code, w.Header().Get("Retry-After"), env.Code
}

// Issue 33, defect 12: credentials that do not resolve are limited per client address on REST (console sign-in
// already was): the first DefaultFailedCredentialBurst answer 401, the next 429 with Retry-After and the
// envelope, before the credential is looked up — a valid key from that address too — while another address is
// untouched. Before the fix all 40 answered 401.
func TestFailedCredentialsLimited(t *testing.T) {
	fx := newFixture(t, schema.DriverSQLite, nil)
	get := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/envs", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		return r
	}
	const attacker, other = "198.51.100.7:4000", "198.51.100.8:4000"
	bogus := "mk_live_" + strings.Repeat("z", 40)
	counts := map[int]int{}
	for range 40 {
		st, retry, code := failedCredentialAnswer(t, fx.h, get(bogus), attacker)
		counts[st]++
		if st == http.StatusTooManyRequests {
			if n, err := strconv.Atoi(retry); err != nil || n < 1 || code != api.CodeRateLimited {
				t.Fatalf("429 with Retry-After %q and code %q, want seconds and rateLimited", retry, code)
			}
		}
	}
	if counts[http.StatusUnauthorized] != api.DefaultFailedCredentialBurst || counts[http.StatusTooManyRequests] != 40-api.DefaultFailedCredentialBurst {
		t.Fatalf("40 bad keys from one address: %v, want %d 401 then 429", counts, api.DefaultFailedCredentialBurst)
	}
	// Session tokens count the same way; the attacker's address stays refused, even with a good key.
	if st, _, _ := failedCredentialAnswer(t, fx.h, get(fx.key), attacker); st != http.StatusTooManyRequests {
		t.Errorf("valid key from the limited address: %d, want 429", st)
	}
	if st, _, _ := failedCredentialAnswer(t, fx.h, get(fx.key), other); st != http.StatusOK {
		t.Errorf("valid key from another address: %d, want 200", st)
	}
	if st, _, _ := failedCredentialAnswer(t, fx.h, get(bogus), other); st != http.StatusUnauthorized {
		t.Errorf("bad key from another address: %d, want 401", st)
	}
	sess := httptest.NewRequest(http.MethodGet, "/test/sessions/"+fx.session.ID, nil)
	sess.Header.Set("Authorization", "Bearer ms_"+strings.Repeat("q", 40))
	if st, _, _ := failedCredentialAnswer(t, fx.h, sess, attacker); st != http.StatusTooManyRequests {
		t.Errorf("session token from the limited address: %d, want 429", st)
	}
}

// Issue 33, defect 12: the OAuth consent form's workspace key is limited the same way: after the burst of refused
// keys, the form answers 429 with Retry-After and the envelope.
func TestOAuthAuthorizeFailedKeysLimited(t *testing.T) {
	p := newMCPPlane(t, schema.DriverSQLite, shopBundle(t))
	const redirect = "http://127.0.0.1:7777/callback"
	reg, _ := json.Marshal(map[string]any{"client_name": "t", "redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	resp, err := http.Post(p.srv.URL+"/oauth/register", "application/json", bytes.NewReader(reg))
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(data, &client); err != nil || client.ClientID == "" {
		t.Fatalf("register: %d %s", resp.StatusCode, data)
	}
	form := url.Values{"client_id": {client.ClientID}, "redirect_uri": {redirect}, "response_type": {"code"},
		"code_challenge": {strings.Repeat("A", 43)}, "code_challenge_method": {"S256"}, "state": {"s"},
		"decision": {"allow"}, "workspace_key": {"mk_live_" + strings.Repeat("z", 40)}}
	counts := map[int]int{}
	var last *http.Response
	for range 35 {
		resp, err := http.PostForm(p.srv.URL+"/oauth/authorize", form)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		counts[resp.StatusCode]++
		last = resp
	}
	if counts[http.StatusUnauthorized] != api.DefaultFailedCredentialBurst || counts[http.StatusTooManyRequests] != 35-api.DefaultFailedCredentialBurst {
		t.Fatalf("35 refused consent keys: %v, want %d 401 then 429", counts, api.DefaultFailedCredentialBurst)
	}
	if last.Header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After")
	}
}
