package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// openBench is the open mode of `doppel bench`: how fast a running doppel opens sessions.
type openBench struct {
	c      *apiClient
	target *benchTarget
	slug   string
	// seedInstr seeds every world ("" opens unseeded worlds).
	seedInstr string
	opens     int // how many sessions to open in the concurrent phase
	clients   int // concurrent clients, each a closed loop on its own keep-alive connection
	seq       int // how many sequential opens to time first, each alone
	// pprof is the server's debug.pprof_addr base URL ("": none): with it the live heap after a collection is read
	// beside the RSS.
	pprof string
}

// openedSession is one session the bench opened.
type openedSession struct {
	id string
}

// run times seq opens one after another, then opens concurrently from clients connections, beside the raw
// /healthz round trip at the same concurrency in the same run; it prints completion time, p50/p99, opens/s, the
// server's and the generator's CPU, and the server's RSS per open session (read from its /metrics while every
// session is still open). Every session it opened is closed before it returns.
func (b *openBench) run(ctx context.Context, out io.Writer) error {
	var all []openedSession
	defer func() { b.closeAll(context.WithoutCancel(ctx), all) }()
	conn := b.target.conn()
	defer conn.close()
	if b.seq > 0 {
		var lat []time.Duration
		for i := 0; i < b.seq; i++ {
			s, d, err := b.open(ctx, conn, i)
			if err != nil {
				return fmt.Errorf("sequential open %d: %w", i, err)
			}
			all = append(all, s)
			lat = append(lat, d)
		}
		fmt.Fprintf(out, "sequential opens (%d, %s, one at a time)  p50 %s  p99 %s  max %s\n", b.seq, b.kind(),
			pct(lat, 50), pct(lat, 99), pct(lat, 100))
		b.closeAll(ctx, all)
		all = nil
	}

	cpu0 := readCPU(ctx, b.c.http, b.c.url)
	raw, took := benchRaw(ctx, b.target, b.clients, 2*time.Second)
	cpu1 := readCPU(ctx, b.c.http, b.c.url)
	fmt.Fprintf(out, "raw GET /healthz, %d at once (the limit)  %.0f/s  p50 %s  p99 %s%s\n", b.clients,
		float64(len(raw))/took.Seconds(), pct(raw, 50), pct(raw, 99), cpu0.since(cpu1, len(raw)))

	conns := make([]*benchConn, b.clients)
	for i := range conns {
		conns[i] = b.target.conn()
		if err := conns[i].ready(ctx); err != nil {
			return fmt.Errorf("connect to %s: %w", b.c.url, err)
		}
		defer conns[i].close()
	}
	heap0 := liveHeap(ctx, b.c.http, b.pprof)
	rss0 := serverRSS(ctx, b.c.http, b.c.url)
	var (
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, b.opens)
		next     atomic.Int64
		failures atomic.Int64
		example  atomic.Value
	)
	cpu0 = readCPU(ctx, b.c.http, b.c.url)
	start := time.Now()
	var wg sync.WaitGroup
	for _, cn := range conns {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.opens || ctx.Err() != nil {
					return
				}
				s, d, err := b.open(ctx, cn, b.seq+i)
				mu.Lock()
				if err != nil {
					failures.Add(1)
					example.CompareAndSwap(nil, err.Error())
				} else {
					lat = append(lat, d)
					all = append(all, s)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1 = readCPU(ctx, b.c.http, b.c.url)
	rss1 := serverRSS(ctx, b.c.http, b.c.url)
	heap1 := liveHeap(ctx, b.c.http, b.pprof)
	fmt.Fprintf(out, "concurrent opens (%d %s from %d clients)  %d ok, %d failed in %s = %.0f opens/s  p50 %s  p99 %s  max %s\n",
		b.opens, b.kind(), b.clients, len(lat), failures.Load(), elapsed.Round(time.Millisecond),
		float64(len(lat))/elapsed.Seconds(), pct(lat, 50), pct(lat, 99), pct(lat, 100))
	if line := cpu0.since(cpu1, len(lat)); line != "" {
		fmt.Fprintf(out, " %s\n", line)
	}
	if rss0 > 0 && rss1 > 0 && len(lat) > 0 {
		fmt.Fprintf(out, "  server RSS %.0f MB before, %.0f MB with %d more sessions open: %.1f KB per open session\n",
			float64(rss0)/1e6, float64(rss1)/1e6, len(lat), float64(rss1-rss0)/float64(len(lat))/1e3)
	}
	if heap0 > 0 && heap1 > 0 && len(lat) > 0 {
		fmt.Fprintf(out, "  server live heap after a collection %.0f MB before, %.0f MB with them open: %.1f KB per open session\n",
			heap0/1e6, heap1/1e6, (heap1-heap0)/float64(len(lat))/1e3)
	}
	if e := example.Load(); e != nil {
		fmt.Fprintf(out, "  a failed open: %.300s\n", e)
	}
	return nil
}

func (b *openBench) kind() string {
	if b.seedInstr != "" {
		return "seeded"
	}
	return "unseeded"
}

// open opens one session with seed i over cn and answers it with the round trip's time.
func (b *openBench) open(ctx context.Context, cn *benchConn, i int) (openedSession, time.Duration, error) {
	body := map[string]any{"seed": i}
	if b.seedInstr != "" {
		body["seedInstructions"] = b.seedInstr
	}
	data, _ := json.Marshal(body)
	t0 := time.Now()
	status, _, answer, err := cn.post(ctx, b.target.path+"/v1/envs/"+b.slug+"/sessions", "Bearer "+b.c.key, data)
	d := time.Since(t0)
	if err != nil {
		return openedSession{}, d, err
	}
	if status != http.StatusOK && status != http.StatusCreated {
		return openedSession{}, d, fmt.Errorf("status %d: %s", status, answer)
	}
	var o struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(answer, &o); err != nil || o.SessionID == "" {
		return openedSession{}, d, fmt.Errorf("answer without a session id: %.200s", answer)
	}
	return openedSession{id: o.SessionID}, d, nil
}

// closeAll closes the sessions, eight at a time.
func (b *openBench) closeAll(ctx context.Context, ss []openedSession) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, s := range ss {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = b.c.do(ctx, http.MethodDelete, "/v1/sessions/"+s.id, nil, nil)
		})
	}
	wg.Wait()
}

// serverRSS is the server's resident memory in bytes (process_resident_memory_bytes from GET /metrics; 0 unknown).
func serverRSS(ctx context.Context, hc *http.Client, base string) float64 {
	v, _ := readMetric(ctx, hc, base, "process_resident_memory_bytes")
	return v
}

// parseMetric reads an unlabelled sample's value from a line of the Prometheus text format.
func parseMetric(line, name string) (float64, bool) {
	if len(line) <= len(name) || line[:len(name)] != name || line[len(name)] != ' ' {
		return 0, false
	}
	f, err := strconv.ParseFloat(line[len(name)+1:], 64)
	return f, err == nil
}

// readMetric reads one unlabelled sample from the server's GET /metrics.
func readMetric(ctx context.Context, hc *http.Client, base, name string) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return 0, false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := parseMetric(sc.Text(), name); ok {
			return v, true
		}
	}
	return 0, false
}

// liveHeap is the server's heap in use right after a collection (HeapInuse from /debug/pprof/heap?debug=1&gc=1 on
// its pprof listener base; 0 unknown).
func liveHeap(ctx context.Context, hc *http.Client, base string) float64 {
	if base == "" {
		return 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/debug/pprof/heap?debug=1&gc=1", nil)
	if err != nil {
		return 0
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapInuse = "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
