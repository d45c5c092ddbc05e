package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// TestCrash runs issue 3's fault acceptance against the real binary, built once (linking it is slow):
//   - kill9: the process is killed with SIGKILL while batches of real traces stream in; after a restart on the
//     same state every acknowledged trace is there, nothing is half stored or counted twice, and a retried batch
//     is counted once. Three kills per backend: SQLite + local blobs always, PostgreSQL + MinIO with
//     DOPPEL_TEST_POSTGRES and DOPPEL_TEST_S3.
//   - services-down: PostgreSQL or MinIO unreachable → 503, nothing written, /readyz names it; then recovery.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash: builds and kills the real binary")
	}
	bin := crashBuild(t, t.TempDir())
	corpus := crashTraces(t)
	t.Run("kill9", func(t *testing.T) { crashKill9(t, bin, corpus) })
	t.Run("services-down", func(t *testing.T) { crashServicesDown(t, bin, corpus) })
}

func crashKill9(t *testing.T, bin string, corpus []map[string]json.RawMessage) {
	for _, variant := range []string{"sqlite+local", "postgres+minio"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			var be crashBackend
			if variant == "sqlite+local" {
				be = sqliteBackend(t, dir)
			} else {
				be = realBackend(t, nil, nil)
			}
			m, err := cred.Mint(cred.KindWorkspace)
			if err != nil {
				t.Fatal(err)
			}
			srv := &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t), env: be.env}
			s := &crashStreamer{t: t, url: srv.apiURL(), key: m.Plaintext, project: "crash-" + variant, size: 50, traces: corpus,
				http: &http.Client{Timeout: 2 * time.Minute}}

			p := srv.start(t)
			const rounds, killAfter, maxBatches = 3, 8, 10000
			for round := 1; round <= rounds; round++ {
				s.stop.Store(false)
				start := s.acked.Load()
				wg := s.run(2, maxBatches)
				e2ePoll(t, 3*time.Minute, 5*time.Millisecond, fmt.Sprintf("round %d: %d acknowledged batches", round, killAfter), func() (bool, string) {
					return s.acked.Load()-start >= killAfter, fmt.Sprintf("%d acknowledged; %d refused", s.acked.Load()-start, s.count(batchRejected))
				})
				p.kill(t) // kill -9 with both workers mid-stream
				s.stop.Store(true)
				wg.Wait()
				if n := s.count(batchRejected); n != 0 {
					t.Fatalf("round %d: %d batches refused while the server was up (first: %s)", round, n, firstAnswer(s, batchRejected))
				}

				p = srv.start(t)
				t.Logf("round %d: restarted in %s", round, p.ready.Round(time.Millisecond))
				present := checkStored(t, be, s, srv.apiURL(), m.Plaintext)
				figure(t, "round %d: kill -9 with %d batches acknowledged in all, %d in flight (%d of them stored whole, none in part); every acknowledged batch stored; restarted in %s",
					round, s.acked.Load(), s.count(batchInFlight), countTrue(present), p.ready.Round(time.Millisecond))
				resendInFlight(t, s, present)
				if t.Failed() {
					t.Logf("%s", p.logTail())
					return
				}
			}
			checkStored(t, be, s, srv.apiURL(), m.Plaintext)
			p.term(t)
		})
	}
}

func firstAnswer(s *crashStreamer, state int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.batches {
		if b.state == state {
			return b.answer
		}
	}
	return ""
}

// crashProxy forwards TCP to a real service until cut: then it drops every connection and refuses new ones,
// as a crashed or unreachable PostgreSQL or MinIO would, until restored.
type crashProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
}

func newCrashProxy(t *testing.T, target string) *crashProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &crashProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.Cut() })
	go p.serve()
	return p
}

func (p *crashProxy) addr() string { return p.ln.Addr().String() }

func (p *crashProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *crashProxy) pipe(c net.Conn) {
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	if down {
		c.Close()
		return
	}
	network, target := "tcp", p.target
	if path, ok := strings.CutPrefix(target, "unix://"); ok {
		network, target = "unix", path // the Docker engine's socket
	}
	up, err := net.DialTimeout(network, target, 10*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut drops every open connection and refuses new ones.
func (p *crashProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// Restore lets connections through again.
func (p *crashProxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// crashCounts reads an environment's stored batches, trace rows and n_traces straight from the database.
func crashCounts(t *testing.T, be crashBackend, slug string) [3]int64 {
	t.Helper()
	ctx := context.Background()
	db, err := schema.Open(ctx, schema.Options{Driver: be.driver, DSN: be.dsn})
	if err != nil {
		t.Fatalf("open %s: %v", be.driver, err)
	}
	defer db.Close()
	var env schema.Environment
	if err := db.NewSelect().Model(&env).Where("slug = ?", slug).Scan(ctx); err != nil {
		t.Fatalf("environment %s: %v", slug, err)
	}
	batches, err := store.ListTraceBatches(ctx, db, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	n, err := store.CountTraces(ctx, db, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	return [3]int64{int64(len(batches)), n, env.NTraces}
}

// crashReadyz returns /readyz's status and body.
func crashReadyz(apiURL string) (int, string) {
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get(apiURL + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// crashServicesDown runs the real binary on PostgreSQL and MinIO through proxies the test cuts: with the blob
// store or the database down, collect answers 503 with the envelope and stores nothing, /readyz answers 503 naming
// the failed dependency, and once the service is back the same process stores the retried batch exactly once.
// (api/collect_test.go covers the handler over both backends; this covers the wired process.)
func crashServicesDown(t *testing.T, bin string, corpus []map[string]json.RawMessage) {
	var pg, s3 *crashProxy
	be := realBackend(t,
		func(real string) string { pg = newCrashProxy(t, real); return pg.addr() },
		func(real string) string { s3 = newCrashProxy(t, real); return s3.addr() })
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv := &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(t), tempAddr: e2eFreeAddr(t), env: be.env}
	s := &crashStreamer{t: t, url: srv.apiURL(), key: m.Plaintext, project: "faults", size: 50, traces: corpus,
		http: &http.Client{Timeout: 3 * time.Minute}}
	p := srv.start(t)

	send := func(k int) (*crashBatch, int, string, *api.CollectAccepted) {
		b := s.batch(k)
		s.batches = append(s.batches, b)
		state, answer, cr := s.post(b)
		b.state, b.answer = state, answer
		return b, state, answer, cr
	}
	_, state, answer, cr := send(0)
	if state != batchAcked || cr == nil || cr.Accepted != 50 {
		t.Fatalf("first batch: %s", answer)
	}
	s.slug = cr.Env
	before := crashCounts(t, be, s.slug)

	for _, down := range []struct {
		name, check, detail string
		proxy               *crashProxy
	}{
		{"blob store down", "blob", "blob store", s3},
		{"database down", "db", "database", pg},
	} {
		down.proxy.Cut()
		b, state, answer, _ := send(len(s.batches))
		var env api.Envelope
		_, body, _ := strings.Cut(answer, " ")
		if state != batchRejected || !strings.HasPrefix(answer, "503 ") || json.Unmarshal([]byte(body), &env) != nil ||
			env.Code != api.CodeUnavailable || !strings.Contains(env.Detail, down.detail) || env.RequestID == "" {
			t.Errorf("%s: collect answered %s, want 503 with the unavailable envelope naming the %s", down.name, answer, down.detail)
		}
		if st, rb := crashReadyz(srv.apiURL()); st != http.StatusServiceUnavailable || !strings.Contains(rb, down.check+":") {
			t.Errorf("%s: /readyz %d %s, want 503 naming %s", down.name, st, rb, down.check)
		}
		if got := crashCounts(t, be, s.slug); got != before {
			t.Errorf("%s: batches/traces/n_traces %v after the refused batch, want %v", down.name, got, before)
		}

		down.proxy.Restore()
		restored := time.Now()
		e2ePoll(t, 2*time.Minute, 200*time.Millisecond, down.name+": /readyz after restore", func() (bool, string) {
			st, rb := crashReadyz(srv.apiURL())
			return st == http.StatusOK, fmt.Sprintf("%d %s", st, rb)
		})
		figure(t, "%s: collect answered 503 (%s), /readyz 503, nothing stored; /readyz 200 again %s after the restore, no restart",
			down.name, env.Code, time.Since(restored).Round(time.Millisecond))
		state, answer, cr := s.post(b)
		if state != batchAcked || cr == nil || cr.Accepted != 50 || cr.Duplicates != 0 {
			t.Fatalf("%s: retry after restore: %s", down.name, answer)
		}
		b.state, b.answer = state, answer
		before = crashCounts(t, be, s.slug)
	}
	if before != [3]int64{3, 150, 150} {
		t.Errorf("batches/traces/n_traces %v, want [3 150 150]", before)
	}
	checkStored(t, be, s, srv.apiURL(), m.Plaintext)
	p.term(t)
}

// BenchmarkDevStartToReady measures `doppel dev` (the built binary, Temporal UI on) from exec to /readyz 200, on a
// fresh data dir and on an existing one, reporting p50 and max; banner_p50_ms is the time the process itself
// prints ("ready in …", from config loaded to listening). Run: go test ./cmd/doppel -run '^$'
// -bench DevStartToReady -benchtime 5x.
func BenchmarkDevStartToReady(b *testing.B) {
	bin := crashBuild(b, b.TempDir())
	m, err := cred.Mint(cred.KindWorkspace)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"fresh", "existing"} {
		b.Run(mode, func(b *testing.B) {
			existing := b.TempDir()
			newServer := func(dir string) *crashServer {
				return &crashServer{bin: bin, dir: dir, key: m.Plaintext, apiAddr: e2eFreeAddr(b), tempAddr: e2eFreeAddr(b), uiAddr: e2eFreeAddr(b)}
			}
			if mode == "existing" {
				newServer(existing).start(b).term(b)
			}
			var ready, banner []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dir := existing
				if mode == "fresh" {
					dir = b.TempDir()
				}
				p := newServer(dir).start(b)
				ready = append(ready, p.ready)
				if d, ok := bannerReady(p.logPath); ok {
					banner = append(banner, d)
				}
				b.StopTimer()
				p.term(b)
				b.StartTimer()
			}
			b.StopTimer()
			p50 := func(ds []time.Duration) float64 {
				if len(ds) == 0 {
					return 0
				}
				slices.Sort(ds)
				return float64(ds[len(ds)/2].Microseconds()) / 1000
			}
			b.ReportMetric(p50(ready), "ready_p50_ms")
			b.ReportMetric(float64(slices.Max(ready).Microseconds())/1000, "ready_max_ms")
			b.ReportMetric(p50(banner), "banner_p50_ms")
		})
	}
}

// bannerReady reads "doppel dev is ready in <duration>" from a run's output.
func bannerReady(logPath string) (time.Duration, bool) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0, false
	}
	_, rest, ok := strings.Cut(string(data), "doppel dev is ready in ")
	if !ok {
		return 0, false
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return 0, false
	}
	d, err := time.ParseDuration(f[0])
	return d, err == nil
}
