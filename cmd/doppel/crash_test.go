package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// crashBuild compiles this command into dir (a warm build links the Temporal server: tens of seconds).
func crashBuild(tb testing.TB, dir string) string {
	tb.Helper()
	bin := filepath.Join(dir, "doppel")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	tb.Logf("built %s in %s", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// crashServer is how to start one `doppel dev` child process; every start reuses its data dir and ports.
type crashServer struct {
	bin, dir, key     string
	apiAddr, tempAddr string
	uiAddr            string // "" runs without the Temporal UI
	// env holds extra DOPPEL_* settings (the real PostgreSQL and MinIO of the production variant).
	env  []string
	runs int
}

// crashProc is one running child: a process, or a container the docker CLI (cmd) is attached to.
type crashProc struct {
	cmd       *exec.Cmd
	container string // when set, signals go to this container, not to the docker CLI
	logPath   string
	exited    chan struct{}
	waitErr   error
	ready     time.Duration
}

// signal sends sig to the child: to the container's process (PID 1 there) through the engine, or to the process.
func (p *crashProc) signal(sig syscall.Signal) error {
	if p.container == "" {
		return p.cmd.Process.Signal(sig)
	}
	if out, err := exec.Command("docker", "kill", "--signal", strconv.Itoa(int(sig)), p.container).CombinedOutput(); err != nil {
		return fmt.Errorf("docker kill --signal %d %s: %w: %s", sig, p.container, err, out)
	}
	return nil
}

func (c *crashServer) apiURL() string { return "http://" + c.apiAddr }

// start launches the child and waits until /readyz answers 200.
func (c *crashServer) start(t testing.TB) *crashProc {
	t.Helper()
	c.runs++
	logPath := filepath.Join(c.dir, fmt.Sprintf("doppel-run-%d.log", c.runs))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "dev", "--data-dir", c.dir, "--api-addr", c.apiAddr, "--temporal-dev-addr", c.tempAddr,
		"--temporal-ui-addr="+c.uiAddr, "--log-level", "warn")
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(),
		"DOPPEL_BOOTSTRAP_KEY=" + c.key,
		// No rebuild while the test streams: the crash is about ingest, and the cores are few.
		"DOPPEL_COLLECT_REBUILD_DEBOUNCE=1h",
		"DOPPEL_COLLECT_RATE_PER_SECOND=100000", "DOPPEL_COLLECT_RATE_BURST=100000",
	}, c.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	p := &crashProc{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", c.bin, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { p.kill(t) })

	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(e2eStartTimeout)
	last := ""
	for {
		select {
		case <-p.exited:
			t.Fatalf("doppel dev exited before ready: %v\n%s", p.waitErr, p.logTail())
		default:
		}
		resp, err := hc.Get(c.apiURL() + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Since(began)
				return p
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("doppel dev not ready within %s (last /readyz: %s)\n%s", e2eStartTimeout, last, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (p *crashProc) kill(t testing.TB) {
	t.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		t.Logf("kill -9: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Errorf("process %d (%s) still running a minute after SIGKILL", p.cmd.Process.Pid, p.container)
	}
}

// term sends SIGTERM and requires a clean exit (status 0) in bounded time.
func (p *crashProc) term(t testing.TB) {
	t.Helper()
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
		if p.waitErr != nil {
			t.Errorf("doppel after SIGTERM: %v, want exit 0\n%s", p.waitErr, p.logTail())
		}
	case <-time.After(e2eStopTimeout):
		t.Errorf("doppel still running %s after SIGTERM\n%s", e2eStopTimeout, p.logTail())
		p.kill(t)
	}
}

func (p *crashProc) logTail() string {
	data, _ := os.ReadFile(p.logPath)
	if len(data) > 6000 {
		data = data[len(data)-6000:]
	}
	return "--- " + p.logPath + " (tail) ---\n" + string(data)
}

// crashTraces are the real retail traces, each as its JSON fields, so ids can be rewritten per batch.
func crashTraces(t testing.TB) []map[string]json.RawMessage {
	t.Helper()
	data, err := sampledata.Read(e2eRetailTraces)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Traces []map[string]json.RawMessage `json:"traces"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("%s: %v", e2eRetailTraces, err)
	}
	if len(body.Traces) == 0 {
		t.Fatalf("%s holds no traces", e2eRetailTraces)
	}
	return body.Traces
}

// What became of a batch the streamer sent.
const (
	batchUnsent   = iota
	batchInFlight // sent; no answer (the server died under it): fully present or fully absent
	batchAcked    // 2xx: every trace must be present
	batchRejected // a non-2xx answer: nothing may be present
)

type crashBatch struct {
	ids    []string
	body   []byte
	state  int
	answer string
}

// crashStreamer posts batches of distinct real traces (ids made unique per batch) and records each answer.
type crashStreamer struct {
	t       testing.TB
	url     string
	key     string
	project string
	size    int
	traces  []map[string]json.RawMessage
	http    *http.Client

	mu      sync.Mutex
	batches []*crashBatch
	slug    string
	acked   atomic.Int64
	stop    atomic.Bool
}

// batch makes batch k: size traces from the corpus, each with a new id.
func (s *crashStreamer) batch(k int) *crashBatch {
	b := &crashBatch{}
	traces := make([]map[string]json.RawMessage, s.size)
	for j := range traces {
		src := s.traces[(k*s.size+j)%len(s.traces)]
		tr := make(map[string]json.RawMessage, len(src))
		for f, v := range src {
			tr[f] = v
		}
		var orig string
		_ = json.Unmarshal(src["id"], &orig)
		id := fmt.Sprintf("%s#crash-b%d-t%d", orig, k, j)
		tr["id"], _ = json.Marshal(id)
		traces[j] = tr
		b.ids = append(b.ids, id)
	}
	body, err := json.Marshal(map[string]any{"project": s.project, "traces": traces})
	if err != nil {
		panic(err)
	}
	b.body = body
	return b
}

// post sends one batch and returns the state it ends in.
func (s *crashStreamer) post(b *crashBatch) (int, string, *api.CollectAccepted) {
	req, err := http.NewRequest(http.MethodPost, s.url+"/api/collect", bytes.NewReader(b.body))
	if err != nil {
		return batchInFlight, err.Error(), nil
	}
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return batchInFlight, err.Error(), nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return batchInFlight, "read answer: " + err.Error(), nil
	}
	if resp.StatusCode/100 != 2 {
		return batchRejected, fmt.Sprintf("%d %s", resp.StatusCode, data), nil
	}
	var cr api.CollectAccepted
	if err := json.Unmarshal(data, &cr); err != nil {
		// A 2xx is an acknowledgement whatever its body says.
		return batchAcked, fmt.Sprintf("%d undecodable %s", resp.StatusCode, data), nil
	}
	return batchAcked, fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(data)), &cr
}

// run streams new batches from workers goroutines until stop is set or a worker gets no answer.
func (s *crashStreamer) run(workers, max int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !s.stop.Load() {
				s.mu.Lock()
				k := len(s.batches)
				if k >= max {
					s.mu.Unlock()
					return
				}
				b := &crashBatch{state: batchUnsent}
				s.batches = append(s.batches, b)
				s.mu.Unlock()

				nb := s.batch(k)
				s.mu.Lock()
				b.ids, b.body, b.state = nb.ids, nb.body, batchInFlight
				s.mu.Unlock()
				state, answer, cr := s.post(b)
				s.mu.Lock()
				b.state, b.answer = state, answer
				if cr != nil {
					if cr.Accepted != len(b.ids) || cr.Duplicates != 0 {
						s.t.Errorf("batch %d of new traces acknowledged as %+v", k, cr)
					}
					if s.slug == "" {
						s.slug = cr.Env
					}
				}
				s.mu.Unlock()
				if state == batchAcked {
					s.acked.Add(1)
				}
				if state != batchAcked {
					return // the server is gone (or refusing): this worker is done
				}
			}
		}()
	}
	return &wg
}

func (s *crashStreamer) count(state int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.batches {
		if b.state == state {
			n++
		}
	}
	return n
}

// crashBackend is where the child keeps its metadata and blobs, opened the same way by the test to check them.
type crashBackend struct {
	name   string
	env    []string // DOPPEL_* settings for the child
	driver string
	dsn    string
	blobs  blob.Store
}

func sqliteBackend(t *testing.T, dir string) crashBackend {
	l, err := blob.NewLocal(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return crashBackend{name: "sqlite+local", driver: schema.DriverSQLite, dsn: "file:" + filepath.Join(dir, "doppel.db"), blobs: l}
}

// realBackend is a fresh PostgreSQL schema and a fresh MinIO bucket (skips without DOPPEL_TEST_POSTGRES/S3);
// dbVia and s3Via, when set, map a service's host:port to the one the child uses (a proxy in front of it).
func realBackend(t *testing.T, dbVia, s3Via func(real string) string) crashBackend {
	dsn := schematest.PostgresDSN(t)
	s3 := blobtest.NewS3(t)
	o, err := blob.ParseURL(testenv.S3(t))
	if err != nil {
		t.Fatal(err)
	}
	childDSN, endpoint := dsn, o.Endpoint
	if dbVia != nil {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("DOPPEL_TEST_POSTGRES: %v", err)
		}
		u.Host = dbVia(u.Host)
		childDSN = u.String()
	}
	if s3Via != nil {
		endpoint = s3Via(o.Endpoint)
	}
	return crashBackend{name: "postgres+minio", driver: schema.DriverPostgres, dsn: dsn, blobs: s3, env: []string{
		"DOPPEL_DB_DRIVER=postgres", "DOPPEL_DB_DSN=" + childDSN,
		"DOPPEL_BLOB_DRIVER=s3", "DOPPEL_BLOB_ENDPOINT=" + endpoint, "DOPPEL_BLOB_ACCESS_KEY=" + o.AccessKey,
		"DOPPEL_BLOB_SECRET_KEY=" + o.SecretKey, "DOPPEL_BLOB_BUCKET=" + s3.Bucket(), "DOPPEL_BLOB_REGION=" + o.Region,
		fmt.Sprintf("DOPPEL_BLOB_USE_SSL=%t", o.UseSSL),
	}}
}

// checkStored opens the backend's database and blob store and checks the streamer's record against them:
// every acknowledged batch fully present, every refused or unsent one absent, one in flight at a kill fully
// present or fully absent; each batch row's blob present and holding exactly that batch's traces; n_traces
// (database and API) equal to the distinct traces stored. It returns the in-flight batches found present.
func checkStored(t *testing.T, be crashBackend, s *crashStreamer, apiURL, key string) (presentInFlight map[int]bool) {
	t.Helper()
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: be.driver, DSN: be.dsn})
	if err != nil {
		t.Fatalf("open %s: %v", be.driver, err)
	}
	defer db.Close()
	var env schema.Environment
	if err := db.NewSelect().Model(&env).Where("slug = ?", s.slug).Scan(ctx); err != nil {
		t.Fatalf("environment %s: %v", s.slug, err)
	}
	traces, err := store.ListTraces(ctx, db, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	stored := make(map[string]string, len(traces)) // trace id → batch row id
	for _, tr := range traces {
		stored[tr.TraceID] = tr.BatchID
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	presentInFlight = map[int]bool{}
	want := map[string]bool{}
	var acked, inflight, refused int
	for k, b := range s.batches {
		n := 0
		for _, id := range b.ids {
			if _, ok := stored[id]; ok {
				n++
			}
		}
		switch b.state {
		case batchAcked:
			acked++
			if n != len(b.ids) {
				t.Errorf("acknowledged batch %d (%s): %d of its %d traces stored", k, b.answer, n, len(b.ids))
			}
		case batchInFlight:
			inflight++
			if n != 0 && n != len(b.ids) {
				t.Errorf("batch %d in flight at the kill is half stored: %d of %d traces (%s)", k, n, len(b.ids), b.answer)
			}
			presentInFlight[k] = n == len(b.ids)
		default:
			refused++
			if n != 0 {
				t.Errorf("batch %d never acknowledged (%s) has %d traces stored", k, b.answer, n)
			}
		}
		if n > 0 {
			for _, id := range b.ids {
				want[id] = true
			}
		}
	}
	for id := range stored {
		if !want[id] {
			t.Errorf("trace %s stored but not part of any batch counted above", id)
		}
	}
	if env.NTraces != int64(len(stored)) || len(stored) != len(want) {
		t.Errorf("environment n_traces %d, trace rows %d, traces of acknowledged/present batches %d: want all equal", env.NTraces, len(stored), len(want))
	}

	// Each batch row: its blob exists and holds exactly the trace ids recorded against it.
	batches, err := store.ListTraceBatches(ctx, db, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	byBatch := map[string][]string{}
	for id, bid := range stored {
		byBatch[bid] = append(byBatch[bid], id)
	}
	var sum int64
	for _, tb := range batches {
		sum += tb.NTraces
		rc, err := be.blobs.Get(ctx, tb.BlobKey)
		if err != nil {
			t.Errorf("batch %s: blob %s: %v", tb.ID, tb.BlobKey, err)
			continue
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Errorf("batch %s: read blob: %v", tb.ID, err)
			continue
		}
		decoded, err := ingest.DecodeBlob(data)
		if err != nil {
			t.Errorf("batch %s: blob %s does not decode: %v", tb.ID, tb.BlobKey, err)
			continue
		}
		var ids []string
		for _, tr := range decoded.Traces {
			ids = append(ids, tr.ID)
		}
		rows := byBatch[tb.ID]
		sort.Strings(ids)
		sort.Strings(rows)
		if tb.NDuplicates == 0 && !slices.Equal(ids, rows) {
			t.Errorf("batch %s: blob holds %d traces, %d trace rows point at it", tb.ID, len(ids), len(rows))
		}
		delete(byBatch, tb.ID)
	}
	if len(byBatch) != 0 || sum != env.NTraces {
		t.Errorf("trace rows without a batch row: %d batches; batch rows count %d new traces, env %d", len(byBatch), sum, env.NTraces)
	}

	// The restarted API answers the same count.
	req, _ := http.NewRequest(http.MethodGet, apiURL+"/v1/envs/"+s.slug, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("GET env after restart: %v", err)
	}
	defer resp.Body.Close()
	var got api.EnvDetail
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET env after restart: %d %v", resp.StatusCode, err)
	}
	if got.NTraces != int64(len(want)) {
		t.Errorf("API n_traces %d after restart, want %d", got.NTraces, len(want))
	}
	t.Logf("%s: %d batches acknowledged, %d in flight at a kill (%d of them stored), %d refused/unsent; %d traces stored",
		be.name, acked, inflight, countTrue(presentInFlight), refused, len(stored))
	return presentInFlight
}

func countTrue(m map[int]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

// resendInFlight posts again every batch that was in flight at a kill, as a collector's retry would: the
// answer must count each trace once, as new exactly when the batch was absent.
func resendInFlight(t *testing.T, s *crashStreamer, present map[int]bool) {
	t.Helper()
	for k, was := range present {
		b := s.batches[k]
		state, answer, cr := s.post(b)
		if state != batchAcked || cr == nil {
			t.Fatalf("resend of batch %d: %s", k, answer)
		}
		wantNew := len(b.ids)
		if was {
			wantNew = 0
		}
		if cr.Accepted != wantNew || cr.Accepted+cr.Duplicates != len(b.ids) {
			t.Errorf("resend of batch %d (stored before: %t): %+v", k, was, cr)
		}
		s.mu.Lock()
		b.state, b.answer = batchAcked, answer
		s.mu.Unlock()
	}
}
