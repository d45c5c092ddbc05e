package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/minio/minio-go/v7"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/cli"
	"github.com/doppel-dev/doppel/collector"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

// collectBackends are the two stacks collect runs on: the embedded one and the production one.
var collectBackends = []struct{ name, driver string }{
	{"sqlite+local", schema.DriverSQLite},
	{"postgres+minio", schema.DriverPostgres},
}

// collectFx is an API serving POST /api/collect over a real database and blob store, on a real
// HTTP listener (so the collector and the CLI can talk to it).
type collectFx struct {
	db      *bun.DB
	blobs   blob.Store
	url     string
	key     string
	ws      *schema.Workspace
	sched   *schedRecorder
	blobDir string // the Local store's directory, "" on MinIO
}

type schedRecorder struct {
	mu         sync.Mutex
	envs       []string
	workspaces []string // the workspace of each scheduled rebuild (its workflow's search attribute)
	err        error
}

func (s *schedRecorder) ScheduleBuild(_ context.Context, workspaceID, envID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envs = append(s.envs, envID)
	s.workspaces = append(s.workspaces, workspaceID)
	return s.err
}

func (s *schedRecorder) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.envs...)
}

// newCollectFx opens the backend's database and blob store (MinIO through a cuttable proxy when
// proxy is non-nil) and serves the API with opts.
func newCollectFx(t testing.TB, driver string, opts api.CollectOptions, proxy **tcpProxy) *collectFx {
	t.Helper()
	return newCollectServer(t, driver, opts, proxy, api.Options{})
}

// newCollectServer is newCollectFx on a server with serve's options beside the database and the collect route.
func newCollectServer(t testing.TB, driver string, opts api.CollectOptions, proxy **tcpProxy, serve api.Options) *collectFx {
	t.Helper()
	ctx := context.Background()
	fx := &collectFx{db: schematest.Open(t, driver), sched: &schedRecorder{}}
	if driver == schema.DriverPostgres {
		s3 := blobtest.NewS3(t)
		if proxy != nil {
			o, err := blob.ParseURL(testenv.S3(t))
			if err != nil {
				t.Fatal(err)
			}
			p := newTCPProxy(t, o.Endpoint)
			*proxy = p
			o.Endpoint, o.Bucket = p.addr, s3.Bucket()
			via, err := blob.NewS3(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			fx.blobs = via
		} else {
			fx.blobs = s3
		}
	} else {
		fx.blobDir = t.TempDir()
		l, err := blob.NewLocal(fx.blobDir)
		if err != nil {
			t.Fatal(err)
		}
		fx.blobs = l
	}
	var err error
	if fx.ws, err = store.CreateWorkspace(ctx, fx.db, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, fx.key, err = store.CreateKey(ctx, fx.db, fx.ws.ID, cred.KindWorkspace, "collector"); err != nil {
		t.Fatal(err)
	}
	opts.Blobs = fx.blobs
	if opts.Scheduler == nil {
		opts.Scheduler = fx.sched
	}
	serve.DB, serve.Routes = fx.db, append([]func(huma.API, *api.Deps){api.CollectRoutes(opts)}, serve.Routes...)
	h, _ := api.New(serve)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	fx.url = srv.URL
	return fx
}

type collectReply struct {
	status int
	header http.Header
	body   map[string]any
}

func (fx *collectFx) post(t testing.TB, body []byte, headers ...string) collectReply {
	t.Helper()
	return fx.postFrom(t, bytes.NewReader(body), headers...)
}

// postFrom is post of a body read from r: one of unknown length (not a bytes.Reader, say) is sent chunked.
func (fx *collectFx) postFrom(t testing.TB, body io.Reader, headers ...string) collectReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fx.url+"/api/collect", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+fx.key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	r := collectReply{status: res.StatusCode, header: res.Header}
	if err := json.Unmarshal(data, &r.body); err != nil {
		t.Fatalf("answer %d is not JSON: %q", res.StatusCode, data)
	}
	return r
}

func (r collectReply) want(t testing.TB, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %v", r.status, status, r.body)
	}
}

func (r collectReply) num(k string) int {
	f, _ := r.body[k].(float64)
	return int(f)
}

// blobKeys lists every object the fixture's blob store holds.
func (fx *collectFx) blobKeys(t testing.TB) []string {
	t.Helper()
	var keys []string
	switch s := fx.blobs.(type) {
	case *blob.S3:
		for obj := range s.Client().ListObjects(context.Background(), s.Bucket(), minio.ListObjectsOptions{Recursive: true}) {
			if obj.Err != nil {
				t.Fatal(obj.Err)
			}
			keys = append(keys, obj.Key)
		}
	default:
		err := filepath.WalkDir(fx.blobDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), ".") {
				keys = append(keys, p)
			}
			return err
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	return keys
}

type rowCount struct{ envs, batches, traces int }

func (fx *collectFx) rows(t testing.TB) rowCount {
	t.Helper()
	ctx := context.Background()
	var c rowCount
	for _, q := range []struct {
		model any
		dst   *int
	}{{(*schema.Environment)(nil), &c.envs}, {(*schema.TraceBatch)(nil), &c.batches}, {(*schema.Trace)(nil), &c.traces}} {
		n, err := fx.db.NewSelect().Model(q.model).Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		*q.dst = int(n)
	}
	return c
}

func (fx *collectFx) env(t testing.TB, slug string) *schema.Environment {
	t.Helper()
	e, err := store.GetEnv(context.Background(), fx.db, fx.ws.ID, slug)
	if err != nil {
		t.Fatalf("env %s: %v", slug, err)
	}
	return e
}

func readCollectData(t testing.TB, name string) ([]byte, trace.Batch) {
	t.Helper()
	data, err := sampledata.Read(name)
	if err != nil {
		t.Fatal(err)
	}
	var b trace.Batch
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	return data, b
}

// body renders a collect body of traces, renaming each id with suffix (so batches can be told apart).
func collectBody(project string, traces []trace.Trace, suffix string) []byte {
	enc := make([][]byte, len(traces))
	for i := range traces {
		t := traces[i]
		t.ID += suffix
		enc[i] = ingest.AppendTrace(nil, &t)
	}
	return ingest.AppendBody(nil, project, enc)
}

func TestCollectRealTraces(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			fx := newCollectFx(t, be.driver, api.CollectOptions{}, nil)
			ctx := context.Background()
			retailBody, retail := readCollectData(t, "tau-retail-dev.json")

			r := fx.post(t, retailBody, "User-Agent", "python-httpx/0.27.0")
			r.want(t, http.StatusAccepted)
			if r.num("accepted") != 126 || r.num("duplicates") != 0 || r.body["env"] != "tau2-retail" || !schema.HasPrefix(fmt.Sprint(r.body["batch"]), schema.PrefixTraceBatch) {
				t.Fatalf("answer %v", r.body)
			}
			env := fx.env(t, "tau2-retail")
			if env.Name != "tau2-retail" || env.Status != schema.EnvCollecting || env.NTraces != 126 || env.CollectedBytes != int64(len(retailBody)) ||
				env.NTools != 14 || env.Language != "python" {
				t.Fatalf("env %+v", env)
			}
			if got := fx.sched.calls(); len(got) != 1 || got[0] != env.ID || fx.sched.workspaces[0] != env.WorkspaceID {
				t.Errorf("build scheduled for %v in %v, want [%s] in %s", got, fx.sched.workspaces, env.ID, env.WorkspaceID)
			}
			// The blob reads back to exactly the traces sent.
			batches, err := store.ListTraceBatches(ctx, fx.db, env.ID)
			if err != nil || len(batches) != 1 {
				t.Fatalf("batches %v %v", batches, err)
			}
			if b := batches[0]; b.NTraces != 126 || b.Bytes != int64(len(retailBody)) || len(b.ToolsSeen) != 14 || !strings.HasPrefix(b.BlobKey, "batches/"+fx.ws.ID+"/") {
				t.Errorf("batch row %+v", b)
			}
			rc, err := fx.blobs.Get(ctx, batches[0].BlobKey)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(rc)
			rc.Close()
			if key := blob.ContentKey("batches/"+fx.ws.ID, data); key != batches[0].BlobKey {
				t.Errorf("blob key %s is not the content address %s", batches[0].BlobKey, key)
			}
			back, err := ingest.DecodeBlob(data)
			if err != nil || !reflect.DeepEqual(*back, retail) {
				t.Fatalf("blob does not read back to the traces sent: %v", err)
			}
			t.Logf("retail: %d body bytes stored as a %d-byte blob", len(retailBody), len(data))

			// Sent again (a collector retrying after a timeout): nothing stored or counted twice.
			r = fx.post(t, retailBody)
			r.want(t, http.StatusAccepted)
			if r.num("accepted") != 0 || r.num("duplicates") != 126 {
				t.Fatalf("resend: %v", r.body)
			}
			if env := fx.env(t, "tau2-retail"); env.NTraces != 126 || env.CollectedBytes != int64(len(retailBody)) {
				t.Fatalf("after resend: n_traces %d collected_bytes %d", env.NTraces, env.CollectedBytes)
			}
			if n := len(fx.sched.calls()); n != 1 {
				t.Errorf("a batch of duplicates scheduled a build (%d calls)", n)
			}
			if keys := fx.blobKeys(t); len(keys) != 1 {
				t.Errorf("identical batches stored %d blobs, want 1: %v", len(keys), keys)
			}

			// The airline file through `doppel collect`'s code, in batches of 50.
			airlinePath := sampledata.File(t, "tau-airline-dev.json")
			res, err := cli.Collect(ctx, cli.CollectOptions{Endpoint: fx.url, Key: fx.key, Files: []string{airlinePath}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Accepted != 148 || res.Batches != 3 || fmt.Sprint(res.Envs) != "[tau-airline]" {
				t.Fatalf("cli.Collect: %+v", res)
			}
			air := fx.env(t, "tau-airline")
			if n, err := store.CountTraces(ctx, fx.db, air.ID); err != nil || n != 148 || air.NTraces != 148 {
				t.Fatalf("airline: %d trace rows, n_traces %d, %v", n, air.NTraces, err)
			}

			// The Go collector, with fresh ids for 10 retail traces and 5 it already sent.
			c, err := collector.New(collector.Options{Endpoint: fx.url, Key: fx.key, Project: "tau2-retail", BatchSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			for i, tr := range retail.Traces[:15] {
				if i < 10 {
					tr.ID += "#go"
				}
				if err := c.Add(tr); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if st := c.Stats(); st.Accepted != 10 || st.Duplicates != 5 || st.Dropped != 0 || st.Batches != 4 {
				t.Fatalf("collector stats %+v", st)
			}
			if env := fx.env(t, "tau2-retail"); env.NTraces != 136 || env.Language != "python" {
				t.Fatalf("after the collector: n_traces %d language %q", env.NTraces, env.Language)
			}
		})
	}
}

func TestCollectRejectsBadBatches(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			fx := newCollectFx(t, be.driver, api.CollectOptions{MaxTraces: 3, MaxRequestBytes: 4 << 10}, nil)
			tr := func(id, msgs string) string { return fmt.Sprintf(`{"id":%q,"messages":[%s]}`, id, msgs) }
			body := func(traces ...string) []byte {
				return []byte(`{"project":"shop","traces":[` + strings.Join(traces, ",") + `]}`)
			}
			user := `{"role":"user","content":"hi"}`
			call := `{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"a\":1}"}}]}`
			cases := []struct {
				name      string
				body      []byte
				status    int
				code      string
				locations []string
			}{
				{"bad role", body(tr("a", user), tr("b", user+`,{"role":"bot","content":"x"}`)), 422, api.CodeInvalid, []string{"body.traces[1].messages[1].role"}},
				{"arguments not JSON", body(tr("a", strings.Replace(call, `{\"a\":1}`, `{a:1}`, 1))), 422, api.CodeInvalid, []string{"body.traces[0].messages[0].tool_calls[0].function.arguments"}},
				{"tool message without id", body(tr("a", call+`,{"role":"tool","content":"ok"}`)), 422, api.CodeInvalid, []string{"body.traces[0].messages[1].tool_call_id"}},
				{"duplicate ids and a wrong type", body(tr("a", user), tr("a", user), `{"id":7,"messages":[`+user+`]}`), 422, api.CodeInvalid, []string{"body.traces[1].id", "body.traces[2].id"}},
				{"no project", []byte(`{"traces":[` + tr("a", user) + `]}`), 422, api.CodeInvalid, []string{"body.project"}},
				{"malformed", []byte(`{"project":"shop","traces":[`), 422, api.CodeInvalid, []string{"body.traces"}},
				{"empty", nil, 422, api.CodeInvalid, []string{"body"}},
				{"too many traces", body(tr("a", user), tr("b", user), tr("c", user), tr("d", user)), 413, api.CodeTooLarge, []string{"body.traces"}},
				{"too many bytes", body(tr("a", `{"role":"user","content":"`+strings.Repeat("x", 5000)+`"}`)), 413, api.CodeTooLarge, nil},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					r := fx.post(t, c.body)
					r.want(t, c.status)
					if r.body["code"] != c.code || r.body["requestId"] == "" {
						t.Errorf("envelope %v", r.body)
					}
					var locs []string
					errs, _ := r.body["errors"].([]any)
					for _, e := range errs {
						locs = append(locs, fmt.Sprint(e.(map[string]any)["location"]))
					}
					if len(c.locations) > 0 && !reflect.DeepEqual(locs, c.locations) {
						t.Errorf("error locations %v, want %v", locs, c.locations)
					}
					if len(c.locations) > 0 && !strings.HasPrefix(fmt.Sprint(r.body["detail"]), c.locations[0]+": ") {
						t.Errorf("detail %q does not start with %s", r.body["detail"], c.locations[0])
					}
				})
			}
			if rc := fx.rows(t); rc != (rowCount{}) {
				t.Errorf("rejected batches wrote rows: %+v", rc)
			}
			if keys := fx.blobKeys(t); len(keys) != 0 {
				t.Errorf("rejected batches wrote blobs: %v", keys)
			}
			if n := len(fx.sched.calls()); n != 0 {
				t.Errorf("rejected batches scheduled %d builds", n)
			}
		})
	}
}

func TestCollectAuth(t *testing.T) {
	fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{}, nil)
	ctx := context.Background()
	pending, err := store.CreateWorkspace(ctx, fx.db, "pending")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SetWorkspaceAccess(ctx, fx.db, pending.ID, schema.AccessPending); err != nil {
		t.Fatal(err)
	}
	_, pendingKey, _ := store.CreateKey(ctx, fx.db, pending.ID, cred.KindWorkspace, "k")
	_, mcpKey, _ := store.CreateKey(ctx, fx.db, fx.ws.ID, cred.KindMCP, "m")
	good := []byte(`{"project":"p","traces":[{"id":"a","messages":[{"role":"user","content":"x"}]}]}`)
	for _, c := range []struct {
		name, auth string
		status     int
	}{
		{"none", "", 401},
		{"mcp token", "Bearer " + mcpKey, 401},
		{"unknown", "Bearer mk_live_" + strings.Repeat("a", 52), 401},
		{"pending workspace", "Bearer " + pendingKey, 403},
	} {
		r := fx.post(t, good, "Authorization", c.auth)
		r.want(t, c.status)
		if c.status == 401 && r.header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%s: 401 without WWW-Authenticate", c.name)
		}
	}
	if rc := fx.rows(t); rc != (rowCount{}) {
		t.Errorf("unauthenticated batches wrote rows: %+v", rc)
	}
}

func TestCollectEnvByteCap(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			_, retail := readCollectData(t, "tau-retail-dev.json")
			first := collectBody("shop", retail.Traces[:10], "")
			fx := newCollectFx(t, be.driver, api.CollectOptions{MaxEnvBytes: int64(len(first)) + 1000}, nil)
			fx.post(t, first).want(t, http.StatusAccepted)
			r := fx.post(t, collectBody("shop", retail.Traces[10:11], ""))
			r.want(t, http.StatusRequestEntityTooLarge)
			if r.body["code"] != api.CodeTooLarge || !strings.Contains(fmt.Sprint(r.body["detail"]), "environment shop") {
				t.Errorf("envelope %v", r.body)
			}
			if env := fx.env(t, "shop"); env.NTraces != 10 || env.CollectedBytes != int64(len(first)) {
				t.Errorf("env after the refused batch: n_traces %d bytes %d", env.NTraces, env.CollectedBytes)
			}
			if rc := fx.rows(t); rc != (rowCount{envs: 1, batches: 1, traces: 10}) {
				t.Errorf("rows %+v", rc)
			}
			// Another project has its own cap.
			fx.post(t, collectBody("other", retail.Traces[:10], "")).want(t, http.StatusAccepted)
		})
	}
}

// fakeClock is the rate limiter's clock in tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestCollectRateLimit(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{RatePerSecond: 0.5, RateBurst: 2, TrustForwardedFor: true, Now: clock.now}, nil)
	good := func(id string) []byte {
		return []byte(`{"project":"p","traces":[{"id":"` + id + `","messages":[{"role":"user","content":"x"}]}]}`)
	}
	from := func(addr string) []string { return []string{"X-Forwarded-For", addr + ", 10.0.0.1"} }
	fx.post(t, good("1"), from("192.0.2.1")...).want(t, 202)
	fx.post(t, []byte(`{}`), from("192.0.2.1")...).want(t, 422) // a refused request costs a token too
	r := fx.post(t, good("2"), from("192.0.2.1")...)
	r.want(t, http.StatusTooManyRequests)
	if r.body["code"] != api.CodeRateLimited || r.header.Get("Retry-After") != "2" {
		t.Errorf("429: Retry-After %q, envelope %v", r.header.Get("Retry-After"), r.body)
	}
	fx.post(t, good("3"), from("192.0.2.2")...).want(t, 202) // another address has its own bucket
	clock.add(2 * time.Second)
	fx.post(t, good("4"), from("192.0.2.1")...).want(t, 202)
	fx.post(t, good("5"), from("192.0.2.1")...).want(t, 429)
	if env := fx.env(t, "p"); env.NTraces != 3 {
		t.Errorf("n_traces %d, want 3", env.NTraces)
	}
}

// The same batch sent six times, four of them at once: every trace is stored and counted once.
func TestCollectRetriedBatchIsStoredOnce(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			fx := newCollectFx(t, be.driver, api.CollectOptions{}, nil)
			_, retail := readCollectData(t, "tau-retail-dev.json")
			body := collectBody("shop", retail.Traces[:50], "")
			accepted := make(chan int, 6)
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					r := fx.post(t, body)
					if r.status != 202 || r.num("accepted")+r.num("duplicates") != 50 {
						t.Errorf("concurrent post: %d %v", r.status, r.body)
					}
					accepted <- r.num("accepted")
				})
			}
			wg.Wait()
			for range 2 {
				r := fx.post(t, body)
				r.want(t, 202)
				accepted <- r.num("accepted")
			}
			close(accepted)
			sum := 0
			for n := range accepted {
				sum += n
			}
			env := fx.env(t, "shop")
			n, err := store.CountTraces(context.Background(), fx.db, env.ID)
			if sum != 50 || env.NTraces != 50 || n != 50 || err != nil || env.CollectedBytes != int64(len(body)) {
				t.Fatalf("accepted %d in all, n_traces %d, %d trace rows (%v), collected %d bytes of %d", sum, env.NTraces, n, err, env.CollectedBytes, len(body))
			}
			if keys := fx.blobKeys(t); len(keys) != 1 {
				t.Errorf("%d blobs for one batch content", len(keys))
			}
		})
	}
}
