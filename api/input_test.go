package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/schema"
)

// Issue #13: a NUL byte (or bytes that are not UTF-8) in a path id, a query parameter or a JSON body string is bad
// input, never a 500 from a database that refuses the statement: 404 for a path id, 422 naming the parameter or
// field otherwise, and nothing is written.
func TestNULInputIsBadInputOnEveryRoute(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		p := newPlane(t, driver, shopBundle(t), planeOptions{})
		s := p.open(map[string]any{"seed": 7})
		env := "/v1/envs/" + p.env.Slug
		counts := func() map[string]int { return rowCounts(t, p.db) }
		before := counts()

		tests := []struct {
			name, method, path, token, body string
			status                          int
			field                           string // named in the 422's detail
		}{
			{"env slug", "GET", "/v1/envs/x%00", p.key, "", 404, ""},
			{"env slug not UTF-8", "GET", "/v1/envs/x%ff", p.key, "", 404, ""},
			{"env slug of tools", "GET", "/v1/envs/x%00/tools", p.key, "", 404, ""},
			{"env slug of wake", "POST", "/v1/envs/x%00/wake", p.key, "", 404, ""},
			{"env slug of open", "POST", "/v1/envs/x%00/sessions", p.key, `{}`, 404, ""},
			{"session id", "GET", "/v1/sessions/ses_%00", p.key, "", 404, ""},
			{"session id of transcript", "GET", "/v1/sessions/" + s.ID + "%00/transcript", s.Token, "", 404, ""},
			{"session id of call", "POST", "/v1/sessions/" + s.ID + "%00/call", s.Token, `{"name": "get_order_details", "arguments": {}}`, 404, ""},
			{"session id of close", "DELETE", "/v1/sessions/ses_%ff", p.key, "", 404, ""},
			{"key id", "DELETE", "/v1/keys/key_%00", p.key, "", 404, ""},
			{"query parameter", "GET", env + "/tools?format=native%00", p.key, "", 422, "query.format"},
			{"seed instructions", "POST", env + "/sessions", p.key, `{"seed_instructions": "a\u0000b"}`, 422, "body.seed_instructions"},
			{"seed instructions, variant B", "POST", env + "/sessions", p.key, `{"seedInstructions": "2 orders\u0000"}`, 422, "body.seedInstructions"},
			{"scenario", "POST", env + "/sessions", p.key, `{"scenario": "\u0000"}`, 422, "body.scenario"},
			{"key name", "POST", "/v1/keys", p.key, `{"name": "ci\u0000", "kind": "workspace"}`, 422, "body.name"},
			{"tool argument", "POST", "/v1/sessions/" + s.ID + "/call", s.Token,
				`{"name": "get_order_details", "arguments": {"order_id": "#W0000001\u0000"}}`, 422, "body.arguments.order_id"},
			{"tool name", "POST", "/v1/sessions/" + s.ID + "/call", s.Token, `{"name": "get\u0000", "arguments": {}}`, 422, "body.name"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
				if tt.body != "" {
					r.Header.Set("Content-Type", "application/json")
				}
				r.Header.Set("Authorization", "Bearer "+tt.token)
				w := httptest.NewRecorder()
				p.h.ServeHTTP(w, r)
				code := map[int]string{404: "notFound", 422: "invalid"}[tt.status]
				m := envelope(t, w, tt.status, code)
				if detail, _ := m["detail"].(string); !strings.Contains(detail, tt.field) || strings.ContainsRune(detail, 0) {
					t.Errorf("detail %q does not name %q (or holds the NUL)", detail, tt.field)
				}
			})
		}
		if after := counts(); !equalCounts(before, after) {
			t.Errorf("rejected requests wrote rows: before %v after %v", before, after)
		}
		// The session still answers.
		if code, out := p.call(s, "get_order_details", map[string]any{"order_id": "#W0000001"}); code != http.StatusOK {
			t.Errorf("call after the rejected ones: %d %v", code, out)
		}
	})
}

// A body whose strings merely spell a backslash and u0000 holds no NUL: it is accepted.
func TestEscapedBackslashIsNotNUL(t *testing.T) {
	p := newPlane(t, schema.DriverSQLite, shopBundle(t), planeOptions{})
	body, _ := json.Marshal(map[string]any{"name": `ci \u0000`, "kind": "workspace"})
	r := httptest.NewRequest(http.MethodPost, "/v1/keys", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+p.key)
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated && w.Code != http.StatusOK {
		t.Fatalf("key named with a literal backslash-u0000: %d %s", w.Code, w.Body)
	}
}
