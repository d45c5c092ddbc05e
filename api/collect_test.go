package api_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/minio/minio-go/v7"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

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

// tcpProxy forwards connections to a real service until Cut, which makes the service unreachable.
type tcpProxy struct {
	addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{addr: ln.Addr().String(), ln: ln}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(p.Cut)
	return p
}

// Cut closes the listener and every forwarded connection.
func (p *tcpProxy) Cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func TestCollectBlobStoreDown(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			var proxy *tcpProxy
			fx := newCollectFx(t, be.driver, api.CollectOptions{}, &proxy)
			_, retail := readCollectData(t, "tau-retail-dev.json")
			body := collectBody("shop", retail.Traces[:5], "")
			// Down: MinIO unreachable, or the local store's disk refusing writes.
			if proxy != nil {
				proxy.Cut()
			} else {
				if err := os.RemoveAll(fx.blobDir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(fx.blobDir, []byte("not a directory"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r := fx.post(t, body)
			r.want(t, http.StatusServiceUnavailable)
			if r.body["code"] != api.CodeUnavailable || !strings.Contains(fmt.Sprint(r.body["detail"]), "blob store") {
				t.Errorf("envelope %v", r.body)
			}
			if rc := fx.rows(t); rc != (rowCount{}) {
				t.Errorf("a batch the blob store refused wrote rows: %+v", rc)
			}
			if n := len(fx.sched.calls()); n != 0 {
				t.Errorf("scheduled %d builds", n)
			}
		})
	}
}

func TestCollectDatabaseDown(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			fx := newCollectFx(t, be.driver, api.CollectOptions{}, nil)
			_, retail := readCollectData(t, "tau-retail-dev.json")
			body := collectBody("shop", retail.Traces[:5], "")

			// The database fails in the middle of the batch's transaction, after the blob is written:
			// the transaction rolls back whole (no env, batch or trace row) and the answer is 503.
			ctx := context.Background()
			if _, err := fx.db.ExecContext(ctx, `ALTER TABLE traces RENAME TO traces_away`); err != nil {
				t.Fatal(err)
			}
			r := fx.post(t, body)
			r.want(t, http.StatusServiceUnavailable)
			if r.body["code"] != api.CodeUnavailable || !strings.Contains(fmt.Sprint(r.body["detail"]), "database") {
				t.Errorf("envelope %v", r.body)
			}
			if _, err := fx.db.ExecContext(ctx, `ALTER TABLE traces_away RENAME TO traces`); err != nil {
				t.Fatal(err)
			}
			if rc := fx.rows(t); rc != (rowCount{}) {
				t.Fatalf("a failed transaction left rows: %+v", rc)
			}
			if n := len(fx.sched.calls()); n != 0 {
				t.Errorf("scheduled %d builds", n)
			}
			// The collector's retry then stores the batch once; the blob written before is reused.
			r = fx.post(t, body)
			r.want(t, 202)
			if r.num("accepted") != 5 || len(fx.blobKeys(t)) != 1 {
				t.Fatalf("retry: %v, blobs %v", r.body, fx.blobKeys(t))
			}

			// The database gone altogether: 503 before the body is read.
			fx.db.Close()
			r = fx.post(t, collectBody("shop", retail.Traces[5:6], ""))
			r.want(t, http.StatusServiceUnavailable)
			if r.body["code"] != api.CodeUnavailable {
				t.Errorf("envelope %v", r.body)
			}
			if keys := fx.blobKeys(t); len(keys) != 1 {
				t.Errorf("blobs %v, want only the first batch's", keys)
			}
		})
	}
}

func TestCollectSchedulerErrorStillAccepts(t *testing.T) {
	fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{}, nil)
	fx.sched.err = errors.New("temporal is away")
	_, retail := readCollectData(t, "tau-retail-dev.json")
	r := fx.post(t, collectBody("shop", retail.Traces[:2], ""))
	r.want(t, 202)
	if r.num("accepted") != 2 || len(fx.sched.calls()) != 1 {
		t.Fatalf("%v, %d schedule calls", r.body, len(fx.sched.calls()))
	}
}

func TestCollectDetectsAgent(t *testing.T) {
	fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{}, nil)
	crew := `{"project":"crew","traces":[{"id":"a","messages":[{"role":"system","content":"You are Clerk. Kind.\nYour personal goal is: help"},{"role":"user","content":"x"}]}]}`
	fx.post(t, []byte(crew), "User-Agent", "python-requests/2.32").want(t, 202)
	if env := fx.env(t, "crew"); env.Framework != "crewai" || env.Language != "python" {
		t.Errorf("detected framework %q language %q", env.Framework, env.Language)
	}
	// What the sender states wins, and replaces what was detected.
	stated := strings.Replace(crew, `"id":"a"`, `"id":"b"`, 1)
	fx.post(t, []byte(stated), "X-Doppel-Framework", "my-framework", "X-Doppel-Language", "typescript").want(t, 202)
	if env := fx.env(t, "crew"); env.Framework != "my-framework" || env.Language != "typescript" {
		t.Errorf("stated framework %q language %q", env.Framework, env.Language)
	}
}

func TestCollectOpenAPI(t *testing.T) {
	_, a := api.New(api.Options{Routes: []func(huma.API, *api.Deps){api.CollectRoutes(api.CollectOptions{})}})
	data, err := json.Marshal(a.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string                `json:"operationId"`
			Security    []map[string][]string `json:"security"`
			RequestBody struct {
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
			Responses map[string]struct {
				Headers map[string]any `json:"headers"`
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
				Required   []string       `json:"required"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	op, ok := doc.Paths["/api/collect"]["post"]
	if !ok || op.OperationID != "collect" {
		t.Fatalf("no collect operation: %v", doc.Paths["/api/collect"])
	}
	if len(op.Security) != 1 || op.Security[0]["workspaceKey"] == nil {
		t.Errorf("security %v", op.Security)
	}
	if ref := op.RequestBody.Content["application/json"].Schema["$ref"]; ref != "#/components/schemas/CollectBody" {
		t.Errorf("request body schema %v", op.RequestBody.Content)
	}
	for _, status := range []string{"202", "401", "403", "413", "422", "429", "503"} {
		if _, ok := op.Responses[status]; !ok {
			t.Errorf("response %s not documented", status)
		}
	}
	if op.Responses["429"].Headers["Retry-After"] == nil {
		t.Errorf("429 does not document Retry-After")
	}
	ref, _ := op.Responses["202"].Content["application/json"].Schema["$ref"].(string)
	resp := doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
	for _, f := range []string{"accepted", "duplicates", "env", "batch"} {
		if resp.Properties[f] == nil {
			t.Errorf("202 body lacks %s: %v", f, resp.Properties)
		}
	}
	if body := doc.Components.Schemas["CollectBody"]; body.Properties["project"] == nil || body.Properties["traces"] == nil {
		t.Errorf("CollectBody schema %v", body)
	}
}

// The environment the API answers and the one the store creates must agree on the slug.
func TestCollectSlugMatchesStore(t *testing.T) {
	for _, name := range []string{"tau2-retail", "Tau Retail", "  My_Agent!! v2 ", "Café Bot", "UPPER.lower.123",
		strings.Repeat("ab ", 40), strings.Repeat("x", 63), strings.Repeat("x", 64), "\u212Aelvin", "İstanbul"} {
		if s := ingest.Slug(name); s != store.Slugify(name) {
			t.Errorf("ingest.Slug(%q) = %q, store.Slugify = %q", name, s, store.Slugify(name))
		}
	}
}

// killChildEnv carries the helper server's configuration (JSON of killChild) from the parent test.
const killChildEnv = "DOPPEL_COLLECT_KILL_CHILD"

type killChild struct {
	Driver, DSN string
	S3, Bucket  string // MinIO, or
	BlobDir     string // the local store
}

// TestCollectKillChild is not a test of its own: it is the server process TestCollectSurvivesKill9
// starts, kills with SIGKILL and starts again. It serves /api/collect until killed.
func TestCollectKillChild(t *testing.T) {
	raw := os.Getenv(killChildEnv)
	if raw == "" {
		t.Skip("the server process of TestCollectSurvivesKill9; runs only as its child")
	}
	var c killChild
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: c.Driver, DSN: c.DSN})
	if err != nil {
		t.Fatal(err)
	}
	var blobs blob.Store
	if c.S3 != "" {
		o, err := blob.ParseURL(c.S3)
		if err != nil {
			t.Fatal(err)
		}
		o.Bucket = c.Bucket
		if blobs, err = blob.NewS3(ctx, o); err != nil {
			t.Fatal(err)
		}
	} else if blobs, err = blob.NewLocal(c.BlobDir); err != nil {
		t.Fatal(err)
	}
	h, _ := api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){api.CollectRoutes(api.CollectOptions{Blobs: blobs, RatePerSecond: -1})}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "LISTEN %s\n", ln.Addr())
	t.Fatal(http.Serve(ln, h))
}

// startKillChild starts the helper server and answers its process and base URL.
func startKillChild(t *testing.T, c killChild) (*exec.Cmd, string) {
	t.Helper()
	raw, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCollectKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "LISTEN "); ok {
			go io.Copy(io.Discard, out)
			return cmd, "http://" + addr
		}
	}
	t.Fatalf("the server process ended before listening: %v", sc.Err())
	return nil, ""
}

// TestCollectSurvivesKill9 streams batches from four clients into a server process, kills it with
// SIGKILL while requests are in flight, three times, and checks after each kill: every
// acknowledged trace is stored; every batch is stored whole or not at all; the environment's
// n_traces and collected_bytes equal what its rows say; every stored trace is in its batch's blob.
// Then the unacknowledged batches are resent (as a collector would) and every trace is stored once.
func TestCollectSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills server processes")
	}
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			var c killChild
			var blobs blob.Store
			c.Driver = be.driver
			if be.driver == schema.DriverPostgres {
				c.DSN = schematest.PostgresDSN(t)
				s3 := blobtest.NewS3(t)
				c.S3, c.Bucket, blobs = testenv.S3(t), s3.Bucket(), s3
			} else {
				c.DSN, c.BlobDir = schematest.SQLiteDSN(t), t.TempDir()
				l, err := blob.NewLocal(c.BlobDir)
				if err != nil {
					t.Fatal(err)
				}
				blobs = l
			}
			db, err := schema.Open(ctx, schema.Options{Driver: c.Driver, DSN: c.DSN})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := schema.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			ws, err := store.CreateWorkspace(ctx, db, "acme")
			if err != nil {
				t.Fatal(err)
			}
			_, key, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "k")
			if err != nil {
				t.Fatal(err)
			}
			_, retail := readCollectData(t, "tau-retail-dev.json")
			const perBatch = 20
			batchIDs := func(n int) []string {
				ids := make([]string, perBatch)
				for k := range ids {
					ids[k] = fmt.Sprintf("%s#%d", retail.Traces[(n*perBatch+k)%len(retail.Traces)].ID, n)
				}
				return ids
			}
			batchBody := func(n int) []byte {
				traces := make([]trace.Trace, perBatch)
				for k := range traces {
					traces[k] = retail.Traces[(n*perBatch+k)%len(retail.Traces)]
				}
				return collectBody("shop", traces, fmt.Sprintf("#%d", n))
			}
			post := func(url string, n int) (int, error) {
				req, _ := http.NewRequest(http.MethodPost, url+"/api/collect", bytes.NewReader(batchBody(n)))
				req.Header.Set("Authorization", "Bearer "+key)
				res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					return 0, err
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				return res.StatusCode, nil
			}
			sent := map[int]bool{} // batch -> acknowledged
			var next atomic.Int64
			for round := 1; round <= 3; round++ {
				cmd, url := startKillChild(t, c)
				var mu sync.Mutex
				acks := 0
				killAt := 10 * round
				killed := make(chan struct{})
				var once sync.Once
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for {
							n := int(next.Add(1))
							mu.Lock()
							sent[n] = false
							mu.Unlock()
							status, err := post(url, n)
							if err != nil {
								return // the server is gone
							}
							if status != http.StatusAccepted {
								t.Errorf("batch %d: status %d", n, status)
								return
							}
							mu.Lock()
							sent[n] = true
							acks++
							kill := acks >= killAt
							mu.Unlock()
							if kill {
								once.Do(func() {
									// A different moment each round: at the ack, or while later batches are further in.
									time.Sleep(time.Duration(round-1) * 9 * time.Millisecond)
									cmd.Process.Signal(syscall.SIGKILL)
									close(killed)
								})
							}
						}
					})
				}
				<-killed
				wg.Wait()
				cmd.Wait()
				checkAfterKill(t, db, blobs, ws.ID, sent, batchIDs)
			}
			// A collector resends what was not acknowledged.
			_, url := startKillChild(t, c)
			unacked := 0
			for n, ok := range sent {
				if ok {
					continue
				}
				unacked++
				if status, err := post(url, n); err != nil || status != http.StatusAccepted {
					t.Fatalf("resend batch %d: %d %v", n, status, err)
				}
				sent[n] = true
			}
			checkAfterKill(t, db, blobs, ws.ID, sent, batchIDs)
			env, _ := store.GetEnv(ctx, db, ws.ID, "shop")
			if env.NTraces != int64(len(sent)*perBatch) {
				t.Fatalf("after resending: n_traces %d, want %d", env.NTraces, len(sent)*perBatch)
			}
			t.Logf("%d batches sent, %d unacknowledged at a kill and resent; %d traces stored once each", len(sent), unacked, env.NTraces)
		})
	}
}

// checkAfterKill checks the stored state against what the clients saw.
func checkAfterKill(t *testing.T, db *bun.DB, blobs blob.Store, wsID string, sent map[int]bool, batchIDs func(int) []string) {
	t.Helper()
	ctx := context.Background()
	// One snapshot for every read: a COMMIT the killed process sent may still land on PostgreSQL while this reads,
	// and the environment's counters and the batch rows must be read as of one moment.
	opts := &sql.TxOptions{ReadOnly: true}
	if db.Dialect().Name() == dialect.PG {
		opts.Isolation = sql.LevelRepeatableRead
	}
	snap, err := db.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Rollback()
	env, err := store.GetEnv(ctx, snap, wsID, "shop")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := store.ListTraces(ctx, snap, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, r := range rows {
		owner[r.TraceID] = r.BatchID
	}
	torn, acked := 0, 0
	for n, ack := range sent {
		present := 0
		for _, id := range batchIDs(n) {
			if owner[id] != "" {
				present++
			}
		}
		if ack {
			acked++
			if present != len(batchIDs(n)) {
				t.Errorf("acknowledged batch %d: %d of %d traces stored", n, present, len(batchIDs(n)))
			}
		} else if present != 0 && present != len(batchIDs(n)) {
			torn++
		}
	}
	if torn > 0 {
		t.Errorf("%d batches are stored in part", torn)
	}
	if env.NTraces != int64(len(rows)) {
		t.Errorf("n_traces %d, but %d trace rows", env.NTraces, len(rows))
	}
	batches, err := store.ListTraceBatches(ctx, snap, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, b := range batches {
		if b.NTraces == 0 {
			continue
		}
		bytes += b.Bytes
		rc, err := blobs.Get(ctx, b.BlobKey)
		if err != nil {
			t.Fatalf("batch %s: blob %s: %v", b.ID, b.BlobKey, err)
		}
		data, _ := io.ReadAll(rc)
		rc.Close()
		got, err := ingest.DecodeBlob(data)
		if err != nil {
			t.Fatalf("batch %s: %v", b.ID, err)
		}
		in := map[string]bool{}
		for _, tr := range got.Traces {
			in[tr.ID] = true
		}
		for id, bid := range owner {
			if bid == b.ID && !in[id] {
				t.Errorf("trace %s is not in its batch's blob", id)
			}
		}
	}
	if bytes != env.CollectedBytes {
		t.Errorf("collected_bytes %d, batches hold %d", env.CollectedBytes, bytes)
	}
	t.Logf("after kill: %d of %d batches acknowledged, %d traces stored", acked, len(sent), len(rows))
}

func TestCollectWithoutBlobStore(t *testing.T) {
	db := schematest.Open(t, schema.DriverSQLite)
	ws, err := store.CreateWorkspace(context.Background(), db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := store.CreateKey(context.Background(), db, ws.ID, cred.KindWorkspace, "k")
	h, _ := api.New(api.Options{DB: db, Routes: []func(huma.API, *api.Deps){api.CollectRoutes(api.CollectOptions{})}})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	fx := &collectFx{url: srv.URL, key: key, db: db}
	r := fx.post(t, []byte(`{"project":"p","traces":[{"id":"a","messages":[{"role":"user","content":"x"}]}]}`))
	r.want(t, http.StatusServiceUnavailable)
	if rc := fx.rows(t); rc != (rowCount{}) {
		t.Errorf("rows %+v", rc)
	}
}
