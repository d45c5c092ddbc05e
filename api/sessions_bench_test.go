package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/config"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/trace"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// The load benchmarks drive the session routes over real loopback HTTP (an httptest server around the API
// handler, a keep-alive client) against a real in-process twin serving the tau-retail bundle, with the
// transcript group-committed to SQLite or the real PostgreSQL. Each also measures, in the same run and at the
// same rate, a bare loopback HTTP round trip (a handler that answers a fixed JSON body): the floor no route can
// beat on this machine.

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loadClient is a keep-alive HTTP client for many concurrent requests to one host.
func loadClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// workload is the recorded tool calls of tau-retail-dev as ready request bodies, per trace.
func workload(traces []trace.Trace) [][][]byte {
	var out [][][]byte
	for _, tr := range traces {
		var calls [][]byte
		for _, c := range trace.Calls(tr) {
			if !c.Answered || c.Args == nil {
				continue
			}
			b, _ := json.Marshal(map[string]any{"name": c.Tool, "arguments": c.Args, "requestor": "assistant"})
			calls = append(calls, b)
		}
		if len(calls) > 0 {
			out = append(out, calls)
		}
	}
	return out
}

type loadTarget struct {
	url, token string
	calls      [][]byte
	next       atomic.Int64
}

func (lt *loadTarget) body() []byte {
	i := lt.next.Add(1) - 1
	return lt.calls[int(i)%len(lt.calls)]
}

func post(hc *http.Client, url, token string, body []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return resp.StatusCode, fmt.Errorf("%d: %s", resp.StatusCode, msg)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// firstErrors keeps the first few errors of a load run, to report them.
type firstErrors struct {
	mu   sync.Mutex
	errs []string
}

func (f *firstErrors) add(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) < 5 {
		f.errs = append(f.errs, err.Error())
	}
}

// openLoop sends n requests at rate per second through latency.Offer (each from its own goroutine on schedule,
// so a slow server cannot slow the offered load) and returns each one's latency from the moment it was sent,
// sorted, the count of non-200 answers, and the sends' lag behind schedule, sorted. The lag is the load
// generator's own: Go's timers wake with about 1 ms granularity here when the process is idle (a 300 µs sleep
// takes 1.1 ms), so latency from the scheduled time would add up to a millisecond of generator error to every
// call; the lag is reported beside the latency instead.
func openLoop(n, rate int, send func(i int) (int, error)) (lat []time.Duration, bad int, errs []string, lag []time.Duration) {
	lat = make([]time.Duration, n)
	lag = make([]time.Duration, n)
	var nbad atomic.Int64
	var fe firstErrors
	latency.Offer(context.Background(), rate, n, func(i int, due time.Time) {
		sent := time.Now()
		lag[i] = sent.Sub(due)
		code, err := send(i)
		lat[i] = time.Since(sent)
		if err != nil || code != http.StatusOK {
			nbad.Add(1)
			if err != nil {
				fe.add(err)
			}
		}
	})
	return latency.Sorted(lat), int(nbad.Load()), fe.errs, latency.Sorted(lag)
}

// rawServer answers every request with a fixed call-result-sized JSON body: the loopback HTTP floor.
func rawServer(t testing.TB) *httptest.Server {
	body := []byte(`{"content":"{\"order_id\": \"#W0000000\", \"status\": \"pending\"}","error":false,"fidelity":"B_twin","rung":"twin","downgraded":false,"callId":"call_0000000000000000","ms":0}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// serverGC runs the rest of a benchmark under the GC target doppel's server processes set for themselves
// (runtime.gc_percent's default), unless GOGC is set.
func serverGC(b *testing.B) {
	if os.Getenv("GOGC") != "" {
		return
	}
	for _, k := range config.Keys() {
		if k.Name == "runtime.gc_percent" {
			old := debug.SetGCPercent(k.Default.(int))
			b.Cleanup(func() { debug.SetGCPercent(old) })
			return
		}
	}
	b.Fatal("no runtime.gc_percent key")
}

// transports are the two ways the API reaches a twin: over its HTTP RPC (a process or container twin) and directly
// (an in-process twin, `doppel dev`'s default).
var transports = []struct {
	name  string
	local bool
}{{"http", false}, {"direct", true}}

// loadPlane serves the tau-retail bundle over loopback HTTP with 64 open sessions, under the server's GC target;
// local reaches the twin directly.
func loadPlane(b *testing.B, driver string, local bool) (*plane, *httptest.Server, []*loadTarget) {
	serverGC(b)
	bundle, traces := retailBundle(b)
	p := newPlane(b, driver, bundle, planeOptions{journal: journal.CallOptions{}, local: local})
	srv := httptest.NewServer(p.h)
	b.Cleanup(srv.Close)
	work := workload(traces)
	targets := make([]*loadTarget, 64)
	for i := range targets {
		s := p.open(map[string]any{"seed": i})
		targets[i] = &loadTarget{url: srv.URL + "/v1/sessions/" + s.ID + "/call", token: s.Token, calls: work[i%len(work)]}
	}
	return p, srv, targets
}

// BenchmarkCallRate: tool calls at a fixed rate (1,000/s, and 250/s to see the unsaturated latency) spread
// over 64 sessions; latency from each call's scheduled time, so queueing is not hidden.
func BenchmarkCallRate(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, tr := range transports {
			for _, rate := range []int{1000, 250} {
				b.Run(fmt.Sprintf("%s/%s/rate=%d", driver, tr.name, rate), func(b *testing.B) {
					_, _, targets := loadPlane(b, driver, tr.local)
					hc := loadClient()
					raw := rawServer(b)
					n := max(b.N, 5*rate) // at least five seconds of load
					send := func(i int) (int, error) {
						t := targets[i%len(targets)]
						return post(hc, t.url, t.token, t.body())
					}
					_, _, _, _ = openLoop(rate/2, rate, send) // warm the connection pools and the twin's indexes
					b.ResetTimer()
					lat, bad, errs, lag := openLoop(n, rate, send)
					b.StopTimer()
					rawLat, _, _, _ := openLoop(n, rate, func(i int) (int, error) { return post(hc, raw.URL, "", targets[0].calls[0]) })
					if bad > 0 {
						b.Errorf("%d of %d calls did not answer 200, first: %q", bad, n, errs)
					}
					reportRate(b, lat, rawLat, lag)
				})
			}
		}
	}
}

// reportRate reports a fixed-rate run: the calls' p50 and p99, the raw limit's beside them, and the generator's lag.
func reportRate(b *testing.B, lat, rawLat, lag []time.Duration) {
	b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
	b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
	b.ReportMetric(ms(latency.Percentile(rawLat, 50)), "raw-p50-ms")
	b.ReportMetric(ms(latency.Percentile(rawLat, 99)), "raw-p99-ms")
	b.ReportMetric(ms(latency.Percentile(lag, 99)), "lag-p99-ms")
	b.ReportMetric(0, "ns/op")
}

// closedLoop sends n requests from one goroutine per target, each sending again as soon as its last request
// answered, and returns their latencies sorted, the time all took, the count of non-200 answers and the first
// errors.
func closedLoop(targets []*loadTarget, n int, send func(t *loadTarget) (int, error)) ([]time.Duration, time.Duration, int, []string) {
	var next, bad atomic.Int64
	var fe firstErrors
	lats := make([][]time.Duration, len(targets))
	var wg sync.WaitGroup
	start := time.Now()
	for g, t := range targets {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				code, err := send(t)
				if err != nil || code != http.StatusOK {
					bad.Add(1)
					if err != nil {
						fe.add(err)
					}
				}
				lats[g] = append(lats[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return latency.Sorted(all), elapsed, int(bad.Load()), fe.errs
}

// BenchmarkCallPeak: 64 sessions, each calling again as soon as its last call answered; throughput and latency.
func BenchmarkCallPeak(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, tr := range transports {
			b.Run(driver+"/"+tr.name, func(b *testing.B) {
				p, _, targets := loadPlane(b, driver, tr.local)
				hc := loadClient()
				raw := rawServer(b)
				n := max(b.N, 20000)
				before := p.journal.Stats()
				cpu0 := cpuTime()
				b.ResetTimer()
				lat, elapsed, bad, errs := closedLoop(targets, n, func(t *loadTarget) (int, error) { return post(hc, t.url, t.token, t.body()) })
				b.StopTimer()
				cpu := cpuTime() - cpu0
				st := p.journal.Stats()
				rawLat, rawElapsed, _, _ := closedLoop(targets, n, func(t *loadTarget) (int, error) { return post(hc, raw.URL, "", t.calls[0]) })
				if bad > 0 {
					b.Errorf("%d of %d calls did not answer 200, first: %q", bad, n, errs)
				}
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "calls/s")
				// CPU of this process (client, API, in-process twin; not PostgreSQL) per call: with the wall-clock
				// rate it shows how much of the machine the run had.
				b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "cpu-µs/call")
				b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
				b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
				b.ReportMetric(float64(st.Items-before.Items)/float64(max(st.Batches-before.Batches, 1)), "calls/commit")
				b.ReportMetric(float64(len(rawLat))/rawElapsed.Seconds(), "raw-req/s")
				b.ReportMetric(ms(latency.Percentile(rawLat, 50)), "raw-p50-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkOpenWarm: seeded session opens, one after another, on a warm twin (the open's Temporal workflow is
// replaced by its two activities run in order; see the report for the figure through Temporal).
func BenchmarkOpenWarm(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, tr := range transports {
			b.Run(driver+"/"+tr.name, func(b *testing.B) {
				p, srv, _ := loadPlane(b, driver, tr.local)
				hc := loadClient()
				raw := rawServer(b)
				n := max(b.N, 300)
				url := srv.URL + "/v1/envs/" + p.env.Slug + "/sessions"
				rawLat := make([]time.Duration, 0, n)
				b.ResetTimer()
				lat := seededOpens(b, hc, url, p.key, n)
				b.StopTimer()
				for range n {
					t0 := time.Now()
					_, _ = post(hc, raw.URL, "", []byte(`{}`))
					rawLat = append(rawLat, time.Since(t0))
				}
				sort.Slice(rawLat, func(i, j int) bool { return rawLat[i] < rawLat[j] })
				b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
				b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
				b.ReportMetric(ms(latency.Percentile(rawLat, 50)), "raw-p50-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkOpenWarmTemporal: seeded session opens over HTTP through the real session-open workflow on a real
// Temporal frontend (DOPPEL_BENCH_TEMPORAL=host:port, e.g. the dev server of `doppel dev`), with a worker in
// this process so the start is eager and both activities are local. Skipped without a frontend.
func BenchmarkOpenWarmTemporal(b *testing.B) {
	addr := os.Getenv("DOPPEL_BENCH_TEMPORAL")
	if addr == "" {
		b.Skip("DOPPEL_BENCH_TEMPORAL not set: no Temporal frontend to open sessions through")
	}
	for _, driver := range schematest.Drivers() {
		b.Run(driver, func(b *testing.B) {
			p, srv, _ := loadPlane(b, driver, true) // doppel dev's default: the twin in process
			c, err := client.Dial(client.Options{HostPort: addr, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			queue := "bench-sessions-" + schema.NewID("")
			w := sdkworker.New(c, queue, sdkworker.Options{})
			worker.Register(w, worker.Deps{Sessions: &activities.Sessions{DB: p.db, Twins: p.twins, Locals: p.locals}})
			if err := w.Start(); err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			p.opener.set(&wfclient.Sessions{Conn: wfclient.Conn{Client: c, TaskQueue: queue}})
			hc := loadClient()
			url := srv.URL + "/v1/envs/" + p.env.Slug + "/sessions"
			n := max(b.N, 300)
			b.ResetTimer()
			lat := seededOpens(b, hc, url, p.key, n)
			b.StopTimer()
			b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
			b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// seededOpens opens n seeded sessions one after another at url with key and returns their latencies, sorted.
func seededOpens(b *testing.B, hc *http.Client, url, key string, n int) []time.Duration {
	lat := make([]time.Duration, 0, n)
	for i := range n {
		body, _ := json.Marshal(map[string]any{"seedInstructions": "2 orders with status pending", "seed": i})
		t0 := time.Now()
		code, err := post(hc, url, key, body)
		lat = append(lat, time.Since(t0))
		if err != nil || code != http.StatusCreated {
			b.Fatalf("open %d: %d %v", i, code, err)
		}
	}
	return latency.Sorted(lat)
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExternal drives a running doppel over HTTP (DOPPEL_BENCH_URL, DOPPEL_BENCH_KEY, DOPPEL_BENCH_ENV:
// e.g. `doppel dev` with tau-retail-dev collected and built): warm seeded opens through its Temporal, then
// tool calls from the recorded traces at 1,000/s and at peak over 64 sessions. Skipped without a target.
func BenchmarkExternal(b *testing.B) {
	base, key, env := os.Getenv("DOPPEL_BENCH_URL"), os.Getenv("DOPPEL_BENCH_KEY"), os.Getenv("DOPPEL_BENCH_ENV")
	if base == "" || key == "" || env == "" {
		b.Skip("DOPPEL_BENCH_URL, DOPPEL_BENCH_KEY and DOPPEL_BENCH_ENV name no running doppel")
	}
	_, traces := retailBundle(b)
	work := workload(traces)
	hc := loadClient()
	raw := rawServer(b)
	openURL := base + "/v1/envs/" + env + "/sessions"
	openOne := func(body map[string]any) (*loadTarget, time.Duration) {
		data, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, openURL, bytes.NewReader(data))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		d := time.Since(t0)
		var out struct {
			SessionID string `json:"sessionId"`
			Token     string `json:"token"`
		}
		if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&out) != nil {
			b.Fatalf("open: %d", resp.StatusCode)
		}
		return &loadTarget{url: base + "/v1/sessions/" + out.SessionID + "/call", token: out.Token}, d
	}
	b.Run("open", func(b *testing.B) {
		n := max(b.N, 200)
		var lat []time.Duration
		for i := range n {
			_, d := openOne(map[string]any{"seedInstructions": "2 orders with status pending", "seed": i})
			lat = append(lat, d)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
		b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
		b.ReportMetric(0, "ns/op")
	})
	targets := make([]*loadTarget, 64)
	for i := range targets {
		targets[i], _ = openOne(map[string]any{"seed": i})
		targets[i].calls = work[i%len(work)]
	}
	send := func(i int) (int, error) {
		t := targets[i%len(targets)]
		return post(hc, t.url, t.token, t.body())
	}
	for _, rate := range []int{1000, 250} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			n := max(b.N, 5*rate)
			_, _, _, _ = openLoop(rate/2, rate, send)
			lat, bad, errs, lag := openLoop(n, rate, send)
			rawLat, _, _, _ := openLoop(n, rate, func(i int) (int, error) { return post(hc, raw.URL, "", targets[0].calls[0]) })
			if bad > 0 {
				b.Errorf("%d of %d calls did not answer 200, first: %q", bad, n, errs)
			}
			reportRate(b, lat, rawLat, lag)
		})
	}
	b.Run("peak", func(b *testing.B) {
		n := max(b.N, 20000)
		all, elapsed, bad, errs := closedLoop(targets, n, func(t *loadTarget) (int, error) { return post(hc, t.url, t.token, t.body()) })
		if bad > 0 {
			b.Errorf("%d of %d calls did not answer 200, first: %q", bad, n, errs)
		}
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "calls/s")
		b.ReportMetric(ms(latency.Percentile(all, 50)), "p50-ms")
		b.ReportMetric(ms(latency.Percentile(all, 99)), "p99-ms")
		b.ReportMetric(0, "ns/op")
	})
}
