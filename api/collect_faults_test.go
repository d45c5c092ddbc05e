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
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

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
