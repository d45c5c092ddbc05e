package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	seedInstr := fs.String("seed-instructions", "", "seed instructions for every session open (seeded opens); empty: unseeded")
	if err := parseClient(fs, e.args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if *slug == "" || *traces == "" {
		return usageError{"bench: --env and --traces are required"}
	}
	if *sessions < 1 || *rate < 0 || *duration <= 0 {
		return usageError{"bench: --sessions must be ≥ 1, --rate ≥ 0 and --duration > 0"}
	}
	c, err := newAPIClient(*url, *key)
	if err != nil {
		return err
	}
	c.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2 * *sessions}}
	calls, err := benchCalls(*traces)
	if err != nil {
		return err
	}

	var raw []time.Duration
	if *rate == 0 {
		raw = benchRaw(ctx, c, *sessions, 2000)
		fmt.Fprintf(e.stdout, "raw GET /healthz, %d at once (the limit)  p50 %s  p99 %s\n", *sessions, pct(raw, 50), pct(raw, 99))
	} else {
		var mu sync.Mutex
		rawCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		latency.Offer(rawCtx, *rate, 0, func(int, time.Time) {
			if d, ok := healthz(ctx, c); ok {
				mu.Lock()
				raw = append(raw, d)
				mu.Unlock()
			}
		})
		cancel()
		fmt.Fprintf(e.stdout, "raw GET /healthz at %d/s (the limit)  p50 %s  p99 %s\n", *rate, pct(raw, 50), pct(raw, 99))
	}

	type session struct{ id, token string }
	var opened []session
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
		opened = append(opened, session{o.SessionID, o.Token})
	}
	kind := "unseeded"
	if *seedInstr != "" {
		kind = "seeded"
	}
	fmt.Fprintf(e.stdout, "session open (%d %s, sequential)  p50 %s  p99 %s\n", len(opens), kind, pct(opens, 50), pct(opens, 99))
	defer func() {
		for _, s := range opened {
			_ = c.do(context.WithoutCancel(ctx), http.MethodDelete, "/v1/sessions/"+s.id, nil, nil)
		}
	}()

	var (
		mu        sync.Mutex
		lat       []time.Duration
		fidelity  = map[string]int{}
		stages    = map[string][]time.Duration{}
		failures  atomic.Int64
		next      atomic.Int64
		sessionMu = make([]sync.Mutex, len(opened))
	)
	call := func(i int64) {
		si := int(i) % len(opened)
		body, _ := json.Marshal(map[string]any{"name": calls[int(i)%len(calls)].Tool,
			"arguments": json.RawMessage(calls[int(i)%len(calls)].RawArgs), "requestor": "assistant"})
		sessionMu[si].Lock() // calls of one session are ordered, as an agent makes them
		t0 := time.Now()
		fid, timing, err := benchCall(ctx, c, opened[si].id, opened[si].token, body)
		d := time.Since(t0)
		sessionMu[si].Unlock()
		if err != nil {
			failures.Add(1)
			return
		}
		mu.Lock()
		lat = append(lat, d)
		fidelity[fid]++
		for _, st := range timing {
			stages[st.name] = append(stages[st.name], st.d)
		}
		mu.Unlock()
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	if *rate == 0 {
		for w := 0; w < len(opened); w++ {
			wg.Go(func() {
				for runCtx.Err() == nil {
					call(next.Add(1) - 1)
				}
			})
		}
	} else {
		latency.Offer(runCtx, *rate, 0, func(i int, _ time.Time) { call(int64(i)) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	mode := fmt.Sprintf("offered %d/s", *rate)
	if *rate == 0 {
		mode = "peak"
	}
	fmt.Fprintf(e.stdout, "calls (%s, %d sessions, %s)  %d ok, %d failed, %.0f calls/s  p50 %s  p99 %s  max %s\n",
		mode, len(opened), duration.String(), len(lat), failures.Load(), float64(len(lat))/elapsed.Seconds(),
		pct(lat, 50), pct(lat, 99), pct(lat, 100))
	for _, name := range []string{"twin", "journal", "total"} {
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

// benchCall sends one call with the session token and answers the fidelity label and the server's stage times.
func benchCall(ctx context.Context, c *apiClient, id, token string, body []byte) (string, []stage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/sessions/"+id+"/call", bytes.NewReader(body))
	if err != nil {
		return "", nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Fidelity string `json:"fidelity"`
	}
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &out) != nil {
		return "", nil, fmt.Errorf("%d %s", resp.StatusCode, data)
	}
	return out.Fidelity, serverTiming(resp.Header.Get("Server-Timing")), nil
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

// benchRaw times n GET /healthz round trips over conc connections: the floor any call sits on.
func benchRaw(ctx context.Context, c *apiClient, conc, n int) []time.Duration {
	var mu sync.Mutex
	var out []time.Duration
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if d, ok := healthz(ctx, c); ok {
					mu.Lock()
					out = append(out, d)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return out
}

// healthz times one GET /healthz.
func healthz(ctx context.Context, c *apiClient) (time.Duration, bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/healthz", nil)
	t0 := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(t0), true
}

// pct is the p-th percentile of ds (100: the maximum), rounded for printing.
func pct(ds []time.Duration, p float64) time.Duration {
	return latency.Percentile(latency.Sorted(ds), p).Round(10 * time.Microsecond)
}
