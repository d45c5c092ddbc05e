package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twinstate"
)

// Every kind of failure answers with the envelope.
func TestEnvelopeOnEveryError(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		type req struct {
			method, path string
			args         []any
		}
		tests := []struct {
			name      string
			req       req
			status    int
			code      string
			detail    string // substring
			locations []string
		}{
			{"unknown route", req{"GET", "/v2/nothing", nil}, 404, api.CodeNotFound, "no route GET /v2/nothing", nil},
			{"wrong method", req{"PUT", "/v1/envs", []any{bearer(f.key)}}, 405, api.CodeMethodNotAllowed, "PUT not allowed", nil},
			{"panic", req{"GET", "/test/panic", nil}, 500, api.CodeInternal, "quote request id", nil},
			{"internal error", req{"GET", "/test/fail", nil}, 500, api.CodeInternal, "internal error", nil},
			{"malformed JSON", req{"POST", "/v1/keys", []any{bearer(f.key), "Content-Type: application/json", strings.NewReader(`{"name": "x",`)}}, 422, api.CodeInvalid, "body: malformed JSON", []string{"body"}},
			{"wrong type", req{"POST", "/test/seed", []any{bearer(f.key), map[string]any{"seed": "seven"}}}, 422, api.CodeInvalid, "body.seed: expected integer", []string{"body.seed"}},
			{"unknown field", req{"POST", "/v1/keys", []any{bearer(f.key), map[string]any{"name": "x", "colour": "red"}}}, 422, api.CodeInvalid, "body.colour", []string{"body.colour"}},
			{"missing field", req{"POST", "/v1/keys", []any{bearer(f.key), map[string]any{"kind": "mcp"}}}, 422, api.CodeInvalid, "body.name", []string{"body.name"}},
			{"bad enum", req{"POST", "/v1/keys", []any{bearer(f.key), map[string]any{"name": "x", "kind": "root"}}}, 422, api.CodeInvalid, "body.kind", []string{"body.kind"}},
			{"two bad fields", req{"POST", "/test/seed", []any{bearer(f.key), map[string]any{"seed": 1.5, "seed_instructions": strings.Repeat("x", 30)}}}, 422, api.CodeInvalid, "(and 1 more)", []string{"body.seed", "body.seed_instructions"}},
			{"empty body", req{"POST", "/v1/keys", []any{bearer(f.key), "Content-Type: application/json"}}, 422, api.CodeInvalid, "body", []string{"body"}},
			{"unknown query parameter", req{"GET", "/v1/envs?limit=3", []any{bearer(f.key)}}, 422, api.CodeInvalid, "query.limit", []string{"query.limit"}},
			{"too large", req{"POST", "/test/seed", []any{bearer(f.key), "Content-Type: application/json", strings.NewReader(`{"seed": 1, "seed_instructions": "` + strings.Repeat("x", 400) + `"}`)}}, 413, api.CodeTooLarge, "", nil},
			{"raw route", req{"GET", "/test/raw", []any{bearer("mk_live_" + strings.Repeat("z", 52))}}, 401, api.CodeUnauthorized, "invalid or revoked", nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				w := f.api.Do(tt.req.method, tt.req.path, tt.req.args...)
				m := envelope(t, w, tt.status, tt.code)
				if d, _ := m["detail"].(string); !strings.Contains(d, tt.detail) {
					t.Errorf("detail %q, want it to contain %q", d, tt.detail)
				}
				var locs []string
				if errs, ok := m["errors"].([]any); ok {
					for _, e := range errs {
						locs = append(locs, e.(map[string]any)["location"].(string))
					}
				}
				for _, want := range tt.locations {
					found := false
					for _, l := range locs {
						found = found || l == want
					}
					if !found {
						t.Errorf("errors locations %v, want %q among them", locs, want)
					}
				}
				if tt.status == 422 && !strings.HasPrefix(m["detail"].(string), tt.locations[0]) {
					t.Errorf("422 detail %q does not start with the field %q", m["detail"], tt.locations[0])
				}
			})
		}
		// A 405 says which methods are allowed.
		if w := f.api.Do("DELETE", "/v1/envs/retail", bearer(f.key)); w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("Allow = %q, want GET, HEAD", w.Header().Get("Allow"))
		}
		// Internal errors are logged with the request id, never shown.
		w := f.api.Get("/test/fail")
		if strings.Contains(w.Body.String(), "hunter2") {
			t.Errorf("internal error leaked: %s", w.Body)
		}
		rid := w.Header().Get("X-Request-Id")
		if log := f.log.String(); !strings.Contains(log, "hunter2") || !strings.Contains(log, rid) {
			t.Errorf("log lacks the internal error or its request id %s:\n%s", rid, log)
		}
		if !strings.Contains(f.log.String(), "boom") {
			t.Errorf("panic not logged")
		}
	})
}

func TestRequestIDOnEveryResponse(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	seen := map[string]bool{}
	for _, p := range []string{"/healthz", "/readyz", "/v1/envs", "/openapi.json", "/docs", "/api/registry", "/nope", "/healthz"} {
		w := f.api.Get(p, bearer(f.key))
		rid := w.Header().Get("X-Request-Id")
		if !schema.HasPrefix(rid, schema.PrefixRequest) || seen[rid] {
			t.Errorf("GET %s: X-Request-Id %q (want a fresh req_ id)", p, rid)
		}
		seen[rid] = true
		// Each request has its access-log line: id, method, path, status and duration, in that order.
		status := strconv.Itoa(w.Code)
		line := regexp.MustCompile(`(?m)^time=\S+ level=INFO msg=request request_id=` + rid + ` method=GET path=` +
			regexp.QuoteMeta(p) + ` status=` + status + ` dur=\S+$`)
		if !line.MatchString(f.log.String()) {
			t.Errorf("GET %s: no access-log line for %s (status %s) in:\n%s", p, rid, status, f.log.String())
		}
	}
}

func TestAuth(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		unknown, _ := cred.Mint(cred.KindWorkspace)
		tests := []struct {
			name   string
			header []any
			status int
			code   string
			access string
		}{
			{"no header", nil, 401, api.CodeUnauthorized, ""},
			{"not bearer", []any{"Authorization: Basic " + f.key}, 401, api.CodeUnauthorized, ""},
			{"malformed", []any{bearer("mk_live_123")}, 401, api.CodeUnauthorized, ""},
			{"unknown key", []any{bearer(unknown.Plaintext)}, 401, api.CodeUnauthorized, ""},
			{"revoked key", []any{bearer(f.revokedKey)}, 401, api.CodeUnauthorized, ""},
			{"mcp token", []any{bearer(f.mcpKey)}, 401, api.CodeUnauthorized, ""},
			{"session token", []any{bearer(f.sessionTok)}, 401, api.CodeUnauthorized, ""},
			{"hash of a key", []any{bearer(cred.Hash(f.key))}, 401, api.CodeUnauthorized, ""},
			{"pending workspace", []any{bearer(f.pendingKey)}, 403, api.CodeForbidden, api.AccessPending},
			{"denied workspace", []any{bearer(f.deniedKey)}, 403, api.CodeForbidden, api.AccessDenied},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				for _, path := range []string{"/v1/envs", "/v1/envs/retail", "/v1/keys"} {
					w := f.api.Get(path, tt.header...)
					m := envelope(t, w, tt.status, tt.code)
					if tt.status == 401 && w.Header().Get("WWW-Authenticate") != "Bearer" {
						t.Errorf("GET %s: 401 without WWW-Authenticate: Bearer", path)
					}
					if got, _ := m["access"].(string); got != tt.access {
						t.Errorf("GET %s: access %q, want %q", path, got, tt.access)
					}
				}
			})
		}
		if w := f.api.Get("/v1/envs", bearer(f.key)); w.Code != 200 {
			t.Fatalf("valid key: %d %s", w.Code, w.Body)
		}
	})
}

func TestSessionAuth(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		path := func(id string) string { return "/test/sessions/" + id }
		tests := []struct {
			name    string
			path    string
			tok     string
			status  int
			code    string
			wantKey bool
		}{
			{"own token", path(f.session.ID), f.sessionTok, 200, "", false},
			{"opening key", path(f.session.ID), f.key, 200, "", true},
			{"token of another session", path(f.session.ID), f.session2Tok, 404, api.CodeNotFound, false},
			{"another key of the workspace", path(f.session.ID), f.key2, 200, "", true},
			{"another workspace's key", path(f.session.ID), f.otherKey, 404, api.CodeNotFound, false},
			{"unknown session", path("ses_0000000000000000"), f.key, 404, api.CodeNotFound, false},
			{"closed session's token", path(f.closedSession.ID), f.closedTok, 401, api.CodeUnauthorized, false},
			{"expired session's token", path(f.expiredSess.ID), f.expiredTok, 404, api.CodeNotFound, false},
			{"mcp token", path(f.session.ID), f.mcpKey, 401, api.CodeUnauthorized, false},
			{"malformed token", path(f.session.ID), "ms_nope", 401, api.CodeUnauthorized, false},
			{"revoked opening key", path(f.session.ID), f.revokedKey, 401, api.CodeUnauthorized, false},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				w := f.api.Get(tt.path, bearer(tt.tok))
				if tt.status != 200 {
					m := envelope(t, w, tt.status, tt.code)
					if tt.status == 403 && m["access"] != api.AccessDenied {
						t.Errorf("access = %v, want denied", m["access"])
					}
					return
				}
				if w.Code != 200 {
					t.Fatalf("status %d: %s", w.Code, w.Body)
				}
				var who struct{ Workspace, Key, Session string }
				_ = json.Unmarshal(w.Body.Bytes(), &who)
				if who.Workspace != f.ws.ID || who.Session != f.session.ID || (who.Key != "") != tt.wantKey {
					t.Errorf("principal %+v", who)
				}
			})
		}
	})
}

func TestEnvRoutes(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		w := f.api.Get("/v1/envs", bearer(f.key))
		if w.Code != 200 {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		var list []map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0]["slug"] != "airline" || list[1]["slug"] != "retail" {
			t.Fatalf("list = %v, want airline then retail (newest first), nothing of other tenants", list)
		}
		spec := []string{"id", "name", "slug", "status", "framework", "n_traces", "n_tools", "schema_source", "covered_pct", "simulated_pct", "has_agent", "language", "headline"}
		for _, k := range spec {
			if _, ok := list[1][k]; !ok {
				t.Errorf("summary lacks spec field %q", k)
			}
		}
		if list[1]["id"] != f.retail.ID || list[1]["n_tools"] != 15.0 || list[1]["covered_pct"] != 88.5 || list[1]["status"] != "ready" {
			t.Errorf("retail summary = %v", list[1])
		}
		if ts, _ := list[1]["created_at"].(string); ts != "2026-01-01T00:00:00Z" {
			t.Errorf("created_at = %q, want RFC 3339 UTC", ts)
		}

		tests := []struct {
			name   string
			slug   string
			key    string
			status int
		}{
			{"own env with a build", "retail", f.key, 200},
			{"own env without a build", "airline", f.key, 200},
			{"other tenant's slug", "secret-project", f.key, 404},
			{"own slug seen by other tenant", "retail", f.otherKey, 404},
			{"unknown slug", "nope", f.key, 404},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				w := f.api.Get("/v1/envs/"+tt.slug, bearer(tt.key))
				if tt.status != 200 {
					envelope(t, w, tt.status, api.CodeNotFound)
					if strings.Contains(w.Body.String(), f.theirs.ID) || strings.Contains(w.Body.String(), f.retail.ID) {
						t.Errorf("404 leaks an id: %s", w.Body)
					}
					return
				}
				var d struct {
					api.EnvSummary
					ActiveBuild *api.BuildSummary `json:"active_build"`
				}
				if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &d) != nil {
					t.Fatalf("%d %s", w.Code, w.Body)
				}
				if d.Slug != tt.slug || d.TwinState != twinstate.Stopped {
					t.Errorf("env = %+v", d)
				}
				if tt.slug == "retail" && (d.ActiveBuild == nil || d.ActiveBuild.ID != f.build.ID || d.ActiveBuild.BundleHash != "sha256:abc" || d.Headline == "") {
					t.Errorf("retail active build = %+v, headline %q", d.ActiveBuild, d.Headline)
				}
				if tt.slug == "airline" && (d.ActiveBuild != nil || !strings.Contains(w.Body.String(), `"active_build":null`)) {
					t.Errorf("airline active build = %+v, want null", d.ActiveBuild)
				}
			})
		}
		// An empty workspace lists [] (not null).
		ws, _ := store.CreateWorkspace(bg, f.db, "empty")
		_, k, _ := store.CreateKey(bg, f.db, ws.ID, cred.KindWorkspace, "k")
		if w := f.api.Get("/v1/envs", bearer(k)); w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
			t.Errorf("empty list = %d %s", w.Code, w.Body)
		}
	})
}

func TestKeyRoutes(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		w := f.api.Post("/v1/keys", bearer(f.key), map[string]any{"name": "laptop"})
		if w.Code != http.StatusCreated {
			t.Fatalf("create: %d %s", w.Code, w.Body)
		}
		var created struct {
			api.KeyInfo
			Key string `json:"key"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &created)
		if k, err := cred.Parse(created.Key); err != nil || k != cred.KindWorkspace || created.Kind != "workspace" || !strings.HasPrefix(created.Key, strings.TrimSuffix(created.Prefix, "…")) {
			t.Fatalf("created = %+v (%v)", created, err)
		}
		// The new key works.
		if w := f.api.Get("/v1/envs", bearer(created.Key)); w.Code != 200 {
			t.Fatalf("new key: %d", w.Code)
		}
		w = f.api.Post("/v1/keys", bearer(f.key), map[string]any{"name": "claude", "kind": "mcp"})
		var mcp struct {
			Key, Kind string
		}
		_ = json.Unmarshal(w.Body.Bytes(), &mcp)
		if w.Code != 201 || !strings.HasPrefix(mcp.Key, "mcp_at_") || mcp.Kind != "mcp" {
			t.Fatalf("create mcp: %d %s", w.Code, w.Body)
		}

		// List: this workspace's keys only, newest first, no plaintext.
		w = f.api.Get("/v1/keys", bearer(f.key))
		var keys []api.KeyInfo
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &keys) != nil {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		if len(keys) != 6 {
			t.Errorf("listed %d keys, want 6 (main, second, mcp, old, laptop, claude)", len(keys))
		}
		for i := 1; i < len(keys); i++ {
			if keys[i].CreatedAt.After(keys[i-1].CreatedAt) {
				t.Errorf("keys not newest first at %d", i)
			}
		}
		for _, secret := range []string{created.Key, mcp.Key, f.key, f.otherKey} {
			if strings.Contains(w.Body.String(), secret[len(secret)-20:]) {
				t.Errorf("list leaks a key's secret")
			}
		}

		// Revoke: the key stops working; another tenant's key is a 404 and keeps working.
		w = f.api.Delete("/v1/keys/"+created.ID, bearer(f.key))
		var revoked api.KeyInfo
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &revoked) != nil || revoked.RevokedAt == nil {
			t.Fatalf("revoke: %d %s", w.Code, w.Body)
		}
		envelope(t, f.api.Get("/v1/envs", bearer(created.Key)), 401, api.CodeUnauthorized)
		otherRow, _, _ := store.ResolveKey(bg, f.db, f.otherKey)
		envelope(t, f.api.Delete("/v1/keys/"+otherRow.ID, bearer(f.key)), 404, api.CodeNotFound)
		envelope(t, f.api.Delete("/v1/keys/key_0000000000000000", bearer(f.key)), 404, api.CodeNotFound)
		if w := f.api.Get("/v1/envs", bearer(f.otherKey)); w.Code != 200 {
			t.Errorf("other tenant's key stopped working: %d", w.Code)
		}
	})
}

// No rejected request writes anything.
func TestRejectedRequestsWriteNothing(t *testing.T) {
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver, nil)
		otherRow, _, _ := store.ResolveKey(bg, f.db, f.otherKey)
		tests := []struct {
			name   string
			method string
			path   string
			args   []any
			status int
		}{
			{"malformed JSON", "POST", "/v1/keys", []any{bearer(f.key), "Content-Type: application/json", strings.NewReader(`{"name":`)}, 422},
			{"wrong type", "POST", "/v1/keys", []any{bearer(f.key), map[string]any{"name": 7}}, 422},
			{"unknown field", "POST", "/v1/keys", []any{bearer(f.key), map[string]any{"name": "x", "admin": true}}, 422},
			{"name too long", "POST", "/v1/keys", []any{bearer(f.key), map[string]any{"name": strings.Repeat("n", 101)}}, 422},
			{"seed not integer", "POST", "/test/seed", []any{bearer(f.key), map[string]any{"seed": "1"}}, 422},
			{"seed unknown field", "POST", "/test/seed", []any{bearer(f.key), map[string]any{"seed": 1, "sed": 2}}, 422},
			{"seed too large", "POST", "/test/seed", []any{bearer(f.key), map[string]any{"seed": 1, "seed_instructions": strings.Repeat("x", 300)}}, 413},
			{"no key", "POST", "/v1/keys", []any{map[string]any{"name": "x"}}, 401},
			{"wrong key", "POST", "/v1/keys", []any{bearer(f.revokedKey), map[string]any{"name": "x"}}, 401},
			{"wrong key, valid seed", "POST", "/test/seed", []any{bearer(f.mcpKey), map[string]any{"seed": 1}}, 401},
			{"pending workspace", "POST", "/v1/keys", []any{bearer(f.pendingKey), map[string]any{"name": "x"}}, 403},
			{"other tenant's key id", "DELETE", "/v1/keys/" + otherRow.ID, []any{bearer(f.key)}, 404},
			{"wrong method", "PATCH", "/v1/keys", []any{bearer(f.key), map[string]any{"name": "x"}}, 405},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				before := rowCounts(t, f.db)
				keysBefore, _ := store.ListKeys(bg, f.db, f.other.ID)
				w := f.api.Do(tt.method, tt.path, tt.args...)
				if w.Code != tt.status {
					t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
				}
				after := rowCounts(t, f.db)
				for k, n := range before {
					if after[k] != n {
						t.Errorf("%s rows %d → %d", k, n, after[k])
					}
				}
				keysAfter, _ := store.ListKeys(bg, f.db, f.other.ID)
				for i := range keysBefore {
					if (keysBefore[i].RevokedAt == nil) != (keysAfter[i].RevokedAt == nil) {
						t.Errorf("other tenant's key %s changed", keysBefore[i].ID)
					}
				}
			})
		}
		// The same route does write when the input is good (so the counts above could have moved).
		before := rowCounts(t, f.db)
		if w := f.api.Post("/test/seed", bearer(f.key), map[string]any{"seed": 1}); w.Code != 200 {
			t.Fatalf("good seed: %d %s", w.Code, w.Body)
		}
		if after := rowCounts(t, f.db); after["*schema.UsageMeter"] != before["*schema.UsageMeter"]+1 {
			t.Errorf("good request wrote nothing: %v → %v", before, after)
		}
	})
}

func TestReadyz(t *testing.T) {
	f := newFixture(t, schema.DriverSQLite, nil)
	ok := func(context.Context) error { return nil }
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	tests := []struct {
		name   string
		checks map[string]api.Checker
		status int
		detail []string
	}{
		{"no checks", nil, 200, nil},
		{"all ok", map[string]api.Checker{"db": func(ctx context.Context) error { return f.db.PingContext(ctx) }, "blob": ok}, 200, nil},
		{"one down", map[string]api.Checker{"db": ok, "temporal": func(context.Context) error { return errors.New("dial tcp 127.0.0.1:7233: connection refused") }}, 503, []string{"temporal: dial tcp"}},
		{"hangs", map[string]api.Checker{"blob": func(context.Context) error { <-stuck; return nil }, "db": ok}, 503, []string{"blob: context deadline exceeded"}},
		{"two down", map[string]api.Checker{"blob": func(context.Context) error { return errors.New("x") }, "temporal": func(context.Context) error { return errors.New("y") }}, 503, []string{"blob: x; temporal: y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := api.New(api.Options{DB: f.db, Readiness: tt.checks, ReadyTimeout: 100 * time.Millisecond})
			w := doHandler(h, "GET", "/readyz")
			if tt.status == 200 {
				var body struct {
					Status string
					Checks map[string]string
				}
				if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &body) != nil || body.Status != "ready" || len(body.Checks) != len(tt.checks) {
					t.Fatalf("%d %s", w.Code, w.Body)
				}
				return
			}
			m := envelope(t, w, tt.status, api.CodeUnavailable)
			for _, d := range tt.detail {
				if !strings.Contains(m["detail"].(string), d) {
					t.Errorf("detail %q, want %q", m["detail"], d)
				}
			}
		})
	}
	if w := doHandler(f.h, "GET", "/healthz"); w.Code != 200 || !strings.Contains(w.Body.String(), `"ok"`) {
		t.Errorf("healthz: %d %s", w.Code, w.Body)
	}
}
