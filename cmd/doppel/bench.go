package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/trace"
)

// runBench measures the tool plane of a running doppel over HTTP: session opens, then tool calls replayed from
// recorded traces at a fixed rate (or as fast as the sessions allow), beside the raw round trip of GET /healthz
// measured in the same run.
func runBench(ctx context.Context, e env) error {
	fs, url, key := clientFlagSet(e, "bench", "bench --env SLUG --traces FILE [flags]")
	slug := fs.String("env", "", "environment to open sessions on (required)")
	traces := fs.String("traces", "", "collect body or JSON array of traces whose tool calls are replayed (required)")
	sessions := fs.Int("sessions", 64, "sessions to open and spread calls over")
	rate := fs.Int("rate", 1000, "calls per second to offer; 0 sends as fast as the sessions allow (peak)")
	duration := fs.Duration("duration", 10*time.Second, "how long to send calls")
	transport := fs.String("transport", "rest", "how calls are sent: rest (POST /v1/sessions/{id}/call) or trpc (POST /trpc/sessions.call)")
	seedInstr := fs.String("seed-instructions", "", "seed instructions for every session open (seeded opens); empty: unseeded")
	openN := fs.Int("opens", 0, "open mode: time this many session opens from --clients concurrent clients (after --sessions sequential ones) instead of replaying calls; --traces is not needed")
	clients := fs.Int("clients", 64, "open mode: concurrent clients, each on its own keep-alive connection")
	pprofURL := fs.String("pprof", "", "open mode: the server's debug.pprof_addr as a URL (http://127.0.0.1:6060): its live heap after a collection is read beside the RSS")
	if err := parseClient(fs, e.args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if *openN > 0 {
		if *slug == "" || *clients < 1 || *sessions < 0 {
			return usageError{"bench: open mode needs --env, --clients ≥ 1 and --sessions ≥ 0"}
		}
		c, err := newAPIClient(*url, *key)
		if err != nil {
			return err
		}
		c.http = &http.Client{Timeout: 30 * time.Second}
		target, err := newBenchTarget(c.url)
		if err != nil {
			return err
		}
		b := &openBench{c: c, target: target, slug: *slug, seedInstr: *seedInstr, opens: *openN, clients: *clients, seq: *sessions, pprof: *pprofURL}
		return b.run(ctx, e.stdout)
	}
	if *slug == "" || *traces == "" {
		return usageError{"bench: --env and --traces are required"}
	}
	if *sessions < 1 || *rate < 0 || *duration <= 0 {
		return usageError{"bench: --sessions must be ≥ 1, --rate ≥ 0 and --duration > 0"}
	}
	if *transport != "rest" && *transport != "trpc" {
		return usageError{"bench: --transport is rest or trpc"}
	}
	c, err := newAPIClient(*url, *key)
	if err != nil {
		return err
	}
	c.http = &http.Client{Timeout: 30 * time.Second}
	calls, err := benchCalls(*traces)
	if err != nil {
		return err
	}
	target, err := newBenchTarget(c.url)
	if err != nil {
		return err
	}

	// The limit: GET /healthz over the same kind of connection, at the same rate or concurrency.
	var raw []time.Duration
	if *rate == 0 {
		cpu0 := readCPU(ctx, c.http, c.url)
		var took time.Duration
		raw, took = benchRaw(ctx, target, *sessions, 2*time.Second)
		fmt.Fprintf(e.stdout, "raw GET /healthz, %d at once (the limit)  %.0f/s  p50 %s  p99 %s%s\n", *sessions,
			float64(len(raw))/took.Seconds(), pct(raw, 50), pct(raw, 99), cpu0.since(readCPU(ctx, c.http, c.url), len(raw)))
	} else {
		raw = benchRawRate(ctx, target, *rate, *sessions, 2*time.Second)
		fmt.Fprintf(e.stdout, "raw GET /healthz at %d/s (the limit)  p50 %s  p99 %s\n", *rate, pct(raw, 50), pct(raw, 99))
	}

	type session struct {
		id   string
		path string
		auth string
		conn *benchConn
		mu   sync.Mutex // calls of one session are ordered, as an agent makes them
		// prefix starts a tRPC call's body: the session id, to which the call's fields are appended.
		prefix []byte
	}
	var opened []*session
	var opens []time.Duration
	for i := 0; i < *sessions; i++ {
		var o struct {
			SessionID string `json:"sessionId"`
			Token     string `json:"token"`
		}
		body := map[string]any{"seed": i}
		if *seedInstr != "" {
			body["seedInstructions"] = *seedInstr
		}
		t0 := time.Now()
		if err := c.do(ctx, http.MethodPost, "/v1/envs/"+*slug+"/sessions", body, &o); err != nil {
			return fmt.Errorf("open session %d: %w", i, err)
		}
		opens = append(opens, time.Since(t0))
		path := target.path + "/v1/sessions/" + o.SessionID + "/call"
		if *transport == "trpc" {
			path = target.path + "/trpc/sessions.call"
		}
		opened = append(opened, &session{id: o.SessionID, path: path, auth: "Bearer " + o.Token, conn: target.conn(),
			prefix: []byte(`{"session_id":"` + o.SessionID + `",`)})
	}
	for _, s := range opened {
		if err := s.conn.ready(ctx); err != nil {
			return fmt.Errorf("connect to %s: %w", c.url, err)
		}
	}
	kind := "unseeded"
	if *seedInstr != "" {
		kind = "seeded"
	}
	fmt.Fprintf(e.stdout, "session open (%d %s, sequential)  p50 %s  p99 %s\n", len(opens), kind, pct(opens, 50), pct(opens, 99))
	defer func() {
		for _, s := range opened {
			s.conn.close()
			_ = c.do(context.WithoutCancel(ctx), http.MethodDelete, "/v1/sessions/"+s.id, nil, nil)
		}
	}()

	// Each call's body is encoded once, before the clock starts.
	bodies := make([][]byte, len(calls))
	for i, cl := range calls {
		bodies[i], _ = json.Marshal(map[string]any{"name": cl.Tool, "arguments": json.RawMessage(cl.RawArgs), "requestor": "assistant"})
	}
	type sample struct {
		d      time.Duration
		answer []byte
		timing string
		status int
	}
	var (
		mu       sync.Mutex
		samples  = make([]sample, 0, 1<<16)
		failures atomic.Int64
	)
	call := func(s *session, body []byte) {
		if *transport == "trpc" {
			body = append(s.prefix[:len(s.prefix):len(s.prefix)], body[1:]...)
		}
		s.mu.Lock()
		t0 := time.Now()
		status, timing, answer, err := s.conn.post(ctx, s.path, s.auth, body)
		d := time.Since(t0) // up to the answer's last byte; reading it happens after
		s.mu.Unlock()
		if err != nil {
			failures.Add(1)
			return
		}
		mu.Lock()
		samples = append(samples, sample{d: d, answer: answer, timing: timing, status: status})
		mu.Unlock()
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	cpu0 := readCPU(ctx, c.http, c.url)
	start := time.Now()
	if *rate == 0 {
		// Peak: one closed loop per session, each replaying the traces' calls from its own offset.
		var wg sync.WaitGroup
		for w, s := range opened {
			wg.Go(func() {
				for i := w * len(bodies) / len(opened); runCtx.Err() == nil; i++ {
					call(s, bodies[i%len(bodies)])
				}
			})
		}
		wg.Wait()
	} else {
		latency.Offer(runCtx, *rate, 0, func(i int, _ time.Time) { call(opened[i%len(opened)], bodies[i%len(bodies)]) })
	}
	elapsed := time.Since(start)
	cpu1 := readCPU(ctx, c.http, c.url)

	var (
		lat      []time.Duration
		fidelity = map[string]int{}
		stages   = map[string][]time.Duration{}
		bad      = map[int]int{}
		example  string
	)
	for _, sm := range samples {
		var out struct {
			Fidelity string `json:"fidelity"`
		}
		answer := sm.answer
		if *transport == "trpc" {
			var r struct {
				Result struct {
					Data json.RawMessage `json:"data"`
				} `json:"result"`
			}
			if json.Unmarshal(answer, &r) == nil {
				answer = r.Result.Data
			}
		}
		if sm.status != http.StatusOK || json.Unmarshal(answer, &out) != nil || out.Fidelity == "" {
			failures.Add(1)
			bad[sm.status]++
			if example == "" {
				example = fmt.Sprintf("%d %s", sm.status, bytes.TrimSpace(sm.answer))
			}
			continue
		}
		lat = append(lat, sm.d)
		fidelity[out.Fidelity]++
		for _, st := range serverTiming(sm.timing) {
			stages[st.name] = append(stages[st.name], st.d)
		}
	}
	mode := fmt.Sprintf("%s, offered %d/s", *transport, *rate)
	if *rate == 0 {
		mode = *transport + ", peak"
	}
	fmt.Fprintf(e.stdout, "calls (%s, %d sessions, %s)  %d ok, %d failed, %.0f calls/s  p50 %s  p99 %s  max %s\n",
		mode, len(opened), duration.String(), len(lat), failures.Load(), float64(len(lat))/elapsed.Seconds(),
		pct(lat, 50), pct(lat, 99), pct(lat, 100))
	if line := cpu0.since(cpu1, len(lat)); line != "" {
		fmt.Fprintf(e.stdout, " %s\n", line)
	}
	for _, name := range []string{"auth", "twin", "journal", "total"} {
		if ds := stages[name]; len(ds) > 0 {
			fmt.Fprintf(e.stdout, "  server %-8s p50 %s  p99 %s\n", name, pct(ds, 50), pct(ds, 99))
		}
	}
	keys := make([]string, 0, len(fidelity))
	for k := range fidelity {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(e.stdout, "  %-12s %d\n", k, fidelity[k])
	}
	if example != "" {
		fmt.Fprintf(e.stdout, "  failed answers by status %v, e.g. %.300s\n", bad, example)
	}
	return nil
}

// benchCalls reads the answered tool calls of a trace file with JSON-object arguments.
func benchCalls(path string) ([]trace.Call, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var b trace.Batch
	if err := json.Unmarshal(data, &b); err != nil || len(b.Traces) == 0 {
		var ts []trace.Trace
		if err2 := json.Unmarshal(data, &ts); err2 != nil {
			return nil, fmt.Errorf("%s: neither a collect body nor an array of traces: %w", path, err)
		}
		b.Traces = ts
	}
	var calls []trace.Call
	for _, t := range b.Traces {
		for _, c := range trace.Calls(t) {
			if c.Answered && c.Args != nil {
				calls = append(calls, c)
			}
		}
	}
	if len(calls) == 0 {
		return nil, fmt.Errorf("%s: no answered tool calls to replay", path)
	}
	return calls, nil
}

// stage is one entry of a Server-Timing header.
type stage struct {
	name string
	d    time.Duration
}

// serverTiming reads the entries of a Server-Timing header that carry a duration ("twin;dur=0.183, …"); others
// are skipped.
func serverTiming(h string) []stage {
	var out []stage
	for _, entry := range strings.Split(h, ",") {
		parts := strings.Split(strings.TrimSpace(entry), ";")
		for _, p := range parts[1:] {
			v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur=")
			if !ok {
				continue
			}
			if f, err := strconv.ParseFloat(v, 64); err == nil && parts[0] != "" {
				out = append(out, stage{parts[0], time.Duration(f * float64(time.Millisecond))})
			}
		}
	}
	return out
}

// pct is the p-th percentile of ds (100: the maximum), rounded for printing.
func pct(ds []time.Duration, p float64) time.Duration {
	return latency.Percentile(latency.Sorted(ds), p).Round(10 * time.Microsecond)
}
