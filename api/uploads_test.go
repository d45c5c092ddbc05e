package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// uploadFx serves uploads, collect and the build route over a real database and blob store (MinIO beside
// PostgreSQL), with a key in each of two workspaces.
type uploadFx struct {
	h             http.Handler
	db            *bun.DB
	blobs         blob.Store
	key, otherKey string
	ws            string
	starter       *recordingStarter
}

const testUploadCap = 4 << 20

func newUploadFx(t testing.TB, driver string) *uploadFx {
	t.Helper()
	db := schematest.Open(t, driver)
	fx := &uploadFx{db: db, starter: &recordingStarter{}}
	if driver == schema.DriverPostgres {
		fx.blobs = blobtest.NewS3(t)
	} else {
		l, err := blob.NewLocal(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		fx.blobs = l
	}
	ws, err := store.CreateWorkspace(bg, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	fx.ws = ws.ID
	other, _ := store.CreateWorkspace(bg, db, "other")
	_, fx.key, _ = store.CreateKey(bg, db, ws.ID, cred.KindWorkspace, "k")
	_, fx.otherKey, _ = store.CreateKey(bg, db, other.ID, cred.KindWorkspace, "k")
	up := &api.UploadRoutes{Blobs: fx.blobs, MaxFileBytes: testUploadCap}
	br := &api.BuildRoutes{Blobs: fx.blobs, Starter: fx.starter}
	fx.h, _ = api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){
		api.CollectRoutes(api.CollectOptions{Blobs: fx.blobs, RatePerSecond: -1}), br.Register, up.Register}})
	return fx
}

func (fx *uploadFx) do(method, path, key string, body io.Reader, contentType string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, body)
	r.Header.Set("Authorization", "Bearer "+key)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	fx.h.ServeHTTP(w, r)
	return w
}

// upload posts files (name → content) and answers the stored uploads in order.
func (fx *uploadFx) upload(t *testing.T, key string, files ...[2]string) []api.UploadInfo {
	t.Helper()
	var ps []part
	for _, f := range files {
		ps = append(ps, part{"file", f[0], f[1]})
	}
	body, ct := multipartBody(t, ps...)
	w := fx.do(http.MethodPost, "/api/uploads", key, body, ct)
	if w.Code != http.StatusCreated {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	var out api.UploadsAccepted
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out.Uploads
}

func countRows(t *testing.T, db bun.IDB, table string) int {
	t.Helper()
	n, err := db.NewSelect().Table(table).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestUploads(t *testing.T) {
	retail, err := sampledata.Read("tau-retail-dev.json")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := sampledata.Read("tau-retail-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	var batch struct {
		Traces []json.RawMessage `json:"traces"`
	}
	if err := json.Unmarshal(retail, &batch); err != nil {
		t.Fatal(err)
	}
	var jsonl bytes.Buffer
	for _, tr := range batch.Traces[:20] {
		jsonl.Write(tr)
		jsonl.WriteByte('\n')
	}
	forEachDriver(t, func(t *testing.T, driver string) {
		fx := newUploadFx(t, driver)

		t.Run("stored content-addressed", func(t *testing.T) {
			ups := fx.upload(t, fx.key, [2]string{"retail.json", string(retail)}, [2]string{"../../etc/tools.json", string(tools)})
			sum := sha256.Sum256(retail)
			if len(ups) != 2 || !schema.HasPrefix(ups[0].ID, schema.PrefixUpload) || ups[0].SHA256 != hex.EncodeToString(sum[:]) ||
				ups[0].Bytes != int64(len(retail)) || ups[1].Filename != "tools.json" {
				t.Fatalf("uploads = %+v", ups)
			}
			again := fx.upload(t, fx.key, [2]string{"again.json", string(retail)})
			u1, _ := store.GetUpload(bg, fx.db, fx.ws, ups[0].ID)
			u2, _ := store.GetUpload(bg, fx.db, fx.ws, again[0].ID)
			if u1 == nil || u2 == nil || u1.BlobKey != u2.BlobKey || !strings.Contains(u1.BlobKey, ups[0].SHA256) {
				t.Fatalf("the same content is one blob keyed by its hash: %+v %+v", u1, u2)
			}
		})

		t.Run("over the cap is 413 and stores nothing", func(t *testing.T) {
			before := countRows(t, fx.db, "uploads")
			big := strings.Repeat("x", testUploadCap+1)
			body, ct := multipartBody(t, part{"file", "small.txt", "ok"}, part{"file", "big.bin", big})
			w := fx.do(http.MethodPost, "/api/uploads", fx.key, body, ct)
			wantEnvelope(t, w, http.StatusRequestEntityTooLarge, "tooLarge")
			if n := countRows(t, fx.db, "uploads"); n != before {
				t.Fatalf("uploads %d → %d after a refused request", before, n)
			}
			// Exactly at the cap is fine.
			fx.upload(t, fx.key, [2]string{"edge.bin", big[:testUploadCap]})
		})

		t.Run("bad requests", func(t *testing.T) {
			for _, tc := range []struct {
				name, ct, body, key string
				status              int
				code, field         string
			}{
				{"json body", "application/json", `{}`, fx.key, http.StatusUnsupportedMediaType, "invalid", ""},
				{"no file part", "", "", fx.key, http.StatusUnprocessableEntity, "invalid", "body.file"},
				{"unknown part", "other", "", fx.key, http.StatusUnprocessableEntity, "invalid", "body.other"},
				{"no key", "", "", "", http.StatusUnauthorized, "unauthorized", ""},
				{"truncated", "truncated", "", fx.key, http.StatusUnprocessableEntity, "invalid", "body"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					var body io.Reader = strings.NewReader(tc.body)
					ct := tc.ct
					switch tc.ct {
					case "", "other", "truncated":
						var buf bytes.Buffer
						mw := multipart.NewWriter(&buf)
						switch tc.ct {
						case "other":
							_ = mw.WriteField("other", "x")
						case "truncated":
							pw, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Disposition": {`form-data; name="file"; filename="a"`}})
							_, _ = pw.Write([]byte("abc"))
						}
						if tc.ct != "truncated" {
							_ = mw.Close()
						}
						body, ct = &buf, mw.FormDataContentType()
					}
					w := fx.do(http.MethodPost, "/api/uploads", tc.key, body, ct)
					e := wantEnvelope(t, w, tc.status, tc.code)
					if tc.field != "" && !strings.HasPrefix(e.Detail, tc.field) {
						t.Errorf("detail %q does not name %s", e.Detail, tc.field)
					}
				})
			}
		})

		t.Run("collect from an upload", func(t *testing.T) {
			for _, tc := range []struct{ name, content string }{
				{"collect body", string(retail)},
				{"json lines", jsonl.String()},
			} {
				up := fx.upload(t, fx.key, [2]string{"traces", tc.content})[0]
				project := "from-upload-" + strings.ReplaceAll(tc.name, " ", "-")
				body, _ := json.Marshal(map[string]string{"project": project, "upload": up.ID})
				w := fx.do(http.MethodPost, "/api/collect", fx.key, bytes.NewReader(body), "application/json")
				if w.Code != http.StatusAccepted {
					t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
				}
				var acc api.CollectAccepted
				_ = json.Unmarshal(w.Body.Bytes(), &acc)
				want := len(batch.Traces)
				if tc.name == "json lines" {
					want = 20
				}
				if acc.Accepted != want || acc.Env != project {
					t.Fatalf("%s: accepted %+v, want %d traces", tc.name, acc, want)
				}
			}
			mine := fx.upload(t, fx.key, [2]string{"traces.jsonl", jsonl.String()})[0]
			for _, tc := range []struct{ name, body, field string }{
				{"both", `{"project":"p","upload":"` + mine.ID + `","traces":[]}`, "body.upload"},
				{"unknown", `{"project":"p","upload":"upl_0000000000000000"}`, "body.upload"},
				{"no project", `{"upload":"` + mine.ID + `"}`, "body.project"},
			} {
				w := fx.do(http.MethodPost, "/api/collect", fx.key, strings.NewReader(tc.body), "application/json")
				e := wantEnvelope(t, w, http.StatusUnprocessableEntity, "invalid")
				if !strings.HasPrefix(e.Detail, tc.field) {
					t.Errorf("%s: detail %q does not name %s", tc.name, e.Detail, tc.field)
				}
			}
			// Another workspace's upload is as unknown as a missing one.
			w := fx.do(http.MethodPost, "/api/collect", fx.otherKey, strings.NewReader(`{"project":"p","upload":"`+mine.ID+`"}`), "application/json")
			e := wantEnvelope(t, w, http.StatusUnprocessableEntity, "invalid")
			if !strings.Contains(e.Detail, "not found") {
				t.Errorf("another workspace's upload: %q", e.Detail)
			}
		})

		t.Run("build inputs from uploads", func(t *testing.T) {
			env, err := store.UpsertEnvByProject(bg, fx.db, fx.ws, "tau2-retail")
			if err != nil {
				t.Fatal(err)
			}
			code := "def handle(args, world):\n    return {\"ok\": True}\n"
			ups := fx.upload(t, fx.key, [2]string{"tools.json", string(tools)}, [2]string{"transfer_to_human_agents.star", code},
				[2]string{"config.json", `{"name": "Retail", "scenarios": {"pending": "1 order with status pending"}}`})
			traces := fx.upload(t, fx.key, [2]string{"traces.jsonl", jsonl.String()})[0]
			// A file that holds no traces names its field and stores nothing.
			body, ct := multipartBody(t, part{"traces_upload", "", ups[2].ID})
			e := wantEnvelope(t, fx.do(http.MethodPost, "/v1/envs/"+env.Slug+"/builds", fx.key, body, ct), http.StatusUnprocessableEntity, "invalid")
			if !strings.HasPrefix(e.Detail, "body.traces_upload[0]") {
				t.Errorf("detail %q does not name body.traces_upload[0]", e.Detail)
			}
			body, ct = multipartBody(t, part{"tools_upload", "", ups[0].ID}, part{"code_upload", "", ups[1].ID}, part{"config_upload", "", ups[2].ID},
				part{"traces_upload", "", traces.ID})
			w := fx.do(http.MethodPost, "/v1/envs/"+env.Slug+"/builds", fx.key, body, ct)
			if w.Code != http.StatusAccepted {
				t.Fatalf("build: %d %s", w.Code, w.Body)
			}
			env, _ = store.GetEnvByID(bg, fx.db, env.ID)
			if n, err := store.CountTraces(bg, fx.db, env.ID); err != nil || n != 20 || env.NTraces != 20 {
				t.Fatalf("traces collected from traces_upload: %d (n_traces %d, %v), want 20", n, env.NTraces, err)
			}
			rc, err := fx.blobs.Get(bg, env.InputsKey)
			if err != nil {
				t.Fatal(err)
			}
			var in infer.Upload
			err = json.NewDecoder(rc).Decode(&in)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			got, err1 := infer.ParseToolDefs(in.Tools)
			want, err2 := infer.ParseToolDefs(tools)
			if err1 != nil || err2 != nil || len(got) == 0 || len(got) != len(want) || in.Code["transfer_to_human_agents"] != code || in.Config == nil || in.Config.Name != "Retail" {
				t.Fatalf("inputs from uploads: tools %d bytes, code %v, config %+v", len(in.Tools), in.Code, in.Config)
			}
			// An upload id the workspace does not hold names its field, and starts nothing.
			started := len(fx.starter.started)
			body, ct = multipartBody(t, part{"tools_upload", "", "upl_0000000000000000"})
			w = fx.do(http.MethodPost, "/v1/envs/"+env.Slug+"/builds", fx.key, body, ct)
			e = wantEnvelope(t, w, http.StatusUnprocessableEntity, "invalid")
			if !strings.HasPrefix(e.Detail, "body.tools_upload") || len(fx.starter.started) != started {
				t.Errorf("unknown upload: %q, %d builds started", e.Detail, len(fx.starter.started)-started)
			}
		})
	})
}

// wantEnvelope fails unless w is the error envelope with status and code, and answers it.
func wantEnvelope(t *testing.T, w *httptest.ResponseRecorder, status int, code string) api.Envelope {
	t.Helper()
	var e api.Envelope
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != code || e.Detail == "" || e.RequestID == "" {
		t.Fatalf("envelope %s (%v), want code %s with detail and requestId", w.Body, err, code)
	}
	return e
}

// FuzzUpload sends POST /api/uploads a fuzzed multipart body under a fuzzed Content-Type boundary: never a 5xx;
// a 201 lists stored uploads; a 4xx is the error envelope.
func FuzzUpload(f *testing.F) {
	fx := newUploadFx(f, schema.DriverSQLite)
	valid := func(parts ...part) []byte {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		_ = mw.SetBoundary("BOUNDARY")
		for _, p := range parts {
			if p.filename == "" {
				_ = mw.WriteField(p.field, p.content)
				continue
			}
			w, _ := mw.CreateFormFile(p.field, p.filename)
			_, _ = io.WriteString(w, p.content)
		}
		_ = mw.Close()
		return buf.Bytes()
	}
	for _, seed := range [][]byte{
		valid(part{"file", "a.json", `{"traces": []}`}),
		valid(part{"file", "a.star", "def handle(args, world):\n    return 1\n"}, part{"file", "b.txt", "two"}),
		valid(part{"file", "", "no filename"}),
		valid(part{"file", "../../x", "dots"}),
		valid(part{"other", "", "value"}),
		valid(),
		valid(part{"file", "big", strings.Repeat("z", testUploadCap+10)})[:testUploadCap/2],
		[]byte("--BOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc"),
		[]byte("--BOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\nContent-Type: ;;;\r\n\r\nabc\r\n--BOUNDARY--\r\n"),
		[]byte("--BOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''%ff%fe\r\n\r\nabc\r\n--BOUNDARY--\r\n"),
		[]byte("--BOUNDARY--\r\n"),
		[]byte("garbage"),
		{},
	} {
		f.Add(seed, "BOUNDARY")
	}
	f.Add([]byte("--x\r\n\r\n--x--"), "x")
	f.Add([]byte("a"), "")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		r := httptest.NewRequest(http.MethodPost, "/api/uploads", bytes.NewReader(body))
		r.Header.Set("Content-Type", `multipart/form-data; boundary="`+boundary+`"`)
		w := fuzzSend(fx.h, r, fx.key)
		checkEnvelope(t, w)
		if w.Code == http.StatusCreated {
			var out api.UploadsAccepted
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out.Uploads) == 0 {
				t.Fatalf("201 without uploads: %s", w.Body)
			}
		}
	})
}
