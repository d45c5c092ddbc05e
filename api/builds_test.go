package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

// recordingStarter records the builds the route asks to start (the e2e test starts real workflows).
type recordingStarter struct {
	mu         sync.Mutex
	started    [][2]string
	workspaces []string // the workspace of each started build (its workflow's search attribute)
}

func (s *recordingStarter) StartBuild(_ context.Context, workspaceID, envID, buildID string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = append(s.started, [2]string{envID, buildID})
	s.workspaces = append(s.workspaces, workspaceID)
	return "build/" + buildID, nil
}

type buildFixture struct {
	h             http.Handler
	db            *bun.DB
	blobs         *blob.Local
	starter       *recordingStarter
	key, otherKey string
	env, theirs   *schema.Environment
	dbCounts      func() map[string]int
	setActive     func(*testing.T, []trace.Trace) *schema.Build
	workspaceID   string
	blobFiles     func() int
}

func newBuildFixture(t testing.TB, driver string) *buildFixture {
	t.Helper()
	db := schematest.Open(t, driver)
	ws, err := store.CreateWorkspace(bg, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := store.CreateWorkspace(bg, db, "other")
	_, key, err := store.CreateKey(bg, db, ws.ID, cred.KindWorkspace, "k")
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, _ := store.CreateKey(bg, db, other.ID, cred.KindWorkspace, "k")
	env, err := store.UpsertEnvByProject(bg, db, ws.ID, "tau2-retail")
	if err != nil {
		t.Fatal(err)
	}
	theirs, _ := store.UpsertEnvByProject(bg, db, other.ID, "tau2-retail")
	dir := t.TempDir()
	blobs, err := blob.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := &buildFixture{db: db, blobs: blobs, starter: &recordingStarter{}, key: key, otherKey: otherKey, env: env, theirs: theirs, workspaceID: ws.ID}
	br := &api.BuildRoutes{Blobs: blobs, Starter: f.starter, MaxUploadBytes: 1 << 20}
	f.h, _ = api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){br.Register}})
	f.dbCounts = func() map[string]int { return rowCounts(t, db) }
	f.blobFiles = func() int {
		n := 0
		_ = walkFiles(dir, func() { n++ })
		return n
	}
	f.setActive = func(t *testing.T, traces []trace.Trace) *schema.Build {
		bundle, _, err := infer.Build(traces, infer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		data, err := bundle.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		k := blob.ContentKey("bundles/", data)
		if err := blobs.Put(bg, k, bytes.NewReader(data), int64(len(data)), "application/octet-stream"); err != nil {
			t.Fatal(err)
		}
		b := &schema.Build{EnvID: env.ID, WorkspaceID: ws.ID, Status: schema.BuildSucceeded, Stage: "succeeded", Progress: 1, BundleKey: k, BundleHash: bundle.Hash()}
		if err := store.CreateBuild(bg, db, b); err != nil {
			t.Fatal(err)
		}
		env.ActiveBuildID, env.Status = b.ID, schema.EnvReady
		if err := store.UpdateEnv(bg, db, env, "active_build_id", "status"); err != nil {
			t.Fatal(err)
		}
		return b
	}
	return f
}

func walkFiles(dir string, each func()) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			_ = walkFiles(dir+"/"+e.Name(), each)
		} else {
			each()
		}
	}
	return nil
}

type part struct{ field, filename, content string }

func multipartBody(t testing.TB, parts ...part) (io.Reader, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		var w io.Writer
		var err error
		if p.filename == "" {
			err = mw.WriteField(p.field, p.content)
		} else {
			w, err = mw.CreateFormFile(p.field, p.filename)
			if err == nil {
				_, err = io.WriteString(w, p.content)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

func (f *buildFixture) do(method, path, key string, body io.Reader, contentType string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, body)
	r.Header.Set("Authorization", "Bearer "+key)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func loadTraces(t *testing.T, name string) []trace.Trace {
	t.Helper()
	data, err := sampledata.Read(name)
	if err != nil {
		t.Fatal(err)
	}
	var b trace.Batch
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	return b.Traces
}

func TestStartBuild(t *testing.T) {
	tools, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	forEachDriver(t, func(t *testing.T, driver string) {
		f := newBuildFixture(t, driver)
		code := "def handle(args, world):\n    return {\"ok\": True}\n"
		body, ct := multipartBody(t,
			part{"tools", "tools.json", string(tools)},
			part{"config", "", `{"name": "Retail", "framework": "tau2", "scenarios": {"pending": "1 order with status pending"}}`},
			part{"code", "transfer_to_human_agents.star", code},
		)
		w := f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.key, body, ct)
		if w.Code != http.StatusAccepted {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var out api.BuildStarted
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.BuildID, "bld_") || out.BuildIDB != out.BuildID || out.Status != "queued" || out.Env != f.env.Slug {
			t.Errorf("answer = %+v", out)
		}
		if len(f.starter.started) != 1 || f.starter.started[0] != [2]string{f.env.ID, out.BuildID} || f.starter.workspaces[0] != f.workspaceID {
			t.Errorf("started = %v in %v", f.starter.started, f.starter.workspaces)
		}

		w = f.do(http.MethodGet, out.Poll, f.key, nil, "")
		if w.Code != http.StatusOK {
			t.Fatalf("poll: %d %s", w.Code, w.Body)
		}
		var det api.BuildDetail
		_ = json.Unmarshal(w.Body.Bytes(), &det)
		if det.ID != out.BuildID || det.Status != "queued" || det.WorkflowID != "build/"+out.BuildID || det.Active {
			t.Errorf("detail = %+v", det)
		}

		// The upload blob holds what was sent, and turns into build options.
		row, err := store.GetBuildByID(bg, f.db, out.BuildID)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := f.blobs.Get(bg, row.UploadKey)
		if err != nil {
			t.Fatalf("upload blob %q: %v", row.UploadKey, err)
		}
		var up infer.Upload
		err = json.NewDecoder(rc).Decode(&up)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		opts, err := up.Options()
		if err != nil {
			t.Fatalf("stored upload does not validate: %v", err)
		}
		if len(opts.Tools) != 16 || opts.Code["transfer_to_human_agents"] != code || opts.Config.Name != "Retail" || opts.Config.Scenarios["pending"] == "" {
			t.Errorf("stored upload = %d tools, code %v, config %+v", len(opts.Tools), opts.Code, opts.Config)
		}
		rows := f.do(http.MethodGet, "/v1/envs/"+f.env.Slug+"/builds", f.key, nil, "")
		if !strings.Contains(rows.Body.String(), out.BuildID) {
			t.Errorf("list lacks the build: %s", rows.Body)
		}
		if f.blobFiles() != 1 {
			t.Errorf("blob files = %d, want the one upload", f.blobFiles())
		}
	})
}

func TestStartBuildRejectsBadParts(t *testing.T) {
	tests := []struct {
		name  string
		parts []part
		loc   string
	}{
		{"tools not JSON", []part{{"tools", "t.json", "{nope"}}, "body.tools"},
		{"tools without names", []part{{"tools", "t.json", `[{"description": "x"}]`}}, "body.tools"},
		{"code does not compile", []part{{"code", "get_order_details.star", "def handle(:\n"}}, "body.code.get_order_details"},
		{"config unknown field", []part{{"config", "c.json", `{"nmae": "x"}`}}, "body.config"},
		{"config wrong type", []part{{"config", "", `{"scenarios": "x"}`}}, "body.config"},
		{"binding without code", []part{{"config", "c.json", `{"bindings": {"cancel_pending_order": "provided"}}`}}, "body.config.bindings.cancel_pending_order"},
	}
	f := newBuildFixture(t, schema.DriverSQLite)
	before := f.dbCounts()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, ct := multipartBody(t, tt.parts...)
			w := f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.key, body, ct)
			m := envelope(t, w, http.StatusUnprocessableEntity, "invalid")
			if !strings.Contains(w.Body.String(), tt.loc) {
				t.Errorf("error does not name %s: %v", tt.loc, m)
			}
		})
	}
	if after := f.dbCounts(); !equalCounts(before, after) {
		t.Errorf("rejected builds wrote rows: before %v after %v", before, after)
	}
	if n := f.blobFiles(); n != 0 {
		t.Errorf("rejected builds wrote %d blobs", n)
	}
	if len(f.starter.started) != 0 {
		t.Errorf("rejected builds started workflows: %v", f.starter.started)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestBuildRoutesTenancyAndLimits(t *testing.T) {
	f := newBuildFixture(t, schema.DriverSQLite)
	body, ct := multipartBody(t, part{"config", "", `{"name": "x"}`})
	w := f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.otherKey, body, ct)
	// The other workspace has its own env under the same slug: it must start a build there, never here.
	if w.Code != http.StatusAccepted || f.starter.started[0][0] != f.theirs.ID {
		t.Fatalf("other tenant's build: %d %s started=%v", w.Code, w.Body, f.starter.started)
	}
	var theirs api.BuildStarted
	_ = json.Unmarshal(w.Body.Bytes(), &theirs)
	envelope(t, f.do(http.MethodGet, "/v1/envs/"+f.env.Slug+"/builds/"+theirs.BuildID, f.key, nil, ""), http.StatusNotFound, "notFound")
	envelope(t, f.do(http.MethodGet, "/v1/envs/nope/builds", f.key, nil, ""), http.StatusNotFound, "notFound")
	envelope(t, f.do(http.MethodGet, "/v1/envs/"+f.env.Slug+"/builds", "mk_live_wrongwrongwrongwrong", nil, ""), http.StatusUnauthorized, "unauthorized")

	big, ct := multipartBody(t, part{"tools", "t.json", `[` + strings.Repeat(" ", 2<<20) + `]`})
	envelope(t, f.do(http.MethodPost, "/v1/envs/"+f.env.Slug+"/builds", f.key, big, ct), http.StatusRequestEntityTooLarge, "tooLarge")
}

func TestBuildReportAndToolSource(t *testing.T) {
	f := newBuildFixture(t, schema.DriverSQLite)
	base := "/v1/envs/" + f.env.Slug
	envelope(t, f.do(http.MethodGet, base+"/tools/get_order_details/source", f.key, nil, ""), http.StatusConflict, "notReady")

	body, ct := multipartBody(t, part{"config", "", `{"name": "x"}`})
	w := f.do(http.MethodPost, base+"/builds", f.key, body, ct)
	var queued api.BuildStarted
	_ = json.Unmarshal(w.Body.Bytes(), &queued)
	envelope(t, f.do(http.MethodGet, base+"/builds/"+queued.BuildID+"/report", f.key, nil, ""), http.StatusConflict, "conflict")

	b := f.setActive(t, loadTraces(t, "tau-retail-dev.json"))
	w = f.do(http.MethodGet, base+"/tools/get_order_details/source", f.key, nil, "")
	if w.Code != http.StatusOK {
		t.Fatalf("source: %d %s", w.Code, w.Body)
	}
	var src api.ToolSource
	_ = json.Unmarshal(w.Body.Bytes(), &src)
	if src.Build != b.ID || src.Language != "starlark" || src.Binding == "" || !strings.Contains(src.Source, "def ") {
		t.Errorf("source = %+v", src)
	}
	envelope(t, f.do(http.MethodGet, base+"/tools/no_such_tool/source", f.key, nil, ""), http.StatusNotFound, "notFound")
}
