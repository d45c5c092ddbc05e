package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/humatest"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

var bg = context.Background()

// syncBuffer is a log sink safe for concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixture is a database with two tenants and an API over it.
type fixture struct {
	db  *bun.DB
	api humatest.TestAPI
	h   http.Handler
	log *syncBuffer

	ws, other                  *schema.Workspace
	key, key2, otherKey        string // workspace keys: ws's (two) and other's
	keyRow, key2Row            *schema.APIKey
	mcpKey, revokedKey         string
	pendingKey, deniedKey      string
	retail, airline, theirs    *schema.Environment
	build                      *schema.Build
	session, session2          *schema.Session // opened by key on retail
	sessionTok, session2Tok    string
	closedTok, expiredTok      string
	closedSession, expiredSess *schema.Session
}

// seedInput is a test-only route body with typed fields (as session open will have).
type seedInput struct {
	Body struct {
		Seed             int64  `json:"seed"`
		SeedInstructions string `json:"seed_instructions,omitempty" maxLength:"20"`
	}
}

type whoOutput struct {
	Body struct {
		Workspace string `json:"workspace"`
		Key       string `json:"key"`
		Session   string `json:"session"`
	}
}

// testRoutes exercises the Routes hook: a session route, a typed body, a panic, an internal error, a body cap.
func testRoutes(a huma.API, d *api.Deps) {
	huma.Register(a, huma.Operation{OperationID: "test.session", Method: http.MethodGet, Path: "/test/sessions/{session_id}", Security: api.SessionAuth()},
		func(ctx context.Context, in *struct {
			SessionID string `path:"session_id"`
		}) (*whoOutput, error) {
			p := api.PrincipalFrom(ctx)
			out := &whoOutput{}
			out.Body.Workspace, out.Body.Session = p.Workspace.ID, p.Session.ID
			if p.Key != nil {
				out.Body.Key = p.Key.ID
			}
			return out, nil
		})
	huma.Register(a, huma.Operation{OperationID: "test.seed", Method: http.MethodPost, Path: "/test/seed", Security: api.WorkspaceKeyAuth(), MaxBodyBytes: 256},
		func(ctx context.Context, in *seedInput) (*whoOutput, error) {
			// A write that must not happen for rejected input.
			if err := store.AddUsage(ctx, d.DB, api.PrincipalFrom(ctx).Workspace.ID, "2026-01", "seeds", 1); err != nil {
				return nil, err
			}
			return &whoOutput{}, nil
		})
	huma.Register(a, huma.Operation{OperationID: "test.panic", Method: http.MethodGet, Path: "/test/panic"},
		func(ctx context.Context, _ *struct{}) (*whoOutput, error) { panic("boom") })
	huma.Register(a, huma.Operation{OperationID: "test.fail", Method: http.MethodGet, Path: "/test/fail"},
		func(ctx context.Context, _ *struct{}) (*whoOutput, error) {
			return nil, errors.New("secret connection string postgres://u:hunter2@db")
		})
	d.Mux.HandleFunc("GET /test/raw", func(w http.ResponseWriter, r *http.Request) {
		if _, err := d.Auth.Workspace(r.Context(), r.Header.Get("Authorization")); err != nil {
			api.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func newFixture(t testing.TB, driver string, ready map[string]api.Checker) *fixture {
	t.Helper()
	f := &fixture{db: schematest.Open(t, driver), log: &syncBuffer{}}
	db := f.db
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	f.ws, err = store.CreateWorkspace(bg, db, "acme")
	must(err)
	f.other, err = store.CreateWorkspace(bg, db, "other")
	must(err)
	f.keyRow, f.key, err = store.CreateKey(bg, db, f.ws.ID, cred.KindWorkspace, "main")
	must(err)
	f.key2Row, f.key2, err = store.CreateKey(bg, db, f.ws.ID, cred.KindWorkspace, "second")
	must(err)
	_, f.otherKey, err = store.CreateKey(bg, db, f.other.ID, cred.KindWorkspace, "theirs")
	must(err)
	_, f.mcpKey, err = store.CreateKey(bg, db, f.ws.ID, cred.KindMCP, "mcp")
	must(err)
	rk, revoked, err := store.CreateKey(bg, db, f.ws.ID, cred.KindWorkspace, "old")
	must(err)
	f.revokedKey = revoked
	_, err = store.RevokeKey(bg, db, f.ws.ID, rk.ID)
	must(err)
	for _, a := range []struct {
		access string
		dst    *string
	}{{schema.AccessPending, &f.pendingKey}, {schema.AccessDenied, &f.deniedKey}} {
		w, err := store.CreateWorkspace(bg, db, a.access)
		must(err)
		must(store.SetWorkspaceAccess(bg, db, w.ID, a.access))
		_, *a.dst, err = store.CreateKey(bg, db, w.ID, cred.KindWorkspace, "k")
		must(err)
	}

	f.retail, err = store.UpsertEnvByProject(bg, db, f.ws.ID, "retail")
	must(err)
	f.airline, err = store.UpsertEnvByProject(bg, db, f.ws.ID, "airline")
	must(err)
	f.theirs, err = store.UpsertEnvByProject(bg, db, f.other.ID, "secret-project")
	must(err)
	// Distinct creation times: retail oldest, airline newest.
	for i, id := range []string{f.retail.ID, f.airline.ID} {
		_, err := db.NewUpdate().Model((*schema.Environment)(nil)).Set("created_at = ?", time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC)).Where("id = ?", id).Exec(bg)
		must(err)
	}
	f.build = &schema.Build{EnvID: f.retail.ID, Status: schema.BuildSucceeded, Progress: 1, Stage: "done", BundleHash: "sha256:abc"}
	must(store.CreateBuild(bg, db, f.build))
	f.retail.ActiveBuildID, f.retail.Status, f.retail.NTools, f.retail.CoveredPct, f.retail.Headline = f.build.ID, schema.EnvReady, 15, 88.5, "15 tools, 88.5% covered"
	must(store.UpdateEnv(bg, db, f.retail, "active_build_id", "status", "n_tools", "covered_pct", "headline"))

	open := func(by *schema.APIKey) (*schema.Session, string) {
		s := &schema.Session{EnvID: f.retail.ID, OpenedByKeyID: by.ID}
		tok, err := store.CreateSession(bg, db, s)
		must(err)
		return s, tok
	}
	f.session, f.sessionTok = open(f.keyRow)
	f.session2, f.session2Tok = open(f.keyRow)
	f.closedSession, f.closedTok = open(f.keyRow)
	_, err = store.EndSession(bg, db, f.closedSession.ID, schema.SessionClosed)
	must(err)
	f.expiredSess, f.expiredTok = open(f.keyRow)
	_, err = store.EndSession(bg, db, f.expiredSess.ID, schema.SessionExpired)
	must(err)

	h, humaAPI := api.New(api.Options{
		DB:           db,
		Logger:       slog.New(slog.NewTextHandler(f.log, nil)),
		Readiness:    ready,
		ReadyTimeout: 200 * time.Millisecond,
		Routes:       []func(huma.API, *api.Deps){testRoutes, api.TracesRoutes(api.TracesOptions{}, nil)},
	})
	f.h = h
	f.api = humatest.Wrap(t, humaAPI)
	return f
}

func bearer(tok string) string { return "Authorization: Bearer " + tok }

// envelope decodes an error answer and checks the parts every error shares.
func envelope(t *testing.T, w *httptest.ResponseRecorder, status int, code string) map[string]any {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, w.Body)
	}
	if m["code"] != code {
		t.Errorf("code %v, want %s: %s", m["code"], code, w.Body)
	}
	rid, _ := m["requestId"].(string)
	if !strings.HasPrefix(rid, "req_") || rid != w.Header().Get("X-Request-Id") {
		t.Errorf("requestId %q, header %q: want one req_ id in both", rid, w.Header().Get("X-Request-Id"))
	}
	if d, _ := m["detail"].(string); d == "" {
		t.Errorf("empty detail: %s", w.Body)
	}
	for k := range m {
		switch k {
		case "detail", "code", "requestId", "errors", "access", "meter", "cardWouldLift":
		default:
			t.Errorf("envelope has unexpected field %q", k)
		}
	}
	return m
}

// rowCounts snapshots every table's row count.
func rowCounts(t testing.TB, db *bun.DB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range schema.Models() {
		n, err := db.NewSelect().Model(m).Count(bg)
		if err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%T", m)] = int(n)
	}
	return out
}

func forEachDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	for _, d := range schematest.Drivers() {
		t.Run(d, func(t *testing.T) { fn(t, d) })
	}
}

func doHandler(h http.Handler, method, path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
	return w
}
