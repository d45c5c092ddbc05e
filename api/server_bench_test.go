package api_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/telemetry"
	"github.com/doppel-dev/doppel/usage"
)

// BenchmarkCallServer: the server's side of a REST tool call at peak, in process and without the network: 64
// sessions of the tau-retail bundle, each calling again as soon as its last call answered, through the API
// handler as `doppel dev` assembles it (request id, access log, body budget, auth with the token cache, huma's
// decoding, validation and encoding, metrics, the usage gate) to the tool plane, the in-process twin reached
// directly and the call journal group-committed to SQLite. Requests and response writers are reused, so
// allocs/op and cpu-µs/call (this process's CPU time, GC and the journal's goroutine included) are the server's.
//
// dev meters as `doppel dev` does by default (usage.enforce on, no plan: no limits, so the gate reads only the
// workspace row) and writes its access log as text to a file, as `doppel dev` writes it to its standard error (one
// write per line); dev-nolog discards the log unformatted, to see what writing it costs; limits-history=N holds the
// workspace to a plan with limits, after journaling N earlier sessions of three calls each in its period: the
// gate's reading, re-read every usage.refresh while calls flow (its memo of the settled records moved forward, the
// live sessions read afresh); dev-history=N journals the same history with no plan, to tell what the larger
// database costs the journal from what the gate's readings cost.
func BenchmarkCallServer(b *testing.B) {
	for _, c := range []struct {
		name    string
		plans   *usage.Plans
		history int
		log     bool
	}{
		{"dev", &usage.Plans{}, 0, true},
		{"dev-nolog", &usage.Plans{}, 0, false},
		{"limits-history=50000", bigPlans, 50000, true},
		{"dev-history=50000", &usage.Plans{}, 50000, true},
	} {
		b.Run(c.name, func(b *testing.B) { benchCallServer(b, c.plans, c.history, c.log) })
	}
}

func benchCallServer(b *testing.B, plans *usage.Plans, history int, log bool) {
	serverGC(b)
	bundle, traces := retailBundle(b)
	m := telemetry.NewMetrics()
	logger := slog.New(slog.DiscardHandler)
	if log {
		f, err := os.Create(filepath.Join(b.TempDir(), "doppel.log"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = f.Close() })
		logger = slog.New(slog.NewTextHandler(f, nil))
	}
	p := newPlane(b, schema.DriverSQLite, bundle, planeOptions{local: true, observer: m, plans: plans, logger: logger,
		journal: journal.CallOptions{OnCommit: m.JournalCommit, Linger: journal.DefaultLinger, LingerStep: journal.DefaultLingerStep,
			LingerFrom: journal.DefaultLingerFrom}})
	if history > 0 {
		seedHistory(b, p, history)
	}
	work := workload(traces)
	type caller struct {
		req   *http.Request
		body  bytes.Reader
		w     discardWriter
		calls [][]byte
		next  int
	}
	callers := make([]*caller, 64)
	for i := range callers {
		s := p.open(map[string]any{"seed": i})
		r, err := http.NewRequest(http.MethodPost, "/v1/sessions/"+s.ID+"/call", http.NoBody)
		if err != nil {
			b.Fatal(err)
		}
		r.Header.Set("Authorization", "Bearer "+s.Token)
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = "127.0.0.1:40000"
		callers[i] = &caller{req: r, calls: work[i%len(work)], w: discardWriter{h: http.Header{}}}
	}
	send := func(c *caller) int {
		body := c.calls[c.next%len(c.calls)]
		c.next++
		c.body.Reset(body)
		c.req.Body = io.NopCloser(&c.body)
		c.req.ContentLength = int64(len(body))
		c.w.reset()
		p.h.ServeHTTP(&c.w, c.req)
		return c.w.code
	}
	run := func(n int) (bad int64) {
		var next, nbad atomic.Int64
		var wg sync.WaitGroup
		for _, c := range callers {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					if send(c) != http.StatusOK {
						nbad.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return nbad.Load()
	}
	run(2000) // warm the twin's indexes, the token cache and the journal
	before := p.journal.Stats()
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	bad := run(b.N)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	st := p.journal.Stats()
	if bad > 0 {
		b.Errorf("%d of %d calls did not answer 200", bad, b.N)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/call")
	b.ReportMetric(float64(st.Items-before.Items)/float64(max(st.Batches-before.Batches, 1)), "calls/commit")
}

// discardWriter is a reusable http.ResponseWriter that keeps the status and drops the body.
type discardWriter struct {
	h     http.Header
	code  int
	wrote bool
	n     int
}

func (w *discardWriter) reset() {
	clear(w.h)
	w.code, w.wrote, w.n = http.StatusOK, false, 0
}

func (w *discardWriter) Header() http.Header { return w.h }

func (w *discardWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
}

func (w *discardWriter) Write(b []byte) (int, error) {
	w.wrote = true
	w.n += len(b)
	return len(b), nil
}
